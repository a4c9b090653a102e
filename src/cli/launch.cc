// `myriad launch`: starts this node's workers of a multi-process run (src/driver does the work),
// and `myriad comm-check`, a hidden worker that checks the rank environment and the world group.
//
//   myriad launch --nproc-per-node N [--nnodes M --node-rank R] [--rdzv URL] [--job NAME]
//                 [--grace-period S] [--max-restarts N] -- <subcommand> [its arguments...]
//   myriad comm-check [--size-kb K] [--timeout S] [--run-dir DIR]      (under myriad launch)
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "cli/args.h"
#include "comm/communicator.h"
#include "comm/rendezvous.h"
#include "comm/store.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/preemption.h"
#include "data/shared_batch.h"
#include "core/config.h"
#include "core/dir_lock.h"
#include "driver/hang_report.h"
#include "driver/job_board.h"
#include "driver/launcher.h"
#include "driver/plan.h"

namespace myriad::cli {
namespace {

// The path of this binary, for the workers' argv[0] (they execute /proc/self/exe itself, which
// stays valid even when the file is replaced meanwhile).
std::string self_path() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "myriad";
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v)
    throw_input("comm-check: ", name, " is not set: run it under myriad launch, e.g. "
                "myriad launch --nproc-per-node 2 -- comm-check");
  try {
    size_t used = 0;
    const long long x = std::stoll(v, &used);
    if (used == std::string(v).size() && x >= 0 && x <= (1 << 24)) return static_cast<int>(x);
  } catch (...) {
  }
  throw_input("comm-check: ", name, " must be an integer 0..", 1 << 24, ", got '", v, "'");
}

