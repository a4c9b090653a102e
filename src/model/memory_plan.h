// What a rank's GPT holds in its op set's memory, from the config alone (no device): the bytes
// of one in-flight micro-batch's activations (a slot) and of the step's own buffers. GptModel
// checks its allocations against it (gpt_impl.h), and the planner predicts memory with it
// (plan/planner.cc), so that the two cannot drift apart.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "ops/fp8.h"

namespace myriad::model {

struct GptMemoryShape {
  int64_t B = 0, T = 0;             // the micro-batch: rows, and each row's tokens held here (seq_len / cp)
  int64_t cp = 1;                   // context-parallel ranks: the sequence's keys are T x cp
  int64_t C = 0;                    // d_model
  int64_t Cl = 0, Fl = 0, Hl = 0;   // this rank's attention width, MLP features, query heads (over tp)
  int64_t Ql = 0;                   // this rank's QKV width: (Hl + 2 kv heads) x head size
  int64_t Pl = 0;                   // this rank's MLP pre-activation width: Fl, or 2 Fl (SwiGLU)
  int64_t Vl = 0;                   // this rank's vocabulary rows (padded vocab over tp)
  int64_t logits_rows = 0;          // rows of logits the head holds at once (logits_rows()); 0: all B T
  bool tp = false, parallel_block = false;
  std::string recompute = "none";   // none, norms, selective, full
  int64_t act_bytes = 4;            // the op set's activation type: 2 (bf16, CUDA) or 4
  int64_t saved_per_row = 1;        // floats attention keeps per (b, h, t): 1 (CUDA), its keys T cp (the CPU)
  int64_t token_bytes = 16;         // per id of a micro-batch's token buffers: 16 (CUDA: ids and groups), 4
  // A mixture of experts: E routed experts, k per token, Fe features each, Fs shared features
  // (this rank's: the shared experts split over tp as the dense MLP);
  // whether the model has dense layers and MoE layers (the recompute set holds what each needs).
  int64_t E = 0, k = 0, Fe = 0, Fs = 0;
  bool has_dense = true, has_moe = false;
  // Expert parallelism: the ranks the experts split over. The experts' buffers hold the balanced
  // share of the rows, B T k (all there can be with ep = 1); a step whose experts get more grows
  // a buffer of its own for them (GptModel::expert_acts), outside this plan.
  int64_t ep = 1;
  int64_t expert_rows() const { return B * T * k; }
  int64_t head_rows() const { return logits_rows > 0 ? std::min(B * T, logits_rows) : B * T; }
  // model.qk_norm: the QKV GEMM's output kept beside the normed qkv, and each row's rstds.
  int64_t qk_rstds = 0;  // per row: Hl + Hkvl ("head"), 2 ("all"), 0 (none)
  bool fp8 = false, fp8_head = false;  // train.precision = "fp8": the block's linears; train.fp8_lm_head
  bool fp8_block = false;           // train.fp8_scaling = "block": tiles' scales, and no cast kept
  int64_t tp_ranks = 1;             // the tensor-parallel group's size (an FP8 cast's scalars hold its amaxes)
  int64_t micro_batches = 1;        // a step's on this rank (core/parallel_layout.h)
};

// The shape of model `m` on a tensor-parallel rank of `tp` (and a context-parallel one of `cp`)
// with micro-batches of B: its geometry; the caller sets tp, parallel_block, recompute and the
// op set's sizes.
inline GptMemoryShape memory_shape(const ModelConfig& m, int64_t tp, int64_t B, int64_t padded_vocab, int64_t cp = 1) {
  GptMemoryShape s;
  s.B = B, s.T = m.seq_len / cp, s.cp = cp, s.C = m.d_model, s.tp_ranks = tp;
  s.Hl = m.heads / tp, s.Cl = s.Hl * m.head_dim();
  s.Ql = (s.Hl + 2 * m.kv() / tp) * m.head_dim();
  s.Fl = m.ffn() / tp, s.Pl = s.Fl * (m.swiglu() ? 2 : 1);
  s.Vl = padded_vocab / tp;
  s.E = m.experts, s.k = m.moe() ? m.experts_per_token : 0, s.Fe = m.moe() ? m.expert_ffn() : 0, s.Fs = m.shared_ffn() / tp;
  s.has_moe = m.moe_layers() > 0, s.has_dense = m.moe_layers() < m.layers;
  s.qk_rstds = m.qk_norm == "head" ? s.Hl + m.kv() / tp : m.qk_norm == "all" ? 2 : 0;
  return s;
}

// The rows of logits that train.logits_mib holds: from 128 rows on a multiple of 128 (the GEMMs'
// tiles), at least one.
inline int64_t logits_rows(double mib, int64_t Vl, int64_t act_bytes) {
  const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(mib * (1 << 20) / double(Vl * act_bytes)));
  return rows >= 128 ? rows / 128 * 128 : rows;
}

