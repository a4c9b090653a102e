#include "model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "ops/cpu/ops.h"
#include "ops/cpu/reduce.h"
#include "ops/cpu/vecmath.h"

namespace myriad {

namespace {
using parallel::CopyToTp;
using parallel::GatherFromSequence;
using parallel::ReduceFromTp;
using parallel::ReduceScatterToSequence;

void zero(std::vector<float>& v, int64_t n) { std::memset(v.data(), 0, n * sizeof(float)); }

constexpr int kColumnBlock = 16;  // channels per thread block in the row-sum loops below

// The tensor-parallel degree of `par`, after the checks that need the config.
int checked_tp_size(const Config& cfg, const parallel::ParallelContext* par) {
  const int t = par ? par->tp_size() : 1;
  if (t == 1) return 1;
  MYRIAD_CHECK(t == cfg.parallel.tp, "the tensor-parallel group has ", t,
               " ranks but parallel.tp = ", cfg.parallel.tp);
  if (cfg.model.heads % t != 0)
    throw_input("config: model.heads (", cfg.model.heads, ") must be divisible by parallel.tp (",
                t, ")");
  if (cfg.parallel.sequence_parallel && cfg.model.seq_len % t != 0)
    throw_input("config: model.seq_len (", cfg.model.seq_len,
                ") must be divisible by parallel.tp (", t,
                ") with parallel.sequence_parallel = true: the tokens of a micro-batch are split "
                "evenly over the tensor-parallel ranks");
  return t;
}

// db (OC) += sum over rows of dout (rows, OC); columns in blocks across threads, rows in order.
void bias_backward(float* db, const float* dout, int rows, int OC) {
  const int blocks = (OC + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kColumnBlock, c1 = std::min(OC, c0 + kColumnBlock);
    float acc[kColumnBlock] = {};
    for (int n = 0; n < rows; ++n) {
      const float* d = dout + static_cast<int64_t>(n) * OC + c0;
#pragma omp simd
      for (int c = 0; c < c1 - c0; ++c) acc[c] += d[c];
    }
    for (int c = c0; c < c1; ++c) db[c] += acc[c - c0];
  }
}

// out (rows, C) += bias (C) on every row.
void add_bias(float* out, const float* bias, int rows, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < rows; ++n) {
    float* o = out + static_cast<int64_t>(n) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] += bias[c];
  }
}

}  // namespace

Gpt::Gpt(const Config& cfg, const parallel::ParallelContext* par, const ModelPart* part,
         int64_t flat_size)
    : cfg_(cfg),
      tp_(checked_tp_size(cfg, par) > 1 ? par->tp : nullptr),
      tpr_(parallel::group_rank(tp_)),
      tps_(parallel::group_size(tp_)),
      sp_cfg_(tp_ != nullptr && cfg.parallel.sequence_parallel),
      part_(part ? *part : ModelPart::whole(cfg)),
      layout_(cfg, tpr_, tps_, &part_),
      L_(cfg.model.layers),
      C_(cfg.model.d_model),
      H_(cfg.model.heads),
      maxT_(cfg.model.seq_len),
      maxB_(cfg.train.micro_batch),
      V_(cfg.model.vocab_size),
      Vp_(cfg.padded_vocab()),
      window_(cfg.model.window),
      Hl_(H_ / tps_),
      Cl_(C_ / tps_),
      Fl_(4 * C_ / tps_),
      Vl_(Vp_ / tps_),
      v0_(Vl_ * tpr_),
      parallel_block_(cfg.model.parallel_block) {
  MYRIAD_CHECK(flat_size == 0 || flat_size >= layout_.total(), "flat size ", flat_size);
  params_.assign(std::max(flat_size, layout_.total()), 0.0f);
  grads_.assign(params_.size(), 0.0f);
  init_params(params_.data(), layout_, cfg.model.seed);
  p_ = tensors_in(params_.data());
  g_ = tensors_in(grads_.data());
  for (size_t c = 0; c < part_.chunks.size(); ++c)
    chunks_.push_back({part_.chunks[c].first, part_.chunks[c].second, part_.embedding && c == 0,
                       part_.head && c + 1 == part_.chunks.size(), {}});

  const int64_t BT = maxB_ * maxT_, C = C_;
  tmp_.assign(BT * C, 0.0f);
  if (tp_) full_.assign(BT * C, 0.0f);
  dresid_.assign(BT * C, 0.0f);
  dln_.assign(BT * C, 0.0f);
  datty_.assign(BT * Cl_, 0.0f);
  dqkv_.assign(BT * 3 * Cl_, 0.0f);
  dfc_.assign(BT * Fl_, 0.0f);
  dgelu_.assign(BT * Fl_, 0.0f);
}

