#include "driver/hang_watch.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>

#include "comm/store.h"
#include "core/log.h"

namespace myriad::driver {
namespace {

// The state letter of /proc/<pid>/stat: R running, S sleeping, D in uninterruptible I/O, T
// stopped, ...; '?' when gone.
char process_state(pid_t pid) {
  std::ifstream in(cat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');  // the command name may hold spaces and parentheses
  return paren != std::string::npos && paren + 2 < text.size() ? text[paren + 2] : '?';
}

double wall_s() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

}  // namespace

HangWatch::HangWatch(Launcher& l, const std::string& run_dir)
    : launcher(l), dir(std::filesystem::path(run_dir) / "driver") {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
}

std::string HangWatch::add(int rank, int index) {
  Rank r;
  r.rank = rank, r.index = index;
  r.path = (dir / cat("heartbeat_rank_", rank)).string();
  std::error_code ec;
  for (const std::filesystem::path& p : {std::filesystem::path(r.path), flight_path(rank), fault_path(rank), inject_path(rank)})
    std::filesystem::remove(p, ec);  // the last attempt's
  ranks.push_back(r);
  return r.path;
}

// Once the workers are being stopped they may be gone before they answer: what they wrote when
// first asked stands, and a second request (another node's hang seen after this node's own) must
// not remove it.
void HangWatch::request_flight_records(int except) {
  if (launcher.stopping()) return;
  std::vector<const Rank*> asked;
  std::error_code ec;
  for (const Rank& r : ranks)
    if (r.rank != except && r.index >= 0 && r.index < launcher.size() && launcher.running(r.index)) {
      std::filesystem::remove(flight_path(r.rank), ec);
      ::kill(launcher.pid(r.index), SIGUSR1);
      asked.push_back(&r);
    }
  // Each asked worker answers within a beat, unless it cannot: stopped, or ended. On a loaded
  // machine a live one may take seconds (a 2 s bound once cost a report its healthy rank, which
  // then read as stopped), so the wait is long; it ends as soon as every answer is in.
  const auto pending = [&](const Rank* r) {
    if (std::filesystem::exists(flight_path(r->rank))) return false;
    const char state = process_state(launcher.pid(r->index));
    return state != 'T' && state != 't' && state != 'Z' && state != 'X' && state != '?';
  };
  for (const double until = comm::steady_now_s() + kAnswer_s; comm::steady_now_s() < until;) {
    if (std::none_of(asked.begin(), asked.end(), pending)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

nlohmann::json HangWatch::workers() const {
  nlohmann::json out = nlohmann::json::array();
  for (const Rank& r : ranks) {
    nlohmann::json w = r.last ? encode(*r.last) : nlohmann::json::object();
    w.erase("beat");
    w["rank"] = r.rank;
    w["running"] = r.index >= 0 && r.index < launcher.size() && launcher.running(r.index);
    if (r.index >= 0 && r.index < launcher.size()) w["pid"] = launcher.pid(r.index);
    out.push_back(std::move(w));
  }
  return out;
}

std::optional<HangReport> HangWatch::report() {
  if (!whole_job) return std::nullopt;
  try {
    HangReport r = write_hang_report(dir.parent_path().string());
    for (const std::string& line : r.findings) log::warn("launch: hang report: ", line);
    for (const std::string& line : r.mismatches) log::warn("launch: hang report: mismatch: ", line);
    return r;
  } catch (const Error& e) {
    log::warn("launch: no hang report: ", e.what());
    return std::nullopt;
  }
}

bool HangWatch::read(Rank& r, double now) {
  const std::optional<HeartbeatRecord> h = read_heartbeat(r.path);
  if (!h) return false;  // not beating yet (or never: not a trainer)
  r.last = h;
  if (h->beat != r.beat) r.beat = h->beat, r.beat_at = now;
  if (h->step != r.step) r.step = h->step, r.step_at = now;
  return true;
}

void HangWatch::read_all() {
  const double now = comm::steady_now_s();
  for (Rank& r : ranks) read(r, now);
}

void HangWatch::operator()() {
  if (fault) return;
  const double now = comm::steady_now_s();
  bool all_stuck = !ranks.empty();
  for (Rank& r : ranks) {
    if (r.index < 0 || r.index >= launcher.size() || !launcher.running(r.index)) {
      all_stuck = false;  // ended: its exit speaks for it
      continue;
    }
    if (!read(r, now)) {
      all_stuck = false;
      continue;
    }
    const std::string phase = r.last->phase.empty() ? "?" : r.last->phase;
    const double silent = now - r.beat_at;
    const char state = silent > kFrozen_s ? process_state(launcher.pid(r.index)) : 'R';
    const bool stopped = state == 'T' || state == 't';
    if ((silent > kFrozen_s && stopped) || silent > kSilent_s) {
      fault = FaultRecord{FaultKind::kHang, ErrorClass::kRuntime, r.rank, -1, r.step,
                          cat("hang: rank ", r.rank, " is frozen", stopped ? " (stopped)" : "", ", no heartbeat for ",
                              static_cast<int>(silent * 10) / 10.0, " s (last step ", r.step, ", ", phase, "); killed")};
      request_flight_records(r.rank);
      report();
      ::kill(-launcher.pid(r.index), SIGKILL);  // its process group, as the launcher stops it
      return;
    }
    // The allowance runs from the worker's last word on it (after an evaluation or a save), or
    // else from when its step last moved.
    r.waited = r.last->allowance_from_s > 0 ? wall_s() - r.last->allowance_from_s : now - r.step_at;
    all_stuck = all_stuck && r.waited > r.last->allowance_s;
  }
  find_stragglers();
  if (!all_stuck) return;
  nlohmann::json everyone = workers();
  for (const nlohmann::json& w : remote) everyone.push_back(w);
  std::optional<Holdup> holdup = find_holdup(everyone);
  request_flight_records();
  // The flight records hold more than the last beats (every group's members, the ranks that
  // left none): on one node they decide.
  if (const std::optional<HangReport> r = report(); r && r->culprits.size() == 1)
    holdup = Holdup{r->culprits[0], r->findings[0]};
  const Rank& first = ranks[0];
  fault = FaultRecord{FaultKind::kStall, ErrorClass::kRuntime, holdup ? holdup->rank : -1, -1, first.step,
                      cat("hang: no rank of this node completed a step for ", static_cast<int>(first.waited),
                          " s (allowance ", first.last->allowance_s, " s, after step ", first.step, ", ",
                          first.last->phase, "); all stopped",
                          holdup ? "; " + holdup->detail : std::string("; no single rank holds it up"))};
  launcher.stop(kStopSignal);
}

void HangWatch::find_stragglers(std::vector<double> population) {
  const bool job_wide = !population.empty();
  std::vector<double> own;
  if (population.empty())
    for (const Rank& r : ranks) population.push_back(r.last ? r.last->own_ms : 0);
  for (double ms : population)
    if (ms > 0) own.push_back(ms);
  if (own.size() < 2 || own.size() < population.size()) return;  // every rank's time known
  // The lower median: with two ranks, the faster one's time.
  std::nth_element(own.begin(), own.begin() + (own.size() - 1) / 2, own.end());
  const double median = own[(own.size() - 1) / 2];
  const double now = comm::steady_now_s();
  for (Rank& r : ranks) {
    const double mine = r.last ? r.last->own_ms : 0;
    double& since = r.over_since[job_wide ? 1 : 0];
    if (r.straggler) continue;
    if (!(mine > slower * median && mine > median + margin_ms) || r.last->steps_run < kMinSteps) {
      since = 0;
      continue;
    }
    if (since == 0) since = now;
    if (now - since < kSustain_s) continue;
    r.straggler = true;
    stragglers.push_back({FaultKind::kStraggler, ErrorClass::kRuntime, r.rank, -1, r.step,
                          cat("straggler: rank ", r.rank, "'s steps take ", static_cast<int>(mine),
                              " ms of their own, ", static_cast<int>(mine / median * 10) / 10.0, " x the median of the ",
                              own.size(), " ranks (", static_cast<int>(median), " ms), over its last 10 steps up to step ",
                              r.step)});
  }
}

}  // namespace myriad::driver
