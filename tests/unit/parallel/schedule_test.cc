#include "parallel/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"
#include "test_util.h"

using namespace myriad;
using namespace myriad::parallel;

namespace {

using K = ActionKind;

using myriad::test::input_error;

bool is_compute(const Action& a) { return a.kind == K::kForward || a.kind == K::kBackward; }

std::vector<Action> computes(const std::vector<Action>& list) {
  std::vector<Action> out;
  for (const Action& a : list)
    if (is_compute(a)) out.push_back(a);
  return out;
}

// The messages a posts to b as b would receive them, and the receives b posts from a, both in
// posting order: the matching rule says these are equal.
std::pair<std::vector<Action>, std::vector<Action>> channel(const Schedule& s, int a, int b) {
  std::vector<Action> sends, recvs;
  for (const Action& x : s.ranks[a])
    if ((x.kind == K::kSendActivation || x.kind == K::kSendGrad) && action_peer(x, a, s.p) == b) {
      const bool act = x.kind == K::kSendActivation;
      sends.push_back({act ? K::kRecvActivation : K::kRecvGrad, x.microbatch,
                       x.chunk + (act ? (a == s.p - 1) : -(a == 0))});
    }
  for (const Action& x : s.ranks[b])
    if ((x.kind == K::kRecvActivation || x.kind == K::kRecvGrad) && action_peer(x, b, s.p) == a)
      recvs.push_back(x);
  return {sends, recvs};
}

// What every schedule must satisfy, checked without the simulator, then with it.
SimResult check_sound(const Schedule& s) {
  const std::string what = ::testing::PrintToString(std::vector<int>{s.p, s.v, s.m});
  EXPECT_EQ(static_cast<int>(s.ranks.size()), s.p);
  for (int r = 0; r < s.p; ++r) {
    const auto& list = s.ranks[r];
    std::vector<int> fwd(s.m * s.v, -1), bwd(s.m * s.v, -1);
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Action& a = list[i];
      const int k = a.microbatch * s.v + a.chunk;
      if (a.kind == K::kForward) {
        EXPECT_EQ(std::exchange(fwd[k], i), -1) << what << to_string(a);
      } else if (a.kind == K::kBackward) {
        EXPECT_EQ(std::exchange(bwd[k], i), -1) << what << to_string(a);
      } else {
        EXPECT_GT(s.p, 1) << what << " a single rank sends " << to_string(a);
      }
      // A send follows the compute that produced it at once.
      if (a.kind == K::kSendActivation) {
        EXPECT_EQ(list[i - 1], (Action{K::kForward, a.microbatch, a.chunk})) << what;
      } else if (a.kind == K::kSendGrad) {
        EXPECT_EQ(list[i - 1], (Action{K::kBackward, a.microbatch, a.chunk})) << what;
      }
    }
    for (int k = 0; k < s.m * s.v; ++k) {
      EXPECT_GE(fwd[k], 0) << what << " rank " << r << " forward " << k << " missing";
      EXPECT_GT(bwd[k], fwd[k]) << what << " rank " << r << " backward " << k;
    }
  }
  for (int a = 0; a < s.p; ++a)
    for (int b = 0; b < s.p; ++b) {
      auto [sends, recvs] = channel(s, a, b);
      EXPECT_EQ(sends, recvs) << what << " rank " << a << " -> " << b;
    }
  const SimResult r = simulate(s);
  EXPECT_FALSE(r.deadlock) << what << r.problem;
  EXPECT_EQ(r.problem, "") << what;
  EXPECT_EQ(static_cast<int>(r.max_in_flight.size()), s.p);
  // Latency slows the pipeline but changes nothing about its soundness.
  const SimResult slow = simulate(s, {1, 2, 0.5});
  EXPECT_EQ(slow.problem, "") << what;
  EXPECT_GE(slow.makespan, r.makespan) << what;
  return r;
}

