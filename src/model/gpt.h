// The GPT decoder on the CPU backend: hand-written forward and backward over flat buffers.
//
// One object owns the parameters, their gradients and the activations of one micro-batch of up
// to (micro_batch, seq_len) tokens. Not thread-safe: one step at a time (the ops inside use
// OpenMP threads).
#pragma once

#include <cstdint>
#include <vector>

#include "core/config.h"
#include "model/params.h"

namespace myriad {

class Gpt {
 public:
  explicit Gpt(const Config& cfg);

  const ParamLayout& layout() const { return layout_; }
  float* params() { return params_.data(); }  // (total) flat, canonical layout
  float* grads() { return grads_.data(); }    // (total) same layout as params
  int64_t num_params() const { return layout_.total(); }
  void zero_grads();

  // Forward and backward of one micro-batch. tokens (B, T+1): inputs are [:, :T], targets the
  // next tokens [:, 1:]. Gradients of grad_scale * mean-token-loss are ADDED to grads(), so a
  // step over k micro-batches passes grad_scale = 1/k. Returns the mean loss over B*T tokens.
  float forward_backward(const int32_t* tokens, int B, float grad_scale);
  // Forward only: the mean loss over the B*T tokens of tokens (B, T+1).
  float loss(const int32_t* tokens, int B);
  // Logits of the last position of each row of tokens (B, T) -> (B, Vp) into out, for sampling
  // (T <= seq_len).
  void last_logits(const int32_t* tokens, int B, int T, float* out);
  // The full logits (B, T, Vp) of the last forward.
  const float* logits() const { return logits_.data(); }

  // Model FLOPs per token of a training step, 6N + 12 L d T_att (MFU's numerator).
  double flops_per_token() const;

 private:
  // Runs the layers and the final norm on tokens (B, T) and computes logits (B, T, Vp).
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

  Config cfg_;
  ParamLayout layout_;
  int64_t L_, C_, H_, maxT_, maxB_, V_, Vp_, window_;
  bool parallel_block_;

  std::vector<float> params_, grads_;
  Tensors p_, g_;  // into params_ and grads_

  // Activations saved for backward (per layer, each (B,T,·) unless noted).
  struct LayerActs {
    float *in;            // (B,T,C) the layer's input: the residual stream
    float *ln1, *ln1_mean, *ln1_rstd;  // (B,T,C), (B,T), (B,T)
    float *qkv;           // (B,T,3C) laid out (H,3,D)
    float *probs;         // (B,H,T,T)
    float *atty;          // (B,T,C) attention output before the projection
    float *mid;           // (B,T,C) residual after attention (sequential block only)
    float *ln2, *ln2_mean, *ln2_rstd;  // (B,T,C), (B,T), (B,T) (sequential block only)
    float *fc;            // (B,T,4C) before GELU
    float *gelu;          // (B,T,4C)
  };
  std::vector<float> act_storage_;
  std::vector<LayerActs> acts_;
  float *out_;                        // (B,T,C) residual stream after the last layer
  float *lnf_, *lnf_mean_, *lnf_rstd_;  // (B,T,C), (B,T), (B,T)
  std::vector<float> logits_;         // (B,T,Vp); backward turns it into dlogits in place
  std::vector<float> losses_;         // (B,T)
  std::vector<int32_t> inputs_, targets_;  // (B,T) contiguous copies
  std::vector<float> tmp_;            // (B,T,C) the MLP's output before the residual add

  // Backward scratch, zeroed per use.
  std::vector<float> dresid_;  // (B,T,C) gradient of the residual stream
  std::vector<float> dln_, datty_, dqkv_, dfc_, dgelu_;  // (B,T,C) (B,T,C) (B,T,3C) (B,T,4C) x2
};

}  // namespace myriad
