#include "comm/rendezvous.h"

#include <gtest/gtest.h>

#include "comm_test_util.h"

using namespace myriad;
using namespace myriad::comm;
using namespace myriad::comm::testing;

namespace {

class RendezvousTest : public ::testing::TestWithParam<std::string> {
 public:
  static void SetUpTestSuite() { redis_ = new LocalRedis(); }
  static void TearDownTestSuite() {
    delete redis_;
    redis_ = nullptr;
  }

 protected:
  std::string url() const {
    return GetParam() == "redis" ? redis_->url(job_) : "file://" + dir_.path() + "/" + job_;
  }

  static LocalRedis* redis_;
  TempDir dir_;
  std::string job_ = unique_job("rdv");
};
LocalRedis* RendezvousTest::redis_ = nullptr;

// 8 ranks in 2 x 4: world, tp (consecutive pairs), dp (strided).
std::vector<GroupSpec> groups_of(int r) {
  return {{"world", r, 8}, {cat("tp", r / 2), r % 2, 2}, {cat("dp", r % 2), r / 2, 4}};
}
std::vector<std::string> payloads_of(int r) {
  std::vector<std::string> p;
  for (const GroupSpec& g : groups_of(r))
    p.push_back(g.rank == 0 ? cat("id of ", g.name, " from ", r) : "");
  return p;
}

TEST_P(RendezvousTest, EveryMemberGetsItsLeadersIdsInTwoRoundTrips) {
  run_ranks(8, [&](int r) {
    auto s = make_store(url(), "0", 10);
    std::vector<std::string> ids = exchange_ids(*s, groups_of(r), payloads_of(r));
    ASSERT_EQ(ids.size(), 3u);
    EXPECT_EQ(ids[0], "id of world from 0");
    EXPECT_EQ(ids[1], cat("id of tp", r / 2, " from ", r / 2 * 2));
    EXPECT_EQ(ids[2], cat("id of dp", r % 2, " from ", r % 2));
    EXPECT_EQ(s->stats().round_trips, 2);
  });
}

TEST_P(RendezvousTest, AMissingMemberIsNamedInTheTimeout) {
  // Ranks 0..6 of 8 arrive; rank 7 never does.
  run_ranks(7, [&](int r) {
    auto s = make_store(url(), "0", 1.0);
    std::string what =
        error_of(ErrorClass::kComm, [&] { exchange_ids(*s, groups_of(r), payloads_of(r)); });
    EXPECT_NE(what.find("group 'world': 7 of 8 members arrived"), std::string::npos) << what;
    if (r % 2 == 1) {
      EXPECT_NE(what.find("group 'dp1': 3 of 4 members arrived"), std::string::npos) << what;
    }
  });
}

TEST_P(RendezvousTest, ManyRanksMultiplexedOnFewThreads) {
  constexpr int kRanks = 256;  // tp 8 x dp 32
  auto groups = [](int r) {
    return std::vector<GroupSpec>{
        {"world", r, kRanks}, {cat("tp", r / 8), r % 8, 8}, {cat("dp", r % 8), r / 8, 32}};
  };
  std::vector<std::vector<std::string>> got(kRanks);
  class Recording final : public Conversation {
   public:
    Recording(std::vector<GroupSpec> g, std::vector<std::string>* out)
        : ex_(g, payloads(g)), out_(out) {}
    std::vector<StoreOp> next(const std::vector<StoreResult>& r) override {
      std::vector<StoreOp> ops = ex_.next(r);
      if (ops.empty()) *out_ = ex_.ids();
      return ops;
    }
    static std::vector<std::string> payloads(const std::vector<GroupSpec>& g) {
      std::vector<std::string> p;
      for (const GroupSpec& x : g) p.push_back(x.rank == 0 ? "id:" + x.name : "");
      return p;
    }

   private:
    IdExchange ex_;
    std::vector<std::string>* out_;
  };
  MuxReport rep = run_conversations(
      kRanks, 2, [&](int) { return make_store(url(), "0", 20); },
      [&](int r) { return std::make_unique<Recording>(groups(r), &got[r]); }, 20);
  EXPECT_EQ(rep.failed, 0) << rep.first_error;
  EXPECT_EQ(rep.conversations, kRanks);
  EXPECT_EQ(rep.round_trips, 2 * kRanks);
  // Per rank: 3 adds and 3 release waits; 2 ops (wait + get) per id it does not lead, 1 per id it
  // leads; one release set per group.
  const int64_t groups_total = 1 + kRanks / 8 + 8;
  EXPECT_EQ(rep.ops,
            kRanks * 3 * 2 + (kRanks * 3 - groups_total) * 2 + groups_total + groups_total);
  for (int r = 0; r < kRanks; ++r)
    EXPECT_EQ(got[r],
              (std::vector<std::string>{"id:world", cat("id:tp", r / 8), cat("id:dp", r % 8)}))
        << r;
}

TEST_P(RendezvousTest, MultiplexedFailuresAreCountedNotThrown) {
  // Groups of 4 with only 3 members present: every conversation times out.
  MuxReport rep = run_conversations(
      3, 2, [&](int) { return make_store(url(), "0", 0.5); },
      [&](int r) {
        return std::make_unique<IdExchange>(std::vector<GroupSpec>{{"g", r, 4}},
                                            std::vector<std::string>{"x"});
      },
      5);
  EXPECT_EQ(rep.failed, 3);
  EXPECT_NE(rep.first_error.find("group/g/release"), std::string::npos) << rep.first_error;
}

INSTANTIATE_TEST_SUITE_P(Stores, RendezvousTest, ::testing::Values("file", "redis"),
                         [](const auto& info) { return info.param; });

TEST(Rendezvous, BadGroupsAreInputErrors) {
  error_of(ErrorClass::kInput, [] { IdExchange({{"", 0, 1}}, {""}); });
  error_of(ErrorClass::kInput, [] { IdExchange({{"a/b", 0, 1}}, {""}); });
  error_of(ErrorClass::kInput, [] { IdExchange({{"g", 2, 2}}, {""}); });
}

}  // namespace
