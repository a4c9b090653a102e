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

// FP8's block scaling (train.fp8_scaling = "block") keeps no cast: under recompute none the norms'
// outputs stay in the slot in bf16 (2 bytes an element where tensor scaling keeps 1), and the step
// needs no shared transient for them; under the other modes the two plans hold alike. Its cast
// buffers add their tiles' inverse scales, 4 bytes each, at each buffer's largest count.
TEST(MemoryPlan, BlockScalingCountsItsTilesAndKeepsNoCast) {
  const Config cfg = llama();
  auto shape = [&](bool block, const char* recompute) {
    model::GptMemoryShape s = model::memory_shape(cfg.model, 1, 2, cfg.padded_vocab());
    s.act_bytes = 2, s.saved_per_row = 1, s.fp8 = true, s.fp8_block = block, s.recompute = recompute;
    return s;
  };
  const model::GptMemoryShape tensor = shape(false, "none"), block = shape(true, "none");
  const int64_t BT = 2 * 64, C = 64;
  EXPECT_TRUE(model::keeps_norm_casts(tensor));
  EXPECT_FALSE(model::keeps_norm_casts(block));
  EXPECT_EQ(model::slot_bytes(block, 4, true) - model::slot_bytes(tensor, 4, true), 4 * 2 * BT * C * (2 - 1));
  EXPECT_EQ(model::buffer_bytes(tensor) - model::buffer_bytes(block), 2 * BT * C * 2);
  for (const char* rc : {"norms", "selective", "full"}) {
    EXPECT_EQ(model::slot_bytes(shape(true, rc), 4, true), model::slot_bytes(shape(false, rc), 4, true)) << rc;
    EXPECT_EQ(model::buffer_bytes(shape(true, rc)), model::buffer_bytes(shape(false, rc))) << rc;
  }
  // N 128 tokens; inputs up to 176 wide (the MLP's), outputs up to 352 (SwiGLU's pairs): buffer 0
  // holds 128 x ceil(352 / 128) = 384 scales; buffer 1 x^T's 176 x ceil(128 / 128) = 176 (more than
  // any weight's blocks: 12 at most, fc's 3 x 4 padded); buffer 2 dy^T's 352.
  EXPECT_EQ(block.Fl, 176);
  EXPECT_EQ(block.Pl, 352);
  EXPECT_EQ(model::fp8_cast_bytes(block) - model::fp8_cast_bytes(tensor), 4 * (384 + 176 + 352));
}

// FP8 casts a step's weights once (fp8::WeightCast) where the step would cast each more than
// twice: with several micro-batches, or full recompute's second forward; the LM head also when its
// rows run in several chunks. The casts then hold each weight's W and W^T and its scales, and the
// cast buffers no longer grow to a weight.
TEST(MemoryPlan, TheWeightsAreCastOnceWhereAStepWouldCastThemMoreThanTwice) {
  const Config cfg = llama();
  auto shape = [&](int64_t micro_batches, const char* recompute, bool head, double logits_mib, bool block = false) {
    model::GptMemoryShape s = model::memory_shape(cfg.model, 1, 2, 1024);  // a head of 1024 rows: the largest weight
    s.act_bytes = 2, s.saved_per_row = 1, s.fp8 = true, s.fp8_head = head, s.fp8_block = block;
    s.recompute = recompute, s.micro_batches = micro_batches;
    s.logits_rows = model::logits_rows(logits_mib, s.Vl, 2);
    return s;
  };
  EXPECT_FALSE(fp8::cast_weights_once(2));
  EXPECT_TRUE(fp8::cast_weights_once(3));
  const model::GptMemoryShape one = shape(1, "none", true, 64), two = shape(2, "none", true, 64),
                              full = shape(1, "full", false, 64), chunks = shape(1, "none", true, 0.01);
  EXPECT_EQ(model::head_chunks(one), 1);
  EXPECT_GT(model::head_chunks(chunks), 1);
  EXPECT_FALSE(model::casts_block_weights_once(one) || model::casts_head_once(one));
  EXPECT_TRUE(model::casts_block_weights_once(two) && model::casts_head_once(two));
  EXPECT_TRUE(model::casts_block_weights_once(full));
  EXPECT_FALSE(model::casts_block_weights_once(chunks));
  EXPECT_TRUE(model::casts_head_once(chunks));
  model::GptMemoryShape bf16 = two;
  bf16.fp8 = bf16.fp8_head = false;
  EXPECT_FALSE(model::casts_block_weights_once(bf16) || model::casts_head_once(bf16));
  EXPECT_EQ(model::weight_cast_bytes(one, 4, 0, true), 0);
  EXPECT_EQ(model::weight_cast_bytes(bf16, 4, 0, true), 0);
  // Per tensor: a layer's four weights and the head, each twice in bytes (W and W^T) and one
  // cast's scalars. Q 64 + 2 x 2 kv heads of 16 = 128 wide; C 64; SwiGLU's 352; V 1024. No
  // head's bytes without the head, no layer's on a rank without layers.
  const int64_t C = 64, Q = 128, P = 352, F = 176, V = 1024, k = 4 * fp8::kept_floats(1);
  const int64_t layer = 2 * (Q * C + C * C + P * C + C * F) + 4 * k, head = 2 * V * C + k;
  EXPECT_EQ(two.Ql, Q);
  EXPECT_EQ(model::weight_cast_bytes(two, 4, 0, true), 4 * layer + head);
  EXPECT_EQ(model::weight_cast_bytes(two, 4, 0, false), 4 * layer);
  EXPECT_EQ(model::weight_cast_bytes(two, 0, 0, true), head);
  EXPECT_EQ(model::weight_cast_bytes(chunks, 4, 0, true), head);
  // Buffer 1 held the largest weight a call cast, the head's V x C; with the weights cast into
  // their own casts it holds at most x^T, the MLP's 176 features by 128 tokens.
  EXPECT_EQ(model::fp8_cast_bytes(one) - model::fp8_cast_bytes(two), V * C - 128 * F);
  // Block scaling: each weight's blocks' scales for both layouts, each from a 64-byte boundary:
  // here 16 floats each (fc's 3 x 1 blocks, padded to 4 a row, then to 16), in place of the
  // scalars.
  const model::GptMemoryShape blocks = shape(2, "none", false, 64, true);
  EXPECT_EQ(fp8::weight_cast_t_offset(P, C), 16);
  EXPECT_EQ(model::weight_cast_bytes(blocks, 1, 0, false) - model::weight_cast_bytes(two, 1, 0, false),
            4 * (4 * 2 * 16) - 4 * k);
}

}  // namespace
