#include "driver/hang_report.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/error.h"
#include "core/worker_report.h"

namespace myriad::driver {
namespace {

// One rank's view of one group: its last issued operation, and what it issued at each number.
struct GroupView {
  uint64_t last = 0;  // the number of its last issued operation (0: none)
  std::string op, state;
  std::vector<int> members;                            // global ranks, when the record says
  std::map<uint64_t, std::pair<std::string, int64_t>> by_match;  // number -> (op, bytes)
};

// A value from a file, short enough for a one-line error.
std::string shown(const nlohmann::json& v) {
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

// A flight record or heartbeat read from a file has each field the matching reads, of the type
// runtime/heartbeat.cc writes: a damaged or foreign file is an input error naming the file and
// the field, not a type error deep in the matching (the files are written whole, renamed into
// place, so a malformed one was not cut by a crash).
class Checker {
 public:
  explicit Checker(std::string file) : file_(std::move(file)) {}
  void object(const nlohmann::json& j, const std::string& at) const {
    if (!j.is_object()) fail(at, "an object", &j);
  }
  void array(const nlohmann::json& j, const std::string& key, const std::string& at) const {
    if (j.contains(key) && !j[key].is_array()) fail(at + key, "an array", &j[key]);
  }
  void string(const nlohmann::json& j, const std::string& key, const std::string& at) const {
    if (j.contains(key) && !j[key].is_string()) fail(at + key, "a string", &j[key]);
  }
  // Integers as the writer's: `unsigned_only` for operation numbers and ranks.
  void integer(const nlohmann::json& j, const std::string& key, const std::string& at, bool unsigned_only,
               bool required = false) const {
    if (!j.contains(key)) {
      if (required) fail(at + key, "", nullptr);
      return;
    }
    const nlohmann::json& v = j[key];
    const bool ok = unsigned_only ? v.is_number_unsigned() : v.is_number_integer();
    // Ranks are ints: a larger number is no rank.
    if (!ok || (key == "rank" && v.get<uint64_t>() > (1u << 30)))
      fail(at + key, unsigned_only ? "a non-negative integer" : "an integer", &v);
  }
  // `got` null: the field is missing.
  [[noreturn]] void fail(const std::string& field, const char* want, const nlohmann::json* got) const {
    throw_input("hang-report: ", file_, ": ", field.empty() ? "the file" : field,
                got ? cat(" must be ", want, ", got ", shown(*got)) : std::string(" is missing"),
                ": not a record Myriad wrote; move it out of the driver/ folder");
  }

 private:
  std::string file_;
};

// The last operation a heartbeat (or record) says its rank finished.
void check_finished(const Checker& c, const nlohmann::json& j) {
  if (!j.contains("finished")) return;
  c.object(j["finished"], "finished");
  c.string(j["finished"], "group", "finished.");
  c.string(j["finished"], "op", "finished.");
  c.integer(j["finished"], "match", "finished.", true);
}

void check_flight_record(const nlohmann::json& j, const std::string& file) {
  const Checker c(file);
  c.object(j, "");
  c.integer(j, "rank", "", true, true);
  c.integer(j, "step", "", false);
  c.string(j, "phase", "");
  check_finished(c, j);
  c.array(j, "groups", "");
  if (!j.contains("groups")) return;
  for (size_t i = 0; i < j["groups"].size(); ++i) {
    const nlohmann::json& g = j["groups"][i];
    const std::string at = cat("groups[", i, "].");
    c.object(g, at.substr(0, at.size() - 1));
    c.string(g, "group", at);
    c.string(g, "op", at);
    c.string(g, "state", at);
    c.integer(g, "match", at, true);
    c.array(g, "members", at);
    if (g.contains("members"))
      for (size_t m = 0; m < g["members"].size(); ++m)
        if (!g["members"][m].is_number_integer()) c.fail(cat(at, "members[", m, "]"), "a rank", &g["members"][m]);
    c.array(g, "records", at);
    if (!g.contains("records")) continue;
    for (size_t r = 0; r < g["records"].size(); ++r) {
      const nlohmann::json& rec = g["records"][r];
      const std::string rat = cat(at, "records[", r, "].");
      c.object(rec, rat.substr(0, rat.size() - 1));
      for (const char* key : {"seq", "match"}) c.integer(rec, key, rat, true);
      for (const char* key : {"bytes", "ended_us"}) c.integer(rec, key, rat, false);
      for (const char* key : {"op", "state"}) c.string(rec, key, rat);
    }
  }
}

// A heartbeat through its one decoder (core/worker_report.h).
HeartbeatRecord check_heartbeat(const nlohmann::json& j, const std::string& file) {
  try {
    return decode_heartbeat(j);
  } catch (const Error& e) {
    throw_input("hang-report: ", file, ": ", e.what(), ": not a record Myriad wrote; move it out of the driver/ folder");
  }
}

// A file's JSON, or an input error naming the file and where its text stops being JSON.
nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw_input("hang-report: ", path.string(), " is not JSON (at byte ", e.byte,
                "): not a record Myriad wrote; move it out of the driver/ folder");
  }
}

}  // namespace

