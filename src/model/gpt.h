// The GPT decoder on the CPU backend: hand-written forward and backward over flat buffers.
//
// One object owns the parameters, their gradients and the activations of one micro-batch of up
// to (micro_batch, seq_len) tokens. Not thread-safe: one step at a time (the ops inside use
// OpenMP threads).
//
// Tensor parallelism (Megatron-style), when built with a ParallelContext whose tp group has
// t > 1 ranks: this object holds rank r's shard of every tensor (params.h says which are split
// and how) and runs its share of every layer; the collectives sit in the regions of
// parallel/mappings.h, around the layers:
//   embedding   vocab-parallel: each rank looks up the tokens of its Vp/t rows of wte (zero
//               for the others), ReduceFromTp (SP: ReduceScatterToSequence) sums the partial
//               rows, then wpe is added once (replicated)
//   attention   LN1 (replicated) -> CopyToTp (SP: GatherFromSequence) -> QKV column-parallel
//               (this rank's H/t heads) -> attention over its heads -> proj row-parallel ->
//               ReduceFromTp (SP: ReduceScatterToSequence) -> + proj bias -> + residual
//   MLP         the same shape: fc column-parallel (4C/t features), GELU, proj row-parallel
//   LM head     LNf -> CopyToTp (SP: GatherFromSequence) -> logits of this rank's Vp/t
//               vocabulary rows (N, Vp/t) -> vocab-parallel cross-entropy: the row max and the
//               sum of exps combined over the ranks, the target logit from the rank that owns it
//               (padded columns never enter)
// Without sequence parallelism the residual stream (B*T, C) is replicated on every rank. With
// it (parallel.sequence_parallel) the LayerNorms and residual adds run on this rank's block of
// B*T/t consecutive tokens of the micro-batch (tokens [r N/t, (r+1) N/t) of the (B, T) order),
// gathered before each column-parallel GEMM and reduce-scattered after each row-parallel one.
// Attention and the LM head always see every token (of their heads / vocabulary rows).
// Replicated tensors then get partial gradients (from this rank's tokens): finish_grads()
// all-reduces them once per step. A forward whose B*T is not divisible by t (generation)
// runs without SP; the weights are the same.
#pragma once

#include <cstdint>
#include <vector>

#include "core/config.h"
#include "model/params.h"
#include "parallel/mappings.h"

namespace myriad {

class Gpt {
 public:
  // par: the tensor-parallel group; nullptr (or a group of one) = the whole model here. The tp
  // group's size must equal parallel.tp.
  explicit Gpt(const Config& cfg, const parallel::ParallelContext* par = nullptr);

  const ParamLayout& layout() const { return layout_; }
  float* params() { return params_.data(); }  // (total) flat, this rank's layout
  float* grads() { return grads_.data(); }    // (total) same layout as params
  int64_t num_params() const { return layout_.total(); }
  void zero_grads();

  // Forward and backward of one micro-batch. tokens (B, T+1): inputs are [:, :T], targets the
  // next tokens [:, 1:]. Gradients of grad_scale * mean-token-loss are ADDED to grads(), so a
  // step over k micro-batches passes grad_scale = 1/k. Returns the mean loss over B*T tokens.
  // With TP every rank passes the same tokens and gets the same loss.
  float forward_backward(const int32_t* tokens, int B, float grad_scale);
  // After the last forward_backward of a step, before reading the gradients: with sequence
  // parallelism, sums the replicated tensors' gradients over the tp group (each rank saw only
  // its tokens). A no-op otherwise.
  void finish_grads();
  // The global L2 norm of the gradients: the split tensors' squares summed over the tp group,
  // the replicated ones counted once. Identical bits on every rank. (Call after finish_grads.)
  double grad_norm() const;

  // Forward only: the mean loss over the B*T tokens of tokens (B, T+1).
  float loss(const int32_t* tokens, int B);
  // Logits of the last position of each row of tokens (B, T) -> (B, Vp) into out, for sampling
  // (T <= seq_len). With TP the vocabulary shards are gathered: every rank gets all Vp.
  void last_logits(const int32_t* tokens, int B, int T, float* out);
  // The logits (B, T, Vp) of the last forward; with TP this rank's (B, T, Vp/t) columns.
  const float* logits() const { return logits_.data(); }

  // Model FLOPs per token of a training step, 6N + 12 L d T_att (MFU's numerator), global.
  double flops_per_token() const;

  int tp_rank() const { return tpr_; }
  int tp_size() const { return tps_; }

