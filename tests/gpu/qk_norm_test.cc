// The queries' and keys' RMSNorm (model.qk_norm) on the CUDA op set against the CPU op set: per
// head (Qwen3's) and over a token's whole query and key blocks (OLMoE's), with grouped query
// heads, the forward's output and rstd, the backward's input and weight gradients; then a
// Qwen3-shaped model (a head size apart from d_model / heads, per-head norms) and an OLMoE-normed
// one trained on the CUDA engine against the CPU engine.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gpu/engine_cases.h"
#include "gpu/gpu_test_util.h"
#include "model/cuda/cuda_ops.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/kinds.h"
#include "optim/optimizer.h"
#include "runtime/engine.h"

namespace {

using namespace gpu_test;
using myriad::QkNorm;
using myriad::QkNormKind;
using myriad::cpu::CpuOps;
using myriad::cuda::CudaOps;

struct QkCase {
  const char* name;
  QkNormKind kind;
  int N, Hkv, G, D;
};

class QkNormOps : public ::testing::TestWithParam<QkCase> {};

TEST_P(QkNormOps, MatchTheCpu) {
  const QkCase c = GetParam();
  const int N = c.N, Hkv = c.Hkv, G = c.G, D = c.D, H = Hkv * G;
  const QkNorm n{c.kind, 1e-6f};
  const bool per_head = c.kind == QkNormKind::kHead;
  const size_t width = size_t(Hkv) * (G + 2) * D, wq_n = per_head ? D : size_t(H) * D,
               wk_n = per_head ? D : size_t(Hkv) * D, stats = size_t(N) * (per_head ? H + Hkv : 2);
  std::mt19937_64 gen(seed() + N + 7 * D + H);
  const auto raw = round_bf16(randn(size_t(N) * width, gen, 2.0f));
  const auto wq = round_bf16(randn(wq_n, gen, 0.2f, 1.0f)), wk = round_bf16(randn(wk_n, gen, 0.2f, 1.0f));
  const auto dy = round_bf16(randn(size_t(N) * width, gen));
  const auto dwq0 = randn(wq_n, gen), dwk0 = randn(wk_n, gen);
  CpuOps cpu;
  std::vector<float> qkv(raw.size()), rstd(stats), dx = dy, dwq = dwq0, dwk = dwk0;
  cpu.qk_norm_forward(n, qkv.data(), rstd.data(), raw.data(), wq.data(), wk.data(), N, Hkv, G, D);
  cpu.qk_norm_backward(n, dx.data(), dwq.data(), dwk.data(), raw.data(), wq.data(), wk.data(), rstd.data(), N, Hkv, G, D);

  CudaOps ops;
  Dev<bf16> graw(raw.size()), gqkv(raw.size()), gwq(wq_n), gwk(wk_n), gdx(dy.size());
  Dev<float> grstd(stats), gdwq(wq_n), gdwk(wk_n);
  up(graw, raw), up(gwq, wq), up(gwk, wk);
  std::vector<float> first_dx, first_dw;
  for (int run = 0; run < 2; ++run) {
    gqkv.poison(), grstd.poison();
    up(gdx, dy), gdwq.upload(dwq0), gdwk.upload(dwk0);
    ops.qk_norm_forward(n, gqkv.p, grstd.p, graw.p, gwq.p, gwk.p, N, Hkv, G, D);
    ops.qk_norm_backward(n, gdx.p, gdwq.p, gdwk.p, graw.p, gwq.p, gwk.p, grstd.p, N, Hkv, G, D);
    CUDA_OK(cudaDeviceSynchronize());
    const auto got_qkv = down(gqkv), got_rstd = grstd.download(), got_dx = down(gdx), got_dwq = gdwq.download(),
               got_dwk = gdwk.download();
    if (run == 0) {
      const double eq = rel_err(got_qkv, qkv), er = rel_err(got_rstd, rstd), ex = rel_err(got_dx, dx),
                   ewq = rel_err(got_dwq, dwq), ewk = rel_err(got_dwk, dwk);
      std::printf("  qk_norm %s: qkv %.2e rstd %.2e dx %.2e dwq %.2e dwk %.2e\n", c.name, eq, er, ex, ewq, ewk);
      EXPECT_LT(eq, 1e-2);   // bf16 outputs
      EXPECT_LT(er, 1e-5);   // fp32 statistics
      EXPECT_LT(ex, 1e-2);
      EXPECT_LT(ewq, 1e-4);  // fp32 sums over tokens, in another order than the CPU's doubles
      EXPECT_LT(ewk, 1e-4);
      // The value heads are copied, not normed.
      for (int t = 0; t < N; ++t)
        for (int g = 0; g < Hkv; ++g)
          for (int d = 0; d < D; ++d) {
            const size_t i = size_t(t) * width + (size_t(g) * (G + 2) + G + 1) * D + d;
            ASSERT_EQ(got_qkv[i], raw[i]) << "value element " << i;
          }
      first_dx = got_dx, first_dw = got_dwq;
    } else {  // a second run: the same bits
      EXPECT_EQ(got_dx, first_dx);
      EXPECT_EQ(got_dwq, first_dw);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, QkNormOps,
                         ::testing::Values(QkCase{"head_G4_D128", QkNormKind::kHead, 77, 2, 4, 128},
                                           QkCase{"head_G1_D64", QkNormKind::kHead, 33, 4, 1, 64},
                                           QkCase{"all_G2_D64", QkNormKind::kAll, 45, 2, 2, 64},
                                           QkCase{"all_G8_D80", QkNormKind::kAll, 9, 1, 8, 80}),
                         [](const auto& info) { return std::string(info.param.name); });

// A model with Qwen3's attention (head size 128 over d_model 256 and 4 heads, per-head norms) or
// OLMoE's whole-block norms, trained on the CUDA engine against the CPU engine, as the dense
// engine parity does (tests/gpu/engine_test.cc).
using namespace engine_cases;
using namespace myriad;

class QkNormEngine : public ::testing::TestWithParam<Case> {};

TEST_P(QkNormEngine, TrainingStepsMatchTheCpu) {
  Config gcfg = config(GetParam(), "cuda"), ccfg = config(GetParam(), "cpu");
  auto gpu = make_engine(gcfg), cpu = make_engine(ccfg);
  ASSERT_NE(gpu->device().find("cuda"), std::string::npos);
  const int64_t P = cpu->layout().total();
  for (int step = 1; step <= 6; ++step) {
    std::vector<int32_t> tokens = batch(ccfg, 2000 + step);
    const double lr = lr_at(ccfg.optim, step - 1, ccfg.train.steps);
    StepResult g = gpu->train_step(tokens.data(), step, lr);
    StepResult c = cpu->train_step(tokens.data(), step, lr);
    std::printf("  %s step %d: loss gpu %.5f cpu %.5f (%.2e), grad norm gpu %.5f cpu %.5f\n", GetParam().name, step,
                g.loss, c.loss, std::fabs(g.loss - c.loss) / c.loss, g.grad_norm, c.grad_norm);
    EXPECT_NEAR(g.loss, c.loss, 0.01 * c.loss) << "step " << step;
    EXPECT_NEAR(g.grad_norm, c.grad_norm, 0.03 * c.grad_norm) << "step " << step;
  }
  gpu->state_to_host();
  const double dw = rel(gpu->host_state().params, cpu->host_state().params, P);
  std::printf("  %s after 6 steps, against the CPU: weights %.2e\n", GetParam().name, dw);
  EXPECT_LT(dw, 2e-2 * GetParam().drift);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, QkNormEngine,
    ::testing::Values(Case{"qwen3_head128", with(kLlama, {"model.head_dim=128", "model.qk_norm=head"}), 2.0},
                      Case{"olmoe_norm_selective", with(kLlama, {"model.qk_norm=all", "train.recompute=selective"}),
                           2.0}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