Gpt::Slot& Gpt::acquire(Chunk& ch, int mb, int B) {
  for (auto& s : ch.slots)
    MYRIAD_CHECK(s->mb != mb, "micro-batch ", mb, " is already in flight in layers [", ch.l0,
                 ", ", ch.l1, ")");
  for (auto& s : ch.slots)
    if (s->mb < 0) {
      s->mb = mb, s->B = B;
      return *s;
    }
  // A new slot: the schedule keeps one more micro-batch in flight than so far.
  auto s = std::make_unique<Slot>();
  const int64_t BT = maxB_ * maxT_, C = C_;
  const int64_t per_layer = BT * C * 4 + BT * Cl_ + BT * 4 + BT * 3 * Cl_ +
                            maxB_ * Hl_ * maxT_ * maxT_ + BT * Fl_ * 2;
  s->storage.assign(per_layer * (ch.l1 - ch.l0) + BT * C * 2 + BT * 2, 0.0f);
  float* a = s->storage.data();
  auto take = [&](int64_t n) { float* p = a; a += n; return p; };
  s->layers.resize(ch.l1 - ch.l0);
  for (auto& l : s->layers) {
    l.in = take(BT * C);
    l.ln1 = take(BT * C), l.ln1_mean = take(BT), l.ln1_rstd = take(BT);
    l.qkv = take(BT * 3 * Cl_);
    l.probs = take(maxB_ * Hl_ * maxT_ * maxT_);
    l.atty = take(BT * Cl_);
    l.mid = take(BT * C);
    l.ln2 = take(BT * C), l.ln2_mean = take(BT), l.ln2_rstd = take(BT);
    l.fc = take(BT * Fl_);
    l.gelu = take(BT * Fl_);
  }
  s->out = take(BT * C);
  s->lnf = take(BT * C), s->lnf_mean = take(BT), s->lnf_rstd = take(BT);
  MYRIAD_CHECK(a <= s->storage.data() + s->storage.size());
  s->inputs.assign(BT, 0);
  s->targets.assign(BT, 0);
  if (ch.head) {
    s->logits.assign(BT * Vl_, 0.0f);
    s->losses.assign(BT, 0.0f);
    if (tp_) s->ce_max.assign(BT, 0.0f), s->ce_sum.assign(BT, 0.0f);
  }
  s->mb = mb, s->B = B;
  ch.slots.push_back(std::move(s));
  return *ch.slots.back();
}

Gpt::Slot& Gpt::held(int c, int mb) const {
  MYRIAD_CHECK(c >= 0 && c < num_chunks(), "chunk ", c, " of ", num_chunks());
  Slot* found = nullptr;
  for (auto& s : chunks_[c].slots)
    if (s->mb == mb) found = s.get();
  MYRIAD_CHECK(found != nullptr, "micro-batch ", mb, " is not in flight in chunk ", c);
  return *found;
}

void Gpt::set_shape(int B, int T) {
  MYRIAD_CHECK(B <= maxB_ && T <= maxT_, "batch ", B, "x", T, " exceeds ", maxB_, "x", maxT_);
  B_ = B, T_ = T, N_ = B * T;
  sp_ = sp_cfg_ && N_ % tps_ == 0;
  R_ = sp_ ? N_ / tps_ : N_;
  r0_ = sp_ ? tpr_ * R_ : 0;
}