 private:
  // Runs the layers and the final norm on tokens (B, T) and computes logits (B, T, Vp/t).
  void forward(const int32_t* tokens, int64_t row_stride, int B, int T);
  // Pointers into a flat buffer (params or grads) for each tensor; null where absent.
  struct LayerTensors {
    float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc_w, *fc_b,
        *fcproj_w, *fcproj_b;
  };
  struct Tensors {
    float *wte, *wpe, *lnf_w, *lnf_b;
    std::vector<LayerTensors> layers;
  };
  Tensors tensors_in(float* base) const;

  // The TP pieces (used only when tp_ is set); N = B*T rows, R = rows of the residual stream
  // here (N, or N/t with SP).
  // Where a LayerNorm writes its R rows of a (N, C) buffer that is then gathered.
  float* local_rows(float* full, int64_t width) const;
  // The input of a column-parallel GEMM: gathers `full`'s local rows (SP); returns full.
  void column_input_forward(float* full, int64_t width);
  // Its gradient: dfull (N, width) holds this rank's partial sum; all-reduced (replicated) or
  // reduce-scattered into local_rows(dfull) (SP). Returns the gradient of the R local rows.
  float* column_input_backward(float* dfull, int64_t width);
  // out (R, OC) = reduction over the ranks of inp (N, IC) @ w^T, + bias.
  void row_parallel_forward(float* out, const float* inp, const float* w, const float* b, int IC,
                            int OC);
  // The gradient of the row-parallel output as the GEMM needs it: dout (R, OC) itself, or
  // gathered into full_ (SP).
  const float* row_parallel_dout(const float* dout, int OC);
  // Backward of row_parallel_forward: dout_full from row_parallel_dout, dout the local rows.
  void row_parallel_backward(float* dinp, float* dw, float* db, const float* dout_full,
                             const float* dout, const float* inp, const float* w, int IC, int OC);
  void embedding_forward_tp(float* out);
  void embedding_backward_tp(const float* dresid);
  void crossentropy_forward_tp();
  void crossentropy_backward_tp(const float* dlosses);

  Config cfg_;
  parallel::Communicator* tp_ = nullptr;  // null without TP (t = 1)
  int tpr_ = 0, tps_ = 1;
  bool sp_cfg_ = false;  // sequence parallelism requested (and t > 1)
  ParamLayout layout_;
  int64_t L_, C_, H_, maxT_, maxB_, V_, Vp_, window_;
  int64_t Hl_, Cl_, Fl_, Vl_, v0_;  // this rank's heads, attention width, MLP width, vocab rows
  bool parallel_block_;

  // The current forward's shape: N = B*T rows, R rows of the residual stream here, the first
  // of them at row r0 of the micro-batch; sp_ when this forward runs sequence-parallel.
  int B_ = 0, T_ = 0, N_ = 0, R_ = 0, r0_ = 0;
  bool sp_ = false;

  std::vector<float> params_, grads_;
  Tensors p_, g_;  // into params_ and grads_

  // Activations saved for backward (per layer, each (B,T,·) unless noted; widths are this
  // rank's: 3C/t, C/t, 4C/t with TP).
  struct LayerActs {
    float *in;            // (B,T,C) the layer's input: the residual stream (R rows)
    float *ln1, *ln1_mean, *ln1_rstd;  // (B,T,C) (all N rows, gathered with SP), (R), (R)
    float *qkv;           // (B,T,3C) laid out (H,3,D)
    float *probs;         // (B,H,T,T)
    float *atty;          // (B,T,C) attention output before the projection
    float *mid;           // (B,T,C) residual after attention (sequential block only; R rows)
    float *ln2, *ln2_mean, *ln2_rstd;  // (B,T,C), (R), (R) (sequential block only)
    float *fc;            // (B,T,4C) before GELU
    float *gelu;          // (B,T,4C)
  };
  std::vector<float> act_storage_;
  std::vector<LayerActs> acts_;
  float *out_;                        // (B,T,C) residual stream after the last layer (R rows)
  float *lnf_, *lnf_mean_, *lnf_rstd_;  // (B,T,C) (all N rows), (R), (R)
  std::vector<float> logits_;         // (B,T,Vp/t); backward turns it into dlogits in place
  std::vector<float> losses_;         // (B,T)
  std::vector<int32_t> inputs_, targets_;  // (B,T) contiguous copies
  std::vector<float> tmp_;            // (B,T,C) the MLP's output before the residual add
  std::vector<float> ce_max_, ce_sum_;  // (B,T) TP cross-entropy: row max and sum of exps
  std::vector<float> full_;           // (B,T,C) TP scratch: partial sums, gathered gradients

  // Backward scratch, zeroed per use.
  std::vector<float> dresid_;  // (B,T,C) gradient of the residual stream
  std::vector<float> dln_, datty_, dqkv_, dfc_, dgelu_;  // (B,T,C) (B,T,C) (B,T,3C) (B,T,4C) x2
};

}  // namespace myriad
