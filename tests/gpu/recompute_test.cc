// Activation recomputation in the CUDA engine (train.recompute): selective and full must train
// exactly as "none" does (bitwise: recompute runs the forward's kernels on the forward's inputs),
// with fewer activations held; a bad mode is an input error. The schedule (model/gpt.h) does it
// for every op set: the CPU unit tests check the same bitwise equality on the oracle.
#include <gtest/gtest.h>

#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "model/cuda/cuda_ops.h"
#include "model/params.h"
#include "optim/optimizer.h"
#include "runtime/engine.h"
#include "test_util.h"

using namespace myriad;

namespace {

// Three layers, so that full and selective recompute two of them (the last layer's activations
// are still in the shared buffers after the forward), and two micro-batches per step.
Config config(const std::vector<std::string>& extra) {
  std::vector<std::string> sets = {"model.layers=3", "model.d_model=256", "model.heads=4",
                                   "model.seq_len=96", "model.vocab_size=300", "train.micro_batch=2",
                                   "train.global_batch=4", "optim.lr=3e-3", "optim.warmup_steps=0",
                                   "train.steps=3", "train.device=cuda"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return parse_config("", "gpu test", sets);
}

Config config(const std::vector<std::string>& extra, const std::string& mode) {
  std::vector<std::string> sets = extra;
  sets.push_back("train.recompute=" + mode);
  return config(sets);
}

std::vector<int32_t> batch(const Config& cfg, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<int32_t> t(cfg.train.global_batch * (cfg.model.seq_len + 1));
  for (auto& x : t) x = static_cast<int32_t>(gen() % cfg.model.vocab_size);
  return t;
}

struct Case {
  const char* name;
  std::vector<std::string> sets;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }
const Case kSequential{"sequential", {}};
const Case kParallelWindow{"parallel_window", {"model.parallel_block=true", "model.window=17"}};

// The names of the tensors where a and b differ (with the count of differing elements), leaving
// out the tensor named `skip`.
std::string differing(const ParamLayout& layout, const float* a, const float* b,
                      const std::string& skip = "") {
  std::string out;
  for (const ParamSpec& p : layout.tensors()) {
    if (p.name == skip) continue;
    int64_t diff = 0;
    for (int64_t i = 0; i < p.numel; ++i) diff += a[p.offset + i] != b[p.offset + i];
    if (diff) out += cat(p.name, "(", diff, ") ");
  }
  return out;
}

// (case, mode): `mode` against "none" on the same batches. The "none" instances are the control:
// two engines of the same mode must already agree bitwise (EngineRepeatability); when a control
// fails too, the difference is not recomputation's.
class RecomputeParity : public ::testing::TestWithParam<std::tuple<Case, const char*>> {};

// One step without clipping, so that a difference stays in the tensor it comes from: the same
// loss and the same gradients (the first moments, (1 - beta1) g) as "none" in every tensor but
// the tied embedding. Its gradient differs run to run today even between two "none" engines, in
// a few rows (the open determinism item of docs/notes/cuda-performance.md); it takes the
// layers' part through the embedding backward, which wpe's gradient checks as well. This test
// keeps recomputation apart from that; the three-step test below needs it fixed.
TEST_P(RecomputeParity, OneStepGradientsBitwiseEqualToNone) {
  const auto& [c, mode] = GetParam();
  std::vector<std::string> sets = c.sets;
  sets.push_back("optim.grad_clip=0");
  const std::vector<int32_t> tokens = batch(config(sets), 501);
  const char* modes[2] = {"none", mode};
  std::vector<float> m[2];
  float loss[2];
  for (int i = 0; i < 2; ++i) {
    auto e = make_engine(config(sets, modes[i]));
    loss[i] = e->train_step(tokens.data(), 1, 1e-3).loss;
    e->state_to_host();
    m[i].assign(e->host_state().m, e->host_state().m + e->layout().total());
  }
  EXPECT_EQ(loss[1], loss[0]);
  EXPECT_EQ(differing(ParamLayout(config(sets)), m[1].data(), m[0].data(), "wte"), "");
}

// Three steps: the same losses, gradient norms, parameters and optimizer state as "none".
TEST_P(RecomputeParity, ThreeStepsBitwiseEqualToNone) {
  const auto& [c, mode] = GetParam();
  Config ref_cfg = config(c.sets, "none"), cfg = config(c.sets, mode);
  auto ref = make_engine(ref_cfg), e = make_engine(cfg);
  const ParamLayout& layout = ref->layout();
  for (int step = 1; step <= 3; ++step) {
    std::vector<int32_t> tokens = batch(cfg, 500 + step);
    const double lr = lr_at(cfg.optim, step - 1, cfg.train.steps);
    StepResult r = ref->train_step(tokens.data(), step, lr);
    StepResult x = e->train_step(tokens.data(), step, lr);
    EXPECT_EQ(x.loss, r.loss) << "step " << step;
    EXPECT_EQ(x.grad_norm, r.grad_norm) << "step " << step;
  }
  ref->state_to_host();
  e->state_to_host();
  const auto a = e->host_state(), b = ref->host_state();
  EXPECT_EQ(differing(layout, a.params, b.params), "") << "parameters";
  EXPECT_EQ(differing(layout, a.m, b.m), "") << "first moments";
  EXPECT_EQ(differing(layout, a.v, b.v), "") << "second moments";
  // The forward alone (validation loss, sampling) runs through the same shared buffers.
  std::vector<int32_t> tokens = batch(cfg, 7);
  EXPECT_EQ(e->loss(tokens.data(), 2), ref->loss(tokens.data(), 2));
  const int64_t Vp = cfg.padded_vocab();
  std::vector<float> la(2 * Vp), lb(2 * Vp);
  e->last_logits(tokens.data(), 2, 37, la.data());
  ref->last_logits(tokens.data(), 2, 37, lb.data());
  EXPECT_TRUE(la == lb);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, RecomputeParity,
    ::testing::Combine(::testing::Values(kSequential, kParallelWindow),
                       ::testing::Values("none", "norms", "selective", "full")),
    [](const auto& info) {
      const std::string mode = std::get<1>(info.param);
      return cat(std::get<0>(info.param).name, "_", mode == "none" ? "control" : mode);
    });

// Device memory shrinks by exactly what the slots stop keeping. Per layer and token, in bf16
// elements: norms drops the norms' outputs (2C; C with the parallel block's one norm) from all
// layers but keeps one shared set; selective drops fc (4C) too; full keeps only `in` (C) and one
// shared set of everything else (11C sequential, 9C parallel block, plus the fp32 LayerNorm
// statistics and the attention's log-sum-exp). GELU's output is kept by none (one step buffer in
// every mode: the backward recomputes it from fc). Measured as the device memory this process
// holds after a step (activations are taken at the first step).
TEST(RecomputeMemory, FullBelowSelectiveBelowNormsBelowNone) {
  for (const Case& c : {kSequential, kParallelWindow}) {
    SCOPED_TRACE(c.name);
    const Config cfg = config(c.sets);
    const int64_t L = cfg.model.layers, C = cfg.model.d_model, H = cfg.model.heads;
    const int64_t N = int64_t(cfg.train.micro_batch) * cfg.model.seq_len;
    const bool seq = !cfg.model.parallel_block;
    int64_t held[4];
    const char* modes[4] = {"none", "norms", "selective", "full"};
    for (int i = 0; i < 4; ++i) {
      auto e = make_engine(config(c.sets, modes[i]));
      const std::vector<int32_t> tokens = batch(cfg, 1);
      e->train_step(tokens.data(), 1, 1e-3);
      held[i] = cuda::CudaOps::held_bytes();
    }
    for (int i = 1; i < 4; ++i) EXPECT_LT(held[i], held[i - 1]) << modes[i];
    const int64_t norms = seq ? 2 : 1;
    const int64_t set_bytes = (seq ? 11 : 9) * N * C * 2 + (seq ? 4 : 2) * N * 4 + N * H * 4;
    EXPECT_EQ(held[0] - held[1], (L - 1) * norms * N * C * 2);
    EXPECT_EQ(held[0] - held[2], (L - 1) * (4 + norms) * N * C * 2);
    EXPECT_EQ(held[0] - held[3], (L - 1) * set_bytes);
  }
}

TEST(RecomputeConfig, BadModeIsAnInputErrorNamingTheKey) {
  const std::string what = myriad::test::input_error([] { config({"train.recompute=partial"}); });
  EXPECT_NE(what.find("train.recompute"), std::string::npos) << what;
  // The engine checks too, for a Config that did not come through parse_config.
  Config cfg = config({});
  cfg.train.recompute = "sometimes";
  const std::string engine_what = myriad::test::input_error([&] { make_engine(cfg); });
  EXPECT_NE(engine_what.find("train.recompute"), std::string::npos) << engine_what;
}

}  // namespace