// FP8 under recompute none keeps the norms' outputs as their one-byte casts, not bf16 (tensor
// scaling; block scaling keeps no cast).
inline bool keeps_norm_casts(const GptMemoryShape& s) { return s.fp8 && !s.fp8_block && s.recompute == "none"; }

// Activation elements of one layer in a slot, its floats (statistics, the router's) and its
// ints (the routing), as GptModel carves them: `set` the attention half, the norms' statistics
// and what the routing keeps (all but full recompute), `mlp` the MLP's wide tensors (no
// recompute), `norms` the norms' outputs (kept by none in bf16, the recompute set's otherwise); of
// the dense MLP (`dense`) and of the MoE one (`moe`): a layer is one, the recompute set both when
// the model has both.
struct LayerCounts {
  int64_t acts = 0, floats = 0, ints = 0;
};
inline LayerCounts layer_counts(const GptMemoryShape& s, bool set, bool mlp, bool dense = true, bool moe = false,
                                bool norms = false) {
  const int64_t BT = s.B * s.T, C = s.C, M = BT * s.k;
  LayerCounts n;
  if (norms) n.acts += (s.parallel_block ? 1 : 2) * BT * C;  // ln1, ln2
  if (set) {
    n.acts += BT * s.Ql + BT * s.Cl;  // qkv, attention output
    n.floats += 2 * BT + s.B * s.Hl * s.T * s.saved_per_row;  // LN1's statistics, attention's
    if (!s.parallel_block) n.acts += BT * C, n.floats += 2 * BT;  // mid, LN2's statistics
    if (s.qk_rstds > 0) n.acts += BT * s.Ql, n.floats += BT * s.qk_rstds;  // the GEMM's qkv, the rstds
  }
  if (mlp && dense) n.acts += BT * s.Pl;  // fc (pre-activation); act is recomputed from it
  if (set && moe) n.floats += BT * s.E + BT * s.k, n.ints += 3 * M, n.acts += M * C;  // logits, weights; routes; ys
  // The experts' input rows, fc and act (their rank's rows), the shared experts' fc and act.
  if (mlp && moe) n.acts += s.expert_rows() * (C + 3 * s.Fe) + BT * 3 * s.Fs;
  return n;
}

// One slot of a chunk of `layers` layers, `moe_layers` of them MoE (the last chunk also holds a
// chunk of the logits, head_rows of them), its token buffers (inputs, targets) apart.
inline int64_t slot_bytes(const GptMemoryShape& s, int64_t layers, bool head, int64_t moe_layers = 0) {
  const int64_t BT = s.B * s.T;
  const bool set = s.recompute != "full", mlp = s.recompute == "none" || s.recompute == "norms";
  // FP8 keeps the norms' outputs (none) as one-byte casts instead, and every layer four casts'
  // scalars (GptModel::LayerActs::ln1_fp8 ...).
  const bool norm_casts = keeps_norm_casts(s), norms = s.recompute == "none" && !norm_casts;
  const LayerCounts d = layer_counts(s, set, mlp, true, false, norms), m = layer_counts(s, set, mlp, false, true, norms);
  const int64_t dense_layers = layers - moe_layers;
  int64_t bytes = ((d.acts + BT * s.C) * dense_layers + (m.acts + BT * s.C) * moe_layers + 2 * BT * s.C) *
                      s.act_bytes                                                          // + each layer's input, out, lnf
                  + (d.floats * dense_layers + m.floats * moe_layers + 2 * BT) * 4  // statistics
                  + (d.ints * dense_layers + m.ints * moe_layers) * 4;              // routes
  if (s.fp8) bytes += layers * 4 * fp8::kept_floats(s.tp_ranks) * 4;
  if (norm_casts) bytes += layers * (s.parallel_block ? 1 : 2) * BT * s.C;
  if (head) bytes += s.head_rows() * s.Vl * s.act_bytes + BT * 4 + (s.tp ? 4 * BT * 4 : 0);  // logits, losses, CE parts
  return bytes;
}
inline int64_t slot_token_bytes(const GptMemoryShape& s) { return 2 * s.B * s.T * s.token_bytes; }

