// The one step (runtime/model_engine.h) on the CUDA op set, in one process, against the same
// step on the CPU op set (the oracle) and against the single-GPU engine: the same model from
// the same seed, the same batches, step by step; its state through the host and back.
// The multi-process layouts are checked through the launcher by scripts/gpu_layouts_check.sh.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "core/config.h"
#include "engine_cases.h"
#include "core/error.h"
#include "optim/optimizer.h"
#include "runtime/engine.h"

using namespace myriad;

namespace {

using namespace engine_cases;

class OneStepOnCuda : public ::testing::TestWithParam<Case> {};

// The tolerances of the single-GPU engine's CPU-parity test (engine_test.cc).
TEST_P(OneStepOnCuda, MatchesTheCpuAndTheSingleGpuEngine) {
  const Config gcfg = config(GetParam(), "cuda"), ccfg = config(GetParam(), "cpu");
  auto ops = make_cuda_model_engine(gcfg, nullptr);
  auto cpu = make_engine(ccfg), single = make_engine(gcfg);
  ASSERT_NE(ops->device().find("cuda"), std::string::npos);
  const int64_t P = cpu->layout().total();
  ASSERT_EQ(ops->layout().total(), P);
  ops->state_to_host();
  EXPECT_EQ(rel(ops->host_state().params, cpu->host_state().params, P), 0.0) << "the same initial weights";
  for (int step = 1; step <= 6; ++step) {
    std::vector<int32_t> tokens = batch(ccfg, 1000 + step);
    const double lr = lr_at(ccfg.optim, step - 1, ccfg.train.steps);
    const StepResult o = ops->train_step(tokens.data(), step, lr);
    const StepResult c = cpu->train_step(tokens.data(), step, lr);
    const StepResult s = single->train_step(tokens.data(), step, lr);
    EXPECT_NEAR(o.loss, c.loss, 0.01 * c.loss) << "step " << step;
    EXPECT_NEAR(o.grad_norm, c.grad_norm, 0.03 * c.grad_norm) << "step " << step;
    EXPECT_NEAR(o.loss, s.loss, 0.01 * s.loss) << "step " << step;
  }
  ops->state_to_host(), single->state_to_host();
  std::printf("  %s after 6 steps: weights against the CPU: op set %.2e, single-GPU engine %.2e; "
              "first moments %.2e, %.2e; second %.2e, %.2e\n", GetParam().name,
              rel(ops->host_state().params, cpu->host_state().params, P),
              rel(single->host_state().params, cpu->host_state().params, P),
              rel(ops->host_state().m, cpu->host_state().m, P), rel(single->host_state().m, cpu->host_state().m, P),
              rel(ops->host_state().v, cpu->host_state().v, P), rel(single->host_state().v, cpu->host_state().v, P));
  EXPECT_LT(rel(ops->host_state().params, cpu->host_state().params, P), 2e-2);
  EXPECT_LT(rel(ops->host_state().params, single->host_state().params, P), 2e-2);
  // The op set rounds to bf16 where the single-GPU engine fuses (residual + LayerNorm, the
  // GELU epilogues): measured on the H200, moments 0.024-0.051 from the CPU's (the single-GPU
  // engine's 0.024-0.032), sampling logits 0.034-0.039 (its 0.021-0.022).
  EXPECT_LT(rel(ops->host_state().m, cpu->host_state().m, P), 8e-2);
  std::vector<int32_t> tokens = batch(ccfg, 7);
  EXPECT_NEAR(ops->loss(tokens.data(), 2), cpu->loss(tokens.data(), 2), 0.01 * cpu->loss(tokens.data(), 2));
  const int64_t Vp = ccfg.padded_vocab();
  std::vector<float> lo(2 * Vp), lc(2 * Vp);
  ops->last_logits(tokens.data(), 2, 37, lo.data());
  cpu->last_logits(tokens.data(), 2, 37, lc.data());
  EXPECT_LT(rel(lo.data(), lc.data(), 2 * Vp), 5e-2);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, OneStepOnCuda,
    ::testing::Values(Case{"sequential", {}}, Case{"window", {"model.window=17"}},
                      Case{"parallel_nobias", {"model.parallel_block=true", "model.bias=false"}},
                      Case{"lamb", {"optim.name=lamb"}}, Case{"clipped", {"optim.grad_clip=0.05"}}),
    [](const auto& info) { return std::string(info.param.name); });

// Parameters, moments and step count out to the host and into a fresh engine: the next step is
// bitwise the same in both; and the same state loaded into the CPU engine trains on alike.
TEST(OneStepOnCudaCheckpoint, StateRoundTripsThroughTheHost) {
  for (const char* opt : {"optim.name=adamw", "optim.name=lamb"}) {
    const Config cfg = config(Case{"c", {opt}}, "cuda"), ccfg = config(Case{"c", {opt}}, "cpu");
    auto a = make_cuda_model_engine(cfg, nullptr), b = make_cuda_model_engine(cfg, nullptr);
    auto c = make_engine(ccfg);
    std::vector<int32_t> tokens = batch(cfg, 3);
    a->train_step(tokens.data(), 1, 1e-3);
    a->train_step(tokens.data(), 2, 1e-3);
    a->state_to_host();
    const int64_t P = a->layout().total();
    for (Engine* to : {b.get(), c.get()}) {
      std::copy(a->host_state().params, a->host_state().params + P, to->host_state().params);
      std::copy(a->host_state().m, a->host_state().m + P, to->host_state().m);
      std::copy(a->host_state().v, a->host_state().v + P, to->host_state().v);
      *to->host_state().steps_taken = *a->host_state().steps_taken;
      to->state_from_host();
    }
    std::vector<int32_t> next = batch(cfg, 4);
    const float la = a->train_step(next.data(), 3, 1e-3).loss;
    EXPECT_EQ(la, b->train_step(next.data(), 3, 1e-3).loss) << opt;
    EXPECT_NEAR(la, c->train_step(next.data(), 3, 1e-3).loss, 0.01 * la) << opt;
    a->state_to_host(), b->state_to_host();
    EXPECT_EQ(rel(a->host_state().params, b->host_state().params, P), 0.0) << opt;
    EXPECT_EQ(rel(a->host_state().v, b->host_state().v, P), 0.0) << opt;
  }
}

// The phase timers come from CUDA events: every phase positive, their sum within the step's
// wall time, and backward (two GEMMs per forward one) longer than forward.
TEST(OneStepOnCudaTimers, PhasesAreTimedOnTheDevice) {
  const Config cfg = config(Case{"t", {"model.layers=4", "model.d_model=512", "model.heads=8"}}, "cuda");
  auto e = make_cuda_model_engine(cfg, nullptr);
  for (int step = 1; step <= 3; ++step) {
    std::vector<int32_t> tokens = batch(cfg, step);
    const auto t0 = std::chrono::steady_clock::now();
    const StepResult r = e->train_step(tokens.data(), step, 1e-3);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step == 1) continue;  // warm-up
    EXPECT_GT(r.times.forward_s, 0);
    EXPECT_GT(r.times.backward_s, r.times.forward_s);
    EXPECT_GT(r.times.optimizer_s, 0);
    EXPECT_LT(r.times.forward_s + r.times.backward_s + r.times.optimizer_s, wall);
  }
  EXPECT_GT(e->peak_memory(), 0);
}

}  // namespace
