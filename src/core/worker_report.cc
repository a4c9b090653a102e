#include "core/worker_report.h"

#include <cmath>
#include <cstdio>
#include <fstream>

namespace myriad {
namespace {

constexpr const char* kKindNames[] = {"crash", "hang", "stall", "loss", "sdc", "straggler", "comm", "diag", "lost"};

std::string shown(const nlohmann::json& v) {
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

// Reads fields of one object, each checked against the type its writer gives it; `at` prefixes
// the field names in errors ("finished.match").
class Fields {
 public:
  Fields(const nlohmann::json& j, std::string at) : j_(j), at_(std::move(at)) {
    if (!j.is_object()) fail_type(at_.empty() ? "the file" : at_.substr(0, at_.size() - 1), "an object", j);
  }
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  std::string str(const char* key, std::string fallback = "") const {
    if (!has(key)) return fallback;
    if (!j_[key].is_string()) fail_type(at_ + key, "a string", j_[key]);
    return j_[key].get<std::string>();
  }
  int64_t integer(const char* key, int64_t fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_number_integer()) fail_type(at_ + key, "an integer", j_[key]);
    return j_[key].get<int64_t>();
  }
  uint64_t count(const char* key) const {
    if (!has(key)) return 0;
    if (!j_[key].is_number_unsigned()) fail_type(at_ + key, "a non-negative integer", j_[key]);
    return j_[key].get<uint64_t>();
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_number()) fail_type(at_ + key, "a number", j_[key]);
    return j_[key].get<double>();
  }
  bool flag(const char* key) const {
    if (!has(key)) return false;
    if (!j_[key].is_boolean()) fail_type(at_ + key, "true or false", j_[key]);
    return j_[key].get<bool>();
  }
  const nlohmann::json& operator[](const char* key) const { return j_[key]; }
  std::string at(const char* key) const { return at_ + key; }
  [[noreturn]] static void fail_type(const std::string& field, const char* want, const nlohmann::json& got) {
    throw_input(field, " must be ", want, ", got ", shown(got));
  }

 private:
  const nlohmann::json& j_;
  std::string at_;
};

nlohmann::json encode(const OpRef& r) {
  nlohmann::json j = {{"group", r.group}, {"op", r.op}, {"seq", r.seq}, {"match", r.match}};
  if (r.step >= 0) j["step"] = r.step;
  if (r.peer >= 0) j["peer"] = r.peer;
  return j;
}

OpRef decode_op(const nlohmann::json& j, const std::string& at) {
  const Fields f(j, at + ".");
  OpRef r;
  r.group = f.str("group"), r.op = f.str("op");
  r.seq = f.count("seq"), r.match = f.count("match");
  r.step = f.integer("step", -1);
  r.peer = static_cast<int>(f.integer("peer", -1));
  return r;
}

}  // namespace

const char* kind_name(FaultKind k) { return kKindNames[static_cast<int>(k)]; }

std::optional<FaultKind> kind_from_name(const std::string& name) {
  for (int k = 0; k < static_cast<int>(std::size(kKindNames)); ++k)
    if (name == kKindNames[k]) return static_cast<FaultKind>(k);
  return std::nullopt;
}

nlohmann::json encode(const FaultRecord& f) {
  nlohmann::json j = {{"kind", kind_name(f.kind)}, {"class", class_name(f.cls)}, {"rank", f.rank},
                      {"node", f.node},          {"step", f.step},              {"detail", f.detail}};
  if (f.evict) j["evict"] = true;
  return j;
}

FaultRecord decode_fault(const nlohmann::json& j) {
  const Fields f(j, "");
  FaultRecord r;
  const std::string kind = f.str("kind", "crash");
  const std::optional<FaultKind> k = kind_from_name(kind);
  if (!k) throw_input("kind must be one of crash, hang, stall, loss, sdc, straggler, comm, diag, lost; got '", kind, "'");
  r.kind = *k;
  r.cls = class_from_name(f.str("class", class_name(ErrorClass::kRuntime)));
  r.rank = static_cast<int>(f.integer("rank", -1));
  r.node = static_cast<int>(f.integer("node", -1));
  r.step = f.integer("step", -1);
  r.detail = f.str("detail");
  r.evict = f.flag("evict");
  return r;
}

