// A node's watch over its workers' heartbeats (core/worker_report.h), once a second:
// - a worker whose beat (one a second) stops is frozen: after kFrozen_s when the process is
//   stopped (SIGSTOP, state T), after kSilent_s whatever its state (stuck in the kernel, its
//   threads deadlocked or starved: a loaded machine can delay a beat by seconds, which must not
//   cost a restart). The culprit is killed with SIGKILL, which fails the attempt the usual way:
//   a kHang fault;
// - workers that beat on but none of which completes a step within its allowance are stuck
//   together (a hung collective, a stuck kernel): all are stopped, a kStall fault. The culprit is
//   the rank the others wait for in their groups (driver/hang_report.h), from this node's
//   heartbeats and, in a job of several nodes, the other nodes' (`remote`, which their agents
//   publish);
// - a rank whose own step time is over fault.straggler_factor x the median of the job's ranks,
//   and fault.straggler_margin_ms more, is a straggler: a kStraggler fault, reported.
// Workers that never beat (comm-check) are not watched. Detection does not wait for a
// collective's timeout.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/worker_report.h"
#include "driver/hang_report.h"
#include "driver/launcher.h"

namespace myriad::driver {

struct HangWatch {
  // A stopped process cannot beat by itself, so 2 missed beats are proof enough; a running one
  // on a loaded machine can miss several (docs/RELIABILITY.md).
  static constexpr double kFrozen_s = 2, kSilent_s = 30;
  struct Rank {
    int rank = 0;
    int index = -1;  // the launcher's worker index
    std::string path;
    long long beat = -1, step = -1;
    double beat_at = 0, step_at = 0;
    double waited = 0;  // seconds its allowance has run (at the last look)
    std::optional<HeartbeatRecord> last;  // its last heartbeat, as read
    bool straggler = false;               // reported in this attempt
    // Since when its steps have been over the thresholds without a break (steady clock; 0: they
    // are not), against this node's ranks [0] and against the job's [1].
    double over_since[2] = {0, 0};
  };
  // A straggler's thresholds (fault.straggler_factor, fault.straggler_margin_ms). A rank is one
  // only once its heartbeat's median own time spans kMinSteps steps and has stayed over both for
  // kSustain_s: on a loaded machine a rank starved for a moment, or a restarted attempt's first
  // slow steps, must not cost a node its place.
  double slower = 2, margin_ms = 50;
  static constexpr int64_t kMinSteps = 6;
  static constexpr double kSustain_s = 2;

  HangWatch(Launcher& l, const std::string& run_dir);
  // Watches rank `rank`, the launcher's worker `index`; returns the path of its heartbeat (its
  // MYRIAD_HEARTBEAT), after removing the last attempt's heartbeat, flight and fault records and
  // any fault injected for it that it did not take.
  std::string add(int rank, int index);
  std::filesystem::path flight_path(int rank) const { return dir / cat("flight_rank_", rank, ".json"); }
  std::filesystem::path fault_path(int rank) const { return dir / cat("fault_rank_", rank, ".json"); }
  // Where a chaos run injects faults into the rank while it runs (core/fault.h's live injection).
  std::filesystem::path inject_path(int rank) const { return dir / cat("inject_rank_", rank); }
  // Asks every running worker of this node for its flight record (SIGUSR1: runtime/heartbeat.h)
  // and waits for those that can answer, up to kAnswer_s; `except` (a stopped rank) cannot.
  static constexpr double kAnswer_s = 10;
  void request_flight_records(int except = -1);
  // What this node's workers said last, each with its rank, for the job's heartbeat.
  nlohmann::json workers() const;
  // On one node, the hang report from the flight records (RUN_DIR/hang_report.txt and .json);
  // across nodes the other nodes' records come later: `myriad hang-report RUN_DIR` then.
  std::optional<HangReport> report();
  // Reads every heartbeat (of ended workers too): what each rank said last.
  void read_all();
  // One look: reads the heartbeats, and on a hang or stall sets `fault` and acts (see above).
  void operator()();
  // Against the own step times of this node's ranks, or of `population` (every rank of the job:
  // the agents share theirs through the store).
  void find_stragglers(std::vector<double> population = {});

  Launcher& launcher;
  std::filesystem::path dir;
  std::vector<Rank> ranks;
  nlohmann::json remote = nlohmann::json::array();  // the other nodes' workers (a supervised job)
  bool whole_job = true;  // this node runs every rank of the job (its flight records tell all)
  std::optional<FaultRecord> fault;  // the hang or stall found (the first)
  std::vector<FaultRecord> stragglers;  // found, for the caller to record (then cleared)

 private:
  bool read(Rank& r, double now);
};

}  // namespace myriad::driver
