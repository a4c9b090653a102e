// Who holds a stalled job up, from the groups' progress in the workers' heartbeats.
#include "driver/hang_report.h"

#include <gtest/gtest.h>

namespace myriad::driver {
namespace {

nlohmann::json op(const std::string& group, uint64_t match, const std::string& state) {
  return {{"group", group}, {"op", "all_reduce"}, {"match", match}, {"state", state}};
}

// dp 2 x tp 2: rank 1's training thread stopped after finishing its step. Its tensor-parallel
// peer (rank 0) waits for it in tp0; rank 3 waits for it in dp1; rank 2 waits in dp0 for rank 0,
// which itself waits: the chain ends at rank 1.
TEST(HangReport, TheRankEveryChainEndsAtIsNamed) {
  const nlohmann::json workers = {
      {{"rank", 0}, {"step", 5}, {"phase", "forward"}, {"groups", {op("tp0", 61, "running"), op("dp0", 8, "done")}}},
      {{"rank", 1}, {"step", 5}, {"phase", "data"}, {"groups", {op("tp0", 60, "done"), op("dp1", 8, "done")}}},
      {{"rank", 2}, {"step", 5}, {"groups", {op("tp1", 70, "done"), op("dp0", 9, "running")}}},
      {{"rank", 3}, {"step", 5}, {"groups", {op("tp1", 70, "done"), op("dp1", 9, "queued")}}}};
  const std::optional<Holdup> h = find_holdup(workers);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->rank, 1);
  EXPECT_NE(h->detail.find("rank 0 in tp0's all_reduce #61"), std::string::npos) << h->detail;
  EXPECT_NE(h->detail.find("rank 3 in dp1's all_reduce #9"), std::string::npos) << h->detail;
  EXPECT_NE(h->detail.find("phase data"), std::string::npos) << h->detail;
}

// Everyone waits on someone (operations issued in different orders): no single culprit.
TEST(HangReport, ADeadlockHasNoCulprit) {
  const nlohmann::json workers = {
      {{"rank", 0}, {"groups", {op("a", 5, "running"), op("b", 3, "done")}}},
      {{"rank", 1}, {"groups", {op("a", 4, "done"), op("b", 4, "running")}}}};
  EXPECT_FALSE(find_holdup(workers));
}

// All done, or all waiting in the same operation (a slow network): nobody is late.
TEST(HangReport, NobodyLateNobodyNamed) {
  EXPECT_FALSE(find_holdup(nlohmann::json::array()));
  const nlohmann::json same = {{{"rank", 0}, {"groups", {op("w", 7, "running")}}},
                               {{"rank", 1}, {"groups", {op("w", 7, "running")}}}};
  EXPECT_FALSE(find_holdup(same));
}

// Two ranks stuck apart: the report does not guess between them.
TEST(HangReport, TwoRanksHeldUpApartAreNotGuessed) {
  const nlohmann::json workers = {
      {{"rank", 0}, {"groups", {op("g0", 2, "running")}}}, {{"rank", 1}, {"groups", {op("g0", 1, "done")}}},
      {{"rank", 2}, {"groups", {op("g1", 2, "running")}}}, {{"rank", 3}, {"groups", {op("g1", 1, "done")}}}};
  EXPECT_FALSE(find_holdup(workers));
}

}  // namespace
}  // namespace myriad::driver

namespace myriad::driver {
namespace {

nlohmann::json rec(uint64_t seq, uint64_t match, const std::string& op, int64_t bytes, const std::string& state) {
  return {{"seq", seq}, {"match", match}, {"op", op}, {"bytes", bytes}, {"state", state}};
}

// Flight records: rank 3 left none (stopped); ranks 1 and 2 wait for it in dp1 and on the
// pipeline link it feeds; rank 0 waits for rank 1. Rank 3 alone holds the job up.
TEST(HangReport, ARankWithoutARecordIsTheOneWaitedFor) {
  const nlohmann::json ranks = {
      {{"rank", 0}, {"step", 6}, {"phase", "forward"},
       {"groups", {{{"group", "tp0"}, {"members", {0, 1}}, {"records", {rec(1, 1, "all_reduce", 64, "done"),
                                                                         rec(2, 2, "all_reduce", 64, "running")}}}}}},
      {{"rank", 1}, {"step", 6}, {"phase", "backward"},
       {"groups", {{{"group", "tp0"}, {"members", {0, 1}}, {"records", {rec(1, 1, "all_reduce", 64, "done")}}},
                   {{"group", "dp1"}, {"members", {1, 3}}, {"records", {rec(2, 5, "reduce_scatter", 32, "running")}}}}}},
      {{"rank", 2}, {"step", 6}, {"phase", "forward"},
       {"groups", {{{"group", "pp0.act.1to0"}, {"members", {3, 2}}, {"records", {rec(3, 9, "recv", 128, "queued")}}}}}}};
  const HangReport r = analyze_hang(ranks);
  ASSERT_EQ(r.culprits, std::vector<int>{3});
  EXPECT_NE(r.findings[0].find("rank 3 (it left no record: stopped or gone) holds the job up: "), std::string::npos)
      << r.findings[0];
  EXPECT_NE(r.findings[0].find("rank 1 in dp1's reduce_scatter #5"), std::string::npos) << r.findings[0];
  EXPECT_NE(r.findings[0].find("rank 2 in pp0.act.1to0's recv #9"), std::string::npos) << r.findings[0];
  EXPECT_TRUE(r.mismatches.empty());
  EXPECT_EQ(r.json()["culprits"], nlohmann::json::array({3}));
}

// The same operation number with different sizes in one group: a mismatch (a send and its
// receive of equal size are not one).
TEST(HangReport, DifferentSizesAtOneNumberAreAMismatch) {
  const nlohmann::json ranks = {
      {{"rank", 0}, {"groups", {{{"group", "dp0"}, {"members", {0, 1}}, {"records", {rec(1, 7, "all_reduce", 4096, "running")}}},
                                {{"group", "l"}, {"members", {0, 1}}, {"records", {rec(2, 1, "send", 8, "done")}}}}}},
      {{"rank", 1}, {"groups", {{{"group", "dp0"}, {"members", {0, 1}}, {"records", {rec(1, 7, "all_reduce", 2048, "running")}}},
                                {{"group", "l"}, {"members", {0, 1}}, {"records", {rec(2, 1, "recv", 8, "done")}}}}}}};
  const HangReport r = analyze_hang(ranks);
  EXPECT_TRUE(r.culprits.empty());
  ASSERT_EQ(r.mismatches.size(), 1u);
  EXPECT_EQ(r.mismatches[0], "group dp0, operation #7: rank 0 all_reduce of 4096 bytes; rank 1 all_reduce of 2048 bytes");
  EXPECT_NE(r.text().find("mismatch: group dp0"), std::string::npos) << r.text();
}

}  // namespace
}  // namespace myriad::driver