int64_t Gpt::boundary_elems(int B) const {
  const int64_t N = int64_t(B) * maxT_;
  return (sp_cfg_ && N % tps_ == 0 ? N / tps_ : N) * C_;
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

// ---- the tensor-parallel pieces (the identity, or the plain op, without TP) ----

float* Gpt::local_rows(float* full, int64_t width) const {
  return sp_ ? full + int64_t(r0_) * width : full;
}

void Gpt::column_input_forward(float* full, int64_t width) {
  if (sp_)
    GatherFromSequence::forward(tp_, full + int64_t(r0_) * width, full, int64_t(R_) * width);
  else
    CopyToTp::forward(tp_, full, int64_t(N_) * width);
}

float* Gpt::column_input_backward(float* dfull, int64_t width) {
  if (!tp_) return dfull;
  if (sp_) {
    float* local = dfull + int64_t(r0_) * width;
    GatherFromSequence::backward(tp_, dfull, local, int64_t(R_) * width);
    return local;
  }
  CopyToTp::backward(tp_, dfull, int64_t(N_) * width);
  return dfull;
}

void Gpt::row_parallel_forward(float* out, const float* inp, const float* w, const float* b,
                               int IC, int OC) {
  if (!tp_) {
    cpu::linear_forward(out, inp, w, b, N_, IC, OC);
    return;
  }
  // The partial product of this rank's input features, reduced over the ranks; the bias once.
  float* partial = sp_ ? full_.data() : out;
  cpu::linear_forward(partial, inp, w, static_cast<const float*>(nullptr), N_, IC, OC);
  if (sp_)
    ReduceScatterToSequence::forward(tp_, partial, out, int64_t(R_) * OC);
  else
    ReduceFromTp::forward(tp_, out, int64_t(N_) * OC);
  if (b) add_bias(out, b, R_, OC);
}

const float* Gpt::row_parallel_dout(const float* dout, int OC) {
  if (!sp_) return dout;  // ReduceFromTp's backward: the identity
  ReduceScatterToSequence::backward(tp_, dout, full_.data(), int64_t(R_) * OC);
  return full_.data();
}

void Gpt::row_parallel_backward(float* dinp, float* dw, float* db, const float* dout_full,
                                const float* dout, const float* inp, const float* w, int IC,
                                int OC) {
  if (!sp_) {
    cpu::linear_backward(dinp, dw, db, dout_full, inp, w, N_, IC, OC);
    return;
  }
  cpu::linear_backward(dinp, dw, static_cast<float*>(nullptr), dout_full, inp, w, N_, IC, OC);
  if (db) bias_backward(db, dout, R_, OC);  // this rank's rows: summed in finish_grads()
}

void Gpt::embedding_forward_tp(const Slot& s, float* out) {
  const int C = C_;
  // This rank's rows of wte for the tokens it owns, zero for the others; summed over the ranks
  // (exactly one rank contributes each row, so the sum is exact).
  float* partial = sp_ ? full_.data() : out;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N_; ++n) {
    const int64_t v = int64_t(s.inputs[n]) - v0_;
    float* o = partial + n * C;
    if (v >= 0 && v < Vl_)
      std::memcpy(o, p_.wte + v * C, C * sizeof(float));
    else
      std::memset(o, 0, C * sizeof(float));
  }
  if (sp_)
    ReduceScatterToSequence::forward(tp_, partial, out, int64_t(R_) * C);
  else
    ReduceFromTp::forward(tp_, out, int64_t(N_) * C);
  // Positions (replicated) on the rows held here.
#pragma omp parallel for schedule(static)
  for (int i = 0; i < R_; ++i) {
    const float* pe = p_.wpe + int64_t((r0_ + i) % T_) * C;
    float* o = out + int64_t(i) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] += pe[c];
  }
}

void Gpt::embedding_backward_tp(const Slot& s, const float* dresid) {
  const int C = C_;
  const int blocks = (C + kColumnBlock - 1) / kColumnBlock;
  // wpe from the rows held here (with SP a partial sum, completed in finish_grads()).
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
    for (int i = 0; i < R_; ++i) {
      const float* d = dresid + int64_t(i) * C;
      float* p = g_.wpe + int64_t((r0_ + i) % T_) * C;
#pragma omp simd
      for (int c = c0; c < c1; ++c) p[c] += d[c];
    }
  }
  // wte: every row's gradient (ReduceFromTp: the identity; SP: gathered), into the rows owned
  // here; channel blocks across threads, tokens in order (deterministic).
  const float* dfull = dresid;
  if (sp_) {
    ReduceScatterToSequence::backward(tp_, dresid, full_.data(), int64_t(R_) * C);
    dfull = full_.data();
  }
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
    for (int n = 0; n < N_; ++n) {
      const int64_t v = int64_t(s.inputs[n]) - v0_;
      if (v < 0 || v >= Vl_) continue;
      const float* d = dfull + int64_t(n) * C;
      float* w = g_.wte + v * C;
#pragma omp simd
      for (int c = c0; c < c1; ++c) w[c] += d[c];
    }
  }
}