TEST(Schedule, KindNames) {
  EXPECT_EQ(schedule_kind("gpipe"), ScheduleKind::kGPipe);
  EXPECT_EQ(schedule_kind("1f1b"), ScheduleKind::kOneFOneB);
  EXPECT_EQ(schedule_kind("interleaved"), ScheduleKind::kInterleaved);
  EXPECT_NE(input_error([] { schedule_kind("zb"); }).find("\"zb\""), std::string::npos);
}

TEST(Schedule, ActionPeerFollowsTheRing) {
  EXPECT_EQ(action_peer({K::kRecvActivation, 0, 1}, 0, 4), 3);  // from rank 3's chunk 0
  EXPECT_EQ(action_peer({K::kSendActivation, 0, 0}, 3, 4), 0);
  EXPECT_EQ(action_peer({K::kRecvGrad, 0, 0}, 3, 4), 0);
  EXPECT_EQ(action_peer({K::kSendGrad, 0, 1}, 0, 4), 3);
  EXPECT_EQ(action_peer({K::kSendGrad, 0, 0}, 2, 4), 1);
  EXPECT_EQ(action_peer({K::kForward, 0, 0}, 2, 4), -1);
}

TEST(Schedule, GPipeSoundOnGrid) {
  for (int p = 1; p <= 4; ++p)
    for (int v = 1; v <= 3; ++v)
      for (int m : {1, p, p + 1, 2 * p, 3 * p}) {
        const Schedule s = make_schedule(ScheduleKind::kGPipe, p, v, m);
        const SimResult r = check_sound(s);
        // Rank 0 holds every micro-batch's activations before the first backward.
        EXPECT_EQ(r.max_in_flight[0], m * v);
        if (v == 1) {
          EXPECT_NEAR(r.bubble, double(p - 1) / m, 1e-9) << p << " " << m;
        }
      }
}

TEST(Schedule, OneFOneBSoundBoundedAndBubble) {
  for (int p = 1; p <= 4; ++p)
    for (int m : {1, p, p + 1, 2 * p, 3 * p, 2 * p + 1}) {
      const Schedule s = make_schedule(ScheduleKind::kOneFOneB, p, 1, m);
      const SimResult r = check_sound(s);
      for (int rank = 0; rank < p; ++rank) EXPECT_LE(r.max_in_flight[rank], p);
      EXPECT_EQ(r.max_in_flight[0], std::min(p, m)) << p << " " << m;
      if (m % p == 0) {
        EXPECT_NEAR(r.bubble, double(p - 1) / m, 1e-9) << p << " " << m;
      }
    }
}

TEST(Schedule, OneFOneBLastRankAlternates) {
  const Schedule s = make_schedule(ScheduleKind::kOneFOneB, 4, 1, 8);
  const std::vector<Action> last = computes(s.ranks[3]);
  for (int mb = 0; mb < 8; ++mb) {
    EXPECT_EQ(last[2 * mb], (Action{K::kForward, mb, 0}));
    EXPECT_EQ(last[2 * mb + 1], (Action{K::kBackward, mb, 0}));
  }
  // Rank 0 warms up with p - 1 forwards.
  const std::vector<Action> first = computes(s.ranks[0]);
  for (int mb = 0; mb < 4; ++mb) EXPECT_EQ(first[mb], (Action{K::kForward, mb, 0}));
  EXPECT_EQ(first[4], (Action{K::kBackward, 0, 0}));
}

TEST(Schedule, InterleavedSoundAndBubble) {
  for (int p = 1; p <= 4; ++p)
    for (int v = 1; v <= 3; ++v)
      for (int m : {p, 2 * p, 3 * p}) {
        const Schedule s = make_schedule(ScheduleKind::kInterleaved, p, v, m);
        const SimResult r = check_sound(s);
        EXPECT_NEAR(r.bubble, double(p - 1) / (v * m), 1e-9) << p << " " << v << " " << m;
      }
}