// The step's buffers besides the slots: gradients of activations, tensor-parallel scratch, the
// layer set that recompute refills, and under cp the whole sequence's qkv and its gradient,
// (B, T cp, Ql) each, and its keys and values as the collectives move them (B, T cp, 2 Hkvl D)
// in fp32 (their gradients' reduce-scatter sums in fp32; the gather moves Act in the same bytes).
inline int64_t buffer_bytes(const GptMemoryShape& s) {
  const int64_t BT = s.B * s.T, C = s.C;
  int64_t acts = 4 * BT * C + BT * s.Cl + BT * s.Ql + BT * s.Pl;  // tmp, tmp2, dresid, dln, datty, dqkv, dfc
  if (s.has_dense) acts += BT * s.Fl;                              // act, the dense MLP's activation output
  int64_t floats = 2;                                                // the loss (a double)
  if (s.fp8) floats += fp8::kept_floats(s.tp_ranks);                 // dfc's cast scalars
  if (s.tp) acts += BT * C;
  if (s.tp && s.act_bytes != 4) floats += 2 * BT * C;
  if (s.cp > 1) acts += BT * s.cp * 2 * s.Ql, floats += BT * s.cp * (s.Ql - s.Cl);  // qkv, dqkv; the k, v blocks
  if (s.has_moe) {  // dys, dxs (M,C), the experts' dfc (Mx,2Fe), the shared ones' (N,2Fs); dlogits, dweights
    const int64_t M = BT * s.k, Mx = s.expert_rows();
    acts += 2 * M * C + Mx * 2 * s.Fe + BT * 2 * s.Fs;
    if (s.ep > 1) acts += M * C + 2 * Mx * C;  // the rows before dispatch (M,C); exchange scratch (2,Mx,C)
    floats += BT * s.E + BT * s.k;
  }
  // The recompute set (every mode but none): the norms' outputs, with what the mode refills
  // besides; with FP8 under none the norms' outputs alone (a slot keeps their casts).
  int64_t ints = 0;
  if (s.recompute != "none" || keeps_norm_casts(s)) {
    const bool mlp = s.recompute == "selective" || s.recompute == "full";
    const LayerCounts sh = layer_counts(s, s.recompute == "full", mlp, s.has_dense, s.has_moe, true);
    acts += sh.acts, floats += sh.floats, ints += sh.ints;
  }
  return acts * s.act_bytes + (floats + ints) * 4;
}

// The op set's scratch at its largest: a dense MLP projection's backward holds its activation's
// gradient and the activation it recomputes from fc, (B,T,Fl) each (CudaOps::linear_backward;
// in FP8 the second half is asked for but unused: the activation goes straight into its cast).
inline int64_t scratch_bytes(const GptMemoryShape& s) { return s.has_dense ? 2 * s.B * s.T * s.Fl * s.act_bytes : 0; }