HangReport analyze_hang(const nlohmann::json& ranks, const nlohmann::json& last_beats) {
  std::map<std::string, std::map<int, GroupView>> groups;  // group -> rank -> view
  std::map<int, const nlohmann::json*> by_rank;
  for (const nlohmann::json& r : ranks) {
    if (!r.contains("rank")) continue;
    const int rank = r["rank"].get<int>();
    by_rank[rank] = &r;
    for (const nlohmann::json& g : r.value("groups", nlohmann::json::array())) {
      GroupView v;
      if (g.contains("records")) {
        v.members = g.value("members", std::vector<int>{});
        uint64_t best_seq = 0;
        for (const nlohmann::json& rec : g["records"]) {
          const uint64_t seq = rec.value("seq", uint64_t(0)), m = rec.value("match", uint64_t(0));
          v.by_match[m] = {rec.value("op", std::string("?")), rec.value("bytes", int64_t(0))};
          if (seq >= best_seq) best_seq = seq, v.last = m, v.op = rec.value("op", ""), v.state = rec.value("state", "");
        }
      } else {
        v.last = g.value("match", uint64_t(0)), v.op = g.value("op", ""), v.state = g.value("state", "");
      }
      groups[g.value("group", std::string("?"))][rank] = std::move(v);
    }
  }
  HangReport report;
  std::map<int, std::set<int>> waits_on;
  std::map<int, std::vector<std::string>> waiters;  // waited-on rank -> "rank 0 in tp0's all_reduce #61"
  for (const auto& [group, views] : groups) {
    std::set<int> members;
    for (const auto& [rank, v] : views) {
      members.insert(rank);
      members.insert(v.members.begin(), v.members.end());
    }
    for (const auto& [rank, v] : views) {
      if (v.last == 0 || v.state == "done") continue;
      for (int peer : members) {
        if (peer == rank) continue;
        const auto it = views.find(peer);
        if (it != views.end() && it->second.last >= v.last) continue;
        waits_on[rank].insert(peer);
        waiters[peer].push_back(cat("rank ", rank, " in ", group, "'s ", v.op, " #", v.last));
      }
    }
    // The same number, different operations or sizes (a pipeline link's send and receive are one).
    std::map<uint64_t, std::vector<std::pair<int, std::pair<std::string, int64_t>>>> at;
    for (const auto& [rank, v] : views)
      for (const auto& [m, what] : v.by_match) at[m].push_back({rank, what});
    for (const auto& [m, list] : at) {
      bool differ = false;
      // The two ends of a pipeline link, or of the node-shared batch, issue different operations.
      auto kind = [](const std::string& op) {
        return op == "send" || op == "recv" ? std::string("message") : op == "publish" || op == "take" ? "batch" : op;
      };
      for (const auto& [rank, what] : list) {
        const bool same_kind = kind(what.first) == kind(list[0].second.first);
        differ = differ || !same_kind || what.second != list[0].second.second;
      }
      if (!differ) continue;
      std::string line = cat("group ", group, ", operation #", m, ":");
      for (const auto& [rank, what] : list) line += cat(" rank ", rank, " ", what.first, " of ", what.second, " bytes;");
      line.pop_back();
      report.mismatches.push_back(line);
    }
  }
  for (const auto& [rank, list] : waiters) {
    if (!waits_on[rank].empty()) continue;
    report.culprits.push_back(rank);
    std::string where;
    if (const auto it = by_rank.find(rank); it == by_rank.end()) {
      where = " (it left no record: stopped or gone";
      if (const std::string key = std::to_string(rank); last_beats.contains(key)) {
        const HeartbeatRecord b = check_heartbeat(last_beats[key], "the heartbeat of rank " + key);
        where += cat("; its last heartbeat", b.age_s >= 0 ? cat(", ", std::round(b.age_s * 10) / 10, " s old") : "",
                     ": step ", b.step, ", phase ", b.phase.empty() ? "?" : b.phase);
        if (b.finished)
          where += cat(", its last finished operation ", b.finished->group, "'s ", b.finished->op, " #", b.finished->match);
      }
      where += ")";
    } else {
      // Its last finished operation: a heartbeat names it; a flight record holds the times.
      const nlohmann::json& me = *it->second;
      std::string last;
      if (me.contains("finished"))
        last = cat(me["finished"].value("group", ""), "'s ", me["finished"].value("op", ""), " #",
                   me["finished"].value("match", uint64_t(0)));
      int64_t latest = 0;
      for (const nlohmann::json& g : me.value("groups", nlohmann::json::array()))
        for (const nlohmann::json& rec : g.value("records", nlohmann::json::array()))
          if (rec.value("state", "") == "done" && rec.value("ended_us", int64_t(0)) > latest)
            latest = rec.value("ended_us", int64_t(0)),
            last = cat(g.value("group", ""), "'s ", rec.value("op", ""), " #", rec.value("match", uint64_t(0)));
      where = cat(" (its last step ", me.value("step", int64_t(-1)), ", phase ", me.value("phase", std::string("?")),
                  last.empty() ? "" : ", its last finished operation " + last, ")");
    }
    std::string who;
    for (const std::string& w : list) who += (who.empty() ? "" : ", ") + w;
    report.findings.push_back(cat("rank ", rank, where, " holds the job up: ", who, " waits for it"));
  }
  return report;
}