// Vocab-parallel cross-entropy over s.logits (N, Vl): columns [v0, v0 + Vl) of the vocabulary,
// the first `live` of them real (the rest padding).
void Gpt::crossentropy_forward_tp(Slot& s) {
  constexpr int kChunk = 256;
  const int N = N_;
  const int64_t Vl = Vl_;
  const int live = static_cast<int>(std::clamp<int64_t>(V_ - v0_, 0, Vl));
  float* mx = s.ce_max.data();
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n)
    mx[n] = live > 0 ? cpu::detail::max_of(s.logits.data() + n * Vl, live) : -INFINITY;
  parallel::max_over_group(tp_, mx, N);
  // Per row: this rank's sum of exp(x - max) and the target's shifted logit (0 unless owned).
  std::vector<float> parts(2 * static_cast<size_t>(N));
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = s.logits.data() + n * Vl;
    const float m = mx[n];
    float e[kChunk];
    float sum = 0;
    for (int j0 = 0; j0 < live; j0 += kChunk) {
      const int len = std::min(kChunk, live - j0);
#pragma omp simd
      for (int j = 0; j < len; ++j) e[j] = cpu::detail::exp_real(x[j0 + j] - m);
      sum += cpu::detail::lane_sum<float>(len, [&e](int64_t j) { return e[j]; });
    }
    const int64_t t = int64_t(s.targets[n]) - v0_;
    parts[2 * n] = sum;
    parts[2 * n + 1] = t >= 0 && t < live ? x[t] - m : 0.0f;
  }
  parallel::sum_over_group(tp_, parts.data(), 2 * int64_t(N));
  for (int n = 0; n < N; ++n) {
    s.ce_sum[n] = parts[2 * n];
    s.losses[n] = std::log(parts[2 * n]) - parts[2 * n + 1];
  }
}

// dlogits = (softmax - onehot) * dlosses on this rank's live columns, 0 on the padding; in place.
void Gpt::crossentropy_backward_tp(Slot& s, const float* dlosses) {
  const int N = N_;
  const int64_t Vl = Vl_;
  const int live = static_cast<int>(std::clamp<int64_t>(V_ - v0_, 0, Vl));
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    float* d = s.logits.data() + n * Vl;
    const float m = s.ce_max[n], inv = 1.0f / s.ce_sum[n], dl = dlosses[n];
    const int64_t t = int64_t(s.targets[n]) - v0_;
    const bool owned = t >= 0 && t < live;
    const float xt = owned ? d[t] : 0.0f;
    const float scale = inv * dl;
#pragma omp simd
    for (int j = 0; j < live; ++j) d[j] = cpu::detail::exp_real(d[j] - m) * scale;
    if (owned) d[t] = (cpu::detail::exp_real(xt - m) * inv - 1.0f) * dl;
    std::fill(d + live, d + Vl, 0.0f);
  }
}

// ---- the model ----

