#include "driver/agent.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/store.h"
#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "core/parallel_layout.h"
#include "core/preemption.h"
#include "core/worker_report.h"
#include "data/shared_batch.h"
#include "driver/hang_report.h"
#include "driver/hang_watch.h"
#include "driver/job_board.h"
#include "driver/policy.h"

namespace myriad::driver {
namespace {

// The path of this binary, for the workers' argv[0] (they execute /proc/self/exe itself, which
// stays valid even when the file is replaced meanwhile).
std::string self_path() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "myriad";
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
std::unique_ptr<comm::Store> claim_attempt(LaunchPlan& plan, std::optional<int64_t> known = std::nullopt) {
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
      if (lost) log::info("launch: the store ", without_password(store->url()), " answers again");
      lost = false;
    } catch (const Error& e) {
      if (!lost)
        log::warn("launch: the store ", without_password(store->url()),
                  " does not answer (", e.what(), "): a restart or a late rendezvous will fail");
      lost = true;
    }
    store->set_timeout(saved);
  }
};

// RUN_DIR/driver/events.jsonl (events.node<R>.jsonl on the other nodes): one JSON object per
// event of a supervised launch (--max-restarts), each also shown on the console as one line.
struct Events {
  Events(const LaunchPlan& plan, bool on) : node(plan.node_rank) {
    if (!on) return;
    const std::filesystem::path dir = std::filesystem::path(plan.run_dir) / "driver";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    path = (dir / (node == 0 ? std::string("events.jsonl") : cat("events.node", node, ".jsonl"))).string();
  }
  // `about`: the node the event is about (default this one); `when`: its Unix time (default now).
  void write(const std::string& event, int rank, const std::string& cls, const std::string& detail, int about = -1,
             double when = 0) {
    if (path.empty()) return;
    if (when <= 0) when = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    nlohmann::json j = {{"time", when}, {"event", event}, {"attempt", attempt}, {"node", about >= 0 ? about : node}};
    if (rank >= 0) j["rank"] = rank;
    if (!cls.empty()) j["class"] = cls;
    if (!detail.empty()) j["detail"] = detail;
    std::ofstream(path, std::ios::app) << j.dump() << "\n";
    log::warn("launch: ", event, " (attempt ", attempt, rank >= 0 ? cat(", rank ", rank) : "", "): ", detail);
  }
  std::string path;
  int node = 0, attempt = 0;
};


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

// The layout the job's workers take on the ranks of `nodes` nodes (data parallelism fills what
// tensor x pipeline (x context) groups leave), or an input error saying why it cannot
// (core/parallel_layout.h): whole groups, the global batch split over the replicas.
ParallelLayout layout_on(const std::optional<Config>& cfg, const LaunchPlan& plan, int nodes) {
  if (!cfg) throw_input("the workers' config is not one the launcher can read (a train --config)");
  Config c = *cfg;
  c.parallel.dp = 0;  // derived from the ranks
  const int64_t ranks = int64_t(nodes) * plan.nproc_per_node, group = ParallelLayout::replica_of(c.parallel);
  if (ranks < group || ranks % group != 0)  // said in the shrink's words
    throw_input("the ", ranks, " ranks left do not hold whole tensor x pipeline", c.parallel.cp > 1 ? " x context" : "",
                " groups of ", group);
  return ParallelLayout::for_world(c, ranks);
}