TEST(Schedule, InterleavedOrderGoesThroughChunksInGroupsOfP) {
  const Schedule s = make_schedule(ScheduleKind::kInterleaved, 2, 2, 4);
  const std::vector<Action> last = computes(s.ranks[1]);
  // Rank 1 warms up with (v - 1) * p = 2 forwards: mb 0, 1 of chunk 0.
  const std::vector<Action> expected = {
      {K::kForward, 0, 0}, {K::kForward, 1, 0}, {K::kForward, 0, 1}, {K::kBackward, 0, 1},
      {K::kForward, 1, 1}, {K::kBackward, 1, 1}, {K::kForward, 2, 0}, {K::kBackward, 0, 0}};
  EXPECT_EQ(std::vector<Action>(last.begin(), last.begin() + 8), expected);
}

TEST(Schedule, InterleavedWithOneChunkIsOneFOneB) {
  for (int p = 1; p <= 4; ++p)
    for (int m : {p, 2 * p, 3 * p}) {
      const Schedule a = make_schedule(ScheduleKind::kInterleaved, p, 1, m);
      const Schedule b = make_schedule(ScheduleKind::kOneFOneB, p, 1, m);
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(computes(a.ranks[r]), computes(b.ranks[r])) << p << " " << m << " rank " << r;
        EXPECT_EQ(a.ranks[r], b.ranks[r]);
      }
    }
}

// p = 2 with chunks: activations and gradients share both directions, so the order of posting
// is what makes the messages match.
TEST(Schedule, TwoRanksMixActivationsAndGradsInOneChannel) {
  const Schedule s = make_schedule(ScheduleKind::kInterleaved, 2, 2, 4);
  auto [sends, recvs] = channel(s, 0, 1);
  bool act = false, grad = false;
  for (const Action& x : sends) (x.kind == K::kRecvActivation ? act : grad) = true;
  EXPECT_TRUE(act && grad);
  EXPECT_EQ(sends, recvs);
}

// Each receive is posted before the compute ahead of its consumer (or earlier), so a transfer
// overlaps that compute.
TEST(Schedule, ReceivesArePostedOneComputeAhead) {
  for (ScheduleKind kind :
       {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved})
    for (int p = 2; p <= 4; ++p) {
      const Schedule s = make_schedule(kind, p, kind == ScheduleKind::kOneFOneB ? 1 : 2, 2 * p);
      for (const auto& list : s.ranks) {
        const std::vector<Action> comp = computes(list);
        int done = 0;  // computes before position i
        for (const Action& a : list) {
          if (is_compute(a)) {
            ++done;
            continue;
          }
          if (a.kind != K::kRecvActivation && a.kind != K::kRecvGrad) continue;
          const Action consumer{a.kind == K::kRecvActivation ? K::kForward : K::kBackward,
                                a.microbatch, a.chunk};
          const int j = static_cast<int>(std::find(comp.begin(), comp.end(), consumer) -
                                         comp.begin());
          EXPECT_LE(done, std::max(j - 1, 0)) << to_string(a);
        }
      }
    }
}

TEST(Schedule, SimulatorCatchesSwappedReceives) {
  Schedule s = make_schedule(ScheduleKind::kInterleaved, 2, 2, 4);
  auto& list = s.ranks[0];
  std::vector<size_t> recvs;
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].kind == K::kRecvActivation || list[i].kind == K::kRecvGrad) recvs.push_back(i);
  ASSERT_GE(recvs.size(), 2u);
  std::swap(list[recvs[0]], list[recvs[1]]);
  const SimResult r = simulate(s);
  EXPECT_NE(r.problem.find("rank 1 -> 0: send #1 is"), std::string::npos) << r.problem;
}

TEST(Schedule, SimulatorCatchesADroppedSend) {
  Schedule s = make_schedule(ScheduleKind::kOneFOneB, 3, 1, 6);
  auto& list = s.ranks[1];
  list.erase(std::find(list.begin(), list.end(), Action{K::kSendActivation, 5, 0}));
  const SimResult r = simulate(s);
  EXPECT_TRUE(r.deadlock) << r.problem;  // rank 2 waits for mb 5 forever
  EXPECT_NE(r.problem.find("rank 2: forward(mb 5, chunk 0) waits for send #6 of rank 1"),
            std::string::npos)
      << r.problem;
}