void Gpt::forward(Chunk& ch, Slot& s, const int32_t* tokens, int64_t stride, const float* input,
                  bool targets) {
  const int B = B_, T = T_, C = C_, N = N_, R = R_, W = window_;
  const int Cl = static_cast<int>(Cl_), Hl = static_cast<int>(Hl_), Fl = static_cast<int>(Fl_);
  float* first_in = ch.l1 > ch.l0 ? s.layers[0].in : s.out;
  if (ch.embedding) {
    for (int b = 0; b < B; ++b)
      std::memcpy(&s.inputs[b * T], tokens + b * stride, T * sizeof(int32_t));
    if (tp_)
      embedding_forward_tp(s, first_in);
    else
      cpu::embedding_forward(first_in, s.inputs.data(), p_.wte, p_.wpe, B, T, C);
  } else {
    std::memcpy(first_in, input, int64_t(R) * C * sizeof(float));
  }
  for (int64_t l = ch.l0; l < ch.l1; ++l) {
    LayerActs& a = s.layers[l - ch.l0];
    const LayerTensors& w = p_.layers[l];
    float* next = l + 1 < ch.l1 ? s.layers[l + 1 - ch.l0].in : s.out;  // (R,C)

    cpu::layernorm_forward(local_rows(a.ln1, C), a.ln1_mean, a.ln1_rstd, a.in, w.ln1_w, w.ln1_b,
                           R, C);
    column_input_forward(a.ln1, C);
    cpu::linear_forward(a.qkv, a.ln1, w.qkv_w, w.qkv_b, N, C, 3 * Cl);
    cpu::attention_forward(a.atty, a.probs, a.qkv, B, T, Cl, Hl, W);
    // Both block forms start with the attention branch added to the residual stream.
    float* attn_sum = parallel_block_ ? next : a.mid;
    row_parallel_forward(attn_sum, a.atty, w.proj_w, w.proj_b, Cl, C);
    cpu::residual_forward(attn_sum, attn_sum, a.in, int64_t(R) * C);
    // The MLP reads LN2(mid) in the sequential block and the shared LN1(in) in the parallel one.
    const float* mlp_in = a.ln1;
    if (!parallel_block_) {
      cpu::layernorm_forward(local_rows(a.ln2, C), a.ln2_mean, a.ln2_rstd, a.mid, w.ln2_w,
                             w.ln2_b, R, C);
      column_input_forward(a.ln2, C);
      mlp_in = a.ln2;
    }
    cpu::linear_forward(a.fc, mlp_in, w.fc_w, w.fc_b, N, C, Fl);
    cpu::gelu_forward(a.gelu, a.fc, int64_t(N) * Fl);
    float* mlp_out = tmp_.data();
    row_parallel_forward(mlp_out, a.gelu, w.fcproj_w, w.fcproj_b, Fl, C);
    cpu::residual_forward(next, attn_sum, mlp_out, int64_t(R) * C);
  }
  if (!ch.head) return;
  cpu::layernorm_forward(local_rows(s.lnf, C), s.lnf_mean, s.lnf_rstd, s.out, p_.lnf_w, p_.lnf_b,
                         R, C);
  column_input_forward(s.lnf, C);
  cpu::linear_forward(s.logits.data(), s.lnf, p_.wte, static_cast<const float*>(nullptr), N, C,
                      static_cast<int>(Vl_));
  last_logits_ = s.logits.data();
  if (!targets) return;
  for (int b = 0; b < B; ++b)
    std::memcpy(&s.targets[b * T], tokens + b * stride + 1, T * sizeof(int32_t));
  if (tp_)
    crossentropy_forward_tp(s);
  else
    cpu::crossentropy_forward(s.losses.data(), s.logits.data(), s.targets.data(), N, V_, Vp_);
}

float Gpt::mean_loss(const Slot& s) const {
  const int N = s.B * maxT_;
  double sum = 0;  // fixed order: the loss is bitwise reproducible
  for (int i = 0; i < N; ++i) sum += s.losses[i];
  return static_cast<float>(sum / N);
}

