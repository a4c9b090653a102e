// Cross-entropy (loss and in-place dlogits) against the CPU oracle in fp32 on the same
// bf16-rounded logits: GPT-2's padded vocabulary (V=50257 of Vp=50304), a byte vocabulary
// (V=256 of 384, and of 256), and Vp % 8 != 0 (the scalar path). Losses are poisoned first;
// the padded columns of dlogits must be exactly 0; the forward-only call (dloss = 0) must leave
// the logits untouched; two runs must give the same bits.
//
// Tolerances: losses are fp32 from the same inputs (fast exp, another summation order): 1e-5.
// dlogits are bf16 (one rounding): 1e-2, over all columns and over the non-target ones alone
// (the target column dominates the norm).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "ops/cpu/ops.h"
#include "ops/cuda/ops.cuh"

namespace {

using namespace gpu_test;
namespace cu = myriad::cuda;

struct Case {
  int N, V, Vp;
};

class CrossEntropy : public ::testing::TestWithParam<Case> {};

TEST_P(CrossEntropy, MatchesCpu) {
  const auto [N, V, Vp] = GetParam();
  std::mt19937_64 gen(seed() + N + V + Vp);
  auto logits = randn(size_t(N) * Vp, gen, 3.0f);
  // Junk in the padding: it must not enter the softmax.
  for (int n = 0; n < N; ++n)
    for (int v = V; v < Vp; ++v) logits[size_t(n) * Vp + v] = 50.0f;
  logits = round_bf16(logits);
  std::vector<int32_t> targets(N);
  for (auto& t : targets) t = static_cast<int32_t>(gen() % V);
  const float dloss = 1.0f / N;

  std::vector<float> rloss(N), rgrad(size_t(N) * Vp), dl(N, dloss);
  myriad::cpu::crossentropy_forward<float>(rloss.data(), logits.data(), targets.data(), N, V, Vp);
  myriad::cpu::crossentropy_backward<float>(rgrad.data(), logits.data(), targets.data(), dl.data(),
                                            N, V, Vp);

  Dev<bf16> dlog(logits.size());
  Dev<float> dlos(N);
  Dev<int32_t> dt(N);
  dt.upload(targets);
  const auto blogits = to_bf16(logits);

  // Forward only: losses, logits untouched.
  dlog.upload(blogits);
  dlos.poison();
  cu::crossentropy(dlos.p, dlog.p, dt.p, 0.0f, N, V, Vp, 0);
  CUDA_OK(cudaDeviceSynchronize());
  const auto loss0 = dlos.download();
  const auto after = dlog.download();
  EXPECT_EQ(std::memcmp(after.data(), blogits.data(), blogits.size() * sizeof(bf16)), 0);
  const double el0 = rel_err(loss0, rloss);
  EXPECT_LT(el0, 1e-5);

  std::vector<float> first_loss, first_grad;
  for (int run = 0; run < 2; ++run) {
    dlog.upload(blogits);
    dlos.poison();
    cu::crossentropy(dlos.p, dlog.p, dt.p, dloss, N, V, Vp, 0);
    CUDA_OK(cudaDeviceSynchronize());
    const auto loss = dlos.download();
    const auto grad = to_float(dlog.download());
    if (run == 0) {
      const double el = rel_err(loss, rloss), eg = rel_err(grad, rgrad);
      // Non-target columns alone.
      std::vector<float> g2 = grad, r2 = rgrad;
      for (int n = 0; n < N; ++n) g2[size_t(n) * Vp + targets[n]] = r2[size_t(n) * Vp + targets[n]] = 0;
      const double eg2 = rel_err(g2, r2);
      std::printf("  crossentropy N=%d V=%d Vp=%d: loss %.2e (fwd only %.2e) dlogits %.2e "
                  "(non-target %.2e)\n", N, V, Vp, el, el0, eg, eg2);
      EXPECT_LT(el, 1e-5);
      EXPECT_LT(eg, 1e-2);
      EXPECT_LT(eg2, 1e-2);
      EXPECT_EQ(loss, loss0);  // the same pass 1 with or without the gradient
      int64_t pad_bad = 0;
      for (int n = 0; n < N; ++n)
        for (int v = V; v < Vp; ++v) pad_bad += grad[size_t(n) * Vp + v] != 0.0f;
      EXPECT_EQ(pad_bad, 0);
      first_loss = loss, first_grad = grad;
    } else {
      EXPECT_EQ(loss, first_loss);
      EXPECT_EQ(grad, first_grad);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CrossEntropy,
                         ::testing::Values(Case{333, 50257, 50304}, Case{64, 256, 384},
                                           Case{333, 256, 256}, Case{37, 259, 261},
                                           Case{5, 3, 8}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return "N" + std::to_string(i.param.N) + "_V" + std::to_string(i.param.V) +
                                  "_Vp" + std::to_string(i.param.Vp);
                         });

}  // namespace
