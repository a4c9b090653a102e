#include <gtest/gtest.h>

#include "op_test_util.h"
#include "ops/cpu/ops.h"

using namespace myriad::cpu;
using namespace myriad::cpu::testing;

namespace {

constexpr int N = 7, IC = 12, OC = 5;

struct LinearCase {
  Vec inp, weight, bias, R;
  bool with_bias;

  LinearCase(uint64_t seed, bool with_bias_) : with_bias(with_bias_) {
    std::mt19937_64 rng(seed);
    inp = random_vec(rng, N * IC);
    weight = random_vec(rng, OC * IC);
    bias = random_vec(rng, OC);
    R = random_vec(rng, N * OC);
  }
  const double* b() const { return with_bias ? bias.data() : nullptr; }

  double loss() const {
    Vec out(N * OC);
    linear_forward(out.data(), inp.data(), weight.data(), b(), N, IC, OC);
    return dot(out, R);
  }
  void backward(Vec& dinp, Vec& dweight, Vec& dbias) const {
    linear_backward(dinp.data(), dweight.data(), with_bias ? dbias.data() : nullptr, R.data(),
                    inp.data(), weight.data(), N, IC, OC);
  }
};

}  // namespace

TEST(Linear, ForwardMatchesNaive) {
  LinearCase c(1, true);
  Vec out(N * OC, 123.0);  // overwritten, not accumulated
  linear_forward(out.data(), c.inp.data(), c.weight.data(), c.bias.data(), N, IC, OC);
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      double s = c.bias[o];
      for (int i = 0; i < IC; ++i) s += c.inp[n * IC + i] * c.weight[o * IC + i];
      EXPECT_NEAR(out[n * OC + o], s, 1e-13);
    }
  }
}

TEST(Linear, GradientsMatchFiniteDifferences) {
  for (bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "bias" : "no bias");
    LinearCase c(2, with_bias);
    Vec dinp(N * IC), dweight(OC * IC), dbias(OC);
    c.backward(dinp, dweight, dbias);
    auto loss = [&] { return c.loss(); };
    check_gradient("dinp", c.inp, dinp, loss);
    check_gradient("dweight", c.weight, dweight, loss);
    if (with_bias) check_gradient("dbias", c.bias, dbias, loss);
    if (!with_bias) {
      for (double x : dbias) EXPECT_EQ(x, 0.0);
    }
  }
}

TEST(Linear, BackwardAccumulates) {
  LinearCase c(3, true);
  Vec dinp1(N * IC), dweight1(OC * IC), dbias1(OC);
  c.backward(dinp1, dweight1, dbias1);
  Vec dinp2 = dinp1, dweight2 = dweight1, dbias2 = dbias1;
  c.backward(dinp2, dweight2, dbias2);
  for (Vec* v : {&dinp1, &dweight1, &dbias1})
    for (auto& x : *v) x *= 2;
  expect_close("dinp", dinp2, dinp1, 1e-14);
  expect_close("dweight", dweight2, dweight1, 1e-14);
  expect_close("dbias", dbias2, dbias1, 1e-14);
}

TEST(Linear, FloatMatchesDouble) {
  const int n = 50, ic = 64, oc = 40;
  std::mt19937_64 rng(4);
  Vec inp = random_vec(rng, n * ic), w = random_vec(rng, oc * ic), b = random_vec(rng, oc),
      R = random_vec(rng, n * oc);
  round_to_float({&inp, &w, &b, &R});
  Vec out(n * oc), dinp(n * ic), dw(oc * ic), db(oc);
  linear_forward(out.data(), inp.data(), w.data(), b.data(), n, ic, oc);
  linear_backward(dinp.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(), n, ic, oc);
  VecF fi = to_float(inp), fw = to_float(w), fb = to_float(b), fR = to_float(R);
  VecF fout(n * oc), fdinp(n * ic), fdw(oc * ic), fdb(oc);
  linear_forward(fout.data(), fi.data(), fw.data(), fb.data(), n, ic, oc);
  linear_backward(fdinp.data(), fdw.data(), fdb.data(), fR.data(), fi.data(), fw.data(), n, ic, oc);
  expect_close("out", fout, out, 1e-5);
  expect_close("dinp", fdinp, dinp, 1e-5);
  expect_close("dweight", fdw, dw, 1e-5);
  expect_close("dbias", fdb, db, 1e-5);
}

TEST(Linear, BiasGradientThreadCountIndependent) {
  const int n = 300, ic = 8, oc = 70;
  std::mt19937_64 rng(5);
  VecF inp = to_float(random_vec(rng, n * ic)), w = to_float(random_vec(rng, oc * ic)),
       dout = to_float(random_vec(rng, n * oc));
  auto dbias = [&] {
    VecF dinp(n * ic), dw(oc * ic), db(oc);
    linear_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), n, ic,
                    oc);
    return db;
  };
  const VecF first = dbias();
  for (int threads : {1, 3}) {
    with_threads(threads, [&] { EXPECT_TRUE(bitwise_equal(first, dbias())) << threads; });
  }
}
