#include <gtest/gtest.h>

#include "op_test_util.h"
#include "ops/cpu/ops.h"

using namespace myriad::cpu;
using namespace myriad::cpu::testing;

namespace {

constexpr int N = 7, C = 12;
constexpr double kEps = 1e-5;

struct RmsNormCase {
  Vec inp, weight, R;

  explicit RmsNormCase(uint64_t seed) {
    std::mt19937_64 rng(seed);
    inp = random_vec(rng, N * C, -2, 2);
    weight = random_vec(rng, C, 0.5, 1.5);
    R = random_vec(rng, N * C);
  }
  double loss() const {
    Vec out(N * C), rstd(N);
    rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), N, C, kEps);
    return dot(out, R);
  }
  // Gradients of loss() into dinp, dweight (accumulated).
  void backward(Vec& dinp, Vec& dweight) const {
    Vec out(N * C), rstd(N);
    rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), N, C, kEps);
    rmsnorm_backward(dinp.data(), dweight.data(), R.data(), inp.data(), weight.data(), rstd.data(),
                     N, C);
  }
};

}  // namespace

TEST(RmsNorm, ForwardMatchesFormula) {
  RmsNormCase c(1);
  for (double eps : {1e-5, 1e-6, 0.25}) {
    Vec out(N * C), rstd(N);
    rmsnorm_forward(out.data(), rstd.data(), c.inp.data(), c.weight.data(), N, C, eps);
    for (int n = 0; n < N; ++n) {
      double ms = 0;
      for (int i = 0; i < C; ++i) ms += c.inp[n * C + i] * c.inp[n * C + i];
      ms /= C;
      const double rs = 1.0 / std::sqrt(ms + eps);
      EXPECT_NEAR(rstd[n], rs, 1e-12);
      for (int i = 0; i < C; ++i)
        EXPECT_NEAR(out[n * C + i], c.inp[n * C + i] * rs * c.weight[i], 1e-12);
    }
  }
}

TEST(RmsNorm, GradientsMatchFiniteDifferences) {
  RmsNormCase c(2);
  Vec dinp(N * C), dweight(C);
  c.backward(dinp, dweight);
  auto loss = [&] { return c.loss(); };
  check_gradient("dinp", c.inp, dinp, loss);
  check_gradient("dweight", c.weight, dweight, loss);
}

TEST(RmsNorm, BackwardAccumulates) {
  RmsNormCase c(3);
  Vec dinp1(N * C), dweight1(C);
  c.backward(dinp1, dweight1);
  Vec dinp2 = dinp1, dweight2 = dweight1;
  c.backward(dinp2, dweight2);
  for (auto& x : dinp1) x *= 2;
  for (auto& x : dweight1) x *= 2;
  expect_close("dinp", dinp2, dinp1, 1e-14);
  expect_close("dweight", dweight2, dweight1, 1e-14);
}

namespace {

// Float forward + backward; out, rstd, dinp and dweight concatenated.
VecF run_float(const Vec& inp, const Vec& weight, const Vec& R, int n, int c) {
  VecF x = to_float(inp), w = to_float(weight), r = to_float(R);
  VecF out(n * c), rstd(n), dinp(n * c), dw(c);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), n, c, kEps);
  rmsnorm_backward(dinp.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), n, c);
  VecF all;
  for (const VecF* v : {&out, &rstd, &dinp, &dw}) all.insert(all.end(), v->begin(), v->end());
  return all;
}

}  // namespace

TEST(RmsNorm, FloatMatchesDouble) {
  const int n = 64, c = 96;
  std::mt19937_64 rng(4);
  Vec inp = random_vec(rng, n * c, -3, 3), weight = random_vec(rng, c, 0.5, 1.5),
      R = random_vec(rng, n * c);
  round_to_float({&inp, &weight, &R});
  Vec out(n * c), rstd(n), dinp(n * c), dw(c);
  rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), n, c, kEps);
  rmsnorm_backward(dinp.data(), dw.data(), R.data(), inp.data(), weight.data(), rstd.data(), n, c);
  Vec want;
  for (const Vec* v : {&out, &rstd, &dinp, &dw}) want.insert(want.end(), v->begin(), v->end());
  expect_close("float vs double", run_float(inp, weight, R, n, c), want, 1e-5);
}

TEST(RmsNorm, DeterministicAndThreadCountIndependent) {
  const int n = 100, c = 72;
  std::mt19937_64 rng(5);
  Vec inp = random_vec(rng, n * c, -3, 3), weight = random_vec(rng, c), R = random_vec(rng, n * c);
  const VecF first = run_float(inp, weight, R, n, c);
  EXPECT_TRUE(bitwise_equal(first, run_float(inp, weight, R, n, c)));
  for (int threads : {1, 3}) {
    with_threads(threads, [&] {
      EXPECT_TRUE(bitwise_equal(first, run_float(inp, weight, R, n, c))) << threads;
    });
  }
}
