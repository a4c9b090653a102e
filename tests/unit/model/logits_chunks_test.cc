// train.logits_mib on the oracle: the LM head, the loss and the head's backward run over row
// chunks inside the forward (model/gpt.h), so that a step holds the logits of one chunk. Trained
// with chunks of a few rows (the last one ragged), every block variant and chunk layout follows
// the run whose one chunk holds all the logits: the same losses and weights within fp32's
// summation order (the head's weight gradient is summed chunk by chunk), the same evaluation and
// the same sampling logits. The memory plan counts one chunk. test_gpu checks the CUDA op set.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/config.h"
#include "model/memory_plan.h"
#include "optim/optimizer.h"
#include "runtime/engine.h"

using namespace myriad;

namespace {

// B 2 x T 16 = 32 rows of logits; 96 ids padded to 128 fp32 columns, 512 bytes a row: 0.0025 MiB
// is 5 rows (chunks of 5, 5, 5, 5, 5, 5, 2).
constexpr const char* kFiveRows = "train.logits_mib=0.0025";

Config config(std::vector<std::string> sets, bool chunks) {
  for (const char* s : {"model.layers=3", "model.d_model=32", "model.heads=2", "model.seq_len=16",
                        "model.vocab_size=96", "train.micro_batch=2", "train.global_batch=4",
                        "optim.lr=3e-3", "optim.warmup_steps=0", "train.steps=3", "train.device=cpu"})
    sets.insert(sets.begin(), s);
  if (chunks) sets.push_back(kFiveRows);
  return parse_config("", "logits chunks test", sets);
}

std::vector<int32_t> batch(const Config& cfg, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<int32_t> t(cfg.train.global_batch * (cfg.model.seq_len + 1));
  for (auto& x : t) x = static_cast<int32_t>(gen() % cfg.model.vocab_size);
  return t;
}

double rel_diff(const float* a, const float* b, int64_t n) {
  double d = 0, r = 0;
  for (int64_t i = 0; i < n; ++i) d += std::pow(double(a[i]) - b[i], 2), r += double(b[i]) * b[i];
  return std::sqrt(d / std::max(r, 1e-30));
}

struct Case {
  const char* name;
  std::vector<std::string> sets;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class LogitsChunks : public ::testing::TestWithParam<Case> {};

TEST_P(LogitsChunks, TrainLikeOneChunk) {
  const Case& c = GetParam();
  const Config cfg = config(c.sets, true);
  auto whole = make_engine(config(c.sets, false)), chunked = make_engine(cfg);
  for (int step = 1; step <= 3; ++step) {
    const std::vector<int32_t> tokens = batch(cfg, 70 + step);
    const double lr = lr_at(cfg.optim, step - 1, cfg.train.steps);
    const StepResult r = whole->train_step(tokens.data(), step, lr), x = chunked->train_step(tokens.data(), step, lr);
    EXPECT_NEAR(x.loss, r.loss, 1e-5 * r.loss) << "step " << step;
    EXPECT_NEAR(x.grad_norm, r.grad_norm, 1e-4 * r.grad_norm) << "step " << step;
  }
  const int64_t P = whole->layout().total();
  EXPECT_LT(rel_diff(chunked->host_state().params, whole->host_state().params, P), 1e-5) << "parameters";
  const std::vector<int32_t> tokens = batch(cfg, 7);
  EXPECT_NEAR(chunked->loss(tokens.data(), 2), whole->loss(tokens.data(), 2), 1e-5) << "evaluation";
  // Sampling's logits: each row's last position.
  const int64_t Vp = cfg.padded_vocab(), T = 9;
  std::vector<int32_t> prompt(2 * T);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + 5) % 96);
  std::vector<float> a(2 * Vp), b(2 * Vp);
  whole->last_logits(prompt.data(), 2, T, a.data());
  chunked->last_logits(prompt.data(), 2, T, b.data());
  EXPECT_LT(rel_diff(b.data(), a.data(), 2 * Vp), 1e-5) << "last logits";
  // Chunks of one row (0.0005 MiB) sample the same.
  std::vector<std::string> one_row = c.sets;
  one_row.push_back("train.logits_mib=0.0005");
  auto single = make_engine(config(one_row, false));
  std::vector<float> d(2 * Vp);
  single->last_logits(prompt.data(), 2, T, d.data());
  auto fresh = make_engine(config(c.sets, false));
  fresh->last_logits(prompt.data(), 2, T, a.data());
  EXPECT_LT(rel_diff(d.data(), a.data(), 2 * Vp), 1e-6) << "one row at a time";
}

INSTANTIATE_TEST_SUITE_P(
    Variants, LogitsChunks,
    ::testing::Values(Case{"gpt2_tied", {}},
                      // the head's gradient lands in wte's before the embedding's is added
                      Case{"gpt2_chunks_recompute", {"parallel.virtual_stages=3", "train.recompute=full"}},
                      Case{"llama_untied", {"model.norm=rmsnorm", "model.position_encoding=rope", "model.mlp=swiglu",
                                            "model.kv_heads=1", "model.tied_embeddings=false", "model.bias=false"}},
                      Case{"parallel_window", {"model.parallel_block=true", "model.window=5"}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(LogitsChunks, TheMemoryPlanHoldsOneChunk) {
  const Config cfg = config({}, true);
  model::GptMemoryShape s = model::memory_shape(cfg.model, 1, 2, cfg.padded_vocab());
  s.act_bytes = 4;
  const int64_t rows = model::logits_rows(cfg.train.logits_mib, s.Vl, s.act_bytes);
  EXPECT_EQ(rows, 5);
  s.logits_rows = rows;
  const int64_t chunked = model::slot_bytes(s, 3, true) - model::slot_bytes(s, 3, false);
  s.logits_rows = 0;
  const int64_t whole = model::slot_bytes(s, 3, true) - model::slot_bytes(s, 3, false);
  EXPECT_EQ(whole - chunked, (32 - 5) * s.Vl * 4);
  // From 128 rows on, a multiple of 128: llama-1b's 128,256 ids in bf16 at the default 512 MiB.
  EXPECT_EQ(model::logits_rows(512, 128256, 2), 2048);
  EXPECT_EQ(model::logits_rows(512, 50304, 2), 5248);
}

}  // namespace
