#include <gtest/gtest.h>

#include "op_test_util.h"
#include "ops/cpu/ops.h"

using namespace myriad::cpu;
using namespace myriad::cpu::testing;

namespace {

double gelu_reference(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}

}  // namespace

TEST(Gelu, ForwardMatchesTanhFormula) {
  std::mt19937_64 rng(1);
  Vec x = random_vec(rng, 101, -6, 6);
  x.insert(x.end(), {0.0, -0.0, 1e-8, -1e-8, 9.0, -9.0, 30.0, -30.0, 200.0, -200.0});
  Vec out(x.size());
  gelu_forward(out.data(), x.data(), static_cast<int64_t>(x.size()));
  VecF xf = to_float(x), outf(x.size());
  gelu_forward(outf.data(), xf.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = gelu_reference(x[i]);
    EXPECT_NEAR(out[i], want, 1e-14 * std::max(1.0, std::abs(want))) << x[i];
    EXPECT_NEAR(outf[i], want, 1e-6 * std::max(1.0, std::abs(want))) << x[i];
  }
}

TEST(Gelu, GradientMatchesFiniteDifferences) {
  std::mt19937_64 rng(2);
  Vec x = random_vec(rng, 37, -5, 5);
  x.insert(x.end(), {0.0, 0.3, -0.3, 12.0, -12.0});
  const int64_t n = static_cast<int64_t>(x.size());
  const Vec R = random_vec(rng, x.size());
  Vec dinp(x.size());
  gelu_backward(dinp.data(), x.data(), R.data(), n);
  check_gradient("dinp", x, dinp, [&] {
    Vec out(x.size());
    gelu_forward(out.data(), x.data(), n);
    return dot(out, R);
  });
}

TEST(Gelu, BackwardAccumulatesAndStaysFinite) {
  std::mt19937_64 rng(3);
  Vec x = random_vec(rng, 50, -4, 4);
  x.insert(x.end(), {-1000.0, -100.0, -50.0, -12.0, 12.0, 50.0, 100.0, 1000.0});
  const int64_t n = static_cast<int64_t>(x.size());
  const Vec dout = random_vec(rng, x.size());
  Vec d1(x.size());
  gelu_backward(d1.data(), x.data(), dout.data(), n);
  Vec d2 = d1;
  gelu_backward(d2.data(), x.data(), dout.data(), n);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(d2[i], 2 * d1[i]);
  VecF xf = to_float(x), doutf = to_float(dout), df(x.size());
  gelu_backward(df.data(), xf.data(), doutf.data(), n);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_TRUE(std::isfinite(df[i])) << x[i];
    EXPECT_TRUE(std::isfinite(d1[i])) << x[i];
  }
}

TEST(Gelu, FloatMatchesDouble) {
  std::mt19937_64 rng(4);
  // Large enough to take the parallel path.
  const int64_t n = 40000;
  Vec x = random_vec(rng, n, -8, 8), dout = random_vec(rng, n);
  round_to_float({&x, &dout});
  Vec out(n), dinp(n);
  gelu_forward(out.data(), x.data(), n);
  gelu_backward(dinp.data(), x.data(), dout.data(), n);
  VecF xf = to_float(x), doutf = to_float(dout), outf(n), dinpf(n);
  gelu_forward(outf.data(), xf.data(), n);
  gelu_backward(dinpf.data(), xf.data(), doutf.data(), n);
  expect_close("out", outf, out, 1e-5);
  expect_close("dinp", dinpf, dinp, 1e-5);
}

TEST(Gelu, VectorAndScalarGiveTheSameBits) {
  // Whole arrays go through the vector loops (8-wide on an AVX2 machine), one element through
  // the scalar path: the float results must not depend on the vector width.
  std::mt19937_64 rng(2);
  const VecF x = to_float(random_vec(rng, 999, -12, 12)), dout = to_float(random_vec(rng, 999));
  const int64_t n = static_cast<int64_t>(x.size());
  VecF out(n), one(n), dinp(n), done(n);
  gelu_forward(out.data(), x.data(), n);
  gelu_backward(dinp.data(), x.data(), dout.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    gelu_forward(&one[i], &x[i], 1);
    gelu_backward(&done[i], &x[i], &dout[i], 1);
  }
  EXPECT_TRUE(bitwise_equal(out, one));
  EXPECT_TRUE(bitwise_equal(dinp, done));
}

TEST(Residual, AddsAndAllowsAliasing) {
  std::mt19937_64 rng(5);
  for (int64_t n : {int64_t{13}, int64_t{50000}}) {
    VecF a = to_float(random_vec(rng, n)), b = to_float(random_vec(rng, n)), out(n);
    residual_forward(out.data(), a.data(), b.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] + b[i]);
    VecF a2 = a;
    residual_forward(a2.data(), a2.data(), b.data(), n);  // out aliases a
    EXPECT_TRUE(bitwise_equal(a2, out));
    VecF b2 = b;
    residual_forward(b2.data(), a.data(), b2.data(), n);  // out aliases b
    EXPECT_TRUE(bitwise_equal(b2, out));
  }
}
