// The fault-tolerance policy (driver/policy.h): one row per fault class and history, as the
// schedule simulator's tests take one row per schedule.
#include "driver/policy.h"

#include <gtest/gtest.h>

namespace myriad::driver {
namespace {

FaultRecord fault(FaultKind kind, int node, int rank, int64_t step = -1, ErrorClass cls = ErrorClass::kRuntime) {
  FaultRecord f;
  f.kind = kind, f.node = node, f.rank = rank, f.step = step, f.cls = cls;
  f.detail = cat(kind_name(kind), " on rank ", rank);
  return f;
}

// A job of `nnodes` with `restarts` of 10 made and nothing else yet.
JobHistory job(int nnodes, int64_t restarts = 0) {
  JobHistory h;
  h.nnodes = nnodes, h.restarts = restarts, h.max_restarts = 10, h.evict_after = 3;
  h.shrink_refused = [nnodes](int gone) { return nnodes - gone >= 2 ? "" : "1 node cannot hold tp x pp of 8"; };
  return h;
}

JobHistory with_past(JobHistory h, std::vector<FaultRecord> past, bool nodes_changed_after_first = false) {
  for (size_t i = 0; i < past.size(); ++i) h.past.push_back({past[i], i == 0 && nodes_changed_after_first});
  return h;
}

struct Row {
  const char* name;
  JobHistory history;
  FaultRecord fault;
  Action action;
  int node = -1;        // kEvict: who leaves
  int64_t step = -1;    // kSkipStep / kRerunCheck
  const char* why = "";  // a part of the reason that must show
};

TEST(Policy, DecidesEveryFaultClassAndHistory) {
  FaultRecord loss7 = fault(FaultKind::kLoss, 0, 1, 7, ErrorClass::kNumerics);
  FaultRecord sdc6 = fault(FaultKind::kSdc, 1, 2, 6);
  FaultRecord crash_n1 = fault(FaultKind::kCrash, 1, 2);
  FaultRecord straggler = fault(FaultKind::kStraggler, 1, 3);
  straggler.evict = true;
  JobHistory loss_seen = job(2);
  loss_seen.last_loss_step = 7;
  JobHistory loss_skipped = loss_seen;
  loss_skipped.skipped = {7};
  const std::vector<Row> rows = {
      {"a crash restarts", job(1), fault(FaultKind::kCrash, 0, 1), Action::kRestart},
      {"a kill on several nodes restarts", job(4), crash_n1, Action::kRestart},
      {"a hang restarts", job(1), fault(FaultKind::kHang, 0, 1), Action::kRestart},
      {"a stall restarts", job(2), fault(FaultKind::kStall, 0, 0), Action::kRestart},
      {"a comm fault restarts", job(2), fault(FaultKind::kComm, 0, 0, -1, ErrorClass::kComm), Action::kRestart},
      {"bad input stops", job(2), fault(FaultKind::kCrash, 0, 0, -1, ErrorClass::kInput), Action::kStop, -1, -1,
       "input error"},
      {"a bug stops", job(2), fault(FaultKind::kCrash, 0, 0, -1, ErrorClass::kInternal), Action::kStop, -1, -1,
       "internal error"},
      {"the budget spent stops", job(2, 10), crash_n1, Action::kStop, -1, -1, "10 restart(s)"},
      {"a first loss fault restarts", job(2), loss7, Action::kRestart},
      {"a loss fault at another step restarts", [] { JobHistory h = job(2); h.last_loss_step = 5; return h; }(), loss7,
       Action::kRestart},
      {"a loss fault recurring on the replay skips its step", loss_seen, loss7, Action::kSkipStep, -1, 7, "recurred"},
      {"a loss fault at a step skipped already restarts", loss_skipped, loss7, Action::kRestart},
      {"a loss fault counts for no node", with_past(job(2), {loss7, loss7}), loss7, Action::kRestart},
      {"a first sdc reruns the check", job(2), sdc6, Action::kRerunCheck, -1, 6, "rank 2"},
      {"an sdc again at the same step and rank evicts", with_past(job(2), {sdc6}), sdc6, Action::kEvict, 1, -1,
       "persistent"},
      {"an sdc again on one node stops", with_past(job(1), {fault(FaultKind::kSdc, 0, 1, 6)}),
       fault(FaultKind::kSdc, 0, 1, 6), Action::kStop, -1, -1, "faulty device"},
      {"an sdc at another step reruns", with_past(job(2), {fault(FaultKind::kSdc, 1, 2, 4)}), sdc6,
       Action::kRerunCheck, -1, 6},
      {"an sdc of another rank reruns", with_past(job(2), {fault(FaultKind::kSdc, 1, 3, 6)}), sdc6,
       Action::kRerunCheck, -1, 6},
      {"an sdc again after the nodes changed reruns", with_past(job(2), {sdc6}, true), sdc6, Action::kRerunCheck, -1,
       6},
      {"a persistent sdc with the budget spent stops", with_past(job(2, 10), {sdc6}), sdc6, Action::kStop, -1, -1,
       "restart(s)"},
      {"a first sdc of a repeat culprit evicts it", with_past(job(2), {crash_n1, crash_n1}), sdc6, Action::kEvict, 1,
       -1, "the last 3 faults"},
      {"an evicting straggler evicts", job(2), straggler, Action::kEvict, 1},
      {"a failed self-check evicts", job(2), fault(FaultKind::kDiag, 1, -1), Action::kEvict, 1},
      {"a lost agent evicts", job(4), fault(FaultKind::kLost, 3, -1), Action::kEvict, 3},
      {"the third fault in a row of one node evicts it", with_past(job(2), {crash_n1, crash_n1}), crash_n1,
       Action::kEvict, 1, -1, "the last 3 faults"},
      {"the count stops at fault.evict_after", with_past(job(2), {crash_n1, crash_n1, crash_n1, crash_n1}), crash_n1,
       Action::kEvict, 1, -1, "the last 3 faults (fault.evict_after = 3)"},
      {"two in a row do not", with_past(job(2), {crash_n1}), crash_n1, Action::kRestart},
      {"another node's fault between breaks the run", with_past(job(2), {crash_n1, fault(FaultKind::kCrash, 0, 0)}),
       crash_n1, Action::kRestart},
      {"a change of nodes restarts the count", with_past(job(2), {crash_n1, crash_n1}, true), crash_n1,
       Action::kRestart},
      {"on one node a repeat culprit restarts in place", with_past(job(1), {fault(FaultKind::kCrash, 0, 1),
                                                                            fault(FaultKind::kCrash, 0, 1)}),
       fault(FaultKind::kCrash, 0, 1), Action::kRestart},
  };
  for (const Row& row : rows) {
    const Decision d = decide(row.history, row.fault);
    EXPECT_EQ(action_name(d.action), std::string(action_name(row.action))) << row.name << ": " << d.why;
    if (row.action == Action::kEvict) {
      EXPECT_EQ(d.node, row.node) << row.name;
    }
    if (row.step >= 0) {
      EXPECT_EQ(d.step, row.step) << row.name;
    }
    EXPECT_NE(d.why.find(row.why), std::string::npos) << row.name << ": " << d.why;
  }
}

// The record of a persistent corruption says so, on one node with what to do.
TEST(Policy, APersistentCorruptionIsNamed) {
  const FaultRecord sdc = fault(FaultKind::kSdc, 0, 1, 6);
  EXPECT_EQ(persistent_corruption(with_past(job(1), {sdc}), sdc),
            "persistent: the rerun of step 6 corrupted it again; replace this node's faulty device");
  EXPECT_EQ(persistent_corruption(with_past(job(2), {sdc}), sdc), "persistent: the rerun of step 6 corrupted it again");
  EXPECT_EQ(persistent_corruption(job(1), sdc), "");
}

TEST(Policy, PlacesAreFilledBySparesForAllOrByShrinkingOrTheJobStops) {
  JobHistory h = job(4);
  EXPECT_EQ(fill(h, 0).action, Action::kRestart);
  h.idle_spares = 2;
  EXPECT_EQ(fill(h, 2).action, Action::kReplace);
  EXPECT_EQ(fill(h, 1).action, Action::kReplace);
  // Fewer spares than places: none is taken; the job shrinks when it can.
  h.idle_spares = 1;
  EXPECT_EQ(fill(h, 2).action, Action::kShrink);
  const Decision d = fill(h, 3);  // 1 node left cannot hold the groups
  EXPECT_EQ(d.action, Action::kStop);
  EXPECT_NE(d.why.find("no spare (myriad launch --spare) is there to take its place; 1 node cannot"), std::string::npos)
      << d.why;
}

// A decision travels in a stop record and reads back the same.
TEST(Policy, ADecisionReadsBackFromItsRecord) {
  const Decision d{Action::kRerunCheck, "rerun step 6", -1, 6, 2};
  EXPECT_EQ(decode_decision(nlohmann::json::parse(encode(d).dump())), d);
  EXPECT_EQ(decode_decision(nlohmann::json()).action, Action::kRestart);
}

// The leader's settlement, as the agents' settle phase computes it: spares for every place, a
// shrink when none took a place, or the job's end naming the node and why.
TEST(Policy, TheLeadersSettlementFillsThePlacesOrSaysWhyNot) {
  JobHistory h = job(4);
  const std::map<int, std::string> leave = {{1, "lost: its agent's heartbeat stopped"}, {3, "its self-check failed"}};
  auto dp_on = [](int nodes) { return int64_t(nodes) * 2; };
  h.idle_spares = 0;
  const Decision without = fill(h, 2);
  h.idle_spares = 2;
  const Decision with = fill(h, 2);
  // Both spares took their places: the layout stays.
  Settlement s = settle_places(leave, with, {{1, 7}, {3, 8}}, without, 4, 0, dp_on);
  EXPECT_EQ(s.spares, (std::map<int, int64_t>{{1, 7}, {3, 8}}));
  EXPECT_FALSE(s.shrinks());
  EXPECT_EQ(s.nnodes, 4);
  EXPECT_TRUE(s.error.empty());
  // The spares left before any took a place: the job shrinks to the nodes that stay, renumbered.
  s = settle_places(leave, with, {}, without, 4, 0, dp_on);
  EXPECT_EQ(s.stay, (std::vector<int>{0, 2}));
  EXPECT_EQ(s.nnodes, 2);
  EXPECT_EQ(s.dp, 4);
  // One took a place and the other left: no shrink around a spare, the job stops, naming why.
  s = settle_places(leave, with, {{1, 7}}, without, 4, 0, dp_on);
  EXPECT_NE(s.error.find("node 1 left the job (lost: its agent's heartbeat stopped) and no spare"), std::string::npos)
      << s.error;
  // No spare, no shrink (too few nodes left): the job stops with fill()'s reason.
  JobHistory small = job(2);
  const Decision stop = fill(small, 1);
  s = settle_places({{0, "evicted"}}, stop, {}, stop, 2, 0, dp_on);
  EXPECT_NE(s.error.find("node 0 left the job (evicted) and no spare"), std::string::npos) << s.error;
  // Nobody leaves: nothing changes.
  EXPECT_EQ(settle_places({}, fill(h, 0), {}, fill(h, 0), 4, 2, dp_on), (Settlement{{}, 4, 2, {}, ""}));
}

// A settlement travels through the job's store and reads back the same; a record in the
// earlier untyped form reads too; one that is not a settlement is an input error.
TEST(Policy, ASettlementReadsBackFromItsRecord) {
  const Settlement a{{{1, 7}}, 4, 0, {}, ""}, b{{}, 2, 4, {0, 2}, ""}, c{{}, 4, 0, {}, "node 1 left the job"};
  for (const Settlement& s : {a, b, c}) EXPECT_EQ(decode_settlement(nlohmann::json::parse(encode(s).dump())), s);
  EXPECT_EQ(decode_settlement(nlohmann::json::parse(R"({"spares": {}, "nnodes": 2, "dp": 4, "shrink": {"nodes": [0, 2], "dp": 4}})")),
            b);
  EXPECT_THROW(decode_settlement(nlohmann::json::parse(R"({"spares": 3})")), Error);
}

// The comm fault is the echo, one rule for the launcher and the agent.
TEST(Policy, ACommFaultMayBeAnEchoAndNothingElseIs) {
  EXPECT_TRUE(may_be_echo(fault(FaultKind::kComm, 0, 0, -1, ErrorClass::kComm)));
  EXPECT_FALSE(may_be_echo(fault(FaultKind::kCrash, 0, 0)));
  EXPECT_FALSE(may_be_echo(fault(FaultKind::kLoss, 0, 0, 3, ErrorClass::kNumerics)));
}

}  // namespace
}  // namespace myriad::driver
