#include <gtest/gtest.h>

#include "op_test_util.h"
#include "ops/cpu/ops.h"

using namespace myriad::cpu;
using namespace myriad::cpu::testing;

namespace {

constexpr int N = 7, V = 11, Vp = 16;

struct CrossEntropyCase {
  Vec logits, R;
  std::vector<int32_t> targets;

  explicit CrossEntropyCase(uint64_t seed) {
    std::mt19937_64 rng(seed);
    logits = random_vec(rng, N * Vp, -3, 3);
    for (int n = 0; n < N; ++n)  // padding holds large values: they must not matter
      for (int j = V; j < Vp; ++j) logits[n * Vp + j] = 50.0 + j;
    targets = random_ints(rng, N, V);
    targets[0] = 0;
    targets[1] = V - 1;
    R = random_vec(rng, N, 0.5, 1.5);
  }
  Vec losses() const {
    Vec out(N);
    crossentropy_forward(out.data(), logits.data(), targets.data(), N, V, Vp);
    return out;
  }
  double loss() const { return dot(losses(), R); }
};

}  // namespace

TEST(CrossEntropy, ForwardMatchesNaive) {
  CrossEntropyCase c(1);
  const Vec losses = c.losses();
  for (int n = 0; n < N; ++n) {
    double s = 0;
    for (int j = 0; j < V; ++j) s += std::exp(c.logits[n * Vp + j]);
    EXPECT_NEAR(losses[n], std::log(s) - c.logits[n * Vp + c.targets[n]], 1e-13);
  }
}

TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  CrossEntropyCase c(2);
  Vec dlogits(N * Vp, 7.0);  // written, not accumulated
  crossentropy_backward(dlogits.data(), c.logits.data(), c.targets.data(), c.R.data(), N, V, Vp);
  check_gradient("dlogits", c.logits, dlogits, [&] { return c.loss(); });
  for (int n = 0; n < N; ++n)
    for (int j = V; j < Vp; ++j) EXPECT_EQ(dlogits[n * Vp + j], 0.0);
}

TEST(CrossEntropy, NegativeTargetsAreLeftOut) {
  // Rows 2 and 5 left out (data.document_end_loss): loss 0 and gradient 0, the other rows as
  // before; the gradient still matches finite differences of the remaining loss.
  CrossEntropyCase c(4);
  const Vec all = c.losses();
  c.targets[2] = c.targets[5] = -1;
  const Vec some = c.losses();
  for (int n = 0; n < N; ++n) EXPECT_EQ(some[n], n == 2 || n == 5 ? 0.0 : all[n]) << n;
  Vec dlogits(N * Vp, 7.0);
  crossentropy_backward(dlogits.data(), c.logits.data(), c.targets.data(), c.R.data(), N, V, Vp);
  for (int j = 0; j < Vp; ++j) {
    EXPECT_EQ(dlogits[2 * Vp + j], 0.0);
    EXPECT_EQ(dlogits[5 * Vp + j], 0.0);
  }
  check_gradient("dlogits", c.logits, dlogits, [&] { return c.loss(); });
}

TEST(CrossEntropy, PaddingIsIgnored) {
  CrossEntropyCase c(3);
  const Vec before = c.losses();
  for (int n = 0; n < N; ++n)
    for (int j = V; j < Vp; ++j) c.logits[n * Vp + j] = (j % 2 ? -1e30 : 1e30);
  const Vec after = c.losses();
  EXPECT_TRUE(bitwise_equal(before, after));
}

TEST(CrossEntropy, InPlaceAndLargeLogits) {
  const int n = 9, v = 1000, vp = 1024;
  std::mt19937_64 rng(4);
  VecF logits = to_float(random_vec(rng, n * vp, -20, 20));
  logits[5] = 1e4f;  // a dominant logit: the softmax must stay finite
  logits[vp + 7] = -1e4f;
  const std::vector<int32_t> targets = random_ints(rng, n, v);
  const VecF dl = to_float(random_vec(rng, n));
  VecF separate(n * vp);
  crossentropy_backward(separate.data(), logits.data(), targets.data(), dl.data(), n, v, vp);
  VecF inplace = logits;
  crossentropy_backward(inplace.data(), inplace.data(), targets.data(), dl.data(), n, v, vp);
  EXPECT_TRUE(bitwise_equal(separate, inplace));
  for (float x : separate) ASSERT_TRUE(std::isfinite(x));
  VecF losses(n);
  crossentropy_forward(losses.data(), logits.data(), targets.data(), n, v, vp);
  for (float x : losses) ASSERT_TRUE(std::isfinite(x));
  // Row sums of the gradient are 0 (softmax sums to 1), up to rounding.
  for (int r = 0; r < n; ++r) {
    double s = 0;
    for (int j = 0; j < v; ++j) s += separate[r * vp + j];
    EXPECT_NEAR(s, 0.0, 1e-5);
  }
}

TEST(CrossEntropy, FloatMatchesDoubleAndIsDeterministic) {
  const int n = 20, v = 1000, vp = 1024;
  std::mt19937_64 rng(5);
  Vec logits = random_vec(rng, n * vp, -8, 8), dl = random_vec(rng, n);
  round_to_float({&logits, &dl});
  const std::vector<int32_t> targets = random_ints(rng, n, v);
  Vec losses(n), dlogits(n * vp);
  crossentropy_forward(losses.data(), logits.data(), targets.data(), n, v, vp);
  crossentropy_backward(dlogits.data(), logits.data(), targets.data(), dl.data(), n, v, vp);
  auto run_float = [&] {
    VecF fl = to_float(logits), fdl = to_float(dl), floss(n);
    crossentropy_forward(floss.data(), fl.data(), targets.data(), n, v, vp);
    crossentropy_backward(fl.data(), fl.data(), targets.data(), fdl.data(), n, v, vp);
    fl.insert(fl.end(), floss.begin(), floss.end());
    return fl;
  };
  const VecF first = run_float();
  Vec want = dlogits;
  want.insert(want.end(), losses.begin(), losses.end());
  expect_close("float vs double", first, want, 1e-5);
  for (int threads : {1, 3}) {
    with_threads(threads, [&] { EXPECT_TRUE(bitwise_equal(first, run_float())) << threads; });
  }
}
