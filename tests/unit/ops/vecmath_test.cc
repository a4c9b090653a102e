// The CPU backend's internal numeric helpers (src/ops/cpu/vecmath.h).
#include "ops/cpu/vecmath.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "op_test_util.h"

using namespace myriad::cpu;
using namespace myriad::cpu::testing;
using myriad::cpu::detail::fast_exp;

namespace {

// One element per call, so that the compiler cannot vectorize across elements.
__attribute__((noinline)) float fast_exp_scalar(float x) { return fast_exp(x); }

}  // namespace

TEST(FastExp, AccurateToTwoUlp) {
  double worst = 0;
  for (int i = 0; i <= 400000; ++i) {
    const float x = -87.0f + 175.0f * static_cast<float>(i) / 400000.0f;
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(fast_exp(x) - want) / want);
  }
  // 2 ulp of a float in [1, 2) is 2^-22; relative to the value that is at most 2^-23 (FLT_EPSILON).
  EXPECT_LT(worst, std::numeric_limits<float>::epsilon()) << "relative error " << worst;
}

TEST(FastExp, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(fast_exp(0.0f), 1.0f);
  EXPECT_EQ(fast_exp(-0.0f), 1.0f);
  EXPECT_EQ(fast_exp(-inf), 0.0f);
  EXPECT_EQ(fast_exp(-100.0f), 0.0f);
  EXPECT_EQ(fast_exp(-1e30f), 0.0f);
  EXPECT_EQ(fast_exp(inf), inf);
  EXPECT_EQ(fast_exp(100.0f), inf);
  EXPECT_TRUE(std::isnan(fast_exp(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_GT(fast_exp(-86.9f), 0.0f);
  EXPECT_TRUE(std::isfinite(fast_exp(87.9f)));
}

TEST(FastExp, VectorAndScalarGiveTheSameBits) {
  std::mt19937_64 rng(1);
  const VecF x = to_float(random_vec(rng, 1003, -90, 90));
  VecF vec(x.size()), scalar(x.size());
#pragma omp simd
  for (size_t i = 0; i < x.size(); ++i) vec[i] = fast_exp(x[i]);
  for (size_t i = 0; i < x.size(); ++i) scalar[i] = fast_exp_scalar(x[i]);
  EXPECT_TRUE(bitwise_equal(vec, scalar));
}

TEST(LaneSum, FixedOrderAndExact) {
  // Element i goes to partial sum i % 8, whatever the length; integers keep it exact.
  for (int n : {0, 1, 7, 8, 9, 100}) {
    std::vector<double> x(n);
    double want = 0;
    for (int i = 0; i < n; ++i) want += (x[i] = i + 1);
    EXPECT_EQ(detail::lane_sum<double>(n, [&x](int64_t i) { return x[i]; }), want) << n;
  }
}