FaultRecord fault_of(const Error& e, int rank) {
  FaultRecord r;
  r.cls = e.cls();
  r.rank = rank;
  r.detail = e.what();
  if (const auto* fe = dynamic_cast<const FaultError*>(&e)) {
    r.kind = fe->kind();
    r.step = fe->step();
    if (fe->rank() >= 0) r.rank = fe->rank();
  } else if (e.cls() == ErrorClass::kComm) {
    r.kind = FaultKind::kComm;
  }
  return r;
}

FaultError nonfinite_loss(int64_t step, double loss) {
  return FaultError(FaultKind::kLoss, ErrorClass::kNumerics, step,
                    cat("step ", step, ": loss is ", loss, "; lower optim.lr or resume from an earlier checkpoint"));
}

bool write_record(const std::string& path, const nlohmann::json& j) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return false;
  const std::string text = j.dump() + "\n";
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  return std::fclose(f) == 0 && ok && std::rename(tmp.c_str(), path.c_str()) == 0;
}

std::optional<FaultRecord> read_fault_record(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  try {
    return decode_fault(j);
  } catch (const Error&) {
    return std::nullopt;
  }
}

nlohmann::json encode(const HeartbeatRecord& h) {
  nlohmann::json j = {{"beat", h.beat},           {"step", h.step},         {"phase", h.phase},
                      {"allowance_s", h.allowance_s}, {"own_ms", h.own_ms}, {"step_ms", h.step_ms},
                      {"tokens_per_s", h.tokens_per_s}, {"steps_run", h.steps_run}};
  if (h.allowance_from_s > 0) j["allowance_from_s"] = h.allowance_from_s;
  if (h.first_step >= 0) j["first_step"] = h.first_step, j["first_step_unix_s"] = h.first_step_unix_s;
  if (!h.resumed_from.empty()) j["resumed_from"] = h.resumed_from;
  if (h.started) j["started"] = encode(*h.started);
  if (h.finished) j["finished"] = encode(*h.finished);
  nlohmann::json groups = nlohmann::json::array();
  for (const GroupProgress& g : h.groups)
    groups.push_back({{"group", g.group}, {"op", g.op}, {"match", g.match}, {"state", g.state}});
  j["groups"] = std::move(groups);
  if (h.age_s >= 0) j["age_s"] = h.age_s;
  return j;
}

HeartbeatRecord decode_heartbeat(const nlohmann::json& j) {
  const Fields f(j, "");
  HeartbeatRecord h;
  h.beat = f.integer("beat", 0);
  h.step = f.integer("step", -1);
  h.phase = f.str("phase");
  h.allowance_s = f.number("allowance_s", 0);
  h.allowance_from_s = f.number("allowance_from_s", 0);
  h.own_ms = f.number("own_ms", 0), h.step_ms = f.number("step_ms", 0), h.tokens_per_s = f.number("tokens_per_s", 0);
  h.steps_run = f.integer("steps_run", 0);
  h.first_step = f.integer("first_step", -1);
  h.first_step_unix_s = f.number("first_step_unix_s", 0);
  h.resumed_from = f.str("resumed_from");
  if (f.has("started")) h.started = decode_op(f["started"], "started");
  if (f.has("finished")) h.finished = decode_op(f["finished"], "finished");
  if (f.has("groups")) {
    if (!f["groups"].is_array()) Fields::fail_type("groups", "an array", f["groups"]);
    for (size_t i = 0; i < f["groups"].size(); ++i) {
      const Fields g(f["groups"][i], cat("groups[", i, "]."));
      h.groups.push_back({g.str("group"), g.str("op"), g.str("state"), g.count("match")});
    }
  }
  h.age_s = f.number("age_s", -1);
  return h;
}

std::optional<HeartbeatRecord> read_heartbeat(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("beat")) return std::nullopt;
  try {
    return decode_heartbeat(j);
  } catch (const Error&) {
    return std::nullopt;
  }
}

}  // namespace myriad
