#include "model/gpt.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "ops/cpu/ops.h"

namespace myriad {

namespace {
void zero(std::vector<float>& v, int64_t n) { std::memset(v.data(), 0, n * sizeof(float)); }
}  // namespace

Gpt::Gpt(const Config& cfg)
    : cfg_(cfg),
      layout_(cfg),
      L_(cfg.model.layers),
      C_(cfg.model.d_model),
      H_(cfg.model.heads),
      maxT_(cfg.model.seq_len),
      maxB_(cfg.train.micro_batch),
      V_(cfg.model.vocab_size),
      Vp_(cfg.padded_vocab()),
      window_(cfg.model.window),
      parallel_block_(cfg.model.parallel_block) {
  params_.assign(layout_.total(), 0.0f);
  grads_.assign(layout_.total(), 0.0f);
  init_params(params_.data(), layout_, cfg.model.seed);
  p_ = tensors_in(params_.data());
  g_ = tensors_in(grads_.data());

  const int64_t BT = maxB_ * maxT_, C = C_;
  const int64_t per_layer = BT * C * 5 + BT * 4 + BT * 3 * C + maxB_ * H_ * maxT_ * maxT_ +
                            BT * 4 * C * 2;
  act_storage_.assign(per_layer * L_ + BT * C * 2 + BT * 2, 0.0f);
  float* a = act_storage_.data();
  auto take = [&](int64_t n) { float* p = a; a += n; return p; };
  acts_.resize(L_);
  for (auto& l : acts_) {
    l.in = take(BT * C);
    l.ln1 = take(BT * C), l.ln1_mean = take(BT), l.ln1_rstd = take(BT);
    l.qkv = take(BT * 3 * C);
    l.probs = take(maxB_ * H_ * maxT_ * maxT_);
    l.atty = take(BT * C);
    l.mid = take(BT * C);
    l.ln2 = take(BT * C), l.ln2_mean = take(BT), l.ln2_rstd = take(BT);
    l.fc = take(BT * 4 * C);
    l.gelu = take(BT * 4 * C);
  }
  out_ = take(BT * C);
  lnf_ = take(BT * C), lnf_mean_ = take(BT), lnf_rstd_ = take(BT);
  MYRIAD_CHECK(a <= act_storage_.data() + act_storage_.size());

  logits_.assign(BT * Vp_, 0.0f);
  losses_.assign(BT, 0.0f);
  inputs_.assign(BT, 0);
  targets_.assign(BT, 0);
  tmp_.assign(BT * C, 0.0f);
  dresid_.assign(BT * C, 0.0f);
  dln_.assign(BT * C, 0.0f);
  datty_.assign(BT * C, 0.0f);
  dqkv_.assign(BT * 3 * C, 0.0f);
  dfc_.assign(BT * 4 * C, 0.0f);
  dgelu_.assign(BT * 4 * C, 0.0f);
}

Gpt::Tensors Gpt::tensors_in(float* base) const {
  auto at = [&](const std::string& name) -> float* {
    const ParamSpec* p = layout_.get(name);
    return p ? base + p->offset : nullptr;
  };
  Tensors t{at("wte"), at("wpe"), at("lnf.w"), at("lnf.b"), {}};
  for (int64_t l = 0; l < L_; ++l) {
    std::string h = "h." + std::to_string(l) + ".";
    t.layers.push_back({at(h + "ln1.w"), at(h + "ln1.b"), at(h + "attn.qkv.w"),
                        at(h + "attn.qkv.b"), at(h + "attn.proj.w"), at(h + "attn.proj.b"),
                        at(h + "ln2.w"), at(h + "ln2.b"), at(h + "mlp.fc.w"), at(h + "mlp.fc.b"),
                        at(h + "mlp.proj.w"), at(h + "mlp.proj.b")});
  }
  return t;
}

void Gpt::zero_grads() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

void Gpt::forward(const int32_t* tokens, int64_t row_stride, int B, int T) {
  MYRIAD_CHECK(B <= maxB_ && T <= maxT_, "batch ", B, "x", T, " exceeds ", maxB_, "x", maxT_);
  const int C = C_, H = H_, N = B * T, W = window_;
  for (int b = 0; b < B; ++b)
    std::memcpy(&inputs_[b * T], tokens + b * row_stride, T * sizeof(int32_t));

  cpu::embedding_forward(acts_[0].in, inputs_.data(), p_.wte, p_.wpe, B, T, C);
  for (int64_t l = 0; l < L_; ++l) {
    LayerActs& a = acts_[l];
    const LayerTensors& w = p_.layers[l];
    float* next = l + 1 < L_ ? acts_[l + 1].in : out_;  // (B,T,C)

    cpu::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.in, w.ln1_w, w.ln1_b, N, C);
    cpu::linear_forward(a.qkv, a.ln1, w.qkv_w, w.qkv_b, N, C, 3 * C);
    cpu::attention_forward(a.atty, a.probs, a.qkv, B, T, C, H, W);
    // Both block forms start with the attention branch added to the residual stream.
    float* attn_sum = parallel_block_ ? next : a.mid;
    cpu::linear_forward(attn_sum, a.atty, w.proj_w, w.proj_b, N, C, C);
    cpu::residual_forward(attn_sum, attn_sum, a.in, int64_t(N) * C);
    // The MLP reads LN2(mid) in the sequential block and the shared LN1(in) in the parallel one.
    const float* mlp_in = a.ln1;
    if (!parallel_block_) {
      cpu::layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.mid, w.ln2_w, w.ln2_b, N, C);
      mlp_in = a.ln2;
    }
    cpu::linear_forward(a.fc, mlp_in, w.fc_w, w.fc_b, N, C, 4 * C);
    cpu::gelu_forward(a.gelu, a.fc, int64_t(N) * 4 * C);
    float* mlp_out = tmp_.data();
    cpu::linear_forward(mlp_out, a.gelu, w.fcproj_w, w.fcproj_b, N, 4 * C, C);
    cpu::residual_forward(next, attn_sum, mlp_out, int64_t(N) * C);
  }
  cpu::layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, out_, p_.lnf_w, p_.lnf_b, N, C);
  cpu::linear_forward(logits_.data(), lnf_, p_.wte, static_cast<const float*>(nullptr), N, C,
                      static_cast<int>(Vp_));
}

