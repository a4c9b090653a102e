// The memory plan under context parallelism (model/memory_plan.h): a rank's activations fall as
// 1/cp, the CPU's kept probabilities as 1/cp of (T, T), and the step gains the whole sequence's
// qkv, its gradient and its keys' and values' blocks for the collectives. GptModel checks its own allocations against the
// plan at every construction (the launcher tests build it under cp); this checks the plan's
// arithmetic itself.
#include "model/memory_plan.h"

#include <gtest/gtest.h>

#include "core/config.h"

using namespace myriad;

namespace {

Config llama() {
  return parse_config("", "t", {"model.layers=4", "model.d_model=64", "model.seq_len=64", "model.heads=4",
                                "model.kv_heads=2", "model.norm=rmsnorm", "model.position_encoding=rope",
                                "model.mlp=swiglu", "model.mlp_hidden=176"});
}

TEST(MemoryPlan, ARanksActivationsFallAsOneOverCp) {
  const Config cfg = llama();
  for (int64_t saved_keys : {int64_t(0), int64_t(1)}) {  // 0: the CPU's probabilities (keys per row), 1: an LSE
    auto shape = [&](int64_t cp) {
      model::GptMemoryShape s = model::memory_shape(cfg.model, 1, 2, cfg.padded_vocab(), cp);
      s.saved_per_row = saved_keys == 0 ? s.T * s.cp : 1;
      return s;
    };
    const model::GptMemoryShape one = shape(1), two = shape(2), four = shape(4);
    EXPECT_EQ(two.T, 32);
    EXPECT_EQ(four.T, 16);
    for (bool head : {false, true}) {
      EXPECT_EQ(model::slot_bytes(two, 4, head) * 2, model::slot_bytes(one, 4, head)) << "head " << head;
      EXPECT_EQ(model::slot_bytes(four, 4, head) * 4, model::slot_bytes(one, 4, head)) << "head " << head;
    }
    // The step's buffers: 1/cp of the per-token ones, plus the whole sequence's qkv and its
    // gradient, and its keys and values (2 of the 4 + 2 + 2 heads' widths here: 4 query heads
    // over 2 key/value heads).
    const int64_t whole_qkv = one.B * one.T * one.Ql * one.act_bytes;
    const int64_t per_token = model::buffer_bytes(one) - 8;  // less the loss (a double)
    EXPECT_EQ(model::buffer_bytes(two) - 8, per_token / 2 + 2 * whole_qkv + whole_qkv / 2);
    EXPECT_EQ(model::buffer_bytes(four) - 8, per_token / 4 + 2 * whole_qkv + whole_qkv / 2);
  }
}

}  // namespace
