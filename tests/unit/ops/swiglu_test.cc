#include <gtest/gtest.h>

#include "op_test_util.h"
#include "ops/cpu/ops.h"

using namespace myriad::cpu;
using namespace myriad::cpu::testing;

namespace {

constexpr int64_t N = 5, F = 9;

double silu(double x) { return x / (1 + std::exp(-x)); }

struct SwigluCase {
  Vec gu, R;  // (N,F,2), (N,F)

  SwigluCase(uint64_t seed, int64_t n, int64_t f, double range) {
    std::mt19937_64 rng(seed);
    gu = random_vec(rng, static_cast<size_t>(n * f * 2), -range, range);
    R = random_vec(rng, static_cast<size_t>(n * f));
  }
  double loss() const {
    Vec out(R.size());
    swiglu_forward(out.data(), gu.data(), N, F);
    return dot(out, R);
  }
};

}  // namespace

TEST(Swiglu, ForwardMatchesFormula) {
  SwigluCase c(1, N, F, 6);
  Vec out(N * F);
  swiglu_forward(out.data(), c.gu.data(), N, F);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f) {
      // Feature f of row n: gate at 2f, up at 2f+1.
      const double gate = c.gu[(n * F + f) * 2], up = c.gu[(n * F + f) * 2 + 1];
      EXPECT_NEAR(out[n * F + f], silu(gate) * up, 1e-14);
    }
}

TEST(Swiglu, GradientsMatchFiniteDifferences) {
  SwigluCase c(2, N, F, 6);
  Vec dgu(c.gu.size());
  swiglu_backward(dgu.data(), c.gu.data(), c.R.data(), N, F);
  check_gradient("dgu", c.gu, dgu, [&] { return c.loss(); });
}

TEST(Swiglu, BackwardAccumulates) {
  SwigluCase c(3, N, F, 6);
  Vec d1(c.gu.size());
  swiglu_backward(d1.data(), c.gu.data(), c.R.data(), N, F);
  Vec d2 = d1;
  swiglu_backward(d2.data(), c.gu.data(), c.R.data(), N, F);
  for (auto& x : d1) x *= 2;
  expect_close("dgu", d2, d1, 1e-14);
}

namespace {

VecF run_float(const Vec& gu, const Vec& dout, int64_t n, int64_t f) {
  const VecF fgu = to_float(gu), fdout = to_float(dout);
  VecF out(static_cast<size_t>(n * f)), dgu(fgu.size());
  swiglu_forward(out.data(), fgu.data(), n, f);
  swiglu_backward(dgu.data(), fgu.data(), fdout.data(), n, f);
  out.insert(out.end(), dgu.begin(), dgu.end());
  return out;
}

}  // namespace

TEST(Swiglu, FloatMatchesDoubleAndIsFiniteForLargeGates) {
  // Gates out to +-120: exp(-g) overflows float there; silu and its derivative must not.
  const int64_t n = 16, f = 64;
  SwigluCase c(4, n, f, 120);
  round_to_float({&c.gu, &c.R});
  Vec want(static_cast<size_t>(n * f)), dgu(c.gu.size());
  swiglu_forward(want.data(), c.gu.data(), n, f);
  swiglu_backward(dgu.data(), c.gu.data(), c.R.data(), n, f);
  want.insert(want.end(), dgu.begin(), dgu.end());
  const VecF got = run_float(c.gu, c.R, n, f);
  for (float x : got) ASSERT_TRUE(std::isfinite(x));
  expect_close("float vs double", got, want, 1e-5);
}

TEST(Swiglu, DeterministicAndThreadCountIndependent) {
  // Large enough (N*F >= 2^14) for the work to be split between threads.
  const int64_t n = 64, f = 384;
  SwigluCase c(5, n, f, 8);
  const VecF first = run_float(c.gu, c.R, n, f);
  for (int threads : {1, 2, 3}) {
    with_threads(threads,
                 [&] { EXPECT_TRUE(bitwise_equal(first, run_float(c.gu, c.R, n, f))) << threads; });
  }
}