float Gpt::loss(const int32_t* tokens, int B) {
  const int T = maxT_, N = B * T;
  forward(tokens, T + 1, B, T);
  for (int b = 0; b < B; ++b)
    std::memcpy(&targets_[b * T], tokens + b * (T + 1) + 1, T * sizeof(int32_t));
  cpu::crossentropy_forward(losses_.data(), logits_.data(), targets_.data(), N, V_, Vp_);
  double sum = 0;  // fixed order: the loss is bitwise reproducible
  for (int i = 0; i < N; ++i) sum += losses_[i];
  return static_cast<float>(sum / N);
}

float Gpt::forward_backward(const int32_t* tokens, int B, float grad_scale) {
  const int T = maxT_, C = C_, H = H_, N = B * T, W = window_;
  const int64_t NC = int64_t(N) * C;
  const float mean_loss = loss(tokens, B);

  // d(mean loss)/d(loss_i) = grad_scale / N; dlogits overwrite the logits in place.
  std::vector<float>& dlosses = losses_;
  std::fill(dlosses.begin(), dlosses.begin() + N, grad_scale / N);
  float* dlogits = logits_.data();
  cpu::crossentropy_backward(dlogits, dlogits, targets_.data(), dlosses.data(), N, V_, Vp_);
  zero(dln_, NC);
  cpu::linear_backward(dln_.data(), g_.wte, static_cast<float*>(nullptr), dlogits, lnf_, p_.wte,
                       N, C, static_cast<int>(Vp_));
  zero(dresid_, NC);
  cpu::layernorm_backward(dresid_.data(), g_.lnf_w, g_.lnf_b, dln_.data(), out_, p_.lnf_w,
                          lnf_mean_, lnf_rstd_, N, C);

  // dresid_ holds the gradient of the residual stream; walking down a layer adds each
  // branch's input gradient into it in place (the backward ops accumulate).
  for (int64_t l = L_ - 1; l >= 0; --l) {
    LayerActs& a = acts_[l];
    const LayerTensors& w = p_.layers[l];
    const LayerTensors& g = g_.layers[l];
    float* dresid = dresid_.data();

    // MLP branch: its output gradient is the residual gradient at the layer's output.
    zero(dgelu_, NC * 4);
    zero(dfc_, NC * 4);
    zero(dln_, NC);
    cpu::linear_backward(dgelu_.data(), g.fcproj_w, g.fcproj_b, dresid, a.gelu, w.fcproj_w, N,
                         4 * C, C);
    cpu::gelu_backward(dfc_.data(), a.fc, dgelu_.data(), NC * 4);
    cpu::linear_backward(dln_.data(), g.fc_w, g.fc_b, dfc_.data(),
                         parallel_block_ ? a.ln1 : a.ln2, w.fc_w, N, C, 4 * C);
    if (!parallel_block_) {
      // dresid becomes the gradient at mid: the pass-through plus LN2's input gradient.
      cpu::layernorm_backward(dresid, g.ln2_w, g.ln2_b, dln_.data(), a.mid, w.ln2_w, a.ln2_mean,
                              a.ln2_rstd, N, C);
      zero(dln_, NC);
    }
    // Attention branch (in the parallel block dln_ still holds the MLP's share of LN1's output
    // gradient, and the attention's share adds to it).
    zero(datty_, NC);
    zero(dqkv_, NC * 3);
    cpu::linear_backward(datty_.data(), g.proj_w, g.proj_b, dresid, a.atty, w.proj_w, N, C, C);
    cpu::attention_backward(dqkv_.data(), datty_.data(), a.qkv, a.probs, B, T, C, H, W);
    cpu::linear_backward(dln_.data(), g.qkv_w, g.qkv_b, dqkv_.data(), a.ln1, w.qkv_w, N, C,
                         3 * C);
    cpu::layernorm_backward(dresid, g.ln1_w, g.ln1_b, dln_.data(), a.in, w.ln1_w, a.ln1_mean,
                            a.ln1_rstd, N, C);
  }
  cpu::embedding_backward(g_.wte, g_.wpe, dresid_.data(), inputs_.data(), B, T, C);
  return mean_loss;
}

void Gpt::last_logits(const int32_t* tokens, int B, int T, float* out) {
  forward(tokens, T, B, T);
  for (int b = 0; b < B; ++b)
    std::memcpy(out + b * Vp_, logits_.data() + (int64_t(b) * T + T - 1) * Vp_, Vp_ * sizeof(float));
}

double Gpt::flops_per_token() const {
  const double t_att = window_ > 0 ? std::min(window_, maxT_) : maxT_;
  return 6.0 * layout_.matmul_params() + 12.0 * L_ * C_ * t_att;
}

}  // namespace myriad