// A layer's FP8 linears' weights (OC, IC) on this rank, indexed by Fp8Weight: QKV, the attention's
// projection, then the dense MLP's fc and projection, or a MoE layer's shared experts' (none
// without them; its routed experts' grouped GEMMs are bf16).
enum Fp8Weight { kQkvWeight = 0, kProjWeight = 1, kFcWeight = 2, kFcProjWeight = 3 };
inline std::vector<std::pair<int64_t, int64_t>> fp8_layer_weights(const GptMemoryShape& s, bool moe) {
  std::vector<std::pair<int64_t, int64_t>> w = {{s.Ql, s.C}, {s.C, s.Cl}};
  if (!moe) w.insert(w.end(), {{s.Pl, s.C}, {s.C, s.Fl}});
  if (moe && s.Fs > 0) w.insert(w.end(), {{2 * s.Fs, s.C}, {s.C, s.Fs}});
  return w;
}
// The LM head's row chunks: each casts the head's weight in its forward and its backward.
inline int64_t head_chunks(const GptMemoryShape& s) { return (s.B * s.T + s.head_rows() - 1) / s.head_rows(); }
// Whether the step casts the block's FP8 weights once each (fp8::cast_weights_once): per call it
// would cast each in a forward and a backward per micro-batch, and in full recompute's second
// forward. (Selective recompute casts fc's weight a third time, the others not: left per call.)
inline bool casts_block_weights_once(const GptMemoryShape& s) {
  return s.fp8 && fp8::cast_weights_once(s.micro_batches * (s.recompute == "full" ? 3 : 2));
}
// Whether it casts the LM head's weight once (train.fp8_lm_head): twice per chunk per micro-batch.
inline bool casts_head_once(const GptMemoryShape& s) {
  return s.fp8_head && fp8::cast_weights_once(s.micro_batches * 2 * head_chunks(s));
}
// FP8's cast buffers (CudaOps: one byte an element; three, each grown to the largest operand it
// holds): 0 a forward's input and a backward's output gradient, row-major; 1 a weight cast per
// call, in either layout, and a backward's input transposed; 2 a backward's output gradient transposed. The
// block's linears take B T rows: QKV (C -> Ql), the attention's projection (Cl -> C), fc (C -> Pl)
// and the MLP's projection (Fl -> C); with fp8_head the LM head too (C -> Vl, a chunk of rows).
//
// Block scaling adds each buffer's tiles' inverse scales (fp8::tile_scales floats), at the largest
// operand's count: 0 (N, in) and (N, out) in 1 x 128 tiles; 1 a weight (OC, IC) or its transpose
// in 128 x 128 blocks, or x^T (in, N) in tiles; 2 (out, N) in tiles.
inline int64_t fp8_cast_bytes(const GptMemoryShape& s) {
  if (!s.fp8) return 0;
  const int64_t N = s.B * s.T, in = std::max({s.C, s.Cl, s.Fl}), out = std::max({s.Ql, s.C, s.Pl});
  int64_t b0 = N * std::max(in, out), b1 = N * in, b2 = N * out;
  const auto tiles = [](int64_t M, int64_t K) { return fp8::tile_scales(M, K, false); };
  int64_t t0 = tiles(N, std::max(in, out)), t1 = tiles(in, N), t2 = tiles(out, N);
  // The weights (OC, IC) cast per call, into buffer 1: the block's linears' and with fp8_head the
  // head's, unless the model holds their casts (weight_cast_bytes), which then take every cast of
  // them, a forward's outside a step too (GptModel::weight_cast).
  std::vector<std::pair<int64_t, int64_t>> weights;
  if (!casts_block_weights_once(s)) weights = fp8_layer_weights(s, false);
  if (s.fp8_head) {
    const int64_t R = s.head_rows();
    b0 = std::max({b0, R * s.C, R * s.Vl}), b1 = std::max(b1, R * s.C), b2 = std::max(b2, R * s.Vl);
    t0 = std::max({t0, tiles(R, s.C), tiles(R, s.Vl)}), t1 = std::max(t1, tiles(s.C, R)), t2 = std::max(t2, tiles(s.Vl, R));
    if (!casts_head_once(s)) weights.push_back({s.Vl, s.C});
  }
  for (const auto& [OC, IC] : weights)
    b1 = std::max(b1, OC * IC), t1 = std::max({t1, fp8::tile_scales(OC, IC, true), fp8::tile_scales(IC, OC, true)});
  return b0 + b1 + b2 + (s.fp8_block ? (t0 + t1 + t2) * 4 : 0);
}
// The weight casts (fp8::WeightCast) a rank holds for the step: of each of its `layers` layers
// (`moe_layers` of them MoE) when the step casts the block's weights once, and with `head` the
// LM head's when it casts that once.
inline int64_t weight_cast_bytes(const GptMemoryShape& s, int64_t layers, int64_t moe_layers, bool head) {
  const fp8::Scaling sc = s.fp8_block ? fp8::Scaling::block : fp8::Scaling::tensor;
  const auto one = [&](int64_t OC, int64_t IC) { return fp8::weight_cast_bytes(OC, IC, sc, s.tp_ranks); };
  int64_t bytes = 0;
  if (casts_block_weights_once(s)) {
    for (const auto& [OC, IC] : fp8_layer_weights(s, false)) bytes += (layers - moe_layers) * one(OC, IC);
    for (const auto& [OC, IC] : fp8_layer_weights(s, true)) bytes += moe_layers * one(OC, IC);
  }
  if (head && casts_head_once(s)) bytes += one(s.Vl, s.C);
  return bytes;
}

// cuDNN's deterministic attention backward works in a workspace of about B H T T bf16 (1,026 MiB
// measured at B 8, H 16, T 2048). Under cp this is Myriad's kernel's (two floats per query row
// and head), which `auto` takes there while deterministic; cuDNN under cp (train.attention =
// "cudnn", or auto with train.deterministic = false) holds more, uncounted here: QKV and its
// gradient moved for grouped queries, the second chunk's key/value gradients and the dQ
// accumulator (0.37 GiB more at Llama 3.2 1B's 16K with cp 2, measured).
inline int64_t attention_workspace_bytes(const GptMemoryShape& s) {
  return s.cp > 1 ? 2 * s.B * s.Hl * s.T * 4 : s.B * s.Hl * s.T * s.T * 2;
}

}  // namespace myriad::model
