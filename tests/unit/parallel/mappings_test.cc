#include "parallel/mappings.h"

#include <gtest/gtest.h>

#include <vector>

#include "tp_test_util.h"

using namespace myriad;
using namespace myriad::parallel;
using namespace myriad::parallel::testing;

namespace {

// Small integers: float sums are exact whatever the order.
float value(int rank, int64_t i) { return static_cast<float>((rank + 2) * (i % 7) - 3); }

class Mappings : public ::testing::Test {
 protected:
  TempDir dir_;
};

TEST_F(Mappings, IdentityWithoutAGroup) {
  std::vector<float> x{1, 2, 3, 4}, y(4, 0);
  CopyToTp::forward(nullptr, x.data(), 4);
  CopyToTp::backward(nullptr, x.data(), 4);
  ReduceFromTp::forward(nullptr, x.data(), 4);
  ReduceFromTp::backward(nullptr, x.data(), 4);
  EXPECT_EQ(x, (std::vector<float>{1, 2, 3, 4}));
  GatherFromSequence::forward(nullptr, x.data(), y.data(), 4);
  EXPECT_EQ(y, x);
  std::fill(y.begin(), y.end(), 0.f);
  ReduceScatterToSequence::forward(nullptr, x.data(), y.data(), 4);
  EXPECT_EQ(y, x);
  EXPECT_EQ(sum_over_group(nullptr, 2.5), 2.5);
  ParallelContext none;
  EXPECT_EQ(none.tp_size(), 1);
  EXPECT_EQ(none.tp_rank(), 0);
}

TEST_F(Mappings, RegionsForwardAndBackward) {
  for (int n : {2, 3}) {
    run_group(dir_, n, [&](int r, comm::Communicator& c) {
      const int64_t chunk = 5, full = chunk * n;
      auto sum_at = [&](int64_t i) {
        float s = 0;
        for (int q = 0; q < n; ++q) s += value(q, i);
        return s;
      };
      // CopyToTp: identity forward, all-reduce backward.
      std::vector<float> x(full);
      for (int64_t i = 0; i < full; ++i) x[i] = value(r, i);
      CopyToTp::forward(&c, x.data(), full);
      for (int64_t i = 0; i < full; ++i) ASSERT_EQ(x[i], value(r, i));
      CopyToTp::backward(&c, x.data(), full);
      for (int64_t i = 0; i < full; ++i) ASSERT_EQ(x[i], sum_at(i));
      // ReduceFromTp: all-reduce forward, identity backward.
      for (int64_t i = 0; i < full; ++i) x[i] = value(r, i);
      ReduceFromTp::backward(&c, x.data(), full);
      for (int64_t i = 0; i < full; ++i) ASSERT_EQ(x[i], value(r, i));
      ReduceFromTp::forward(&c, x.data(), full);
      for (int64_t i = 0; i < full; ++i) ASSERT_EQ(x[i], sum_at(i));
      // GatherFromSequence: all-gather forward (also in place), reduce-scatter backward.
      std::vector<float> local(chunk), gathered(full);
      for (int64_t i = 0; i < chunk; ++i) local[i] = value(r, r * chunk + i);
      GatherFromSequence::forward(&c, local.data(), gathered.data(), chunk);
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < chunk; ++i) ASSERT_EQ(gathered[q * chunk + i], value(q, q * chunk + i));
      std::fill(gathered.begin(), gathered.end(), -1.f);
      std::copy(local.begin(), local.end(), gathered.begin() + r * chunk);
      GatherFromSequence::forward(&c, gathered.data() + r * chunk, gathered.data(), chunk);
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < chunk; ++i) ASSERT_EQ(gathered[q * chunk + i], value(q, q * chunk + i));
      for (int64_t i = 0; i < full; ++i) x[i] = value(r, i);
      GatherFromSequence::backward(&c, x.data(), local.data(), chunk);
      for (int64_t i = 0; i < chunk; ++i) ASSERT_EQ(local[i], sum_at(r * chunk + i));
      // ReduceScatterToSequence: reduce-scatter forward (also in place), all-gather backward.
      for (int64_t i = 0; i < full; ++i) x[i] = value(r, i);
      ReduceScatterToSequence::forward(&c, x.data(), x.data() + r * chunk, chunk);
      for (int64_t i = 0; i < chunk; ++i) ASSERT_EQ(x[r * chunk + i], sum_at(r * chunk + i));
      for (int64_t i = 0; i < chunk; ++i) local[i] = value(r, i);
      ReduceScatterToSequence::backward(&c, local.data(), gathered.data(), chunk);
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < chunk; ++i) ASSERT_EQ(gathered[q * chunk + i], value(q, i));
      // Scalars and per-element reductions.
      const double s = sum_over_group(&c, 0.1 * (r + 1) + 1e-12);
      double expect = 0;
      for (int q = 0; q < n; ++q) expect += 0.1 * (q + 1) + 1e-12;
      EXPECT_EQ(s, expect);  // every value carried exactly, added in rank order
      std::vector<float> m{float(r), float(-r), r == 1 ? 9.f : 0.f};
      max_over_group(&c, m.data(), 3);
      EXPECT_EQ(m, (std::vector<float>{float(n - 1), 0.f, 9.f}));
      std::vector<float> v{float(r), 1.f};
      sum_over_group(&c, v.data(), 2);
      EXPECT_EQ(v, (std::vector<float>{float(n * (n - 1) / 2), float(n)}));
      ParallelContext ctx{&c};
      EXPECT_EQ(ctx.tp_size(), n);
      EXPECT_EQ(ctx.tp_rank(), r);
    });
  }
}

}  // namespace
