#include "driver/hang_report.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/error.h"

namespace myriad::driver {
namespace {

// One rank's view of one group: its last issued operation, and what it issued at each number.
struct GroupView {
  uint64_t last = 0;  // the number of its last issued operation (0: none)
  std::string op, state;
  std::vector<int> members;                            // global ranks, when the record says
  std::map<uint64_t, std::pair<std::string, int64_t>> by_match;  // number -> (op, bytes)
};

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
        const nlohmann::json& b = last_beats[key];
        where += cat("; its last heartbeat", b.contains("age_s") ? cat(", ", std::round(b["age_s"].get<double>() * 10) / 10, " s old") : "",
                     ": step ", b.value("step", int64_t(-1)), ", phase ", b.value("phase", std::string("?")));
        if (b.contains("finished"))
          where += cat(", its last finished operation ", b["finished"].value("group", ""), "'s ",
                       b["finished"].value("op", ""), " #", b["finished"].value("match", uint64_t(0)));
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
    std::ifstream in(e.path());
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_object()) ranks.push_back(std::move(j));
  }
  if (ranks.empty())
    throw_input("hang-report: ", dir.string(), " holds no flight records (flight_rank_*.json): they are written when "
                "`myriad launch` stops a hung job, or when a collective times out");
  nlohmann::json beats = nlohmann::json::object();
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("heartbeat_rank_", 0) != 0) continue;
    std::ifstream in(e.path());
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_object()) continue;
    const auto written = fs::last_write_time(e.path(), ec);
    if (!ec) j["age_s"] = std::chrono::duration<double>(fs::file_time_type::clock::now() - written).count();
    beats[name.substr(15)] = std::move(j);
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