void Gpt::backward(Chunk& ch, Slot& s, const float* doutput, float* dinput, float grad_scale) {
  const int B = B_, T = T_, C = C_, N = N_, R = R_, W = window_;
  const int Cl = static_cast<int>(Cl_), Hl = static_cast<int>(Hl_), Fl = static_cast<int>(Fl_);
  const int64_t NC = int64_t(N) * C;
  if (ch.head) {
    // d(mean loss)/d(loss_i) = grad_scale / N; dlogits overwrite the logits in place.
    std::vector<float>& dlosses = s.losses;
    std::fill(dlosses.begin(), dlosses.begin() + N, grad_scale / N);
    float* dlogits = s.logits.data();
    if (tp_)
      crossentropy_backward_tp(s, dlosses.data());
    else
      cpu::crossentropy_backward(dlogits, dlogits, s.targets.data(), dlosses.data(), N, V_, Vp_);
    zero(dln_, NC);
    cpu::linear_backward(dln_.data(), g_.wte, static_cast<float*>(nullptr), dlogits, s.lnf,
                         p_.wte, N, C, static_cast<int>(Vl_));
    float* dlnf = column_input_backward(dln_.data(), C);
    zero(dresid_, NC);
    cpu::layernorm_backward(dresid_.data(), g_.lnf_w, g_.lnf_b, dlnf, s.out, p_.lnf_w,
                            s.lnf_mean, s.lnf_rstd, R, C);
  } else {
    std::memcpy(dresid_.data(), doutput, int64_t(R) * C * sizeof(float));
  }

  // dresid_ holds the gradient of the residual stream; walking down a layer adds each
  // branch's input gradient into it in place (the backward ops accumulate).
  for (int64_t l = ch.l1 - 1; l >= ch.l0; --l) {
    LayerActs& a = s.layers[l - ch.l0];
    const LayerTensors& w = p_.layers[l];
    const LayerTensors& g = g_.layers[l];
    float* dresid = dresid_.data();
    // The gradient at the layer's output as the row-parallel GEMMs need it (all rows).
    const float* dout = row_parallel_dout(dresid, C);

    // MLP branch: its output gradient is the residual gradient at the layer's output.
    zero(dgelu_, int64_t(N) * Fl);
    zero(dfc_, int64_t(N) * Fl);
    zero(dln_, NC);
    row_parallel_backward(dgelu_.data(), g.fcproj_w, g.fcproj_b, dout, dresid, a.gelu,
                          w.fcproj_w, Fl, C);
    cpu::gelu_backward(dfc_.data(), a.fc, dgelu_.data(), int64_t(N) * Fl);
    cpu::linear_backward(dln_.data(), g.fc_w, g.fc_b, dfc_.data(),
                         parallel_block_ ? a.ln1 : a.ln2, w.fc_w, N, C, Fl);
    if (!parallel_block_) {
      // dresid becomes the gradient at mid: the pass-through plus LN2's input gradient.
      float* dln2 = column_input_backward(dln_.data(), C);
      cpu::layernorm_backward(dresid, g.ln2_w, g.ln2_b, dln2, a.mid, w.ln2_w, a.ln2_mean,
                              a.ln2_rstd, R, C);
      zero(dln_, NC);
      dout = row_parallel_dout(dresid, C);
    }
    // Attention branch (in the parallel block dln_ still holds the MLP's share of LN1's output
    // gradient, and the attention's share adds to it).
    zero(datty_, int64_t(N) * Cl);
    zero(dqkv_, int64_t(N) * 3 * Cl);
    row_parallel_backward(datty_.data(), g.proj_w, g.proj_b, dout, dresid, a.atty, w.proj_w, Cl,
                          C);
    cpu::attention_backward(dqkv_.data(), datty_.data(), a.qkv, a.probs, B, T, Cl, Hl, W);
    cpu::linear_backward(dln_.data(), g.qkv_w, g.qkv_b, dqkv_.data(), a.ln1, w.qkv_w, N, C,
                         3 * Cl);
    float* dln1 = column_input_backward(dln_.data(), C);
    cpu::layernorm_backward(dresid, g.ln1_w, g.ln1_b, dln1, a.in, w.ln1_w, a.ln1_mean,
                            a.ln1_rstd, R, C);
  }
  if (!ch.embedding)
    std::memcpy(dinput, dresid_.data(), int64_t(R) * C * sizeof(float));
  else if (tp_)
    embedding_backward_tp(s, dresid_.data());
  else
    cpu::embedding_backward(g_.wte, g_.wpe, dresid_.data(), s.inputs.data(), B, T, C);
}

float Gpt::forward_chunk(int c, int mb, int B, const int32_t* tokens, const float* input) {
  MYRIAD_CHECK(c >= 0 && c < num_chunks(), "chunk ", c, " of ", num_chunks());
  Chunk& ch = chunks_[c];
  set_shape(B, maxT_);
  Slot& s = acquire(ch, mb, B);
  forward(ch, s, tokens, maxT_ + 1, input, /*targets=*/true);
  return ch.head ? mean_loss(s) : 0.0f;
}

const float* Gpt::chunk_output(int c, int mb) const { return held(c, mb).out; }

void Gpt::backward_chunk(int c, int mb, const float* doutput, float* dinput, float grad_scale) {
  Slot& s = held(c, mb);
  set_shape(s.B, maxT_);
  backward(chunks_[c], s, doutput, dinput, grad_scale);
  s.mb = -1;
}

void Gpt::drop_chunk(int c, int mb) { held(c, mb).mb = -1; }

// ---- the whole model in this process ----

// The micro-batch number of the whole-model forwards (loss, sampling): never a schedule's.
constexpr int kWholeModel = 1 << 30;