TEST(Schedule, SimulatorFindsADeadlock) {
  // Rank 0 waits for the gradient of mb 0 before sending mb 0's activation to rank 1.
  Schedule s{2, 1, 1, ScheduleKind::kGPipe, {}};
  s.ranks = {
      {{K::kForward, 0, 0}, {K::kRecvGrad, 0, 0}, {K::kBackward, 0, 0}, {K::kSendActivation, 0, 0}},
      {{K::kRecvActivation, 0, 0}, {K::kForward, 0, 0}, {K::kBackward, 0, 0},
       {K::kSendGrad, 0, 0}}};
  const SimResult r = simulate(s);
  EXPECT_TRUE(r.deadlock);
  EXPECT_NE(r.problem.find("deadlock: rank 0: backward(mb 0, chunk 0) waits"), std::string::npos)
      << r.problem;
}

TEST(Schedule, SimulatorNamesBrokenRules) {
  auto problem = [](std::vector<std::vector<Action>> ranks, int p, int v, int m) {
    return simulate(Schedule{p, v, m, ScheduleKind::kGPipe, std::move(ranks)}).problem;
  };
  EXPECT_EQ(problem({{{K::kBackward, 0, 0}, {K::kForward, 0, 0}}}, 1, 1, 1),
            "rank 0: backward(mb 0, chunk 0) before its forward");
  EXPECT_EQ(problem({{{K::kForward, 0, 0}, {K::kForward, 0, 0}}}, 1, 1, 1),
            "rank 0: forward(mb 0, chunk 0) is duplicated");
  EXPECT_EQ(problem({{{K::kForward, 0, 0}}}, 1, 1, 1),
            "rank 0: backward(mb 0, chunk 0) is missing");
  EXPECT_EQ(problem({{{K::kForward, 0, 1}, {K::kForward, 0, 0}}}, 1, 2, 1),
            "rank 0: forward(mb 0, chunk 1) before its input is computed");
  EXPECT_EQ(problem({{{K::kSendActivation, 0, 0}}}, 1, 1, 1),
            "rank 0: send activation(mb 0, chunk 0) has no peer (a single rank)");
  EXPECT_EQ(problem({{{K::kSendActivation, 0, 0}}, {}}, 2, 1, 1),
            "rank 0: send activation(mb 0, chunk 0) before its forward");
  // Rank 1 never posts the receive for rank 0's activation.
  EXPECT_EQ(
      problem({{{K::kForward, 0, 0}, {K::kSendActivation, 0, 0}}, {{K::kForward, 0, 0}}}, 2, 1, 1),
      "rank 1: forward(mb 0, chunk 0) without its receive posted before it");
  EXPECT_EQ(problem({{{K::kRecvActivation, 0, 0}}, {}}, 2, 1, 1),
            "rank 0: recv activation(mb 0, chunk 0) has no peer (the first virtual stage)");
  // A sound schedule plus one more receive of a message already received.
  Schedule s = make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2);
  s.ranks[1].push_back({K::kRecvActivation, 1, 0});
  EXPECT_EQ(simulate(s).problem, "rank 1: recv activation(mb 1, chunk 0) posted twice");
}

TEST(Schedule, InputErrors) {
  auto error = [](ScheduleKind kind, int p, int v, int m) {
    return input_error([&] { make_schedule(kind, p, v, m); });
  };
  EXPECT_NE(error(ScheduleKind::kGPipe, 0, 1, 1).find("pp must be at least 1, got 0"),
            std::string::npos);
  EXPECT_NE(error(ScheduleKind::kGPipe, 1, 0, 1).find("virtual_stages must be at least 1"),
            std::string::npos);
  EXPECT_NE(error(ScheduleKind::kInterleaved, 1, 1, 0).find("micro-batches"), std::string::npos);
  EXPECT_NE(error(ScheduleKind::kOneFOneB, 2, 2, 4).find("virtual_stages = 1, got 2"),
            std::string::npos);
  EXPECT_NE(error(ScheduleKind::kInterleaved, 4, 2, 6).find("(6) to be divisible by pp (4)"),
            std::string::npos);
}

