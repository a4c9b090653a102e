// The fault-tolerance policy of a supervised job (`myriad launch --max-restarts N`): what the job
// does about a fault, decided from the fault's typed record (core/worker_report.h) and the job's
// history alone. Pure functions, so that a table of cases tests them (tests/unit/driver/
// policy_test.cc); the agent (driver/agent.h) carries the decisions out.
//
//   decide(history, fault) -> restart | skip a step | rerun a check | evict | stop
//   fill(history, leaving) -> replace by spares | shrink data parallelism | stop
//
// The rules:
// - bad input fails the same way every time, and a bug is no fault of the machine: stop;
// - the restart budget spent: stop;
// - a loss fault (NaN, spike) at the step of the last one recurred on the replay: the data, not
//   a machine; restart skipping that step's batch (train.skip_steps);
// - silent data corruption: restart and rerun the check at that step on that rank; corrupt again
//   there, its device is faulty: its node leaves (on one node the job stops);
// - a straggler (fault.evict_stragglers), a failed self-check, a lost agent: the node leaves;
// - on several nodes, the culprit of the last fault.evict_after faults in a row (counted since
//   the job's nodes last changed; a loss fault counts for no node): its node leaves;
// - anything else: restart from the latest committed checkpoint.
// Nodes that leave are replaced by spares when there are enough for all, else the job shrinks
// its data parallelism when the ranks left hold whole tensor x pipeline groups, else it stops.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/worker_report.h"

namespace myriad::driver {

// A communication fault is most often the echo of a peer's own failure (its groups aborted):
// before one is taken for the cause, the cause is given this long to show.
constexpr double kEchoWait_s = 3.0;
inline bool may_be_echo(const FaultRecord& f) { return f.kind == FaultKind::kComm || f.cls == ErrorClass::kComm; }

// What happened to the job so far, as the agents share it through the store.
struct JobHistory {
  int nnodes = 1;
  int64_t restarts = 0, max_restarts = 0;  // made so far, and allowed
  int64_t evict_after = 3;                 // fault.evict_after
  struct Past {
    FaultRecord fault;            // why an earlier attempt stopped
    bool nodes_changed = false;   // a spare took a place, or the job shrank, after it
  };
  std::vector<Past> past;         // the earlier attempts', oldest first
  std::vector<int64_t> skipped;   // steps the job skips already
  int64_t last_loss_step = -1;    // the step of the last loss fault (-1: none)
  int idle_spares = 0;            // spares waiting for a place
  // Why the job cannot go on without `gone` of its nodes ("" when it can: the ranks left hold
  // whole tensor x pipeline groups and split the global batch).
  std::function<std::string(int gone)> shrink_refused;
};

enum class Action { kRestart, kSkipStep, kRerunCheck, kEvict, kReplace, kShrink, kStop };
const char* action_name(Action a);

struct Decision {
  Action action = Action::kRestart;
  std::string why;     // one line: why this action
  int node = -1;       // kEvict: the node that leaves
  int64_t step = -1;   // kSkipStep: the step skipped; kRerunCheck: the step rerun
  int rank = -1;       // kRerunCheck: the rank whose replica is checked again
  bool operator==(const Decision&) const = default;
};

// A decision as a stop record carries it, and back (an unknown action reads as restart).
nlohmann::json encode(const Decision& d);
Decision decode_decision(const nlohmann::json& j);

Decision decide(const JobHistory& history, const FaultRecord& fault);
// A corrupt replica corrupt again on the rerun of its step, with the job's nodes unchanged
// since: "persistent: the rerun of step S corrupted it again" (on one node, "; replace this
// node's faulty device" more), for the fault's record; "" when it is not.
std::string persistent_corruption(const JobHistory& history, const FaultRecord& fault);
// How the places of `leaving` nodes are filled.
Decision fill(const JobHistory& history, int leaving);

// The leader's plan after an attempt (the job board's plan/<A>): how the places of the nodes
// that leave are filled, and the layout the next attempt runs. One encoder and decoder, as
// Decision's.
struct Settlement {
  std::map<int, int64_t> spares;  // node -> the spare that takes its place
  int nnodes = 0;                 // nodes in the next attempt
  int64_t dp = 0;                 // its data parallelism (0: the config's)
  std::vector<int> stay;          // a shrink: the nodes that stay, in order (their new ranks); empty: none
  std::string error;              // the job cannot go on, and why ("": it goes on)
  bool shrinks() const { return !stay.empty(); }
  bool operator==(const Settlement&) const = default;
};
nlohmann::json encode(const Settlement& s);
// An input error naming what is wrong when `j` is not a settlement.
Settlement decode_settlement(const nlohmann::json& j);

// The settlement, from what the leader learned: `leave` (node -> why it leaves), `filled`
// (fill() with the spares that were idle), `assigned` (the spares that took places, node ->
// spare, as the board gave them: a spare may leave meanwhile), `without` (fill() with no spare,
// used when none took a place), the job's nodes and data parallelism now, and `dp_on(n)`, the
// data parallelism on n nodes.
Settlement settle_places(const std::map<int, std::string>& leave, const Decision& filled,
                         const std::map<int, int64_t>& assigned, const Decision& without, int nnodes, int64_t dp,
                         const std::function<int64_t(int nodes)>& dp_on);

}  // namespace myriad::driver
