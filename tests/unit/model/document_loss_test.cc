// data.document_end_loss = false (Hardening III item 5): a micro-batch whose every target
// begins a document counts none. It is left out of the step's mean, its loss and its gradient
// alike, so the step trains exactly as it would on the other micro-batches alone; a step none of
// whose micro-batches counts a target is not taken (no update, no loss), never a loss of 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "optim/optimizer.h"
#include "runtime/engine.h"

using namespace myriad;

namespace {

Config config(int64_t global_batch) {
  return parse_config("", "document loss test",
                      {"model.layers=2", "model.d_model=32", "model.heads=2", "model.seq_len=16", "model.vocab_size=96",
                       "train.micro_batch=1", cat("train.global_batch=", global_batch), "optim.lr=3e-3",
                       "optim.warmup_steps=0", "train.steps=3", "train.device=cpu", "data.document_mask=true",
                       "data.document_end_loss=false"});
}

constexpr int64_t T = 16;

// A row of T + 1 random tokens, and its document starts: one document, or (`singles`) a
// document at every token, whose targets then all begin documents.
void add_row(std::vector<int32_t>& tokens, std::vector<int32_t>& starts, uint64_t seed, bool singles) {
  std::mt19937_64 gen(seed);
  for (int64_t i = 0; i <= T; ++i) {
    tokens.push_back(static_cast<int32_t>(gen() % 96));
    starts.push_back(singles ? static_cast<int32_t>(i) : 0);
  }
}

TEST(DocumentEndLoss, AMicroBatchThatCountsNoTargetIsLeftOutOfTheStepsMean) {
  auto both = make_engine(config(2)), alone = make_engine(config(1)), probe = make_engine(config(1));
  std::vector<int32_t> tokens, starts, tokens1, starts1;
  add_row(tokens, starts, 1, /*singles=*/true);  // micro-batch 0: no target counts
  add_row(tokens, starts, 2, false);             // micro-batch 1: every target but none counts
  add_row(tokens1, starts1, 2, false);
  ASSERT_EQ(Rows(tokens.data(), starts.data()).counted_targets(1, T, false), 0);
  ASSERT_EQ(Rows(tokens.data(), starts.data()).from(1, T).counted_targets(1, T, false), T);
  const float forward = probe->loss({tokens1.data(), starts1.data()}, 1);
  const StepResult r = both->train_step({tokens.data(), starts.data()}, 1, 1e-3);
  const StepResult a = alone->train_step({tokens1.data(), starts1.data()}, 1, 1e-3);
  EXPECT_FALSE(r.counted_nothing);
  EXPECT_EQ(r.loss, forward) << "the step's loss is the counting micro-batch's, not half of it";
  EXPECT_EQ(r.loss, a.loss);
  EXPECT_EQ(r.grad_norm, a.grad_norm);
  const int64_t P = both->layout().total();
  EXPECT_TRUE(std::equal(both->host_state().params, both->host_state().params + P, alone->host_state().params))
      << "the update is the counting micro-batch's alone, bit for bit";

  // A step none of whose micro-batches counts a target: no update, no loss.
  std::vector<int32_t> none, none_starts;
  add_row(none, none_starts, 3, true);
  add_row(none, none_starts, 4, true);
  const std::vector<float> before(both->host_state().params, both->host_state().params + P);
  const StepResult n = both->train_step({none.data(), none_starts.data()}, 2, 1e-3);
  EXPECT_TRUE(n.counted_nothing);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), both->host_state().params)) << "nothing was updated";
  // With every target counted (document_end_loss on) the same rows train as before.
  EXPECT_EQ(Rows(none.data(), none_starts.data()).counted_targets(2, T, true), 2 * T);
}

}  // namespace
