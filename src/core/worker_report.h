// What a worker tells its launcher, as typed records: its heartbeat while it runs (written each
// second by runtime/heartbeat.cc), and its fault record when it fails (written by the CLI as
// the process exits). One encoder and one decoder each; the driver decides from these records
// and never from a worker's log text (docs/ARCHITECTURE.md, "The driver").
//
// The files live in RUN_DIR/driver/, at the paths the launcher gives each worker:
//   MYRIAD_HEARTBEAT     heartbeat_rank_<R>         (rewritten whole each beat, renamed into place)
//   MYRIAD_FAULT_RECORD  fault_rank_<R>.json        (written once, by a worker that fails)
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"

namespace myriad {

// What kind of fault: how it shows, which decides what the driver does about it (driver/policy.h).
enum class FaultKind {
  kCrash,      // a process ended on an error of its own, or was killed
  kHang,       // a process froze: its heartbeat stopped (stopped, stuck in the kernel)
  kStall,      // every rank beats on and none completes a step (a hung collective, a stuck kernel)
  kLoss,       // the loss is not finite, or a spike (fault.spike_factor)
  kSdc,        // silent data corruption: a replica's parameters differ from what their update left
  kStraggler,  // a rank's own step time far above the job's median
  kComm,       // a collective failed or timed out: most often the echo of another fault
  kDiag,       // a node's self-check failed
  kLost,       // a node's agent stopped beating
};
const char* kind_name(FaultKind k);
// The kind of kind_name(k); nullopt for a name it does not know.
std::optional<FaultKind> kind_from_name(const std::string& name);

struct FaultRecord {
  FaultKind kind = FaultKind::kCrash;
  ErrorClass cls = ErrorClass::kRuntime;
  int rank = -1;       // the rank it is about (an sdc: the rank whose copy differed); -1: a node's
  int node = -1;       // the node it is about; -1: not known yet (the agent fills it)
  int64_t step = -1;   // the step it struck (a loss fault's, an sdc's); -1: none named
  std::string detail;  // one line, for people
  bool evict = false;  // the fault names a node to leave the job (a straggler, a persistent sdc)
  bool operator==(const FaultRecord&) const = default;
};
nlohmann::json encode(const FaultRecord& f);
// Throws Error(kInput) naming the field that is missing or of the wrong type.
FaultRecord decode_fault(const nlohmann::json& j);

// An error that knows its fault's kind and step: what the trainer throws for a loss fault or a
// corrupt replica, so that the record the CLI writes carries them.
class FaultError : public Error {
 public:
  FaultError(FaultKind kind, ErrorClass cls, int64_t step, const std::string& what, int rank = -1)
      : Error(cls, what), kind_(kind), step_(step), rank_(rank) {}
  FaultKind kind() const { return kind_; }
  int64_t step() const { return step_; }
  int rank() const { return rank_; }

 private:
  FaultKind kind_;
  int64_t step_;
  int rank_;
};
// The record of an error a process fails with, as rank `rank`: a FaultError's kind and step, a
// communication fault's kComm, anything else kCrash.
FaultRecord fault_of(const Error& e, int rank);
// The fault record of a non-finite loss at `step`: the one wording of it.
FaultError nonfinite_loss(int64_t step, double loss);

// Writes a record whole (a temporary file renamed into place); false when it cannot.
bool write_record(const std::string& path, const nlohmann::json& j);
// A fault record from its file; nullopt when absent or not a record.
std::optional<FaultRecord> read_fault_record(const std::string& path);

// One operation of a group, as a heartbeat names it (comm/communicator.h's records).
struct OpRef {
  std::string group, op;
  uint64_t seq = 0, match = 0;
  int64_t step = -1;  // -1: not within a step
  int peer = -1;      // -1: a collective
};
// A group's last issued operation and its state ("running", "done", ...).
struct GroupProgress {
  std::string group, op, state;
  uint64_t match = 0;
};

// A worker's heartbeat (runtime/heartbeat.h says what each field means).
struct HeartbeatRecord {
  int64_t beat = 0;
  int64_t step = -1;           // the last completed step
  std::string phase;           // what it does now: start, data, forward, backward, ...
  double allowance_s = 0;      // how long step may stand still before the run is stuck ...
  double allowance_from_s = 0; // ... counted from this wall time (Unix seconds; 0: from when step last moved)
  double own_ms = 0, step_ms = 0, tokens_per_s = 0;
  int64_t steps_run = 0;       // steps this process completed
  int64_t first_step = -1;     // the first of them (a restarted process's first productive step)
  double first_step_unix_s = 0;  // when it completed (Unix seconds); 0: none yet
  std::string resumed_from;    // the checkpoint it resumed from; empty: none
  std::optional<OpRef> started, finished;  // its last operation started, and finished
  std::vector<GroupProgress> groups;
  double age_s = -1;           // the launcher's: seconds since it last changed; -1: not said
};
nlohmann::json encode(const HeartbeatRecord& h);
// Fields it lacks keep their defaults; a field of the wrong type throws Error(kInput) naming it
// ("step must be an integer, got \"five\"").
HeartbeatRecord decode_heartbeat(const nlohmann::json& j);
// A heartbeat from its file; nullopt when absent, being written, or not a heartbeat.
std::optional<HeartbeatRecord> read_heartbeat(const std::string& path);

}  // namespace myriad