TEST(Partition, EvenWithoutEmbeddingOrHead) {
  EXPECT_EQ(partition_layers(8, 4, 1, 0, 0), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(partition_layers(4, 4, 1, 0, 0), (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(partition_layers(9, 4, 1, 0, 0), (std::vector<int>{3, 2, 2, 2}));  // ties: earlier
  EXPECT_EQ(partition_layers(5, 1, 1, 3, 3), (std::vector<int>{5}));
}

TEST(Partition, HeavyEndsGetFewerLayers) {
  // The head costs two layers: the last stage keeps one, the others share the rest.
  EXPECT_EQ(partition_layers(8, 4, 1, 0, 2), (std::vector<int>{3, 2, 2, 1}));
  EXPECT_EQ(partition_layers(8, 4, 1, 1, 1), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(partition_layers(10, 4, 1, 1, 1), (std::vector<int>{2, 3, 3, 2}));
  // Even a huge head leaves one layer on the last stage.
  EXPECT_EQ(partition_layers(6, 3, 1, 0, 100), (std::vector<int>{3, 2, 1}));
  EXPECT_EQ(partition_layers(24, 8, 1, 0.5, 2.5), (std::vector<int>{3, 4, 4, 3, 3, 3, 3, 1}));
  EXPECT_NE(input_error([] { partition_layers(3, 4, 1, 0, 0); }).find("model.layers = 3"),
            std::string::npos);
}

// The most expensive stage costs as little as any split allows: the smallest bound C such that
// the stages can hold all layers with none above C (each with at least one layer).
TEST(Partition, MinimizesTheMostExpensiveStage) {
  for (int stages = 1; stages <= 8; ++stages)
    for (int layers = stages; layers <= 3 * stages + 2; ++layers)
      for (double embed : {0.0, 0.7, 3.0})
        for (double head : {0.0, 1.5, 4.0}) {
          auto extra = [&](int i) { return (i == 0 ? embed : 0) + (i == stages - 1 ? head : 0); };
          const std::vector<int> n = partition_layers(layers, stages, 1.0, embed, head);
          double worst = 0;
          int sum = 0;
          for (int i = 0; i < stages; ++i) {
            EXPECT_GE(n[i], 1);
            worst = std::max(worst, n[i] + extra(i));
            sum += n[i];
          }
          EXPECT_EQ(sum, layers);
          double best = 1e9;
          for (int i = 0; i < stages; ++i)
            for (int k = 1; k <= layers; ++k) {
              const double bound = k + extra(i);
              int fit = 0;
              for (int j = 0; j < stages; ++j)
                fit += std::max(0, static_cast<int>(std::floor(bound - extra(j) + 1e-9)));
              bool each = true;
              for (int j = 0; j < stages; ++j) each = each && 1 + extra(j) <= bound + 1e-9;
              if (each && fit >= layers) best = std::min(best, bound);
            }
          EXPECT_NEAR(worst, best, 1e-9) << layers << " on " << stages << ", " << embed << ", "
                                         << head;
        }
}

TEST(Partition, StageLayerRanges) {
  using R = std::vector<std::pair<int, int>>;
  EXPECT_EQ(stage_layer_ranges({}, 8, 2, 2, 1, 0, 0), (R{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  EXPECT_EQ(stage_layer_ranges({3, 1, 2}, 6, 3, 1, 1, 0, 0), (R{{0, 3}, {3, 4}, {4, 6}}));
  EXPECT_EQ(stage_layer_ranges({1, 2, 2, 1}, 6, 2, 2, 1, 0, 0),
            (R{{0, 1}, {1, 3}, {3, 5}, {5, 6}}));
  // Counts that do not split the layers are the parallel layout's refusals (layout_test).
}

}  // namespace
