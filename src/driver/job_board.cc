#include "driver/job_board.h"

#include <chrono>
#include <thread>

#include "core/error.h"
#include "core/log.h"

namespace myriad::driver {

JobBoard::JobBoard(const std::string& url, double timeout_s, double patience_s)
    : store_(comm::make_store(url, "driver", timeout_s)), patience_(patience_s) {}

template <class F>
auto JobBoard::patiently(F fn) -> decltype(fn(std::declval<comm::Store&>())) {
  const double until = comm::steady_now_s() + patience_;
  for (bool warned = false;;) {
    try {
      return fn(*store_);
    } catch (const Error& e) {
      if (e.cls() != ErrorClass::kComm || comm::steady_now_s() >= until) throw;
      if (!warned) log::warn("launch: the job's store does not answer (", e.what(), "); trying again");
      warned = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  }
}

// A value that does not parse is absent (nothing this code wrote).
std::optional<nlohmann::json> JobBoard::json_at(const std::string& key) {
  const std::optional<std::string> v = patiently([&](comm::Store& s) { return s.try_get(key); });
  if (!v) return std::nullopt;
  nlohmann::json j = nlohmann::json::parse(*v, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

namespace {
double wall_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
// Each heartbeat carries when it was written and how long it lives: a key whose expiry did not
// take (a claim written without one) still reads as gone once that time has passed.
nlohmann::json stamped(const nlohmann::json& state, double ttl_s) {
  nlohmann::json s = state;
  s["time"] = wall_s(), s["ttl_s"] = ttl_s;
  return s;
}
}  // namespace

void JobBoard::beat(const std::string& name, const nlohmann::json& state, double ttl_s) {
  patiently([&](comm::Store& s) { s.set("agent/" + name, stamped(state, ttl_s).dump(), ttl_s); return 0; });
}

bool JobBoard::live(const nlohmann::json& beat) {
  const std::string status = beat.value("status", "");
  if (status == "done" || status == "ended") return false;
  return !beat.contains("time") || wall_s() - beat.value("time", 0.0) < beat.value("ttl_s", 5.0);
}

std::optional<nlohmann::json> JobBoard::claim(const std::string& name, const nlohmann::json& state, double ttl_s) {
  const std::string key = "agent/" + name;
  for (int tries = 0; tries < 20; ++tries) {
    const std::optional<std::string> held = patiently([&](comm::Store& s) { return s.try_get(key); });
    if (held) {
      const nlohmann::json j = nlohmann::json::parse(*held, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && live(j)) return j;
    }
    // Atomically over what was read: of two launches that both found the place free, one wins.
    const std::string mine = stamped(state, ttl_s).dump();
    if (patiently([&](comm::Store& s) { return s.compare_set(key, held, mine); }) == mine) {
      beat(name, state, ttl_s);  // the same, now with its expiry
      return std::nullopt;
    }
  }
  throw_runtime("launch: the job's store kept changing ", key, " while this launch tried to claim it");
}

std::optional<nlohmann::json> JobBoard::heartbeat(const std::string& name) { return json_at("agent/" + name); }

namespace {
nlohmann::json set_once(std::optional<std::string> held, const nlohmann::json& mine) {
  if (!held) return mine;
  nlohmann::json j = nlohmann::json::parse(*held, nullptr, false);
  return j.is_object() ? j : mine;
}
}  // namespace

nlohmann::json JobBoard::stop(int64_t attempt, const nlohmann::json& cause) {
  return set_once(patiently([&](comm::Store& s) { return s.compare_set(cat("stop/", attempt), std::nullopt, cause.dump()); }),
                  cause);
}

std::optional<nlohmann::json> JobBoard::stopped(int64_t attempt) { return json_at(cat("stop/", attempt)); }

void JobBoard::diagnosed(int64_t attempt, int node, const nlohmann::json& result) {
  patiently([&](comm::Store& s) { s.set(cat("diag/", attempt, "/", node), result.dump()); return 0; });
}

std::optional<nlohmann::json> JobBoard::diagnosis(int64_t attempt, int node) {
  return json_at(cat("diag/", attempt, "/", node));
}

nlohmann::json JobBoard::leave(int64_t attempt, const nlohmann::json& proposal) {
  return set_once(
      patiently([&](comm::Store& s) { return s.compare_set(cat("leave/", attempt), std::nullopt, proposal.dump()); }),
      proposal);
}

Settlement JobBoard::settle(int64_t attempt, const Settlement& plan) {
  const nlohmann::json p = encode(plan);
  return decode_settlement(
      set_once(patiently([&](comm::Store& s) { return s.compare_set(cat("plan/", attempt), std::nullopt, p.dump()); }), p));
}

std::optional<Settlement> JobBoard::settled(int64_t attempt) {
  if (std::optional<nlohmann::json> j = json_at(cat("plan/", attempt))) return decode_settlement(*j);
  return std::nullopt;
}

void JobBoard::end(const nlohmann::json& how) {
  patiently([&](comm::Store& s) { s.set("end", how.dump()); return 0; });
}

std::optional<std::string> JobBoard::ended() {
  return patiently([&](comm::Store& s) { return s.try_get("end"); });
}

int64_t JobBoard::join_as_spare() {
  return patiently([&](comm::Store& s) { return s.add("spares", 1); }) - 1;
}

std::vector<int64_t> JobBoard::idle_spares() {
  const int64_t n = patiently([&](comm::Store& s) { return s.add("spares", 0); });
  std::vector<int64_t> out;
  for (int64_t k = 0; k < n; ++k)
    if (heartbeat(cat("spare", k)) && !patiently([&](comm::Store& s) { return s.try_get(cat("spare/", k, "/node")); }))
      out.push_back(k);
  return out;
}

bool JobBoard::assign_spare(int64_t k, int node, int64_t attempt) {
  const std::string want = cat(node, " ", attempt);
  return patiently([&](comm::Store& s) { return s.compare_set(cat("spare/", k, "/node"), std::nullopt, want); }) ==
         want;
}

std::optional<std::pair<int, int64_t>> JobBoard::assignment(int64_t k) {
  const std::optional<std::string> v = patiently([&](comm::Store& s) { return s.try_get(cat("spare/", k, "/node")); });
  if (!v) return std::nullopt;
  const size_t space = v->find(' ');
  if (space == std::string::npos) return std::nullopt;
  return std::make_pair(std::stoi(v->substr(0, space)), std::stoll(v->substr(space + 1)));
}

void JobBoard::flight(int64_t attempt, int rank, const nlohmann::json& entry) {
  patiently([&](comm::Store& s) { s.set(cat("flight/", attempt, "/", rank), entry.dump()); return 0; });
}

std::optional<nlohmann::json> JobBoard::flight_of(int64_t attempt, int rank) {
  return json_at(cat("flight/", attempt, "/", rank));
}

void JobBoard::block(const std::string& name, const std::string& why) {
  patiently([&](comm::Store& s) { s.set("evicted/" + name, why); return 0; });
}

std::optional<std::string> JobBoard::blocked(const std::string& name) {
  return patiently([&](comm::Store& s) { return s.try_get("evicted/" + name); });
}

}  // namespace myriad::driver
