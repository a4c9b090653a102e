// plan_buckets: buckets in readiness order cover the padded buffer, each splits evenly over dp,
// and the ranks' owned ranges partition [0, total).
#include "optim/buckets.h"

#include <gtest/gtest.h>

#include <vector>

namespace myriad {
namespace {

void check_plan(int64_t total, int dp, int64_t bucket_elems) {
  SCOPED_TRACE(testing::Message() << "total " << total << " dp " << dp << " bucket " << bucket_elems);
  const GradBuckets g = plan_buckets(total, dp, bucket_elems);
  EXPECT_EQ(g.dp, dp);
  EXPECT_EQ(g.total, total);
  EXPECT_EQ(g.padded_total % dp, 0);
  EXPECT_TRUE(g.padded_total >= total && g.padded_total < total + dp);

  // Descending and contiguous from padded_total down to 0; all but the last of the target size.
  int64_t end = g.padded_total;
  const int64_t target = bucket_elems <= 0 ? g.padded_total : (bucket_elems + dp - 1) / dp * dp;
  for (size_t b = 0; b < g.buckets.size(); ++b) {
    const FlatRange& r = g.buckets[b];
    EXPECT_EQ(r.end, end);
    EXPECT_GT(r.size(), 0);
    EXPECT_EQ(r.size() % dp, 0);
    EXPECT_TRUE(b + 1 < g.buckets.size() ? r.size() == target : r.size() <= target);
    end = r.begin;
    // The pieces tile the bucket in rank order, equal sizes.
    for (int q = 0; q < dp; ++q) {
      const FlatRange p = g.piece(static_cast<int>(b), q);
      EXPECT_EQ(p.size(), r.size() / dp);
      EXPECT_EQ(p.begin, r.begin + q * p.size());
    }
  }
  EXPECT_EQ(end, 0);

  // Over all ranks, the owned ranges hit every element of [0, total) exactly once.
  std::vector<int> hits(total, 0);
  for (int q = 0; q < dp; ++q) {
    const std::vector<FlatRange> own = g.owned(q);
    ASSERT_FALSE(own.empty());
    for (size_t i = 0; i < own.size(); ++i) {
      const FlatRange& r = own[i];
      if (r.size() == 0) {  // "owns nothing" is exactly {{0, 0}}
        EXPECT_EQ(own.size(), 1u);
        continue;
      }
      EXPECT_TRUE(r.begin >= 0 && r.end <= total);
      if (i > 0) {
        EXPECT_GT(r.begin, own[i - 1].end);  // ascending, adjacent ones merged
      }
      for (int64_t j = r.begin; j < r.end; ++j) ++hits[j];
    }
  }
  for (int64_t j = 0; j < total; ++j) ASSERT_EQ(hits[j], 1) << "element " << j;
}

TEST(PlanBuckets, CoverAndPartition) {
  for (int dp : {1, 2, 3, 4, 8})
    for (int64_t total : {1, 7, 64, 1000, 12345})
      for (int64_t bucket : {0, 1, 5, 64, 999, 100000}) check_plan(total, dp, bucket);
}

TEST(PlanBuckets, ReadinessOrderAndRemainder) {
  // 10 elements over dp 4: padded to 12; buckets of 8 from the end, the first 4 take the rest.
  const GradBuckets g = plan_buckets(10, 4, 7);
  EXPECT_EQ(g.padded_total, 12);
  ASSERT_EQ(g.buckets.size(), 2u);
  EXPECT_EQ(g.buckets[0], (FlatRange{4, 12}));
  EXPECT_EQ(g.buckets[1], (FlatRange{0, 4}));
  EXPECT_EQ(g.piece(0, 3), (FlatRange{10, 12}));  // all padding
  EXPECT_EQ(g.owned(3), (std::vector<FlatRange>{{3, 4}}));
  EXPECT_EQ(g.owned(0), (std::vector<FlatRange>{{0, 1}, {4, 6}}));
  EXPECT_EQ(plan_buckets(0, 4, 8).buckets.size(), 0u);
}

TEST(PlanBuckets, OneRankOwnsEverything) {
  const GradBuckets g = plan_buckets(1001, 1, 100);
  EXPECT_EQ(g.buckets.size(), 11u);
  EXPECT_EQ(g.buckets.back(), (FlatRange{0, 1}));
  EXPECT_EQ(g.owned(0), (std::vector<FlatRange>{{0, 1001}}));
}

TEST(PlanBuckets, RankInThePaddingOwnsNothing) {
  // 3 elements over 4 ranks: rank 3's only piece is padding; an empty list would mean "all".
  const GradBuckets g = plan_buckets(3, 4, 0);
  EXPECT_EQ(g.owned(3), (std::vector<FlatRange>{{0, 0}}));
}

}  // namespace
}  // namespace myriad
