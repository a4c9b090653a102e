#include <gtest/gtest.h>

#include "op_test_util.h"
#include "ops/cpu/ops.h"

using namespace myriad::cpu;
using namespace myriad::cpu::testing;

namespace {

constexpr int N = 7, C = 12;

struct LayerNormCase {
  Vec inp, weight, bias, R;
  bool with_bias;

  LayerNormCase(uint64_t seed, bool with_bias_) : with_bias(with_bias_) {
    std::mt19937_64 rng(seed);
    inp = random_vec(rng, N * C, -2, 2);
    weight = random_vec(rng, C, 0.5, 1.5);
    bias = random_vec(rng, C);
    R = random_vec(rng, N * C);
  }
  const double* b() const { return with_bias ? bias.data() : nullptr; }

  double loss() const {
    Vec out(N * C), mean(N), rstd(N);
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), b(), N, C);
    return dot(out, R);
  }
  // Gradients of loss() into dinp, dweight, dbias (accumulated).
  void backward(Vec& dinp, Vec& dweight, Vec& dbias) const {
    Vec out(N * C), mean(N), rstd(N);
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), b(), N, C);
    layernorm_backward(dinp.data(), dweight.data(), with_bias ? dbias.data() : nullptr, R.data(),
                       inp.data(), weight.data(), mean.data(), rstd.data(), N, C);
  }
};

}  // namespace

TEST(LayerNorm, ForwardNormalizesRows) {
  LayerNormCase c(1, true);
  Vec out(N * C), mean(N), rstd(N);
  Vec ones(C, 1.0);
  layernorm_forward(out.data(), mean.data(), rstd.data(), c.inp.data(), ones.data(),
                    static_cast<const double*>(nullptr), N, C);
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int i = 0; i < C; ++i) m += c.inp[n * C + i];
    m /= C;
    for (int i = 0; i < C; ++i) v += (c.inp[n * C + i] - m) * (c.inp[n * C + i] - m);
    v /= C;  // biased, as PyTorch
    EXPECT_NEAR(mean[n], m, 1e-12);
    EXPECT_NEAR(rstd[n], 1.0 / std::sqrt(v + 1e-5), 1e-9);
    double s = 0, s2 = 0;
    for (int i = 0; i < C; ++i) {
      s += out[n * C + i];
      s2 += out[n * C + i] * out[n * C + i];
    }
    EXPECT_NEAR(s / C, 0.0, 1e-12);
    EXPECT_NEAR(s2 / C, v / (v + 1e-5), 1e-9);
  }
}

TEST(LayerNorm, GradientsMatchFiniteDifferences) {
  for (bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "bias" : "no bias");
    LayerNormCase c(2, with_bias);
    Vec dinp(N * C), dweight(C), dbias(C);
    c.backward(dinp, dweight, dbias);
    auto loss = [&] { return c.loss(); };
    check_gradient("dinp", c.inp, dinp, loss);
    check_gradient("dweight", c.weight, dweight, loss);
    if (with_bias) check_gradient("dbias", c.bias, dbias, loss);
  }
}

TEST(LayerNorm, BackwardAccumulates) {
  LayerNormCase c(3, true);
  Vec dinp1(N * C), dweight1(C), dbias1(C);
  c.backward(dinp1, dweight1, dbias1);
  Vec dinp2 = dinp1, dweight2 = dweight1, dbias2 = dbias1;
  c.backward(dinp2, dweight2, dbias2);
  for (auto& x : dinp1) x *= 2;
  for (auto& x : dweight1) x *= 2;
  for (auto& x : dbias1) x *= 2;
  expect_close("dinp", dinp2, dinp1, 1e-14);
  expect_close("dweight", dweight2, dweight1, 1e-14);
  expect_close("dbias", dbias2, dbias1, 1e-14);
}

namespace {

// Float forward + backward on a larger case; all outputs concatenated.
VecF run_float(const Vec& inp, const Vec& weight, const Vec& bias, const Vec& R, int n, int c) {
  VecF x = to_float(inp), w = to_float(weight), b = to_float(bias), r = to_float(R);
  VecF out(n * c), mean(n), rstd(n), dinp(n * c), dw(c), db(c);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c);
  layernorm_backward(dinp.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), n, c);
  VecF all;
  for (const VecF* v : {&out, &mean, &rstd, &dinp, &dw, &db})
    all.insert(all.end(), v->begin(), v->end());
  return all;
}

}  // namespace

TEST(LayerNorm, FloatMatchesDouble) {
  const int n = 64, c = 96;
  std::mt19937_64 rng(4);
  Vec inp = random_vec(rng, n * c, -3, 3), weight = random_vec(rng, c, 0.5, 1.5),
      bias = random_vec(rng, c), R = random_vec(rng, n * c);
  // Round the inputs to float first so that both paths see the same numbers.
  round_to_float({&inp, &weight, &bias, &R});
  Vec out(n * c), mean(n), rstd(n), dinp(n * c), dw(c), db(c);
  layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), n,
                    c);
  layernorm_backward(dinp.data(), dw.data(), db.data(), R.data(), inp.data(), weight.data(),
                     mean.data(), rstd.data(), n, c);
  Vec want;
  for (const Vec* v : {&out, &mean, &rstd, &dinp, &dw, &db})
    want.insert(want.end(), v->begin(), v->end());
  expect_close("float vs double", run_float(inp, weight, bias, R, n, c), want, 1e-5);
}

TEST(LayerNorm, DeterministicAndThreadCountIndependent) {
  const int n = 100, c = 72;
  std::mt19937_64 rng(5);
  Vec inp = random_vec(rng, n * c, -3, 3), weight = random_vec(rng, c), bias = random_vec(rng, c),
      R = random_vec(rng, n * c);
  const VecF first = run_float(inp, weight, bias, R, n, c);
  EXPECT_TRUE(bitwise_equal(first, run_float(inp, weight, bias, R, n, c)));
  for (int threads : {1, 3}) {
    with_threads(threads, [&] {
      EXPECT_TRUE(bitwise_equal(first, run_float(inp, weight, bias, R, n, c))) << threads;
    });
  }
}
