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