float Gpt::forward_backward(const int32_t* tokens, int B, float grad_scale) {
  float loss = 0;
  for (int c = 0; c < num_chunks(); ++c)
    loss = forward_chunk(c, 0, B, tokens, c > 0 ? chunk_output(c - 1, 0) : nullptr);
  // Several chunks here (pp = 1 with virtual stages) pass their gradients in memory.
  std::vector<float> dout, din;
  for (int c = num_chunks() - 1; c >= 0; --c) {
    din.assign(c > 0 ? boundary_elems(B) : 0, 0.0f);
    backward_chunk(c, 0, c + 1 < num_chunks() ? dout.data() : nullptr, c > 0 ? din.data() : nullptr,
                   grad_scale);
    dout.swap(din);
  }
  return loss;
}

float Gpt::loss(const int32_t* tokens, int B) {
  float loss = 0;
  for (int c = 0; c < num_chunks(); ++c)
    loss = forward_chunk(c, kWholeModel, B, tokens, c > 0 ? chunk_output(c - 1, kWholeModel) : nullptr);
  for (int c = 0; c < num_chunks(); ++c) drop_chunk(c, kWholeModel);
  return loss;
}

void Gpt::last_logits(const int32_t* tokens, int B, int T, float* out) {
  MYRIAD_CHECK(part_.embedding && part_.head, "last_logits needs the whole model in one process");
  set_shape(B, T);
  for (int c = 0; c < num_chunks(); ++c) {
    Slot& s = acquire(chunks_[c], kWholeModel, B);
    forward(chunks_[c], s, tokens, T, c > 0 ? held(c - 1, kWholeModel).out : nullptr,
            /*targets=*/false);
  }
  for (int c = 0; c < num_chunks(); ++c) drop_chunk(c, kWholeModel);
  const float* logits = last_logits_;
  if (!tp_) {
    for (int b = 0; b < B; ++b)
      std::memcpy(out + b * Vp_, logits + (int64_t(b) * T + T - 1) * Vp_, Vp_ * sizeof(float));
    return;
  }
  // This rank's vocabulary columns of each row's last position, gathered over the ranks:
  // rank q's block is columns [q Vl, (q+1) Vl).
  const int64_t chunk = int64_t(B) * Vl_;
  std::vector<float> all(chunk * tps_);
  float* mine = all.data() + tpr_ * chunk;
  for (int b = 0; b < B; ++b)
    std::memcpy(mine + b * Vl_, logits + (int64_t(b) * T + T - 1) * Vl_, Vl_ * sizeof(float));
  GatherFromSequence::forward(tp_, mine, all.data(), chunk);
  for (int q = 0; q < tps_; ++q)
    for (int b = 0; b < B; ++b)
      std::memcpy(out + b * Vp_ + q * Vl_, all.data() + q * chunk + b * Vl_, Vl_ * sizeof(float));
}

void Gpt::finish_grads(int64_t begin, int64_t end) {
  if (!sp_cfg_) return;
  // Every replicated tensor (norms, row-parallel biases, wpe) saw only this rank's tokens: one
  // all-reduce of their elements in [begin, end), packed in layout order. Every tp rank has
  // the same layout shape, so the ranks pack the same elements.
  std::vector<std::pair<int64_t, int64_t>> runs;
  int64_t n = 0;
  for (const ParamSpec& p : layout_.tensors()) {
    const int64_t a = std::max(begin, p.offset), b = std::min(end, p.offset + p.numel);
    if (p.replicated() && a < b) runs.emplace_back(a, b), n += b - a;
  }
  std::vector<float> packed(n);
  int64_t at = 0;
  for (auto [a, b] : runs)
    std::memcpy(packed.data() + at, grads_.data() + a, (b - a) * sizeof(float)), at += b - a;
  parallel::sum_over_group(tp_, packed.data(), n);
  at = 0;
  for (auto [a, b] : runs)
    std::memcpy(grads_.data() + a, packed.data() + at, (b - a) * sizeof(float)), at += b - a;
}

double Gpt::flops_per_token() const {
  const double t_att = window_ > 0 ? std::min(window_, maxT_) : maxT_;
  return 6.0 * layout_.matmul_params() + 12.0 * L_ * C_ * t_att;
}

}  // namespace myriad