// The fault point "comm_check" (core/fault.h's grammar, e.g. comm_check:fail@rank=1), reached
// before the store is opened. Besides kill: fail (or throw) names the rank; sleep sleeps until a
// signal ends it; sleep_ignore_term ignores SIGTERM and SIGINT (only SIGKILL ends it).
void comm_check_fault(int rank) {
  const std::string a = fault::action("comm_check");
  if (a.empty()) return;
  if (a == "fail" || a == "throw") throw_runtime("injected fault at comm_check: rank ", rank, " failed");
  if (a == "sleep" || a == "sleep_ignore_term") {
    if (a == "sleep_ignore_term") signal(SIGTERM, SIG_IGN), signal(SIGINT, SIG_IGN);
    log::info("comm-check: rank ", rank, " sleeps (injected fault ", a, ")");
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  fault::trigger("comm_check");  // kill
  throw_input("comm-check: unknown fault '", a, "' in MYRIAD_INJECT_FAULT (comm_check:kill|fail|sleep|"
              "sleep_ignore_term, with @rank=R, @node=N, @attempt=A)");
}

// Every launch of a job is an attempt with a namespace of its own in the store, so that a
// relaunch (after a failure, or after success) never meets the keys of an earlier one. The
// launchers count their arrivals in the job's "launch" namespace: the k-th launch of each of
// the n nodes gets attempt (arrivals - 1) / n. The keys of older attempts are dropped then: the
// workers that used them have ended (on this node; elsewhere they belong to a job that is
// being restarted). Opening the store here also checks its URL and reachability before any
// worker starts.
// A supervised restart knows its attempt (`known`: the job's agents decided it together), and
// still counts its arrival, so that a later launch by hand lands past it.
std::unique_ptr<comm::Store> claim_attempt(driver::LaunchPlan& plan, std::optional<int64_t> known = std::nullopt) {
  constexpr double kTimeout_s = 30;
  std::unique_ptr<comm::Store> store = comm::make_store(plan.rdzv, "launch", kTimeout_s);
  const int64_t arrived = store->add("arrivals", 1);
  const int64_t attempt = known ? *known : (arrived - 1) / plan.nnodes;
  plan.attempt = std::to_string(attempt);
  if (attempt > 0)
    if (int64_t n = store->drop_attempts_below(attempt); n > 0)
      log::info("launch: dropped ", n, " store entries of the job's earlier attempts");
  return store;
}

// Warns once when the store stops answering while the workers run (their next use of it would
// fail: a restart, a late rendezvous), and once when it answers again.
struct StoreWatch {
  comm::Store* store;
  double next_s = 0;
  bool lost = false;
  void operator()() {
    const double now = comm::steady_now_s();
    if (!store || now < next_s) return;
    next_s = now + 5;
    const double saved = store->timeout_s();
    store->set_timeout(2);
    try {
      store->try_get("arrivals");
      if (lost) log::info("launch: the store ", driver::without_password(store->url()), " answers again");
      lost = false;
    } catch (const Error& e) {
      if (!lost)
        log::warn("launch: the store ", driver::without_password(store->url()),
                  " does not answer (", e.what(), "): a restart or a late rendezvous will fail");
      lost = true;
    }
    store->set_timeout(saved);
  }
};

// The state letter of /proc/<pid>/stat: R running, S sleeping, D in uninterruptible I/O, T
// stopped, ...; '?' when gone.
char process_state(pid_t pid) {
  std::ifstream in(cat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');  // the command name may hold spaces and parentheses
  return paren != std::string::npos && paren + 2 < text.size() ? text[paren + 2] : '?';
}

// Hang detection from the workers' heartbeats (runtime/heartbeat.h), once a second:
// - a worker whose beat (one a second) stops is frozen: after kFrozen_s when the process is
//   stopped (SIGSTOP, state T), after kSilent_s whatever its state (stuck in the kernel, its
//   threads deadlocked or starved: a loaded machine can delay a beat by seconds, which must not
//   cost a restart). The culprit, killed with SIGKILL, which fails the attempt the usual way;
// - workers that beat on but none of which completes a step within its allowance are stuck
//   together (a hung collective, a stuck kernel): all are stopped. The culprit is the rank the
//   others wait for in their groups (driver/hang_report.h), from this node's heartbeats and, in a
//   job of several nodes, the other nodes' (`remote`, which their agents publish).
// Workers that never beat (comm-check) are not watched. Detection does not wait for a
// collective's timeout.
struct HangWatch {
  static constexpr double kFrozen_s = 4, kSilent_s = 30;
  struct Rank {
    int rank = 0;
    int index = -1;  // the launcher's worker index
    std::string path;
    long long beat = -1, step = -1;
    double beat_at = 0, step_at = 0, allowance = 0, own_ms = 0;
    std::string phase;
    nlohmann::json last;     // its last heartbeat, as read
    bool straggler = false;  // reported in this attempt
  };
  // A straggler: a rank whose own step time (heartbeat.h) is over kSlower x the median of the
  // node's ranks, and kMargin_ms more, over its last 10 steps.
  static constexpr double kSlower = 2, kMargin_ms = 50;
  struct Report {
    int rank;
    std::string detail;
  };
  HangWatch(driver::Launcher& l, const std::string& run_dir) : launcher(l), dir(std::filesystem::path(run_dir) / "driver") {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
  }
  std::string add(int rank, int index) {
    Rank r;
    r.rank = rank, r.index = index;
    r.path = (dir / cat("heartbeat_rank_", rank)).string();
    std::error_code ec;
    std::filesystem::remove(r.path, ec);  // the last attempt's
    std::filesystem::remove(flight_path(rank), ec);
    ranks.push_back(r);
    return r.path;
  }
  std::filesystem::path flight_path(int rank) const { return dir / cat("flight_rank_", rank, ".json"); }
  // Asks every running worker of this node for its flight record (SIGUSR1: runtime/heartbeat.h)
  // and waits up to 2 s for them; `except` (a stopped rank) cannot answer.
  // Once the workers are being stopped they may be gone before they answer: what they wrote
  // when first asked stands, and a second request (another node's hang seen after this node's
  // own) must not remove it.
  void request_flight_records(int except = -1) {
    if (launcher.stopping()) return;
    std::vector<std::filesystem::path> want;
    std::error_code ec;
    for (const Rank& r : ranks)
      if (r.rank != except && r.index >= 0 && r.index < launcher.size() && launcher.running(r.index)) {
        std::filesystem::remove(flight_path(r.rank), ec);
        ::kill(launcher.pid(r.index), SIGUSR1);
        want.push_back(flight_path(r.rank));
      }
    for (const double until = comm::steady_now_s() + 2; comm::steady_now_s() < until;) {
      if (std::all_of(want.begin(), want.end(), [](const auto& p) { return std::filesystem::exists(p); })) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  // What this node's workers said last, each with its rank, for the job's heartbeat.
  nlohmann::json workers() const {
    nlohmann::json out = nlohmann::json::array();
    for (const Rank& r : ranks) {
      nlohmann::json w = r.last.is_object() ? r.last : nlohmann::json::object();
      w.erase("beat");
      w["rank"] = r.rank;
      w["running"] = r.index >= 0 && r.index < launcher.size() && launcher.running(r.index);
      if (r.index >= 0 && r.index < launcher.size()) w["pid"] = launcher.pid(r.index);
      out.push_back(std::move(w));
    }
    return out;
  }
  // On one node, the hang report from the flight records (RUN_DIR/hang_report.txt and .json);
  // across nodes the other nodes' records come later: `myriad hang-report RUN_DIR` then.
  std::optional<driver::HangReport> report() {
    if (!whole_job) return std::nullopt;
    try {
      driver::HangReport r = driver::write_hang_report(dir.parent_path().string());
      for (const std::string& line : r.findings) log::warn("launch: hang report: ", line);
      for (const std::string& line : r.mismatches) log::warn("launch: hang report: mismatch: ", line);
      return r;
    } catch (const Error& e) {
      log::warn("launch: no hang report: ", e.what());
      return std::nullopt;
    }
  }
  void operator()() {
    if (!verdict.empty()) return;
    const double now = comm::steady_now_s();
    bool all_stuck = !ranks.empty();
    for (Rank& r : ranks) {
      if (r.index < 0 || r.index >= launcher.size() || !launcher.running(r.index)) {
        all_stuck = false;  // ended: its exit speaks for it
        continue;
      }
      std::ifstream in(r.path);
      const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object() || !j.contains("beat")) {
        all_stuck = false;  // not beating yet (or never: not a trainer)
        continue;
      }
      r.last = j;
      const long long beat = j.value("beat", -1LL), step = j.value("step", -1LL);
      r.own_ms = j.value("own_ms", 0.0);
      if (beat != r.beat) r.beat = beat, r.beat_at = now;
      if (step != r.step) r.step = step, r.step_at = now;
      r.phase = j.value("phase", std::string("?")), r.allowance = j.value("allowance_s", 0.0);
      const double silent = now - r.beat_at;
      const char state = silent > kFrozen_s ? process_state(launcher.pid(r.index)) : 'R';
      if ((silent > kFrozen_s && (state == 'T' || state == 't')) || silent > kSilent_s) {
        culprit = r.rank;
        verdict = cat("hang: rank ", r.rank, " is frozen", state == 'T' || state == 't' ? " (stopped)" : "",
                      ", no heartbeat for ", static_cast<int>(silent * 10) / 10.0, " s (last step ", r.step, ", ",
                      r.phase, "); killed");
        request_flight_records(r.rank);
        report();
        ::kill(-launcher.pid(r.index), SIGKILL);  // its process group, as the launcher stops it
        return;
      }
      all_stuck = all_stuck && now - r.step_at > r.allowance;
    }
    find_stragglers();
    if (all_stuck) {
      nlohmann::json everyone = workers();
      for (const nlohmann::json& w : remote) everyone.push_back(w);
      std::optional<driver::Holdup> holdup = driver::find_holdup(everyone);
      request_flight_records();
      // The flight records hold more than the last beats (every group's members, the ranks that
      // left none): on one node they decide.
      if (const std::optional<driver::HangReport> r = report(); r && r->culprits.size() == 1)
        holdup = driver::Holdup{r->culprits[0], r->findings[0]};
      culprit = holdup ? holdup->rank : -1;
      verdict = cat("hang: no rank of this node completed a step for ", static_cast<int>(now - ranks[0].step_at),
                    " s (allowance ", ranks[0].allowance, " s, after step ", ranks[0].step, ", ", ranks[0].phase,
                    "); all stopped", holdup ? "; " + holdup->detail : std::string("; no single rank holds it up"));
      launcher.stop(driver::kStopSignal);
    }
  }
  // Against the own step times of this node's ranks, or of `population` (every rank of the job:
  // the agents share theirs through the store).
  void find_stragglers(std::vector<double> population = {}) {
    std::vector<double> own;
    if (population.empty())
      for (const Rank& r : ranks) population.push_back(r.own_ms);
    for (double ms : population)
      if (ms > 0) own.push_back(ms);
    if (own.size() < 2 || own.size() < population.size()) return;  // every rank's time known
    // The lower median: with two ranks, the faster one's time.
    std::nth_element(own.begin(), own.begin() + (own.size() - 1) / 2, own.end());
    const double median = own[(own.size() - 1) / 2];
    for (Rank& r : ranks)
      if (!r.straggler && r.own_ms > kSlower * median && r.own_ms > median + kMargin_ms) {
        r.straggler = true;
        reports.push_back({r.rank, cat("straggler: rank ", r.rank, "'s steps take ", static_cast<int>(r.own_ms),
                                       " ms of their own, ", static_cast<int>(r.own_ms / median * 10) / 10.0,
                                       " x the median of the ", own.size(), " ranks (", static_cast<int>(median),
                                       " ms), over its last 10 steps up to step ", r.step)});
      }
  }
  driver::Launcher& launcher;
  std::filesystem::path dir;
  std::vector<Rank> ranks;
  nlohmann::json remote = nlohmann::json::array();  // the other nodes' workers (a supervised job)
  bool whole_job = true;  // this node runs every rank of the job (its flight records tell all)
  std::string verdict;  // empty: no hang seen
  int culprit = -1;
  std::vector<Report> reports;  // stragglers found, for the caller to record (then cleared)
};

// RUN_DIR/driver/events.jsonl (events.node<R>.jsonl on the other nodes): one JSON object per
// event of a supervised launch (--max-restarts), each also shown on the console as one line.
struct Events {
  Events(const driver::LaunchPlan& plan, bool on) : node(plan.node_rank) {
    if (!on) return;
    const std::filesystem::path dir = std::filesystem::path(plan.run_dir) / "driver";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    path = (dir / (node == 0 ? std::string("events.jsonl") : cat("events.node", node, ".jsonl"))).string();
  }
  // `about`: the node the event is about (default this one).
  void write(const std::string& event, int rank, const std::string& cls, const std::string& detail, int about = -1) {
    if (path.empty()) return;
    nlohmann::json j = {{"time", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()},
                        {"event", event}, {"attempt", attempt}, {"node", about >= 0 ? about : node}};
    if (rank >= 0) j["rank"] = rank;
    if (!cls.empty()) j["class"] = cls;
    if (!detail.empty()) j["detail"] = detail;
    std::ofstream(path, std::ios::app) << j.dump() << "\n";
    log::warn("launch: ", event, " (attempt ", attempt, rank >= 0 ? cat(", rank ", rank) : "", "): ", detail);
  }
  std::string path;
  int node = 0, attempt = 0;
};


// The workers' config (a train command's --config and --set), whose fault section the agent acts
// on and whose layout it shrinks; nullopt when the command is not a train or its config does not
// load (the workers then report why).
std::optional<Config> worker_config(const std::vector<std::string>& command) {
  if (command.empty() || command[0] != "train") return std::nullopt;
  std::string config;
  std::vector<std::string> sets;
  for (size_t i = 1; i + 1 < command.size(); ++i) {
    if (command[i] == "--config") config = command[i + 1];
    if (command[i] == "--set") sets.push_back(command[i + 1]);
  }
  if (config.empty()) return std::nullopt;
  try {
    return load_config(config, sets);
  } catch (const Error&) {
    return std::nullopt;
  }
}

std::string host_name() {
  char buf[256] = {};
  return ::gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string("localhost");
}

// A corrupt replica (runtime/trainer.cc's check), as a fault's detail names it: the step and the
// rank whose copy differed. The restart reruns that step on that rank: clean, the corruption was
// transient; corrupt again, its device is faulty (Megatron's rerun, at the job's level).
struct Corruption {
  long long step = -1;
  int rank = -1;
  bool operator==(const Corruption&) const = default;
};
std::optional<Corruption> corruption_in(const std::string& detail) {
  const size_t at = detail.find("silent data corruption at step ");
  Corruption c;
  if (at == std::string::npos || std::sscanf(detail.c_str() + at, "silent data corruption at step %lld: rank %d's", &c.step, &c.rank) != 2)
    return std::nullopt;
  return c;
}

// The step of a numerics fault ("step S: loss ..."), as the trainer and the engine word it.
std::optional<int64_t> loss_fault_step(const std::string& detail) {
  for (size_t at = detail.find("step "); at != std::string::npos; at = detail.find("step ", at + 1)) {
    long long step = 0;
    int used = 0;
    if (std::sscanf(detail.c_str() + at, "step %lld: loss %n", &step, &used) == 1 && used > 0) return step;
  }
  return std::nullopt;
}

// `--set train.skip_steps=[...]` in the workers' command: the config's steps and the job's.
void set_skip_steps(std::vector<std::string>& command, std::vector<int64_t> steps) {
  for (size_t i = 0; i + 1 < command.size(); ++i)
    if (command[i] == "--set" && command[i + 1].rfind("train.skip_steps=", 0) == 0) {
      command.erase(command.begin() + i, command.begin() + i + 2);
      break;
    }
  if (steps.empty()) return;
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  std::string list;
  for (int64_t s : steps) list += (list.empty() ? "" : ",") + std::to_string(s);
  command.insert(command.end(), {"--set", "train.skip_steps=[" + list + "]"});
}

// A hung job across nodes: every agent puts its ranks' flight records (null for a rank that
// wrote none: a stopped process) and last heartbeats in the job's store; node 0's agent gathers
// every rank's, waiting up to 5 s, and writes RUN_DIR/hang_report.{txt,json}, as the launcher of
// a job on one node does on its own. Each culprit's finding is a diagnose event.
void share_hang_report(driver::JobBoard& board, driver::Launcher& launcher, const driver::LaunchPlan& plan,
                       const HangWatch& hangs, int64_t attempt, Events& events) {
  for (const HangWatch::Rank& r : hangs.ranks) {
    std::ifstream in(hangs.flight_path(r.rank));
    const nlohmann::json record = nlohmann::json::parse(in, nullptr, false);
    nlohmann::json beat = r.last;
    if (beat.is_object()) beat["age_s"] = comm::steady_now_s() - r.beat_at;
    board.flight(attempt, r.rank, {{"record", record.is_object() ? record : nlohmann::json()}, {"beat", beat}});
  }
  if (plan.node_rank != 0) return;
  nlohmann::json records = nlohmann::json::array(), beats = nlohmann::json::object();
  std::vector<bool> have(static_cast<size_t>(plan.world_size), false);
  for (const double until = comm::steady_now_s() + 5;;) {
    for (int rank = 0; rank < plan.world_size; ++rank) {
      if (have[rank]) continue;
      const std::optional<nlohmann::json> e = board.flight_of(attempt, rank);
      if (!e) continue;
      have[rank] = true;
      if ((*e)["record"].is_object()) records.push_back((*e)["record"]);
      if ((*e)["beat"].is_object()) beats[std::to_string(rank)] = (*e)["beat"];
    }
    if (std::all_of(have.begin(), have.end(), [](bool b) { return b; }) || comm::steady_now_s() > until) break;
    launcher.wait(0.1);
  }
  if (records.empty()) return;
  const driver::HangReport report = driver::write_hang_report(plan.run_dir, records, beats);
  for (size_t i = 0; i < report.culprits.size(); ++i) {
    log::warn("launch: hang report: ", report.findings[i]);
    events.write("diagnose", report.culprits[i], "", "hang report: " + report.findings[i],
                 report.culprits[i] / plan.nproc_per_node);
  }
  for (const std::string& m : report.mismatches) log::warn("launch: hang report: mismatch: ", m);
}

// The node agent's side of the job (myriad launch --max-restarts): its heartbeat in the store,
// the job-wide stop (a fault on any node stops every node's workers at once, without waiting
// for a collective to time out), and the loss of a node (its agent's heartbeat gone).
struct JobWatch {
  JobWatch(driver::JobBoard& b, driver::Launcher& l, const driver::LaunchPlan& p, HangWatch& h, double hb,
           int64_t a, std::string n)
      : board(b), launcher(l), plan(p), hangs(h), heartbeat_s(hb), attempt(a), name(std::move(n)) {}
  driver::JobBoard& board;
  driver::Launcher& launcher;
  const driver::LaunchPlan& plan;
  HangWatch& hangs;
  double heartbeat_s;
  int64_t attempt;
  std::string name;                 // --node-name
  std::vector<std::string> errors;  // the workers' recent error lines
  std::vector<double> seen_at;      // when each peer's heartbeat was last seen this attempt (0: never)
  std::optional<nlohmann::json> remote;  // the job's stop record, when another node made it
  nlohmann::json job_state = nlohmann::json::object();  // what every stop record carries (restarts, skips)
  double next_s = 0;
  bool store_down = false;  // the last tick found the store gone

  // The node's heartbeat: who it is, and each worker's last heartbeat (step, phase, rates, the
  // last collective started and finished, each group's progress).
  nlohmann::json state(const char* status) const {
    return {{"host", host_name()}, {"name", name}, {"node", plan.node_rank}, {"pid", ::getpid()}, {"attempt", attempt},
            {"status", status}, {"run_dir", std::filesystem::absolute(plan.run_dir).string()}, {"workers", hangs.workers()}, {"errors", errors}};
  }
  void beat(const char* status, double ttl) { board.beat(cat("node", plan.node_rank), state(status), ttl); }
  // A heartbeat's life: 5 beats (the agent's loop turns about once a second, whatever is asked).
  double ttl_s() const { return 5 * std::max(1.0, heartbeat_s); }
  void operator()() {
    const double now = comm::steady_now_s();
    if (now < next_s) return;
    next_s = now + heartbeat_s;
    try {
      // Beating on while the workers stop (a frozen one takes the grace period): alive, not lost.
      beat(remote ? "stopping" : "training", ttl_s());
      if (store_down) {  // back (perhaps restarted empty): the peers get 5 beats to beat again
        log::info("launch: the job's store answers again");
        for (double& t : seen_at)
          if (t > 0) t = now;
        store_down = false;
      }
      if (remote) return;
      // A node's own faults are recorded after its workers ended: a record seen now is another's.
      if (std::optional<nlohmann::json> stop = board.stopped(attempt)) {
        remote = *stop;
        // A hung job: this node's ranks write their flight records too, for `myriad hang-report`.
        if (stop->value("detail", "").rfind("hang:", 0) == 0) hangs.request_flight_records();
        launcher.stop(driver::kStopSignal);
        return;
      }
      // Lost: seen beating this attempt, then not for 5 beats (its key expires after 5; a store
      // restarted empty refills within one).
      seen_at.resize(plan.nnodes, 0.0);
      std::vector<double> own;  // every rank's own step time, job-wide (0: not known yet)
      for (const HangWatch::Rank& r : hangs.ranks) own.push_back(r.own_ms);
      nlohmann::json remote = nlohmann::json::array();
      for (int m = 0; m < plan.nnodes; ++m) {
        if (m == plan.node_rank) continue;
        if (std::optional<nlohmann::json> hb = board.heartbeat(cat("node", m))) {
          seen_at[m] = now;
          for (const nlohmann::json& w : (*hb)["workers"]) own.push_back(w.value("own_ms", 0.0)), remote.push_back(w);
        } else if (seen_at[m] > 0 && now - seen_at[m] > ttl_s()) {
          nlohmann::json lost = {{"node", m}, {"rank", -1}, {"class", class_name(ErrorClass::kRuntime)},
                                 {"detail", "lost: its agent's heartbeat stopped"}};
          lost.update(job_state);
          remote = board.stop(attempt, lost);
          launcher.stop(driver::kStopSignal);
          return;
        }
      }
      hangs.remote = std::move(remote);
      // Stragglers against the whole job (a node whose ranks are all slow, a tensor-parallel
      // group waiting on one of its own, has no straggler against its own median).
      if (static_cast<int>(own.size()) == plan.world_size) hangs.find_stragglers(own);
    } catch (const std::exception& e) {  // the store gone (or a record nobody here wrote)
      if (!store_down) log::warn("launch: the job's store does not answer (", e.what(), "); the workers train on");
      store_down = true;
    }
  }
};

// A SIGINT or SIGTERM to the agent during stop and check: it leaves (not evicted).
struct Interrupted {
  int signal;
};

// Waits up to `s` seconds, carrying output; a signal to the agent interrupts.
void pause(driver::Launcher& launcher, double s) {
  for (const driver::Launcher::Event& e : launcher.wait(s))
    if (e.kind == driver::Launcher::Event::Kind::kSignal) throw Interrupted{e.signal};
}

// The leader's plan for the places left after attempt A, waited for up to 2 minutes (beating,
// answering signals); nullopt when it did not come.
std::optional<nlohmann::json> wait_for_plan(driver::JobBoard& board, driver::Launcher& launcher, int64_t attempt,
                                            const std::function<void()>& beat) {
  for (const double until = comm::steady_now_s() + 120; comm::steady_now_s() < until; pause(launcher, 0.2)) {
    if (std::optional<nlohmann::json> p = board.settled(attempt)) return p;
    beat();
  }
  return std::nullopt;
}

// Stop and check: the node's self-check (myriad self-check) in a process of its own, as the
// workers run, given a minute at most (a hung disk is what it looks for). Returns {ok, detail}.
nlohmann::json self_check(driver::Launcher& launcher, const driver::LaunchPlan& plan, const std::optional<Config>& cfg,
                          int64_t attempt, std::string& last_line, const std::function<void(const char*)>& beat) {
  driver::WorkerSpec spec;
  spec.rank = -1, spec.local_rank = 0;
  spec.exe = "/proc/self/exe";
  const std::string dir = (cfg ? *cfg : Config{}).checkpoint_root(plan.run_dir);
  spec.argv = {self_path(), "self-check", "--checkpoint-dir", dir, "--ranks", std::to_string(plan.nproc_per_node),
               "--min-bus-gbps", cat(cfg ? cfg->fault.diag_min_bus_gbps : FaultConfig{}.diag_min_bus_gbps),
               "--device", cfg ? cfg->train.device : "auto"};
  spec.env = {{"MYRIAD_NODE_RANK", std::to_string(plan.node_rank)}, {"MYRIAD_ATTEMPT", std::to_string(attempt)}};
  spec.log_path = (std::filesystem::path(plan.log_dir) / cat("self_check_node", plan.node_rank, ".log")).string();
  last_line.clear();
  launcher.spawn(spec);
  constexpr double kLimit_s = 60;
  const double until = comm::steady_now_s() + kLimit_s;
  bool late = false;
  const driver::RunResult r = launcher.run([&] {
    beat("checking");
    if (!late && comm::steady_now_s() > until) late = true, launcher.stop(SIGKILL), launcher.stop(SIGKILL);
  });
  if (r.signal != 0 || r.preempted) throw Interrupted{r.signal != 0 ? r.signal : SIGTERM};
  const bool ok = r.ok() && last_line.rfind("self-check ok", 0) == 0;
  const std::string detail = late ? cat("no result within ", kLimit_s, " s")
                             : !last_line.empty() ? last_line
                             : r.failure ? r.failure->describe()
                                         : std::string("no result");
  return {{"ok", ok}, {"detail", detail}};
}

// Why the job cannot go on without `gone` of its nodes ("" when it can): its ranks must still
// hold whole tensor x pipeline groups, and the global batch split over the remaining replicas.
std::string shrink_refused(const std::optional<Config>& cfg, const driver::LaunchPlan& plan, int gone) {
  if (!cfg) return "the workers' config is not one the launcher can read (a train --config)";
  const int64_t world = int64_t(plan.nnodes - gone) * plan.nproc_per_node, group = cfg->parallel.tp * cfg->parallel.pp;
  if (world < group || world % group != 0)
    return cat("the ", world, " ranks left do not hold whole tensor x pipeline groups of ", group);
  try {
    cfg->accum_steps(world / group);  // the batch's split over the replicas left (interleaved: x pp)
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// After attempt A stopped (`cause`: the job's record of why): this node checks itself; then the
// job settles which nodes leave (a failed self-check, a lost agent, a straggler to evict, or on
// several nodes the culprit of the last fault.evict_after faults): every agent proposes its view
// and the first one written stands for all. The leader (the lowest node rank that stays) fills
// their places, with spares when there are enough, else by shrinking data parallelism, once;
// the others read its plan. `beat` keeps this agent's heartbeat alive meanwhile; `dp` is the
// data parallelism a shrink set (0: the config's), updated. Returns why this agent leaves the
// job (evicted, or the job cannot go on), nullopt to restart. Throws Interrupted.
struct Leaving {
  std::string why;
  bool job_ends;         // else only this node leaves (evicted)
  bool finished = false;  // the job had finished its steps meanwhile (a fault at its very end)
};

// Whether the job ended at or after attempt A (another node finished it, or gave up).
std::optional<std::string> ended_since(driver::JobBoard& board, int64_t attempt) {
  const std::optional<std::string> e = board.ended();
  if (!e) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(*e, nullptr, false);
  if (!j.is_object() || j.value("attempt", int64_t(-1)) < attempt) return std::nullopt;
  return j.value("status", "");
}
std::optional<Leaving> stop_and_check(driver::JobBoard& board, driver::Launcher& launcher,
                                          driver::LaunchPlan& plan, const std::string& name, const std::optional<Config>& cfg,
                                          const FaultConfig& fault, int64_t attempt, const nlohmann::json& cause,
                                          std::string& check_line, Events& events,
                                          const std::function<void(const char*)>& beat, int64_t& dp) {
  const int me = plan.node_rank;
  const nlohmann::json mine = self_check(launcher, plan, cfg, attempt, check_line, beat);
  board.diagnosed(attempt, me, mine);
  events.write("diagnose", -1, mine["ok"] ? "" : class_name(ErrorClass::kRuntime),
               cat("self-check of node ", me, ": ", mine["detail"].get<std::string>()));
  // This agent's view: every node's result, or its loss.
  nlohmann::json leave = nlohmann::json::object();  // node -> why
  const double deadline = comm::steady_now_s() + 120;
  for (int m = 0; m < plan.nnodes; ++m)
    for (;;) {
      if (std::optional<nlohmann::json> d = board.diagnosis(attempt, m)) {
        if (!d->value("ok", false)) leave[std::to_string(m)] = cat("its self-check failed: ", d->value("detail", ""));
        break;
      }
      if (std::optional<std::string> e = ended_since(board, attempt))
        return Leaving{cat("the job ended meanwhile (", *e, ")"), false, *e == "done"};
      if (!board.heartbeat(cat("node", m))) {
        leave[std::to_string(m)] = "lost: its agent's heartbeat stopped";
        break;
      }
      if (comm::steady_now_s() > deadline) {
        leave[std::to_string(m)] = "no self-check result within 120 s";
        break;
      }
      beat("checking");
      pause(launcher, 0.2);
    }
  const int culprit = cause.value("node", -1);
  const std::string who = std::to_string(culprit);
  if (cause.value("evict", false) && culprit >= 0) leave[who] = cause.value("detail", "");  // "straggler: ..."
  // The culprit of the last fault.evict_after faults in a row, counted since the job's nodes last
  // changed (a spare in a node's place, or a shrink, starts that node's count afresh). On one
  // node there is nowhere else to run: it restarts in place. A bad loss is the same on every
  // rank (the data's or the model's, not a node's): it counts for no node.
  if (plan.nnodes > 1 && culprit >= 0 && cause.value("rank", -1) >= 0 && !leave.contains(who)) {
    int64_t in_a_row = 0;
    for (int64_t a = attempt; a >= 0 && in_a_row < fault.evict_after; --a, ++in_a_row) {
      const std::optional<nlohmann::json> rec = a == attempt ? cause : board.stopped(a);
      if (!rec || rec->value("node", -1) != culprit || rec->value("rank", -1) < 0 || rec->value("loss_fault", false))
        break;
      if (a < attempt)
        if (std::optional<nlohmann::json> p = board.settled(a); p && (p->contains("shrink") || !(*p)["spares"].empty()))
          break;
    }
    if (in_a_row >= fault.evict_after)
      leave[who] = cat("it caused the last ", in_a_row, " faults (fault.evict_after = ", fault.evict_after, ")");
  }
  leave = board.leave(attempt, leave);  // the first view written stands for every agent
  if (leave.empty()) return std::nullopt;
  if (leave.contains(std::to_string(me))) {
    const std::string why = cat("node ", me, " (", name, ") evicted: ", leave[std::to_string(me)].get<std::string>());
    events.write("evict", -1, "", why);
    board.block(name, why);
    if (!fault.evict_command.empty()) {
      std::string command = fault.evict_command;
      for (auto [from, to] : {std::pair<std::string, std::string>{"{host}", host_name()}, {"{node}", std::to_string(me)},
                              {"{name}", name}})
        for (size_t at = 0; (at = command.find(from, at)) != std::string::npos; at += to.size())
          command.replace(at, from.size(), to);
      const int rc = std::system(command.c_str());
      log::info("launch: evict command '", command, "' exited with ", rc);
    }
    return Leaving{why, false};
  }
  int leader = 0;
  while (leave.contains(std::to_string(leader))) ++leader;
  nlohmann::json settled;
  if (me == leader) {
    // Spares for every place, or none (a job shrinks around no spare), or the job ends.
    nlohmann::json p = {{"spares", nlohmann::json::object()}, {"nnodes", plan.nnodes}, {"dp", dp}};
    std::vector<int64_t> idle = board.idle_spares();
    size_t next = 0;
    if (idle.size() >= leave.size())
      for (const auto& [m, why] : leave.items())
        while (next < idle.size())
          if (board.assign_spare(idle[next++], std::stoi(m), attempt + 1)) {
            p["spares"][m] = idle[next - 1];
            break;
          }
    if (p["spares"].size() < leave.size()) {
      std::string why = p["spares"].empty() ? shrink_refused(cfg, plan, static_cast<int>(leave.size()))
                                            : "a spare left while it was being given a place";
      if (why.empty()) {
        nlohmann::json nodes = nlohmann::json::array();
        for (int m = 0; m < plan.nnodes; ++m)
          if (!leave.contains(std::to_string(m))) nodes.push_back(m);
        const int64_t new_dp = int64_t(nodes.size()) * plan.nproc_per_node / (cfg->parallel.tp * cfg->parallel.pp);
        p["shrink"] = {{"nodes", nodes}, {"dp", new_dp}};
        p["nnodes"] = nodes.size(), p["dp"] = new_dp;
      } else {
        const std::string m = leave.begin().key();
        p["error"] = cat("node ", m, " left the job (", leave[m].get<std::string>(), ") and no spare (myriad launch "
                         "--spare) is there to take its place; ", why);
      }
    }
    settled = board.settle(attempt, p);
  } else {
    std::optional<nlohmann::json> p = wait_for_plan(board, launcher, attempt, [&] { beat("checking"); });
    if (!p) return Leaving{cat("the job's leader, node ", leader, ", decided nothing within 120 s"), true};
    settled = *p;
  }
  for (const auto& [m, why] : leave.items()) {
    const std::string spare =
        settled["spares"].contains(m) ? cat("; spare ", settled["spares"][m].get<int64_t>(), " takes its place") : "";
    events.write("evict", -1, "", cat("node ", m, " evicted: ", why.get<std::string>(), spare), std::stoi(m));
  }
  if (settled.contains("error")) return Leaving{settled["error"].get<std::string>(), true};
  if (settled.contains("shrink")) {
    const std::vector<int> nodes = settled["shrink"]["nodes"].get<std::vector<int>>();
    dp = settled["shrink"]["dp"].get<int64_t>();
    const int was = plan.nnodes;
    plan.node_rank = static_cast<int>(std::find(nodes.begin(), nodes.end(), me) - nodes.begin());
    plan.nnodes = static_cast<int>(nodes.size());
    plan.world_size = plan.nnodes * plan.nproc_per_node;
    plan.command.insert(plan.command.end(), {"--set", cat("parallel.dp=", dp)});
    events.write("evict", -1, "", cat("no spare: the job goes on on ", plan.nnodes, " of its ", was,
                                      " nodes, data parallelism ", dp, ", the same global batch; this node is now node ",
                                      plan.node_rank));
  }
  return std::nullopt;
}

}  // namespace

int cmd_launch(int argc, char** argv) {
  int sep = -1;
  for (int i = 0; i < argc && sep < 0; ++i)
    if (std::string(argv[i]) == "--") sep = i;
  if (sep < 0)
    throw_input("launch: expected '--' and then the subcommand to run, e.g. "
                "myriad launch --nproc-per-node 4 -- train --config FILE");
  Args args("launch", sep, argv,
            {"nproc-per-node", "nnodes", "node-rank", "rdzv", "job", "grace-period", "max-restarts", "node-name"},
            {"spare"});
  driver::LaunchFlags flags;
  args.required("nproc-per-node");
  flags.nproc_per_node = args.get_int("nproc-per-node", 0);
  if (args.has("nnodes")) flags.nnodes = args.get_int("nnodes", 1);
  if (args.has("node-rank")) flags.node_rank = args.get_int("node-rank", 0);
  flags.rdzv = args.get("rdzv");
  flags.job = args.get("job");
  if (args.has("job") && flags.job.empty()) throw_input("launch: --job must not be empty");
  for (int i = sep + 1; i < argc; ++i) flags.command.push_back(argv[i]);
  driver::Launcher::Options options;
  options.grace_s = args.get_double("grace-period", 10);
  if (!(options.grace_s >= 0 && options.grace_s <= 3600))
    throw_input("launch: --grace-period must be 0..3600 seconds, got ", args.get("grace-period"));

  const long long max_restarts = args.get_int("max-restarts", 0);
  if (max_restarts < 0 || max_restarts > 1000)
    throw_input("launch: --max-restarts must be 0..1000, got ", max_restarts);
  const bool spare = args.has("spare");
  if (spare && max_restarts == 0)
    throw_input("launch: --spare waits to replace a node of a supervised job: give --max-restarts too");
  if (spare && args.has("node-rank"))
    throw_input("launch: a --spare has no node rank until it takes one over: drop --node-rank");
  if (spare) flags.node_rank = 0;  // until it takes a node over

  driver::LaunchPlan plan = driver::plan_launch(flags, driver::process_env());
  // What the logs and the job's heartbeats call this node (its node rank is its identity).
  const std::string node_name = args.has("node-name") ? args.get("node-name") : host_name();
  if (node_name.empty() || node_name.find_first_of(" \t\n") != std::string::npos)
    throw_input("launch: --node-name must be a non-empty word, got '", node_name, "'");
  if (spare && plan.default_store)
    throw_input("launch: --spare needs the job's store (--rdzv URL), shared with the nodes it may replace");
  const bool temporary_run_dir = plan.run_dir.empty();
  // One run per directory (core/dir_lock.h): node 0's launcher holds the run's lock across its
  // restarts, and its workers do not take it. Taken before the run directory is touched (its own
  // store is emptied next).
  std::vector<std::unique_ptr<DirLock>> locks;
  if (!spare && plan.node_rank == 0 && !temporary_run_dir) {
    const std::optional<Config> cfg = worker_config(plan.command);
    locks = lock_run(plan.run_dir, (cfg ? *cfg : Config{}).checkpoint_root(plan.run_dir));
  }
  driver::prepare_run_dir(plan);
  const bool supervised = max_restarts > 0;
  const std::optional<Config> worker_cfg = worker_config(plan.command);
  const FaultConfig fault = worker_cfg ? worker_cfg->fault : FaultConfig{};
  bool restarted = false, resumed = false;
  std::string resumed_from, check_line;
  std::unique_ptr<Events> events;
  std::vector<std::string>* errors = nullptr;  // the job watch's, while it runs
  std::map<int, std::string> last_error;       // rank -> its last "myriad: ..." line, this attempt
  options.on_line = [&](int rank, std::string_view line) {
    if (rank < 0) {  // the self-check
      check_line = std::string(line);
      return;
    }
    if (line.rfind("myriad: ", 0) == 0) last_error[rank] = std::string(line.substr(8));
    if (errors && line.rfind("myriad: ", 0) == 0) {
      errors->push_back(cat("rank ", rank, ": ", line));
      if (errors->size() > 5) errors->erase(errors->begin());
    }
    if (!restarted || resumed) return;
    if (const size_t at = line.find(" I resume: "); at != std::string_view::npos)
      resumed_from = std::string(line.substr(at + 11));
    // "HH:MM:SS I step S/N | ...": the first step the restarted attempt completed.
    if (line.size() > 17 && line.substr(8, 8) == " I step " && line.find('/') != std::string_view::npos) {
      resumed = true;
      events->write("resumed", rank, "", cat(line.substr(11, line.find(' ', 16) - 11),
                                             resumed_from.empty() ? "" : ", from " + resumed_from));
    }
  };
  // A collective that timed out: before the others are stopped they write their flight records
  // too, and on one node the hang report says whom the timed-out rank waited for.
  HangWatch* hang_watch = nullptr;  // this attempt's
  options.before_stop = [&](const driver::WorkerExit& failure) {
    if (!hang_watch || failure.error_class() != ErrorClass::kComm) return;
    hang_watch->request_flight_records(failure.rank);
    hang_watch->report();
  };
  // A preemption: the workers get the trainer's own grace (fault.preempt_grace_s) and 5 s more
  // before SIGKILL, and the config's extra preemption signal is caught here too (its default
  // action would end the launcher, and with it every worker, before any saved).
  options.preempt_grace_s = fault.preempt_grace_s + 5;
  options.preempt_signal = preemption::signal_number(fault.preempt_signal);
  driver::Launcher launcher(options);
  // The job's board: one connection patient with a store that restarts (stop and check, the
  // spare's wait), one that is not (the ticks of a running attempt, which must not block).
  std::unique_ptr<driver::JobBoard> board, watch_board;
  if (supervised) {
    board = std::make_unique<driver::JobBoard>(plan.rdzv, 30, 60);
    watch_board = std::make_unique<driver::JobBoard>(plan.rdzv, 5);
  }
  int64_t shrunk_dp = 0;  // the data parallelism a shrink left the job with (0: the config's)

  // An evicted node stays out of the job (as a node or as a spare) until it is renamed.
  if (board)
    if (const std::optional<std::string> why = board->blocked(node_name))
      throw_input("launch: '", node_name, "' is on job ", plan.job, "'s block list (", *why,
                  "): once it is repaired, start it under another --node-name, or run a new --job");
  // A live job under this name: this node rank's agent beat within its last 5 beats (its key
  // expires then) and has not ended. Taking its place would drop its attempt's store keys and
  // tie the two jobs' faults together, so the launch is refused before it claims an attempt.
  // Spares and the other node ranks of that job join it as before.
  // An unsupervised launch has no board of its own: it claims its place, and beats while its
  // workers run (the agents' heartbeat), through this one.
  std::optional<driver::JobBoard> probe;
  driver::JobBoard* place = nullptr;  // where this launch claimed its node rank
  const double beat_ttl_s = 5 * std::max(1.0, fault.heartbeat_s);
  auto starting = [&] {
    return nlohmann::json{{"host", host_name()}, {"name", node_name}, {"node", plan.node_rank}, {"pid", ::getpid()},
                          {"status", "starting"}, {"run_dir", std::filesystem::absolute(plan.run_dir).string()}};
  };
  if (!spare && !plan.default_store) {
    place = board ? board.get() : &probe.emplace(plan.rdzv, 30);
    if (const std::optional<nlohmann::json> hb = place->claim(cat("node", plan.node_rank), starting(), beat_ttl_s))
      throw_input("launch: job ", plan.job, " is running: node ", plan.node_rank, "'s agent (host ",
                  hb->value("host", "?"), ", pid ", hb->value("pid", 0), ", run directory ", hb->value("run_dir", "?"),
                  ") beat within its last 5 beats; wait for it to end, stop it, or give this run another --job or --rdzv "
                  "job name");
  }
  // The beats that must not hold this agent's loop up (an unsupervised launch's own, and the
  // last one): a connection of their own that gives up after 2 s, as the store check's does.
  // Through `place`, a store gone mid-run would be waited for 30 s a beat while the workers,
  // the hang watch and the store check go unattended.
  std::optional<driver::JobBoard> quick;
  if (place) quick.emplace(plan.rdzv, 2);
  // Whatever ends this launch, its agent says so at once, so that a relaunch under the same
  // name need not wait for its heartbeat to expire.
  struct EndBeat {
    driver::JobBoard* board = nullptr;
    std::string key;
    nlohmann::json state;
    double ttl_s = 5;  // as a live agent's: peers still judge its node lost after 5 beats
    ~EndBeat() {
      if (!board) return;
      try {
        board->beat(key, state, ttl_s);
      } catch (const std::exception&) {  // the store gone: the key expires by itself
      }
    }
  } end_beat;
  if (place) {
    nlohmann::json ended = starting();
    ended["status"] = "ended";
    end_beat = {&*quick, cat("node", plan.node_rank), ended, beat_ttl_s};
  }
  // The attempt a supervised restart starts, decided by the job's agents (nullopt: count arrivals).
  std::optional<int64_t> next_attempt;
  // What the job carries from attempt to attempt, in every stop record (so that every agent,
  // and a spare that joins late, reads the same): the restarts made, the steps skipped because
  // their loss fault recurred on the replay, and the step of the last loss fault.
  long long restarts_made = 0;
  std::vector<int64_t> skipped;
  int64_t last_loss_fault = -1;
  auto job_state = [&] {
    return nlohmann::json{{"restarts", restarts_made}, {"skip_steps", skipped}, {"loss_fault_step", last_loss_fault}};
  };
  auto carry_over = [&](const nlohmann::json& cause) {
    restarts_made = cause.value("restarts", restarts_made);
    skipped = cause.value("skip_steps", skipped);
    last_loss_fault = cause.value("loss_fault_step", last_loss_fault);
  };
  auto apply_skips = [&] {  // the workers skip the config's steps and the job's
    std::vector<int64_t> all = worker_cfg ? worker_cfg->train.skip_steps : std::vector<int64_t>{};
    all.insert(all.end(), skipped.begin(), skipped.end());
    set_skip_steps(plan.command, all);
  };
  // A spare waits, beating, until the leader gives it a node to take over; then it is that node.
  if (spare) {
    const int64_t k = board->join_as_spare();
    const std::optional<std::string> ended = board->ended();  // an earlier run's, under this name
    log::info("launch: spare ", k, " of job ", plan.job, " waits for a node to take over");
    try {
      for (;;) {
        board->beat(cat("spare", k), {{"host", host_name()}, {"name", node_name}, {"pid", ::getpid()}}, 5 * std::max(1.0, fault.heartbeat_s));
        if (board->ended() != ended) {  // the job is over: nothing left to take over
          log::info("launch: spare ", k, ": the job ended");
          return 0;
        }
        if (std::optional<std::pair<int, int64_t>> given = board->assignment(k)) {
          plan.node_rank = given->first;
          next_attempt = given->second;
          break;
        }
        pause(launcher, fault.heartbeat_s);
      }
      // The leader's plan names this spare, and gives the layout the job runs now.
      const std::optional<nlohmann::json> got = wait_for_plan(*board, launcher, *next_attempt - 1, [] {});
      if (!got) throw_runtime("launch: spare ", k, ": the job's leader settled nothing within 120 s");
      const nlohmann::json& p = *got;
      if (p.contains("error") || p["spares"].value(std::to_string(plan.node_rank), int64_t(-1)) != k) {
        log::info("launch: spare ", k, ": the job did not take it after all");
        return 0;
      }
      plan.nnodes = p.value("nnodes", plan.nnodes);
      plan.world_size = plan.nnodes * plan.nproc_per_node;
      if (const std::optional<nlohmann::json> cause = board->stopped(*next_attempt - 1)) {
        carry_over(*cause);
        ++restarts_made;  // the restart it joins
        apply_skips();
      }
      if ((shrunk_dp = p.value("dp", int64_t(0))) > 0)
        plan.command.insert(plan.command.end(), {"--set", cat("parallel.dp=", shrunk_dp)});
    } catch (const Interrupted& i) {
      log::info("launch: spare ", k, " stops (", driver::signal_name(i.signal), ")");
      return 0;
    }
    log::info("launch: spare ", k, " takes over node ", plan.node_rank, " in the job's restart ", restarts_made, " of ",
              max_restarts);
    plan.command.insert(plan.command.end(), {"--resume", "auto"});
    restarted = true;
  }
  events = std::make_unique<Events>(plan, supervised);

  driver::RunResult r;
  std::optional<Corruption> rerun;  // the last attempt's corrupt replica, whose step this one reruns
  std::string restarting;  // the restart event, written once the new attempt has its number
  std::string failed;      // the last attempt's failure, as the console's last line says it
  ErrorClass failed_class = ErrorClass::kRuntime;
  for (;; ++restarts_made) {
    std::unique_ptr<comm::Store> store = claim_attempt(plan, next_attempt);
    const int64_t attempt = std::stoll(plan.attempt);
    events->attempt = static_cast<int>(attempt);
    if (!restarting.empty()) events->write("restart", -1, "", restarting);
    failed.clear();
    const int first = plan.node_rank * plan.nproc_per_node;
    log::info("launch: ", plan.command[0], " on ranks ", first, "..", first + plan.nproc_per_node - 1,
              " of ", plan.world_size, ", node ", plan.node_rank, " (", node_name, "), ", plan.origin, "; job ", plan.job, ", attempt ",
              plan.attempt, ", store ", driver::without_password(plan.rdzv), "; logs in ", plan.log_dir);
    std::vector<driver::WorkerSpec> specs = driver::worker_specs(plan, "/proc/self/exe", self_path());
    last_error.clear();
    HangWatch hangs(launcher, plan.run_dir);
    hangs.whole_job = plan.nnodes == 1;
    hang_watch = &hangs;
    for (driver::WorkerSpec& spec : specs) {
      spec.env.emplace_back("MYRIAD_HEARTBEAT", hangs.add(spec.rank, launcher.size()));
      launcher.spawn(spec);
    }
    StoreWatch store_watch{store.get()};
    std::optional<HangWatch::Report> straggler;  // to evict (fault.evict_stragglers)
    std::optional<JobWatch> job;
    if (board) {
      job.emplace(*watch_board, launcher, plan, hangs, fault.heartbeat_s, attempt, node_name);
      job->job_state = job_state();
      errors = &job->errors;
    }
    // The rank of the last attempt's corrupt replica, if it runs here, passed the rerun of its
    // step (its heartbeat's step moved past it, or the attempt finished).
    auto check_rerun = [&](bool finished) {
      if (!rerun) return;
      for (const HangWatch::Rank& h : hangs.ranks)
        if (h.rank == rerun->rank && (finished || h.step >= rerun->step)) {
          events->write("diagnose", h.rank, "",
                        cat("the silent data corruption of rank ", h.rank, " at step ", rerun->step,
                            " was transient: the rerun of that step passed the replicas' check"));
          rerun.reset();
          return;
        }
    };
    double next_beat_s = 0;  // an unsupervised launch's own heartbeat (a supervised one's is the job watch's)
    r = launcher.run([&] {
      store_watch();
      hangs();
      if (job) (*job)();
      if (!job && place && comm::steady_now_s() >= next_beat_s) {
        next_beat_s = comm::steady_now_s() + std::max(1.0, fault.heartbeat_s);
        nlohmann::json running = starting();
        running["status"] = "training";
        try {
          quick->beat(cat("node", plan.node_rank), running, beat_ttl_s);
        } catch (const Error&) {  // the store gone: StoreWatch says so; the workers train on
        }
      }
      check_rerun(false);
      for (const HangWatch::Report& s : hangs.reports) {
        if (events->path.empty()) log::warn("launch: ", s.detail);
        events->write("diagnose", s.rank, "", s.detail);
        if (fault.evict_stragglers && board && !straggler) {  // its node leaves the job
          straggler = s;
          launcher.stop(driver::kStopSignal);
        }
      }
      hangs.reports.clear();
    });
    errors = nullptr;  // (the job watch, which owns them, ends with this attempt)
    hang_watch = nullptr;
    if (r.ok()) check_rerun(true);
    // What the workers of this node left in shared memory (a killed reader never unlinks).
    if (int n = data::remove_node_segments(plan.job, plan.rdzv, plan.attempt, plan.node_rank); n > 0)
      log::info("launch: removed ", n, " shared-memory segment(s) the workers left");
    if (r.preempted) break;  // the batch system takes the nodes back: no restart
    const bool local = r.failure || !hangs.verdict.empty() || straggler;
    if (!local && !(job && job->remote)) {
      if (job && r.ok()) {  // finished, not lost (best effort: the job is done either way)
        try {
          job->beat("done", 3600);
          end_beat.board = nullptr;  // "done" stands for an hour: the peers must not think it lost
          board->end({{"attempt", attempt}, {"status", "done"}});
        } catch (const Error&) {
        }
      }
      break;
    }
    // The job's cause: this node's failure unless another node recorded its own first. A hang is
    // the launcher's own finding (it killed the frozen rank, or stopped them all).
    nlohmann::json cause;
    if (local && straggler) {
      cause = {{"node", plan.node_rank}, {"rank", straggler->rank}, {"class", class_name(ErrorClass::kRuntime)},
               {"detail", straggler->detail}, {"evict", true}};
      cause.update(job_state());
      cause = board->stop(attempt, cause);
    } else if (local) {
      const int rank = !hangs.verdict.empty() ? hangs.culprit : r.failure->rank;
      const ErrorClass cls = !hangs.verdict.empty() ? ErrorClass::kRuntime : r.failure->error_class();
      // A worker's own account of its failure, when it gave one, says why.
      std::string why = last_error.count(rank) ? last_error[rank] : "";
      if (const std::string prefix = cat(class_name(cls), ": "); why.rfind(prefix, 0) == 0) why.erase(0, prefix.size());
      if (!why.empty()) why = ": " + why;
      const std::string what = !hangs.verdict.empty() ? hangs.verdict : cat("rank ", rank, " ", r.failure->describe(), why);
      // The same replica corrupt again on the rerun of its step: a faulty device, evicted.
      const std::optional<Corruption> again = corruption_in(what);
      const bool persistent = again && rerun && *again == *rerun;
      // A stalled job's culprit may run on another node (named from the heartbeats).
      const int node = rank >= 0 ? rank / plan.nproc_per_node : plan.node_rank;
      cause = {{"node", node}, {"rank", rank}, {"class", class_name(cls)}, {"detail", what}};
      cause.update(job_state());
      // A loss fault at the step the last one was at recurred on the replay: the data, not the
      // machine. The next attempt skips that step's batch.
      if (const std::optional<int64_t> at = loss_fault_step(what); at && cls == ErrorClass::kNumerics) {
        cause["loss_fault_step"] = *at;
        cause["loss_fault"] = true;
        if (*at == last_loss_fault && std::find(skipped.begin(), skipped.end(), *at) == skipped.end()) {
          std::vector<int64_t> more = skipped;
          more.push_back(*at);
          cause["skip_steps"] = more;
        }
      }
      if (persistent) {
        cause["detail"] = cat(what, "; persistent: the rerun of step ", again->step, " corrupted it again");
        cause["evict"] = true;
      }
      if (board && cls == ErrorClass::kComm) {
        // Most often the echo of another node's fault: give its agent a moment to record the cause.
        for (const double until = comm::steady_now_s() + 3; comm::steady_now_s() < until && !board->stopped(attempt);)
          launcher.wait(0.1);
      }
      if (board) cause = board->stop(attempt, cause);
    } else {
      cause = *job->remote;
    }
    const size_t skipped_before = skipped.size();
    carry_over(cause);
    const int cause_node = cause.value("node", -1), cause_rank = cause.value("rank", -1);
    failed_class = class_from_name(cause.value("class", ""));
    failed = cause.value("detail", "");
    if (cause_node != plan.node_rank) failed = cat("node ", cause_node, ": ", failed);
    // A persistent corruption on a job of one node has nowhere else to run.
    const bool persistent = cause.value("evict", false) && corruption_in(failed);
    if (persistent && plan.nnodes == 1) failed += "; replace this node's faulty device";
    rerun = corruption_in(failed);
    const bool final_stop = failed_class == ErrorClass::kInput || failed_class == ErrorClass::kInternal ||
                            restarts_made >= max_restarts || (persistent && plan.nnodes == 1);
    events->write("fault", cause_rank, class_name(failed_class), failed, cause_node);
    events->write("stop", -1, "", cause_node == plan.node_rank ? "the other workers of this node were stopped"
                                                               : "this node's workers were stopped");
    if (board && plan.nnodes > 1 && cause.value("detail", "").rfind("hang:", 0) == 0) {
      try {
        share_hang_report(*board, launcher, plan, hangs, attempt, *events);
      } catch (const Error& e) {  // a report is worth having, not worth the job
        log::warn("launch: no hang report: ", e.what());
      }
    }
    // Bad input fails the same way every time, and a bug is not a fault of the machine.
    if (final_stop) {
      if (board) board->end({{"attempt", attempt}, {"status", failed}});
      break;
    }
    if (board) {
      // Stop and check: every node checks itself; the nodes that fail, are lost, or caused the
      // last fault.evict_after faults leave the job, and spares take their places.
      std::optional<Leaving> out;
      try {
        out = stop_and_check(*board, launcher, plan, node_name, worker_cfg, fault, attempt, cause, check_line, *events,
                                 [&](const char* status) {
                                   try {
                                     job->beat(status, job->ttl_s());
                                   } catch (const Error&) {  // the patient board finds out
                                   }
                                 },
                                 shrunk_dp);
      } catch (const Interrupted& i) {
        std::fprintf(stderr, "myriad: launch: %s received during stop and check; logs in %s\n",
                     driver::signal_name(i.signal).c_str(), plan.log_dir.c_str());
        // A preemption between attempts: the workers are stopped, the last checkpoint stands.
        return exit_code(i.signal == driver::kStopSignal ? ErrorClass::kRuntime : ErrorClass::kPreempted);
      }
      if (out && out->finished) {
        log::info("launch: ", out->why);
        failed.clear();
        break;
      }
      if (out) {
        // An evicted node leaves; a job that cannot go on ends (its spares then leave too).
        if (out->job_ends) board->end({{"attempt", attempt}, {"status", out->why}});
        std::fprintf(stderr, "myriad: launch: %s; logs in %s\n", out->why.c_str(), plan.log_dir.c_str());
        return exit_code(ErrorClass::kRuntime);
      }
    }
    if (board) next_attempt = attempt + 1;
    // The restarted attempt resumes from the latest committed checkpoint by itself.
    if (!restarted) plan.command.insert(plan.command.end(), {"--resume", "auto"});
    restarted = true, resumed = false, resumed_from.clear();
    restarting = cat("restart ", restarts_made + 1, " of ", max_restarts, " after ", failed,
                     "; resuming from the latest committed checkpoint");
    if (skipped.size() > skipped_before) {
      apply_skips();
      events->write("diagnose", cause_rank, "",
                    cat("the loss fault at step ", skipped.back(), " recurred on the replay: the data, not a "
                        "machine; the next attempt skips that step's batch (train.skip_steps)"), cause_node);
    }
  }
  if (r.preempted) {
    if (board) {
      try {
        board->end({{"attempt", std::stoll(plan.attempt)}, {"status", "preempted"}});
      } catch (const Error&) {  // the spares then leave when their wait ends
      }
    }
    // Trainers answer a preemption by saving and exiting preempted; anything else (a worker that
    // does not save, one killed after the grace period) ended without a save of its own.
    const auto unsaved = std::find_if(r.exits.begin(), r.exits.end(), [](const driver::WorkerExit& x) {
      return !x.ok() && x.error_class() != ErrorClass::kPreempted;
    });
    const std::string by = r.signal != 0 ? cat(" (", driver::signal_name(r.signal), ")") : "";
    if (r.failure)
      std::fprintf(stderr, "myriad: launch: preempted%s, and rank %d %s; logs in %s\n", by.c_str(), r.failure->rank,
                   r.failure->describe().c_str(), plan.log_dir.c_str());
    else if (unsaved != r.exits.end())
      std::fprintf(stderr, "myriad: launch: preempted%s: rank %d %s without saving; logs in %s\n", by.c_str(),
                   unsaved->rank, unsaved->describe().c_str(), plan.log_dir.c_str());
    else
      std::fprintf(stderr, "myriad: launch: preempted%s: the workers stopped, each after saving its step unless its "
                   "grace ran out; launch again with --resume auto to continue from the latest committed checkpoint; "
                   "logs in %s\n", by.c_str(), plan.log_dir.c_str());
    return r.exit_code();
  }
  if (!failed.empty() && (r.failure || r.signal == 0)) {
    std::fprintf(stderr, "myriad: launch: %s; logs in %s\n", failed.c_str(), plan.log_dir.c_str());
    return exit_code(failed_class);
  }
  if (r.signal != 0) {
    std::fprintf(stderr, "myriad: launch: %s received, the workers were stopped (%s); logs in %s\n",
                 driver::signal_name(r.signal).c_str(), class_name(ErrorClass::kRuntime),
                 plan.log_dir.c_str());
    return r.exit_code();
  }
  log::info("launch: all ", plan.nproc_per_node, " worker(s) exited with code 0 in ",
            static_cast<int64_t>(r.seconds * 1000), " ms");
  // A run directory nobody asked for is kept only when its logs tell of a failure.
  if (temporary_run_dir) {
    std::error_code ec;
    std::filesystem::remove_all(plan.run_dir, ec);
  }
  return 0;
}

int cmd_comm_check(int argc, char** argv) {
  Args args("comm-check", argc, argv, {"size-kb", "timeout", "run-dir"});
  const long long size_kb = args.get_int("size-kb", 64);
  if (size_kb < 1 || size_kb > (1 << 20)) throw_input("comm-check: --size-kb must be 1..1048576");
  const double timeout_s = args.get_double("timeout", 60);
  if (!(timeout_s > 0)) throw_input("comm-check: --timeout must be > 0 seconds");
  const int rank = env_int("MYRIAD_RANK"), size = env_int("MYRIAD_WORLD_SIZE");
  if (size < 1 || rank >= size)
    throw_input("comm-check: MYRIAD_RANK ", rank, " is not below MYRIAD_WORLD_SIZE ", size);
  const std::string url = env_or("MYRIAD_RDZV", "");
  if (url.empty()) throw_input("comm-check: MYRIAD_RDZV is not set: run it under myriad launch");
  const std::string attempt = env_or("MYRIAD_ATTEMPT", "0");
  log::info("comm-check: rank ", rank, " of ", size, " (local rank ",
            env_or("MYRIAD_LOCAL_RANK", "?"), " of ", env_or("MYRIAD_LOCAL_WORLD_SIZE", "?"),
            ", node ", env_or("MYRIAD_NODE_RANK", "?"), " of ", env_or("MYRIAD_NNODES", "?"),
            "), job ", env_or("MYRIAD_JOB", "?"), ", attempt ", attempt, ", store ",
            driver::without_password(url));
  comm_check_fault(rank);

  const auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<comm::Store> store = comm::make_store(url, attempt, timeout_s);
  comm::CommOptions options;
  options.backend = "gloo";
  options.timeout_s = timeout_s;
  comm::GroupSpec world_spec;
  world_spec.name = "world", world_spec.rank = rank, world_spec.size = size;
  std::vector<std::unique_ptr<comm::Communicator>> groups =
      comm::make_groups(store, {world_spec}, options);
  comm::Communicator& world = *groups.at(0);
  const auto t1 = std::chrono::steady_clock::now();

  const int64_t count = size_kb * 1024 / static_cast<int64_t>(sizeof(float));
  std::vector<float> buf(static_cast<size_t>(count), static_cast<float>(rank + 1));
  world.all_reduce(buf.data(), count)->wait();
  world.barrier()->wait();  // nobody leaves while a peer may still be reading from it
  const auto t2 = std::chrono::steady_clock::now();
  // Sums of integers are exact in float32 up to 2^24 (N <= 5792 ranks).
  const double expected = 0.5 * size * (size + 1.0);
  for (int64_t i = 0; i < count; ++i)
    if (buf[static_cast<size_t>(i)] != static_cast<float>(expected))
      throw Error(ErrorClass::kComm,
                  cat("comm-check: rank ", rank, ": all_reduce gave ", buf[static_cast<size_t>(i)],
                      " at element ", i, ", expected ", expected));
  using ms = std::chrono::duration<double, std::milli>;
  log::info("comm-check: set-up ", static_cast<int64_t>(ms(t1 - t0).count()), " ms, all_reduce of ",
            size_kb, " KiB and a barrier ", static_cast<int64_t>(ms(t2 - t1).count()), " ms");
  std::cout << "comm-check ok: rank " << rank << " of " << size << std::endl;
  return 0;
}

}  // namespace myriad::cli
