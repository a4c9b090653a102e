// A worker's heartbeat to its launcher: a small file (MYRIAD_HEARTBEAT, set by `myriad launch`)
// rewritten every second by a thread of its own, one JSON object (core/worker_report.h's
// HeartbeatRecord, through its one encoder and decoder):
//
//   {"beat": 12, "step": 40, "phase": "backward", "allowance_s": 60, "own_ms": 51.2,
//    "step_ms": 53.0, "tokens_per_s": 9650, "steps_run": 3, "first_step": 38,
//    "first_step_unix_s": 1764835200.5,
//    "resumed_from": "runs/x/checkpoints/step_00000037",
//    "started":  {"group": "dp0", "op": "reduce_scatter", "seq": 88, "match": 85, "step": 41},
//    "finished": {"group": "tp0", "op": "all_reduce", "seq": 87, "match": 60, "step": 41},
//    "groups": [{"group": "tp0", "op": "all_reduce", "match": 60, "state": "done"}, ...]}
//
// - beat counts up each second; step is the last completed step; phase what the worker does now
//   (start, data, forward, backward, optimizer, eval, checkpoint: set_phase);
// - steps_run: the steps this process completed; first_step and first_step_unix_s: the first of
//   them and when (a restarted attempt's first productive step, seen however late the launcher
//   reads); resumed_from: the checkpoint it resumed from;
// - allowance_s: from allowance_from_s (the wall time of the last set()), how long the launcher may see step stand still before it calls the run hung;
// - own_ms: the median of the recent steps' own time, each step's wall time (from the end of the
//   one before) less the time it sat blocked on its peers; 0 until known. Ranks that wait for a
//   straggler show the wait as blocked time, the straggler shows it as its own;
// - started / finished: the operation this rank started last and the one it finished last, over
//   all its groups (seq: this rank's numbering in the group; match: what the group's members
//   share, the n-th collective, or the n-th message of a link);
// - groups: each group's last issued operation and its state. A rank waiting in a group's
//   operation #m whose peer has issued fewer than m there is waiting on that peer: the launcher
//   names the rank that holds a stalled job up (driver/hang_report.h).
//
// The flight record: on SIGUSR1 (the launcher's request before it stops a hung job), and when the
// worker fails (a collective timed out), it writes flight_rank_<R>.json beside the heartbeat:
// its step and phase, and for each group its members (global ranks) and last operations (seq,
// match, op, bytes, peer, step, state, times). `myriad hang-report` matches them (driver/
// hang_report.h).
//
// A process that is frozen (stopped, or gone) stops beating; one whose training is stuck (a hung
// collective, a stuck kernel) beats on with a step that does not move: the launcher tells the
// two apart by that. Without MYRIAD_HEARTBEAT it does nothing.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace myriad {

namespace comm {
class Communicator;
}

// What this process does now (a string literal), for the heartbeat: set by the step's code at
// each phase's start, from the thread that trains.
void set_phase(const char* phase);

class Heartbeat {
 public:
  // Reads MYRIAD_HEARTBEAT; until set() the beats allow `startup_s` before the first step.
  explicit Heartbeat(double startup_s);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // The last completed step and how long the next may take, from now (an evaluation or a save
  // after the step does not eat into the next step's allowance).
  void set(int64_t step, double allowance_s);
  void set_own_ms(double ms) { own_ms_ = ms; }
  void set_rate(double step_ms, double tokens_per_s) { step_ms_ = step_ms, tokens_per_s_ = tokens_per_s; }
  // Step `step` trained to its end (not a skipped one): counts it; the process's first is kept.
  void step_done(int64_t step);
  void set_resumed_from(const std::string& checkpoint);
  // The groups whose operation records the beats report; they must outlive the heartbeat, or be
  // replaced (an empty list) before they go.
  void watch(std::vector<comm::Communicator*> groups);
  // Writes the flight record now (a failing worker, before it exits).
  void dump_flight_record();
  // The node-shared batch (data/shared_batch.h) as one more group, `group` of `members`: its
  // reader publishes step S (op "publish"), the others wait to take it ("take", done once taken).
  // A rank waiting for a batch its reader never published waits on that reader.
  void set_batch(const std::string& group, const std::vector<int>& members, int64_t step, const char* op, bool done);

 private:
  void beat();
  std::string path_, flight_path_;
  std::atomic<int64_t> step_{0}, beats_{0};
  std::atomic<double> allowance_s_{0}, allowance_from_s_{0}, own_ms_{0}, step_ms_{0}, tokens_per_s_{0},
      first_step_unix_s_{0};
  std::atomic<int64_t> steps_run_{0}, first_step_{-1};
  std::string resumed_from_;     // guarded by groups_mu_
  std::mutex groups_mu_;
  std::vector<comm::Communicator*> groups_;
  struct Batch {
    std::string group;  // empty: no shared batch
    std::vector<int> members;
    int64_t step = 0;
    const char* op = "";
    bool done = true;
  } batch_;  // guarded by groups_mu_
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace myriad