// Why the job cannot go on without `gone` of its nodes ("" when it can).
std::string shrink_refused(const std::optional<Config>& cfg, const LaunchPlan& plan, int gone) {
  try {
    layout_on(cfg, plan, plan.nnodes - gone);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// What the job carries from attempt to attempt, in every stop record (so that every agent, and
// a spare that joins late, reads the same): the restarts made, the steps skipped because their
// loss fault recurred on the replay, and the step of the last loss fault.
struct JobState {
  int64_t restarts = 0;
  std::vector<int64_t> skipped;
  int64_t last_loss_step = -1;
  nlohmann::json json() const {
    return {{"restarts", restarts}, {"skip_steps", skipped}, {"loss_fault_step", last_loss_step}};
  }
  void carry_over(const nlohmann::json& record) {
    restarts = record.value("restarts", restarts);
    skipped = record.value("skip_steps", skipped);
    last_loss_step = record.value("loss_fault_step", last_loss_step);
  }
};

// A stop record: why an attempt stopped, the policy's decision, and the job's state after it.
struct Stop {
  FaultRecord fault;
  Decision decision;
  nlohmann::json record;  // as the store holds it (the job's state after the decision included)
  nlohmann::json json(const JobState& state) const {
    nlohmann::json j = encode(fault);
    j.update(state.json());
    j["decision"] = encode(decision);
    return j;
  }
  static Stop from(const nlohmann::json& j) {
    Stop s;
    s.record = j;
    s.fault = decode_fault(j);
    s.decision = decode_decision(j.value("decision", nlohmann::json::object()));
    return s;
  }
};

// The job's history as the policy reads it: the faults of the attempts before `attempt` (from the
// board), and what the job carries.
JobHistory history_of(JobBoard& board, const LaunchPlan& plan, const std::optional<Config>& cfg, int64_t max_restarts,
                      const JobState& state, int64_t attempt) {
  JobHistory h;
  h.nnodes = plan.nnodes;
  h.restarts = state.restarts, h.max_restarts = max_restarts;
  h.evict_after = (cfg ? cfg->fault : FaultConfig{}).evict_after;
  h.skipped = state.skipped, h.last_loss_step = state.last_loss_step;
  // Back to the last change of the job's nodes, or as far as the eviction count can reach.
  for (int64_t a = attempt - 1; a >= 0 && attempt - a <= std::max<int64_t>(h.evict_after, 1); --a) {
    const std::optional<nlohmann::json> rec = board.stopped(a);
    if (!rec) break;
    bool changed = false;
    if (std::optional<Settlement> p = board.settled(a); p && (p->shrinks() || !p->spares.empty())) changed = true;
    try {
      h.past.insert(h.past.begin(), {decode_fault(*rec), changed});
    } catch (const Error&) {
      break;
    }
    if (changed) break;
  }
  h.shrink_refused = [cfg, plan](int gone) { return shrink_refused(cfg, plan, gone); };
  return h;
}

// Records why attempt A stopped, with the policy's decision, unless a node did first; returns
// the record that stands for the job. `state` is the job's before this fault; the record carries
// it after the decision (a skipped step, the loss fault's step).
Stop record_stop(JobBoard& board, const LaunchPlan& plan, const std::optional<Config>& cfg, int64_t max_restarts,
                 JobState state, int64_t attempt, FaultRecord fault) {
  const JobHistory history = history_of(board, plan, cfg, max_restarts, state, attempt);
  Stop s{fault, decide(history, fault), {}};
  if (fault.kind == FaultKind::kLoss) state.last_loss_step = fault.step;
  if (s.decision.action == Action::kSkipStep) state.skipped.push_back(s.decision.step);
  if (s.decision.action == Action::kEvict) s.fault.evict = true;
  if (const std::string p = persistent_corruption(history, fault); !p.empty()) s.fault.detail += "; " + p;
  return Stop::from(board.stop(attempt, s.json(state)));
}

// A hung job across nodes: every agent puts its ranks' flight records (null for a rank that
// wrote none: a stopped process) and last heartbeats in the job's store; node 0's agent gathers
// every rank's, waiting up to kGather_s (another node's agent may still be waiting for its own
// ranks' answers, HangWatch::kAnswer_s), and writes RUN_DIR/hang_report.{txt,json}, as the launcher of
// a job on one node does on its own. Each culprit's finding is a diagnose event.
void share_hang_report(JobBoard& board, Launcher& launcher, const LaunchPlan& plan, const HangWatch& hangs,
                       int64_t attempt, Events& events) {
  for (const HangWatch::Rank& r : hangs.ranks) {
    std::ifstream in(hangs.flight_path(r.rank));
    const nlohmann::json record = nlohmann::json::parse(in, nullptr, false);
    nlohmann::json beat;
    if (r.last) {
      HeartbeatRecord h = *r.last;
      h.age_s = comm::steady_now_s() - r.beat_at;
      beat = encode(h);
    }
    board.flight(attempt, r.rank, {{"record", record.is_object() ? record : nlohmann::json()}, {"beat", beat}});
  }
  if (plan.node_rank != 0) return;
  nlohmann::json records = nlohmann::json::array(), beats = nlohmann::json::object();
  std::vector<bool> have(static_cast<size_t>(plan.world_size), false);
  constexpr double kGather_s = HangWatch::kAnswer_s + 5;
  for (const double until = comm::steady_now_s() + kGather_s;;) {
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
  const HangReport report = write_hang_report(plan.run_dir, records, beats);
  for (size_t i = 0; i < report.culprits.size(); ++i) {
    log::warn("launch: hang report: ", report.findings[i]);
    events.write("diagnose", report.culprits[i], "", "hang report: " + report.findings[i],
                 report.culprits[i] / plan.nproc_per_node);
  }
  for (const std::string& m : report.mismatches) log::warn("launch: hang report: mismatch: ", m);
}

bool is_hang(const FaultRecord& f) { return f.kind == FaultKind::kHang || f.kind == FaultKind::kStall; }

// The node agent's side of the job (myriad launch --max-restarts): its heartbeat in the store,
// the job-wide stop (a fault on any node stops every node's workers at once, without waiting
// for a collective to time out), and the loss of a node (its agent's heartbeat gone).
struct JobWatch {
  JobWatch(JobBoard& b, Launcher& l, const LaunchPlan& p, HangWatch& h, double hb, int64_t a, std::string n,
           std::function<Stop(FaultRecord)> rec)
      : board(b), launcher(l), plan(p), hangs(h), heartbeat_s(hb), attempt(a), name(std::move(n)), record(std::move(rec)) {}
  JobBoard& board;
  Launcher& launcher;
  const LaunchPlan& plan;
  HangWatch& hangs;
  double heartbeat_s;
  int64_t attempt;
  std::string name;                 // --node-name
  std::function<Stop(FaultRecord)> record;  // records a fault of the job's (a lost node)
  std::vector<std::string> errors;  // the workers' recent error lines, shown in the heartbeat
  std::vector<double> seen_at;      // when each peer's heartbeat was last seen this attempt (0: never)
  std::optional<Stop> remote;       // the job's stop record, when another node made it
  double next_s = 0;
  bool store_down = false;  // the last tick found the store gone

  // The node's heartbeat: who it is, and each worker's last heartbeat (step, phase, rates, the
  // last collective started and finished, each group's progress).
  nlohmann::json state(const char* status) const {
    return {{"host", host_name()}, {"name", name}, {"node", plan.node_rank}, {"pid", ::getpid()}, {"attempt", attempt},
            {"status", status}, {"run_dir", std::filesystem::absolute(plan.run_dir).string()}, {"workers", hangs.workers()}, {"errors", errors}};
  }
  void beat(const char* status, double ttl) { board.beat(cat("node", plan.node_rank), state(status), ttl); }
  double ttl_s() const { return beat_ttl_s(heartbeat_s); }
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
      // Another node stopped the attempt: stop here too. This node's own failures are recorded
      // after its workers ended: a record seen now is another's.
      if (std::optional<nlohmann::json> stop = board.stopped(attempt)) {
        remote = Stop::from(*stop);
        // A hung job: this node's ranks write their flight records too, for `myriad hang-report`.
        if (is_hang(remote->fault)) hangs.request_flight_records();
        launcher.stop(kStopSignal);
        return;
      }
      // Lost: seen beating this attempt, then not for 5 beats (its key expires after 5; a store
      // restarted empty refills within one).
      seen_at.resize(plan.nnodes, 0.0);
      std::vector<double> own;  // every rank's own step time, job-wide (0: not known yet)
      for (const HangWatch::Rank& r : hangs.ranks) own.push_back(r.last ? r.last->own_ms : 0);
      nlohmann::json others = nlohmann::json::array();
      for (int m = 0; m < plan.nnodes; ++m) {
        if (m == plan.node_rank) continue;
        if (std::optional<nlohmann::json> hb = board.heartbeat(cat("node", m))) {
          seen_at[m] = now;
          for (const nlohmann::json& w : (*hb)["workers"]) {
            double ms = 0;
            try {
              ms = decode_heartbeat(w).own_ms;
            } catch (const Error&) {  // another version's beat: its time unknown
            }
            own.push_back(ms), others.push_back(w);
          }
        } else if (seen_at[m] > 0 && now - seen_at[m] > ttl_s()) {
          remote = record({FaultKind::kLost, ErrorClass::kRuntime, -1, m, -1, "lost: its agent's heartbeat stopped"});
          launcher.stop(kStopSignal);
          return;
        }
      }
      hangs.remote = std::move(others);
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
void pause(Launcher& launcher, double s) {
  for (const Launcher::Event& e : launcher.wait(s))
    if (e.kind == Launcher::Event::Kind::kSignal) throw Interrupted{e.signal};
}

// The leader's plan for the places left after attempt A, waited for up to 2 minutes (beating,
// answering signals); nullopt when it did not come.
std::optional<Settlement> wait_for_plan(JobBoard& board, Launcher& launcher, int64_t attempt,
                                        const std::function<void()>& beat) {
  for (const double until = comm::steady_now_s() + 120; comm::steady_now_s() < until; pause(launcher, 0.2)) {
    if (std::optional<Settlement> p = board.settled(attempt)) return p;
    beat();
  }
  return std::nullopt;
}

// Stop and check: the node's self-check (myriad self-check) in a process of its own, as the
// workers run, given a minute at most (a hung disk is what it looks for). Its exit status says
// whether it passed; its fault record (or its last line) what it found, for people.
nlohmann::json self_check(Launcher& launcher, const LaunchPlan& plan, const std::optional<Config>& cfg,
                          int64_t attempt, const std::string& last_line, const std::function<void(const char*)>& beat) {
  WorkerSpec spec;
  spec.rank = -1, spec.local_rank = 0;
  spec.exe = "/proc/self/exe";
  const std::string dir = (cfg ? *cfg : Config{}).checkpoint_root(plan.run_dir);
  spec.argv = {self_path(), "self-check", "--checkpoint-dir", dir, "--ranks", std::to_string(plan.nproc_per_node),
               "--min-bus-gbps", cat(cfg ? cfg->fault.diag_min_bus_gbps : FaultConfig{}.diag_min_bus_gbps),
               "--device", cfg ? cfg->train.device : "auto"};
  const std::string record = (std::filesystem::path(plan.run_dir) / "driver" / cat("fault_self_check_node", plan.node_rank, ".json")).string();
  std::error_code ec;
  std::filesystem::remove(record, ec);
  spec.env = {{"MYRIAD_NODE_RANK", std::to_string(plan.node_rank)}, {"MYRIAD_ATTEMPT", std::to_string(attempt)},
              {"MYRIAD_FAULT_RECORD", record},
              {"MYRIAD_INJECT_LIVE", (std::filesystem::path(plan.run_dir) / "driver" / cat("inject_node", plan.node_rank)).string()}};
  spec.log_path = (std::filesystem::path(plan.log_dir) / cat("self_check_node", plan.node_rank, ".log")).string();
  launcher.spawn(spec);
  constexpr double kLimit_s = 60;
  const double until = comm::steady_now_s() + kLimit_s;
  bool late = false;
  const RunResult r = launcher.run([&] {
    beat("checking");
    if (!late && comm::steady_now_s() > until) late = true, launcher.stop(SIGKILL), launcher.stop(SIGKILL);
  });
  if (r.signal != 0 || r.preempted) throw Interrupted{r.signal != 0 ? r.signal : SIGTERM};
  const std::optional<FaultRecord> f = read_fault_record(record);
  const std::string detail = late ? cat("no result within ", kLimit_s, " s")
                             : f ? f->detail
                             : !last_line.empty() ? last_line
                             : r.failure ? r.failure->describe()
                                         : std::string("no result");
  return {{"ok", r.ok() && !late}, {"detail", detail}};
}

// Why this agent leaves the job after stop and check.
struct Leaving {
  std::string why;
  bool job_ends;          // else only this node leaves (evicted)
  bool finished = false;  // the job had finished its steps meanwhile (a fault at its very end)
};

// Whether an agent of one of the job's nodes [0, nnodes) beats as running (not its last beat).
bool any_node_running(JobBoard& board, int nnodes) {
  for (int n = 0; n < nnodes; ++n)
    if (const std::optional<nlohmann::json> hb = board.heartbeat(cat("node", n)); hb && JobBoard::live(*hb))
      return true;
  return false;
}

// Whether the job ended at or after attempt A (another node finished it, or gave up).
std::optional<std::string> ended_since(JobBoard& board, int64_t attempt) {
  const std::optional<std::string> e = board.ended();
  if (!e) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(*e, nullptr, false);
  if (!j.is_object() || j.value("attempt", int64_t(-1)) < attempt) return std::nullopt;
  return j.value("status", "");
}

// One agent: the phases of docs/ARCHITECTURE.md's drawing, each a method that returns the next.
//
//   claim -> train -> end                      (finished, preempted, signalled)
//                 \-> record -> end            (the policy stops the job)
//                          \-> check -> settle -> restart -> claim
//                                            \-> end  (this node leaves, or the job cannot go on)
class Agent {
 public:
  explicit Agent(AgentSettings s);
  int run();

 private:
  enum class Phase { kClaim, kTrain, kRecord, kCheck, kSettle, kRestart, kEnd };
  // Before the first attempt: the block list, this node's place in the job (refused when a live
  // agent holds it), a spare's wait for a node. An exit code when the launch ends there.
  std::optional<int> join();
  Phase claim();    // the attempt's number and store; this node's workers spawned
  Phase train();    // the workers run, watched; how they ended
  Phase record();   // the fault that stopped the attempt, the job's record of it, the decision
  Phase check();    // stop and check: this node's self-check, every node's, who leaves
  Phase settle();   // the leader fills the places left (spares, a shrink, or the end); all apply it
  Phase restart();  // the next attempt resumes from the latest committed checkpoint
  int end();        // the launch's exit code, and what it says last

  void apply_skips();
  void beat_checking(const char* status);
  int spare_wait();  // -1: took a node over; else the exit code

  AgentSettings s_;
  LaunchPlan& plan_;
  const std::optional<Config> cfg_;
  const FaultConfig fault_;
  const bool supervised_;
  std::unique_ptr<Launcher> launcher_;
  // The job's board: one connection patient with a store that restarts (stop and check, the
  // spare's wait), one that is not (the ticks of a running attempt, which must not block).
  std::unique_ptr<JobBoard> board_, watch_board_;
  // Where an agent outside the job's board claimed its node rank (an unsupervised launch's own
  // heartbeat), and a connection for the beats that must not hold its loop up.
  std::optional<JobBoard> probe_, quick_;
  JobBoard* place_ = nullptr;
  std::unique_ptr<Events> events_;
  JobState job_;
  std::optional<int64_t> next_attempt_;  // decided by the job's agents (nullopt: count arrivals)
  int64_t shrunk_dp_ = 0;                // the data parallelism a shrink left the job with (0: the config's)
  bool restarted_ = false;
  std::string check_line_;               // the self-check's last line (display)

  // The attempt under way.
  int64_t attempt_ = 0;
  std::unique_ptr<comm::Store> store_;   // its namespace in the job's store
  std::unique_ptr<HangWatch> hangs_;     // its workers' heartbeats
  // The job watch beats for this agent from the attempt's start until its stop and check ends.
  std::optional<JobWatch> job_watch_;
  bool watching_ = false;                // the workers run (their error lines go to the heartbeat)
  RunResult result_;                     // how its workers ended
  std::optional<FaultRecord> straggler_; // found, to evict (fault.evict_stragglers)
  Stop cause_;                           // the job's record of why it stopped, and the decision
  nlohmann::json leave_;                 // the nodes that leave after it, and why
  std::optional<Leaving> leaving_;       // why this agent leaves the job (check, settle)
  std::optional<Decision> rerun_;        // the last attempt's corrupt replica, whose step this one reruns
  std::string restarting_;               // the restart event, written once the new attempt has its number
  std::string failed_;                   // the last attempt's failure, as the console's last line says it
  ErrorClass failed_class_ = ErrorClass::kRuntime;

  // Whatever ends this launch, its agent says so at once, so that a relaunch under the same
  // name need not wait for its heartbeat to expire.
  struct EndBeat {
    JobBoard* board = nullptr;
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
  } end_beat_;
  nlohmann::json starting() const {
    return {{"host", host_name()}, {"name", s_.node_name}, {"node", plan_.node_rank}, {"pid", ::getpid()},
            {"status", "starting"}, {"run_dir", std::filesystem::absolute(plan_.run_dir).string()}};
  }
};

Agent::Agent(AgentSettings s)
    : s_(std::move(s)),
      plan_(s_.plan),
      cfg_(worker_config(s_.plan.command)),
      fault_(cfg_ ? cfg_->fault : FaultConfig{}),
      supervised_(s_.max_restarts > 0) {
  Launcher::Options& options = s_.launcher;
  options.on_line = [this](int rank, std::string_view line) {
    if (rank < 0) {  // the self-check
      check_line_ = std::string(line);
      return;
    }
    if (watching_ && job_watch_ && line.rfind("myriad: ", 0) == 0) {  // shown in the node's heartbeat
      std::vector<std::string>& errors = job_watch_->errors;
      errors.push_back(cat("rank ", rank, ": ", line));
      if (errors.size() > 5) errors.erase(errors.begin());
    }
  };
  // A collective that timed out: before the others are stopped they write their flight records
  // too, and on one node the hang report says whom the timed-out rank waited for.
  options.before_stop = [this](const WorkerExit& failure) {
    if (!watching_ || !hangs_ || failure.error_class() != ErrorClass::kComm) return;
    hangs_->request_flight_records(failure.rank);
    hangs_->report();
  };
  // A preemption: the workers get the trainer's own grace (fault.preempt_grace_s) and 5 s more
  // before SIGKILL, and the config's extra preemption signal is caught here too (its default
  // action would end the launcher, and with it every worker, before any saved).
  options.preempt_grace_s = fault_.preempt_grace_s + 5;
  options.preempt_signal = preemption::signal_number(fault_.preempt_signal);
  launcher_ = std::make_unique<Launcher>(options);
  if (supervised_) {
    board_ = std::make_unique<JobBoard>(plan_.rdzv, 30, 60);
    watch_board_ = std::make_unique<JobBoard>(plan_.rdzv, 5);
  }
}

void Agent::apply_skips() {  // the workers skip the config's steps and the job's
  std::vector<int64_t> all = cfg_ ? cfg_->train.skip_steps : std::vector<int64_t>{};
  all.insert(all.end(), job_.skipped.begin(), job_.skipped.end());
  set_skip_steps(plan_.command, all);
}

void Agent::beat_checking(const char* status) {
  if (!job_watch_) return;
  try {
    job_watch_->beat(status, job_watch_->ttl_s());
  } catch (const Error&) {  // the patient board finds out
  }
}

// A spare waits, beating, until the leader gives it a node to take over; then it is that node.
int Agent::spare_wait() {
  JobBoard& board = *board_;
  const int64_t k = board.join_as_spare();
  // An end already written is an earlier run's under this name, or this run's, ended just before
  // the spare joined. The nodes' beats tell which: if no agent of the job beats as running
  // within a heartbeat's life, the job is over (else the spare waited for ever).
  const std::optional<std::string> ended = board.ended();
  const double joined_s = comm::steady_now_s();
  bool job_runs = !ended;
  log::info("launch: spare ", k, " of job ", plan_.job, " waits for a node to take over");
  try {
    for (;;) {
      board.beat(cat("spare", k), {{"host", host_name()}, {"name", s_.node_name}, {"pid", ::getpid()}},
                 beat_ttl_s(fault_.heartbeat_s));
      if (board.ended() != ended) {  // the job is over: nothing left to take over
        log::info("launch: spare ", k, ": the job ended");
        return 0;
      }
      job_runs = job_runs || any_node_running(board, plan_.nnodes);
      if (!job_runs && comm::steady_now_s() - joined_s > beat_ttl_s(fault_.heartbeat_s)) {
        log::info("launch: spare ", k, ": job ", plan_.job, " ended before this spare joined (", *ended,
                  ") and none of its nodes runs: nothing to take over");
        return 0;
      }
      if (std::optional<std::pair<int, int64_t>> given = board.assignment(k)) {
        plan_.node_rank = given->first;
        next_attempt_ = given->second;
        break;
      }
      pause(*launcher_, fault_.heartbeat_s);
    }
    // The leader's plan names this spare, and gives the layout the job runs now.
    const std::optional<Settlement> got = wait_for_plan(board, *launcher_, *next_attempt_ - 1, [] {});
    if (!got) throw_runtime("launch: spare ", k, ": the job's leader settled nothing within 120 s");
    const Settlement& p = *got;
    const auto mine = p.spares.find(plan_.node_rank);
    if (!p.error.empty() || mine == p.spares.end() || mine->second != k) {
      log::info("launch: spare ", k, ": the job did not take it after all");
      return 0;
    }
    plan_.nnodes = p.nnodes > 0 ? p.nnodes : plan_.nnodes;
    plan_.world_size = plan_.nnodes * plan_.nproc_per_node;
    if (const std::optional<nlohmann::json> cause = board.stopped(*next_attempt_ - 1)) {
      job_.carry_over(*cause);
      ++job_.restarts;  // the restart it joins
      apply_skips();
    }
    if ((shrunk_dp_ = p.dp) > 0) plan_.command.insert(plan_.command.end(), {"--set", cat("parallel.dp=", shrunk_dp_)});
  } catch (const Interrupted& i) {
    log::info("launch: spare ", k, " stops (", signal_name(i.signal), ")");
    return 0;
  }
  log::info("launch: spare ", k, " takes over node ", plan_.node_rank, " in the job's restart ", job_.restarts, " of ",
            s_.max_restarts);
  plan_.command.insert(plan_.command.end(), {"--resume", "auto"});
  restarted_ = true;
  return -1;
}

int Agent::run() {
  if (const std::optional<int> code = join()) return *code;
  for (Phase phase = Phase::kClaim; phase != Phase::kEnd;) {
    try {
      switch (phase) {
        case Phase::kClaim: phase = claim(); break;
        case Phase::kTrain: phase = train(); break;
        case Phase::kRecord: phase = record(); break;
        case Phase::kCheck: phase = check(); break;
        case Phase::kSettle: phase = settle(); break;
        case Phase::kRestart: phase = restart(); break;
        case Phase::kEnd: break;
      }
    } catch (const Interrupted& i) {  // a signal to the agent between attempts (check, settle)
      std::fprintf(stderr, "myriad: launch: %s received during stop and check; logs in %s\n",
                   signal_name(i.signal).c_str(), plan_.log_dir.c_str());
      // A preemption between attempts: the workers are stopped, the last checkpoint stands.
      return exit_code(i.signal == kStopSignal ? ErrorClass::kRuntime : ErrorClass::kPreempted);
    }
  }
  return end();
}

std::optional<int> Agent::join() {
  // An evicted node stays out of the job (as a node or as a spare) until it is renamed.
  if (board_)
    if (const std::optional<std::string> why = board_->blocked(s_.node_name))
      throw_input("launch: '", s_.node_name, "' is on job ", plan_.job, "'s block list (", *why,
                  "): once it is repaired, start it under another --node-name, or run a new --job");
  // A live job under this name: this node rank's agent beat within its last 5 beats (its key
  // expires then) and has not ended. Taking its place would drop its attempt's store keys and
  // tie the two jobs' faults together, so the launch is refused before it claims an attempt.
  // Spares and the other node ranks of that job join it as before. An unsupervised launch has
  // no board of its own: it claims its place, and beats while its workers run, through its own.
  if (!s_.spare && !plan_.default_store) {
    place_ = board_ ? board_.get() : &probe_.emplace(plan_.rdzv, 30);
    if (const std::optional<nlohmann::json> hb =
            place_->claim(cat("node", plan_.node_rank), starting(), beat_ttl_s(fault_.heartbeat_s)))
      throw_input("launch: job ", plan_.job, " is running: node ", plan_.node_rank, "'s agent (host ",
                  hb->value("host", "?"), ", pid ", hb->value("pid", 0), ", run directory ", hb->value("run_dir", "?"),
                  ") beat within its last 5 beats; wait for it to end, stop it, or give this run another --job or --rdzv "
                  "job name");
  }
  // The beats that must not hold this agent's loop up (an unsupervised launch's own, and the
  // last one): a connection of their own that gives up after 2 s, as the store check's does.
  // Through `place_`, a store gone mid-run would be waited for 30 s a beat while the workers,
  // the hang watch and the store check go unattended.
  if (place_) {
    quick_.emplace(plan_.rdzv, 2);
    nlohmann::json ended = starting();
    ended["status"] = "ended";
    end_beat_ = {&*quick_, cat("node", plan_.node_rank), ended, beat_ttl_s(fault_.heartbeat_s)};
  }
  if (s_.spare)
    if (const int code = spare_wait(); code >= 0) return code;
  events_ = std::make_unique<Events>(plan_, supervised_);
  return std::nullopt;
}

Agent::Phase Agent::claim() {
  job_watch_.reset();  // the last attempt's beats for this agent end here
  store_ = claim_attempt(plan_, next_attempt_);
  attempt_ = std::stoll(plan_.attempt);
  events_->attempt = static_cast<int>(attempt_);
  if (!restarting_.empty()) events_->write("restart", -1, "", restarting_);
  failed_.clear();
  straggler_.reset();
  const int first = plan_.node_rank * plan_.nproc_per_node;
  log::info("launch: ", plan_.command[0], " on ranks ", first, "..", first + plan_.nproc_per_node - 1, " of ",
            plan_.world_size, ", node ", plan_.node_rank, " (", s_.node_name, "), ", plan_.origin, "; job ", plan_.job,
            ", attempt ", plan_.attempt, ", store ", without_password(plan_.rdzv), "; logs in ", plan_.log_dir);
  hangs_ = std::make_unique<HangWatch>(*launcher_, plan_.run_dir);
  hangs_->whole_job = plan_.nnodes == 1;
  if (cfg_) hangs_->slower = cfg_->fault.straggler_factor, hangs_->margin_ms = cfg_->fault.straggler_margin_ms;
  for (WorkerSpec& spec : worker_specs(plan_, "/proc/self/exe", self_path())) {
    spec.env.emplace_back("MYRIAD_HEARTBEAT", hangs_->add(spec.rank, launcher_->size()));
    spec.env.emplace_back("MYRIAD_FAULT_RECORD", hangs_->fault_path(spec.rank).string());
    spec.env.emplace_back("MYRIAD_INJECT_LIVE", hangs_->inject_path(spec.rank).string());
    launcher_->spawn(spec);
  }
  if (board_)
    job_watch_.emplace(*watch_board_, *launcher_, plan_, *hangs_, fault_.heartbeat_s, attempt_, s_.node_name,
                       [this, attempt = attempt_](FaultRecord f) {
                         return record_stop(*watch_board_, plan_, cfg_, s_.max_restarts, job_, attempt, std::move(f));
                       });
  return Phase::kTrain;
}

Agent::Phase Agent::train() {
  Launcher& launcher = *launcher_;
  HangWatch& hangs = *hangs_;
  StoreWatch store_watch{store_.get()};
  // The rank of the last attempt's corrupt replica, if it runs here, passed the rerun of its
  // step (its heartbeat's step moved past it, or the attempt finished).
  auto check_rerun = [&](bool finished) {
    if (!rerun_) return;
    for (const HangWatch::Rank& h : hangs.ranks)
      if (h.rank == rerun_->rank && (finished || h.step >= rerun_->step)) {
        events_->write("diagnose", h.rank, "",
                       cat("the silent data corruption of rank ", h.rank, " at step ", rerun_->step,
                           " was transient: the rerun of that step passed the replicas' check"));
        rerun_.reset();
        return;
      }
  };
  // A restarted attempt's first productive step: the first heartbeat that counts a step.
  bool resumed = !restarted_;
  auto check_resumed = [&] {
    if (resumed) return;
    for (const HangWatch::Rank& h : hangs.ranks)
      if (h.last && h.last->first_step >= 0) {
        resumed = true;
        events_->write("resumed", h.rank, "",
                       cat("step ", h.last->first_step, cfg_ ? cat("/", cfg_->train.steps) : "",
                           h.last->resumed_from.empty() ? "" : ", from " + h.last->resumed_from),
                       -1, h.last->first_step_unix_s);
        return;
      }
  };
  double next_beat_s = 0;  // an unsupervised launch's own heartbeat (a supervised one's is the job watch's)
  watching_ = true;
  result_ = launcher.run([&] {
    store_watch();
    hangs();
    check_resumed();
    if (job_watch_) (*job_watch_)();
    if (!job_watch_ && place_ && comm::steady_now_s() >= next_beat_s) {
      next_beat_s = comm::steady_now_s() + std::max(1.0, fault_.heartbeat_s);
      nlohmann::json running = starting();
      running["status"] = "training";
      try {
        quick_->beat(cat("node", plan_.node_rank), running, beat_ttl_s(fault_.heartbeat_s));
      } catch (const Error&) {  // the store gone: StoreWatch says so; the workers train on
      }
    }
    check_rerun(false);
    for (const FaultRecord& s : hangs.stragglers) {
      if (events_->path.empty()) log::warn("launch: ", s.detail);
      events_->write("diagnose", s.rank, "", s.detail);
      if (fault_.evict_stragglers && board_ && !straggler_) {  // its node leaves the job
        straggler_ = s;
        straggler_->evict = true;
        launcher.stop(kStopSignal);
      }
    }
    hangs.stragglers.clear();
  });
  watching_ = false;  // the workers have ended
  hangs.read_all();   // what the workers said last, the ones that ended too
  check_resumed();
  if (result_.ok()) check_rerun(true);
  // What the workers of this node left in shared memory (a killed reader never unlinks).
  if (int n = data::remove_node_segments(plan_.job, plan_.rdzv, plan_.attempt, plan_.node_rank); n > 0)
    log::info("launch: removed ", n, " shared-memory segment(s) the workers left");
  if (result_.preempted) return Phase::kEnd;  // the batch system takes the nodes back: no restart
  const bool local = result_.failure || hangs.fault || straggler_;
  if (local || (job_watch_ && job_watch_->remote)) return Phase::kRecord;
  if (job_watch_ && result_.ok()) {  // finished, not lost (best effort: the job is done either way)
    try {
      job_watch_->beat("done", 3600);
      end_beat_.board = nullptr;  // "done" stands for an hour: the peers must not think it lost
      board_->end({{"attempt", attempt_}, {"status", "done"}});
    } catch (const Error&) {
    }
  }
  return Phase::kEnd;
}

Agent::Phase Agent::record() {
  HangWatch& hangs = *hangs_;
  // The fault: this node's own finding (a hang it stopped, a straggler), or the failed worker's
  // record of why; the job's stands unless another node recorded its own first.
  if (result_.failure || hangs.fault || straggler_) {
    FaultRecord f;
    if (straggler_) {
      f = *straggler_;
    } else if (hangs.fault) {
      f = *hangs.fault;
    } else {
      const WorkerExit& x = *result_.failure;
      const std::optional<FaultRecord> own = read_fault_record(hangs.fault_path(x.rank).string());
      f.kind = own ? own->kind : x.error_class() == ErrorClass::kComm ? FaultKind::kComm : FaultKind::kCrash;
      f.cls = x.error_class();
      f.rank = own && own->rank >= 0 ? own->rank : x.rank;
      f.step = own ? own->step : -1;
      f.detail = cat("rank ", x.rank, " ", x.describe(), own && !own->detail.empty() ? ": " + own->detail : "");
    }
    f.node = f.rank >= 0 ? f.rank / plan_.nproc_per_node : plan_.node_rank;
    if (board_ && may_be_echo(f)) {
      // Most often the echo of another node's fault: give its agent a moment to record the cause.
      for (const double until = comm::steady_now_s() + kEchoWait_s;
           comm::steady_now_s() < until && !board_->stopped(attempt_);)
        launcher_->wait(0.1);
    }
    if (board_) {
      cause_ = record_stop(*board_, plan_, cfg_, s_.max_restarts, job_, attempt_, f);
    } else {  // unsupervised: the first failure ends the launch
      cause_ = Stop{};
      cause_.fault = f;
      cause_.decision = {Action::kStop, "no restarts (--max-restarts 0)"};
    }
  } else {
    cause_ = *job_watch_->remote;
  }
  if (board_) job_.carry_over(cause_.record);
  const FaultRecord& f = cause_.fault;
  const Decision& d = cause_.decision;
  failed_class_ = f.cls;
  failed_ = f.detail;
  if (f.node != plan_.node_rank) failed_ = cat("node ", f.node, ": ", failed_);
  rerun_.reset();
  if (d.action == Action::kRerunCheck) rerun_ = d;
  events_->write("fault", f.rank, class_name(failed_class_), failed_, f.node);
  events_->write("stop", -1, "", f.node == plan_.node_rank ? "the other workers of this node were stopped"
                                                           : "this node's workers were stopped");
  if (board_ && plan_.nnodes > 1 && is_hang(f)) {
    try {
      share_hang_report(*board_, *launcher_, plan_, hangs, attempt_, *events_);
    } catch (const Error& e) {  // a report is worth having, not worth the job
      log::warn("launch: no hang report: ", e.what());
    }
  }
  if (d.action == Action::kStop) {
    if (board_) board_->end({{"attempt", attempt_}, {"status", failed_}});
    return Phase::kEnd;
  }
  return Phase::kCheck;
}

// Stop and check: this node checks itself; then the job settles which nodes leave (the policy's
// evictions: a failed self-check, a lost agent, the cause's own eviction): every agent proposes
// its view and the first one written stands for all.
Agent::Phase Agent::check() {
  JobBoard& board = *board_;
  const int me = plan_.node_rank;
  auto beat = [this](const char* status) { beat_checking(status); };
  check_line_.clear();
  const nlohmann::json mine = self_check(*launcher_, plan_, cfg_, attempt_, check_line_, beat);
  board.diagnosed(attempt_, me, mine);
  events_->write("diagnose", -1, mine["ok"] ? "" : class_name(ErrorClass::kRuntime),
                 cat("self-check of node ", me, ": ", mine["detail"].get<std::string>()));
  const JobHistory history = history_of(board, plan_, cfg_, s_.max_restarts, job_, attempt_ + 1);
  // This agent's view: each node that leaves, and why (the policy's decision on its fault).
  nlohmann::json leave = nlohmann::json::object();
  auto evict = [&](const FaultRecord& f) {
    const Decision d = decide(history, f);
    if (d.action == Action::kEvict && d.node >= 0 && !leave.contains(std::to_string(d.node)))
      leave[std::to_string(d.node)] = d.why;
  };
  const double deadline = comm::steady_now_s() + 120;
  for (int m = 0; m < plan_.nnodes; ++m)
    for (;;) {
      if (std::optional<nlohmann::json> d = board.diagnosis(attempt_, m)) {
        if (!d->value("ok", false))
          evict({FaultKind::kDiag, ErrorClass::kRuntime, -1, m, -1, cat("its self-check failed: ", d->value("detail", ""))});
        break;
      }
      if (std::optional<std::string> e = ended_since(board, attempt_)) {
        leaving_ = Leaving{cat("the job ended meanwhile (", *e, ")"), false, *e == "done"};
        return Phase::kEnd;
      }
      if (!board.heartbeat(cat("node", m))) {
        evict({FaultKind::kLost, ErrorClass::kRuntime, -1, m, -1, "lost: its agent's heartbeat stopped"});
        break;
      }
      if (comm::steady_now_s() > deadline) {
        evict({FaultKind::kDiag, ErrorClass::kRuntime, -1, m, -1, "no self-check result within 120 s"});
        break;
      }
      beat("checking");
      pause(*launcher_, 0.2);
    }
  const Decision& d = cause_.decision;
  if (d.action == Action::kEvict && d.node >= 0 && !leave.contains(std::to_string(d.node)))
    leave[std::to_string(d.node)] = d.why;
  leave_ = board.leave(attempt_, leave);  // the first view written stands for every agent
  if (leave_.empty()) return Phase::kRestart;
  if (!leave_.contains(std::to_string(me))) return Phase::kSettle;
  const std::string why = cat("node ", me, " (", s_.node_name, ") evicted: ", leave_[std::to_string(me)].get<std::string>());
  events_->write("evict", -1, "", why);
  board.block(s_.node_name, why);
  if (!fault_.evict_command.empty()) {
    std::string command = fault_.evict_command;
    for (auto [from, to] : {std::pair<std::string, std::string>{"{host}", host_name()}, {"{node}", std::to_string(me)},
                            {"{name}", s_.node_name}})
      for (size_t at = 0; (at = command.find(from, at)) != std::string::npos; at += to.size())
        command.replace(at, from.size(), to);
    const int rc = std::system(command.c_str());
    log::info("launch: evict command '", command, "' exited with ", rc);
  }
  leaving_ = Leaving{why, false};
  return Phase::kEnd;
}

// The leader (the lowest node rank that stays) fills the places of the nodes that leave as
// fill() decides: spares, a shrink of data parallelism, or the job's end; the others read its
// plan. Every agent applies it.
Agent::Phase Agent::settle() {
  JobBoard& board = *board_;
  const int me = plan_.node_rank;
  int leader = 0;
  while (leave_.contains(std::to_string(leader))) ++leader;
  Settlement settled;
  if (me == leader) {
    std::map<int, std::string> leave;  // node -> why it leaves
    for (const auto& [m, why] : leave_.items()) leave[std::stoi(m)] = why.get<std::string>();
    std::vector<int64_t> idle = board.idle_spares();
    JobHistory h = history_of(board, plan_, cfg_, s_.max_restarts, job_, attempt_ + 1);
    h.idle_spares = static_cast<int>(idle.size());
    const Decision filled = fill(h, static_cast<int>(leave.size()));
    std::map<int, int64_t> assigned;  // the spares that took places (one may leave meanwhile)
    if (filled.action == Action::kReplace) {
      size_t next = 0;
      for (const auto& [m, why] : leave)
        while (next < idle.size())
          if (board.assign_spare(idle[next++], m, attempt_ + 1)) {
            assigned[m] = idle[next - 1];
            break;
          }
    }
    h.idle_spares = 0;
    const Decision without = fill(h, static_cast<int>(leave.size()));
    settled = board.settle(attempt_, settle_places(leave, filled, assigned, without, plan_.nnodes, shrunk_dp_,
                                                   [&](int nodes) { return layout_on(cfg_, plan_, nodes).dp; }));
  } else {
    std::optional<Settlement> p = wait_for_plan(board, *launcher_, attempt_, [&] { beat_checking("checking"); });
    if (!p) {
      leaving_ = Leaving{cat("the job's leader, node ", leader, ", decided nothing within 120 s"), true};
      return Phase::kEnd;
    }
    settled = *p;
  }
  for (const auto& [m, why] : leave_.items()) {
    const auto spare = settled.spares.find(std::stoi(m));
    events_->write("evict", -1, "",
                   cat("node ", m, " evicted: ", why.get<std::string>(),
                       spare != settled.spares.end() ? cat("; spare ", spare->second, " takes its place") : std::string()),
                   std::stoi(m));
  }
  if (!settled.error.empty()) {
    leaving_ = Leaving{settled.error, true};
    return Phase::kEnd;
  }
  if (settled.shrinks()) {
    shrunk_dp_ = settled.dp;
    const int was = plan_.nnodes;
    plan_.node_rank = static_cast<int>(std::find(settled.stay.begin(), settled.stay.end(), me) - settled.stay.begin());
    plan_.nnodes = static_cast<int>(settled.stay.size());
    plan_.world_size = plan_.nnodes * plan_.nproc_per_node;
    plan_.command.insert(plan_.command.end(), {"--set", cat("parallel.dp=", shrunk_dp_)});
    events_->write("evict", -1, "", cat("no spare: the job goes on on ", plan_.nnodes, " of its ", was,
                                        " nodes, data parallelism ", shrunk_dp_,
                                        ", the same global batch; this node is now node ", plan_.node_rank));
  }
  return Phase::kRestart;
}

Agent::Phase Agent::restart() {
  ++job_.restarts;
  next_attempt_ = attempt_ + 1;
  // The restarted attempt resumes from the latest committed checkpoint by itself.
  if (!restarted_) plan_.command.insert(plan_.command.end(), {"--resume", "auto"});
  restarted_ = true;
  restarting_ = cat("restart ", job_.restarts, " of ", s_.max_restarts, " after ", failed_,
                    "; resuming from the latest committed checkpoint");
  if (cause_.decision.action == Action::kSkipStep) {
    apply_skips();
    events_->write("diagnose", cause_.fault.rank, "", cause_.decision.why, cause_.fault.node);
  }
  return Phase::kClaim;
}

int Agent::end() {
  const RunResult& r = result_;
  if (leaving_ && leaving_->finished) {  // a fault at the job's very end: another node finished it
    log::info("launch: ", leaving_->why);
    failed_.clear();
  } else if (leaving_) {
    // An evicted node leaves; a job that cannot go on ends (its spares then leave too).
    if (leaving_->job_ends) board_->end({{"attempt", attempt_}, {"status", leaving_->why}});
    std::fprintf(stderr, "myriad: launch: %s; logs in %s\n", leaving_->why.c_str(), plan_.log_dir.c_str());
    return exit_code(ErrorClass::kRuntime);
  }
  if (r.preempted) {
    if (board_) {
      try {
        board_->end({{"attempt", std::stoll(plan_.attempt)}, {"status", "preempted"}});
      } catch (const Error&) {  // the spares then leave when their wait ends
      }
    }
    // Trainers answer a preemption by saving and exiting preempted; anything else (a worker that
    // does not save, one killed after the grace period) ended without a save of its own.
    const auto unsaved = std::find_if(r.exits.begin(), r.exits.end(), [](const WorkerExit& x) {
      return !x.ok() && x.error_class() != ErrorClass::kPreempted;
    });
    const std::string by = r.signal != 0 ? cat(" (", signal_name(r.signal), ")") : "";
    if (r.failure)
      std::fprintf(stderr, "myriad: launch: preempted%s, and rank %d %s; logs in %s\n", by.c_str(), r.failure->rank,
                   r.failure->describe().c_str(), plan_.log_dir.c_str());
    else if (unsaved != r.exits.end())
      std::fprintf(stderr, "myriad: launch: preempted%s: rank %d %s without saving; logs in %s\n", by.c_str(),
                   unsaved->rank, unsaved->describe().c_str(), plan_.log_dir.c_str());
    else
      std::fprintf(stderr, "myriad: launch: preempted%s: the workers stopped, each after saving its step unless its "
                   "grace ran out; launch again with --resume auto to continue from the latest committed checkpoint; "
                   "logs in %s\n", by.c_str(), plan_.log_dir.c_str());
    return r.exit_code();
  }
  if (!failed_.empty() && (r.failure || r.signal == 0)) {
    std::fprintf(stderr, "myriad: launch: %s; logs in %s\n", failed_.c_str(), plan_.log_dir.c_str());
    return exit_code(failed_class_);
  }
  if (r.signal != 0) {
    std::fprintf(stderr, "myriad: launch: %s received, the workers were stopped (%s); logs in %s\n",
                 signal_name(r.signal).c_str(), class_name(ErrorClass::kRuntime), plan_.log_dir.c_str());
    return r.exit_code();
  }
  log::info("launch: all ", plan_.nproc_per_node, " worker(s) exited with code 0 in ",
            static_cast<int64_t>(r.seconds * 1000), " ms");
  // A run directory nobody asked for is kept only when its logs tell of a failure.
  if (s_.temporary_run_dir) {
    std::error_code ec;
    std::filesystem::remove_all(plan_.run_dir, ec);
  }
  return 0;
}

}  // namespace

int run_agent(AgentSettings settings) { return Agent(std::move(settings)).run(); }

}  // namespace myriad::driver
