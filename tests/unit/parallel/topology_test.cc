#include "parallel/topology.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/error.h"
#include "test_util.h"

using namespace myriad;
using namespace myriad::parallel;

namespace {

using myriad::test::input_error;

// Every layout: coordinates are a bijection, groups partition the world, a rank's group members
// share its other coordinates and are listed by the group's coordinate.
void check_consistent(const Topology& t) {
  constexpr Dim kAll[] = {Dim::kTp, Dim::kDp, Dim::kPp, Dim::kCp};
  std::set<std::tuple<int, int, int, int>> seen;
  for (int r = 0; r < t.world(); ++r) {
    const Coord c = t.coord(r);
    EXPECT_EQ(t.rank_of(c), r);
    EXPECT_TRUE(seen.insert({c.tp, c.dp, c.pp, c.cp}).second);
    for (Dim d : kAll) {
      const std::vector<int> g = t.group(d, r);
      ASSERT_EQ(static_cast<int>(g.size()), t.size(d));
      EXPECT_EQ(g[c[d]], r);
      for (int i = 0; i < t.size(d); ++i) {
        const Coord m = t.coord(g[i]);
        EXPECT_EQ(m[d], i);
        for (Dim o : kAll) {
          if (o == d) continue;
          EXPECT_EQ(m[o], c[o]);
        }
        EXPECT_EQ(t.group_index(d, g[i]), t.group_index(d, r));
      }
      EXPECT_EQ(t.groups(d)[t.group_index(d, r)], g);
    }
  }
  for (Dim d : kAll) {
    std::set<int> all;
    const auto groups = t.groups(d);
    EXPECT_EQ(static_cast<int>(groups.size()), t.world() / t.size(d));
    for (const auto& g : groups) all.insert(g.begin(), g.end());
    EXPECT_EQ(static_cast<int>(all.size()), t.world());
  }
}

TEST(Topology, DefaultOrderTpFastestThenDpThenPp) {
  Topology t(16, 2, 2);  // dp = 16 / (2 x 2) = 4
  EXPECT_EQ(t.tp(), 2);
  EXPECT_EQ(t.pp(), 2);
  EXPECT_EQ(t.dp(), 4);
  // rank = tp + 2 * (dp + 4 * pp)
  EXPECT_EQ(t.coord(0), (Coord{0, 0, 0}));
  EXPECT_EQ(t.coord(1), (Coord{1, 0, 0}));
  EXPECT_EQ(t.coord(2), (Coord{0, 1, 0}));
  EXPECT_EQ(t.coord(7), (Coord{1, 3, 0}));
  EXPECT_EQ(t.coord(8), (Coord{0, 0, 1}));
  EXPECT_EQ(t.coord(13), (Coord{1, 2, 1}));
  EXPECT_EQ(t.group(Dim::kTp, 13), (std::vector<int>{12, 13}));
  EXPECT_EQ(t.group(Dim::kDp, 13), (std::vector<int>{9, 11, 13, 15}));
  EXPECT_EQ(t.group(Dim::kPp, 13), (std::vector<int>{5, 13}));
  EXPECT_EQ(t.group_name(Dim::kTp, 13), "tp6");
  EXPECT_EQ(t.group_name(Dim::kDp, 13), "dp3");  // tp 1 + 2 x pp 1
  EXPECT_EQ(t.group_name(Dim::kPp, 13), "pp5");  // tp 1 + 2 x dp 2
  check_consistent(t);

  const auto specs = t.group_specs(13);
  ASSERT_EQ(specs.size(), 4u);
  EXPECT_EQ(specs[0].name, "world");
  EXPECT_EQ(specs[0].rank, 13);
  EXPECT_EQ(specs[0].size, 16);
  EXPECT_EQ(specs[1].name, "tp6");
  EXPECT_EQ(specs[1].rank, 1);
  EXPECT_EQ(specs[1].size, 2);
  EXPECT_EQ(specs[2].name, "pp5");
  EXPECT_EQ(specs[2].rank, 1);
  EXPECT_EQ(specs[3].name, "dp3");
  EXPECT_EQ(specs[3].rank, 2);
  EXPECT_EQ(specs[3].size, 4);
}

// Expert parallelism folds into each stage's tp x cp x dp ranks, tp fastest: the expert groups and
// the experts' data-parallel groups each partition the stage, every member lists the group alike,
// and an expert group meets each experts' data-parallel group once.
TEST(Topology, ExpertGroupsFoldTheStagesTensorAndDataRanks) {
  for (const Topology& t : {Topology(16, 2, 2, 4), Topology(16, 2, 2, 2, "tp-dp-pp", 2)})  // tp 2 x (cp 2 x) dp x pp 2
  for (int ep : {2, 4, 8}) {
    for (int pp = 0; pp < 2; ++pp) {
      std::set<int> in_ep, in_edp;
      for (int r = 0; r < t.world(); ++r) {
        if (t.coord(r).pp != pp) continue;
        const std::vector<int> g = t.expert_group(r, ep), d = t.expert_dp_group(r, ep);
        ASSERT_EQ(static_cast<int>(g.size()), ep);
        ASSERT_EQ(static_cast<int>(d.size()), 8 / ep);
        const std::vector<comm::GroupSpec> specs = t.expert_group_specs(r, ep);
        ASSERT_EQ(specs.size(), 2u);
        EXPECT_EQ(g[specs[0].rank], r);
        EXPECT_EQ(d[specs[1].rank], r);
        for (int m : g) {
          EXPECT_EQ(t.coord(m).pp, pp);
          EXPECT_EQ(t.expert_group(m, ep), g);
          EXPECT_EQ(t.expert_group_specs(m, ep)[0].name, specs[0].name);
        }
        for (int m : d) EXPECT_EQ(t.expert_dp_group(m, ep), d);
        int shared = 0;
        for (int m : g) shared += std::count(d.begin(), d.end(), m);
        EXPECT_EQ(shared, 1);
        in_ep.insert(g.begin(), g.end()), in_edp.insert(d.begin(), d.end());
      }
      EXPECT_EQ(in_ep.size(), 8u);
      EXPECT_EQ(in_edp.size(), 8u);
    }
  }
  // tp fastest: an expert group of 2 is a tensor-parallel group; under cp, one of 4 holds the
  // two cp ranks' tensor-parallel pairs.
  const Topology t(16, 2, 2, 4);
  EXPECT_EQ(t.expert_group(0, 2), t.group(Dim::kTp, 0));
  EXPECT_TRUE(t.expert_group_specs(0, 1).empty());
  const Topology c(16, 2, 2, 2, "tp-dp-pp", 2);
  EXPECT_EQ(c.expert_group(0, 4), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(c.coord(2).cp, 1);
}

TEST(Topology, OtherOrders) {
  {
    Topology t(12, 3, 2, 0, "dp-tp-pp");  // dp 2 fastest, then tp 3, then pp 2... dp = 2
    EXPECT_EQ(t.dp(), 2);
    // rank = dp + 2 * (tp + 3 * pp)
    EXPECT_EQ(t.coord(1), (Coord{0, 1, 0}));
    EXPECT_EQ(t.coord(2), (Coord{1, 0, 0}));
    EXPECT_EQ(t.coord(7), (Coord{0, 1, 1}));
    EXPECT_EQ(t.group(Dim::kTp, 7), (std::vector<int>{7, 9, 11}));
    EXPECT_EQ(t.group(Dim::kDp, 7), (std::vector<int>{6, 7}));
    EXPECT_EQ(t.group(Dim::kPp, 7), (std::vector<int>{1, 7}));
    check_consistent(t);
  }
  {
    Topology t(8, 2, 4, 1, "pp-dp-tp");  // pp fastest
    EXPECT_EQ(t.coord(1), (Coord{0, 0, 1}));
    EXPECT_EQ(t.coord(4), (Coord{1, 0, 0}));
    EXPECT_EQ(t.group(Dim::kPp, 5), (std::vector<int>{4, 5, 6, 7}));
    EXPECT_EQ(t.group(Dim::kTp, 5), (std::vector<int>{1, 5}));
    EXPECT_EQ(t.group(Dim::kDp, 5), (std::vector<int>{5}));
    check_consistent(t);
  }
  for (const char* order : {"tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp"})
    for (auto [w, tp, pp] : {std::tuple{1, 1, 1}, {6, 2, 1}, {24, 2, 3}, {8, 8, 1}, {8, 1, 8}}) {
      SCOPED_TRACE(testing::Message() << order << " world " << w << " tp " << tp << " pp " << pp);
      check_consistent(Topology(w, tp, pp, 0, order));
    }
}

// Context parallelism: a fourth dimension, right after tp unless the order names it; its groups,
// and the dp x cp groups the gradients are reduced over (dp-major).
TEST(Topology, ContextParallelSitsAfterTpAndItsGradientsSpanDpTimesCp) {
  Topology t(16, 2, 2, 0, "tp-dp-pp", 2);  // dp = 16 / (2 x 2 x 2) = 2
  EXPECT_EQ(t.dp(), 2);
  EXPECT_EQ(t.cp(), 2);
  // rank = tp + 2 (cp + 2 (dp + 2 pp))
  EXPECT_EQ(t.coord(2), (Coord{0, 0, 0, 1}));
  EXPECT_EQ(t.coord(13), (Coord{1, 1, 1, 0}));
  EXPECT_EQ(t.group(Dim::kCp, 13), (std::vector<int>{13, 15}));
  EXPECT_EQ(t.group(Dim::kDp, 13), (std::vector<int>{9, 13}));
  EXPECT_EQ(t.dcp_group(13), (std::vector<int>{9, 11, 13, 15}));
  EXPECT_EQ(t.dcp_group(11), t.dcp_group(13));
  check_consistent(t);
  const auto specs = t.group_specs(13);
  ASSERT_EQ(specs.size(), 6u);
  EXPECT_EQ(specs[4].name, t.group_name(Dim::kCp, 13));
  EXPECT_EQ(specs[4].rank, 0);
  EXPECT_EQ(specs[5].name, "dcp3");  // tp 1 + 2 x pp 1
  EXPECT_EQ(specs[5].rank, 2);       // dp 1 x cp 2 + cp 0
  EXPECT_EQ(specs[5].size, 4);
  // Named in the order, cp goes where it says.
  Topology named(8, 1, 1, 0, "dp-cp-tp-pp", 4);
  EXPECT_EQ(named.group(Dim::kCp, 0), (std::vector<int>{0, 2, 4, 6}));
  check_consistent(named);
  for (const char* order : {"tp-dp-pp", "pp-dp-tp", "cp-tp-dp-pp", "tp-pp-dp-cp"})
    for (auto [w, tp, pp, cp] : {std::tuple{4, 1, 1, 4}, {24, 2, 3, 2}, {16, 2, 2, 2}}) {
      SCOPED_TRACE(testing::Message() << order << " world " << w << " cp " << cp);
      check_consistent(Topology(w, tp, pp, 0, order, cp));
    }
  // Without cp the specs are as before: no cp or dcp group.
  EXPECT_EQ(Topology(8, 2, 2).group_specs(3).size(), 4u);
  EXPECT_EQ(input_error([] { Topology(12, 2, 1, 0, "tp-dp-pp", 4); }),
            "world 12 is not divisible by tp 2 x pp 1 x cp 4 = 8 (dp = world / (tp x pp x cp))");
}

TEST(Topology, DpZeroIsDerivedFromTheWorld) {
  Topology t(6, 2, 1, 0, "tp-pp-dp");
  EXPECT_EQ(t.dp(), 3);
  EXPECT_EQ(t.order(), "tp-pp-dp");
  EXPECT_EQ(t.group(Dim::kDp, 0), (std::vector<int>{0, 2, 4}));
}

TEST(Topology, ErrorsSpellOutTheArithmetic) {
  EXPECT_EQ(input_error([] { Topology(6, 4, 1); }),
            "world 6 is not divisible by tp 4 x pp 1 = 4 (dp = world / (tp x pp))");
  EXPECT_EQ(input_error([] { Topology(8, 2, 2, 3); }),
            "world 8 is not tp 2 x pp 2 x dp 3 = 12 (set parallel.dp = 0 to derive it from the "
            "world size)");
  EXPECT_NE(input_error([] { Topology(0, 1, 1); }).find("world size must be at least 1"),
            std::string::npos);
  EXPECT_NE(input_error([] { Topology(4, 0, 1); }).find("parallel.tp must be at least 1, got 0"),
            std::string::npos);
  EXPECT_NE(input_error([] { Topology(4, 1, -1); }).find("parallel.pp must be at least 1, got -1"),
            std::string::npos);
  EXPECT_NE(input_error([] { Topology(4, 1, 1, -2); }).find("parallel.dp must be 0"),
            std::string::npos);
  for (const char* bad : {"tp-dp", "tp-tp-pp", "tp-dp-pp-tp", "tp,dp,pp", "", "tp-dp-xx"})
    EXPECT_NE(input_error([bad] { Topology(4, 2, 1, 0, bad); }).find("must name tp, dp and pp once each"),
              std::string::npos)
        << bad;
}

}  // namespace