std::string HangReport::text() const {
  std::string t;
  if (culprits.empty()) t += "hang report: no rank holds the others up (nobody waits, or they wait on each other)\n";
  for (const std::string& f : findings) t += "hang report: " + f + "\n";
  for (const std::string& m : mismatches) t += "hang report: mismatch: " + m + "\n";
  return t;
}

nlohmann::json HangReport::json() const {
  return {{"culprits", culprits}, {"findings", findings}, {"mismatches", mismatches}};
}

std::optional<Holdup> find_holdup(const nlohmann::json& ranks) {
  const HangReport r = analyze_hang(ranks);
  if (r.culprits.size() != 1) return std::nullopt;
  return Holdup{r.culprits[0], r.findings[0]};
}

HangReport write_hang_report(const std::string& run_dir) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(run_dir) / "driver";
  nlohmann::json ranks = nlohmann::json::array();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("flight_rank_", 0) != 0 || e.path().extension() != ".json") continue;
    nlohmann::json j = read_json(e.path());
    check_flight_record(j, e.path().string());
    ranks.push_back(std::move(j));
  }
  if (ranks.empty())
    throw_input("hang-report: ", dir.string(), " holds no flight records (flight_rank_*.json): they are written when "
                "`myriad launch` stops a hung job, or when a collective times out");
  nlohmann::json beats = nlohmann::json::object();
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    // (heartbeat_rank_<R>.tmp: a beat being written, or cut by a crash)
    if (name.rfind("heartbeat_rank_", 0) != 0 || e.path().extension() == ".tmp") continue;
    HeartbeatRecord h = check_heartbeat(read_json(e.path()), e.path().string());
    const auto written = fs::last_write_time(e.path(), ec);
    if (!ec) h.age_s = std::chrono::duration<double>(fs::file_time_type::clock::now() - written).count();
    beats[name.substr(15)] = encode(h);
  }
  return write_hang_report(run_dir, ranks, beats);
}

HangReport write_hang_report(const std::string& run_dir, const nlohmann::json& ranks, const nlohmann::json& last_beats) {
  const HangReport r = analyze_hang(ranks, last_beats);
  std::ofstream(std::filesystem::path(run_dir) / "hang_report.txt") << r.text();
  std::ofstream(std::filesystem::path(run_dir) / "hang_report.json") << r.json().dump(2) << "\n";
  return r;
}

}  // namespace myriad::driver
