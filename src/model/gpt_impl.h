// The definitions of the layer schedule, GptModel<Ops> (model/gpt.h), for the files that
// instantiate it with an op set: gpt.cc (the CPU op set) and model/cuda/ (the CUDA one).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "model/flops.h"
#include "model/gpt.h"
#include "model/memory_plan.h"
#include "core/parallel_layout.h"
#include "ops/fp8.h"
#include "ops/rope.h"

namespace myriad {

namespace gpt_detail {

// The tensor-parallel degree of `par`, its layout's rules checked again (a Config built in code
// has not been through parse_config's check): core/parallel_layout.h.
inline int checked_tp_size(const Config& cfg, const parallel::ParallelContext* par) {
  const int t = par ? par->tp_size() : 1;
  const ParallelLayout layout = ParallelLayout::of(cfg, par ? par->dp_size() : 1);
  MYRIAD_CHECK(t == 1 || t == layout.tp, "the tensor-parallel group has ", t, " ranks but parallel.tp = ", layout.tp);
  return t;
}

// The context-parallel degree of `par` (1 without a cp group: the whole sequence here, as a
// single process of a cp config runs it: bench, evaluation), checked against the layout.
inline int checked_cp_size(const Config& cfg, const parallel::ParallelContext* par) {
  const int c = par ? par->cp_size() : 1;
  const ParallelLayout layout = ParallelLayout::of(cfg, par ? par->dp_size() : 1);
  MYRIAD_CHECK(c == 1 || c == layout.cp, "the context-parallel group has ", c, " ranks but parallel.cp = ", layout.cp);
  return c;
}

// train.recompute, checked again for a Config that did not come through parse_config.
template <class Recompute>
Recompute recompute_mode(const std::string& mode) {
  if (mode == "none") return Recompute::kNone;
  if (mode == "norms") return Recompute::kNorms;
  if (mode == "selective") return Recompute::kSelective;
  if (mode == "full") return Recompute::kFull;
  throw_input("config: train.recompute = \"", mode, "\" is not one of: none, norms, selective, full");
}

}  // namespace gpt_detail

template <OpSet Ops>
GptModel<Ops>::GptModel(const Config& cfg, const parallel::ParallelContext* par, const ModelPart* part,
                        int64_t flat_size, Ops ops)
    : ops_(std::move(ops)),
      cfg_(cfg),
      tp_(gpt_detail::checked_tp_size(cfg, par) > 1 ? par->tp : nullptr),
      tpr_(parallel::group_rank(tp_)),
      tps_(parallel::group_size(tp_)),
      sp_cfg_(tp_ != nullptr && cfg.parallel.sequence_parallel),
      part_(part ? *part : ModelPart::whole(cfg)),
      layout_(cfg, tpr_, tps_, &part_, expert_shard(par)),
      L_(cfg.model.layers),
      C_(cfg.model.d_model),
      H_(cfg.model.heads),
      maxT_(cfg.model.seq_len / gpt_detail::checked_cp_size(cfg, par)),
      maxB_(cfg.train.micro_batch),
      V_(cfg.model.vocab_size),
      Vp_(cfg.padded_vocab()),
      window_(cfg.model.window),
      documents_(cfg.data.document_mask),
      document_end_loss_(cfg.data.document_end_loss),
      D_(cfg.model.head_dim()),
      G_(cfg.model.heads / cfg.model.kv()),
      Hl_(H_ / tps_),
      Hkvl_(cfg.model.kv() / tps_),
      Cl_(Hl_ * D_),
      Ql_((Hl_ + 2 * Hkvl_) * D_),
      Fl_(cfg.model.ffn() / tps_),
      Pl_(Fl_ * (cfg.model.swiglu() ? 2 : 1)),
      Vl_(Vp_ / tps_),
      v0_(Vl_ * tpr_),
      norm_{cfg.model.rmsnorm() ? NormKind::kRMSNorm : NormKind::kLayerNorm, static_cast<float>(cfg.model.norm_eps)},
      qk_norm_{cfg.model.qk_norm == "head"  ? QkNormKind::kHead
               : cfg.model.qk_norm == "all" ? QkNormKind::kAll
                                            : QkNormKind::kNone,
               static_cast<float>(cfg.model.norm_eps)},
      mlp_(cfg.model.swiglu() ? Mlp::kSwiGlu : Mlp::kGelu),
      router_{cfg.model.router_score == "sigmoid" ? RouterScore::kSigmoid : RouterScore::kSoftmax,
              static_cast<int>(cfg.model.experts), static_cast<int>(cfg.model.moe() ? cfg.model.experts_per_token : 0),
              cfg.model.router_norm_topk, static_cast<float>(cfg.model.router_scale),
              static_cast<int>(cfg.model.router_groups), static_cast<int>(cfg.model.router_top_groups),
              static_cast<float>(cfg.moe.capacity_factor), static_cast<float>(cfg.moe.aux_loss),
              static_cast<float>(cfg.moe.z_loss)},
      E_(cfg.model.experts),
      k_(router_.top_k),
      Fe_(cfg.model.moe() ? cfg.model.expert_ffn() : 0),
      Fs_(cfg.model.shared_ffn() / tps_),
      rope_(cfg.model.rope()),
      gemm_(cfg.train.precision == "fp8" ? Gemm::kFp8 : Gemm::kBf16),
      head_gemm_(cfg.train.precision == "fp8" && cfg.train.fp8_lm_head ? Gemm::kFp8 : Gemm::kBf16),
      parallel_block_(cfg.model.parallel_block),
      recompute_(gpt_detail::recompute_mode<Recompute>(cfg.train.recompute)) {
  MYRIAD_CHECK(flat_size == 0 || flat_size >= layout_.total(), "flat size ", flat_size);
  if (par && par->ep) ep_ = par->ep, epr_ = par->ep_rank(), eps_ = par->ep_size();
  seqT_ = cfg.model.seq_len;
  ops_.select_attention(cfg.train.attention, cfg.train.deterministic);  // before cp's refusal, which reads it
  if (par && par->cp_size() > 1) {
    if (const std::string why = ops_.context_parallel_refusal(seqT_ / (2 * par->cp_size())); !why.empty())
      throw_input("config: parallel.cp = ", par->cp_size(), ": ", why);
    cp_ = par->cp, cpr_ = par->cp_rank(), cps_ = par->cp_size();
  }
  overlap_dispatch_ = cfg.moe.overlap_dispatch;
  overlap_cp_ = cfg.parallel.overlap_cp;
  MYRIAD_CHECK(eps_ == 1 || eps_ == ParallelLayout::of(cfg, par->dp_size()).ep, "the expert-parallel group has ", eps_,
               " ranks but parallel.ep = ", cfg.parallel.ep);
  El_ = E_ / eps_;
  micro_batches_ = ParallelLayout::of(cfg, par ? par->dp_size() : 1).micro_batches;
  if (cfg.model.moe()) {
    if (const std::string why = ops_.moe_refusal(); !why.empty()) throw_input("config: model.experts = ", E_, ": ", why);
  }
  if (gemm_ == Gemm::kFp8) {
    if (const std::string why = ops_.fp8_refusal(fp8::recipe_of(cfg.train)); !why.empty()) throw_input("config: ", why);
    // cuBLASLt's FP8 GEMMs take dimensions of multiples of 16: the layout checked the shapes
    // (core/parallel_layout.h); the device is the op set's to judge (above).
    ops_.set_fp8(fp8::recipe_of(cfg.train), amax_group());
  }
  if (rope_) {
    const ModelConfig& m = cfg.model;
    RopeScaling scaling{m.rope_scaling, m.rope_factor, m.rope_low_freq_factor, m.rope_high_freq_factor,
                        m.rope_original_positions};
    ops_.set_rope(rope_frequencies(m.rope_theta, static_cast<int>(D_), scaling));
  }
  params_.zeros(std::max(flat_size, layout_.total()));
  grads_.zeros(params_.size());
  if constexpr (std::is_same_v<Param, float>) {
    init_params(params_.data(), layout_, cfg.model.seed);
  } else {  // drawn in fp32 on the host, held in the op set's Param type
    std::vector<float> host(static_cast<size_t>(params_.size()), 0.0f);
    init_params(host.data(), layout_, cfg.model.seed);
    ops_.upload_params(params_.data(), host.data(), params_.size());
  }
  p_ = tensors_in(params_.data());
  g_ = tensors_in(grads_.data());
  for (int64_t l = 0; l < L_; ++l)
    if (cfg.model.layer_is_moe(l) && part_.has_layer(l)) route_stats_.push_back({l, std::vector<int64_t>(E_, 0)});
  for (size_t c = 0; c < part_.chunks.size(); ++c)
    chunks_.push_back({part_.chunks[c].first, part_.chunks[c].second, part_.embedding && c == 0,
                       part_.head && c + 1 == part_.chunks.size(), {}});

  const int64_t BT = maxB_ * maxT_, C = C_;
  head_rows_ = memory_shape().head_rows();
  norm_casts_ = model::keeps_norm_casts(memory_shape());
  tmp_.zeros(BT * C);
  tmp2_.zeros(BT * C);
  if (tp_) full_.zeros(BT * C);
  if (tp_ && !std::is_same_v<Act, float>) wide_.zeros(2 * BT * C);
  dresid_.zeros(BT * C);
  dln_.zeros(BT * C);
  datty_.zeros(BT * Cl_);
  dqkv_.zeros(BT * Ql_);
  dfc_.zeros(BT * Pl_);
  if (gemm_ == Gemm::kFp8) dfc_scalars_.zeros(fp8::kept_floats(tps_)), dfc_fp8_.scalars = dfc_scalars_.data();
  loss_.zeros(1);
  const bool has_moe = cfg.model.moe_layers() > 0, has_dense = cfg.model.moe_layers() < L_;
  if (has_dense) act_.zeros(BT * Fl_);
  if (cp_) cp_qkv_.zeros(BT * cps_ * Ql_), cp_dqkv_.zeros(BT * cps_ * Ql_), cp_pack_.zeros(BT * cps_ * 2 * Hkvl_ * D_);
  if (has_moe) {
    const int64_t M = BT * k_;
    dys_.zeros(M * C), dxs_.zeros(M * C);
    dxfc_.zeros(M * 2 * Fe_), dsfc_.zeros(BT * 2 * Fs_);
    exchange_rows_ = M;
    if (ep_) xs_.zeros(M * C), xr_.zeros(2 * M * C), perm_.zeros(2 * M);
    dlogits_.zeros(BT * E_), dweights_.zeros(BT * k_);
  }
  // The recompute set: the norms' outputs and what the mode does not keep. FP8 with none keeps
  // the norms' outputs as casts (acquire), so their bf16 is a transient here too.
  if (recompute_ != Recompute::kNone || norm_casts_) {
    const bool set = recompute_ == Recompute::kFull;
    const bool mlp = recompute_ == Recompute::kSelective || recompute_ == Recompute::kFull;
    int64_t acts = 0, floats = 0, ints = 0;
    carve_layer(shared_, acts, floats, ints, nullptr, nullptr, nullptr, set, mlp, has_dense, has_moe, true);
    shared_acts_.zeros(acts), shared_stats_.zeros(floats), shared_ids_.zeros(ints);
    acts = 0, floats = 0, ints = 0;
    carve_layer(shared_, acts, floats, ints, shared_acts_.data(), shared_stats_.data(), shared_ids_.data(), set, mlp,
                has_dense, has_moe, true);
    if (mlp && has_moe) shared_.spill = static_cast<int>(spills_.size()), spills_.emplace_back();
  }
  const int64_t held = (tmp_.size() + tmp2_.size() + full_.size() + dresid_.size() + dln_.size() + datty_.size() +
                        dqkv_.size() + dfc_.size() + act_.size() + shared_acts_.size() + xs_.size() + dys_.size() + dxs_.size() +
                        dxfc_.size() + xr_.size() + dsfc_.size() + cp_qkv_.size() + cp_dqkv_.size()) *
                           int64_t(sizeof(Act)) +
                       (wide_.size() + shared_stats_.size() + dlogits_.size() + dweights_.size() +
                        shared_ids_.size() + cp_pack_.size() + dfc_scalars_.size()) * 4 + loss_.size() * 8;
  MYRIAD_CHECK(held == model::buffer_bytes(memory_shape()), "the step's buffers hold ", held,
               " bytes, the memory plan (model/memory_plan.h) says ", model::buffer_bytes(memory_shape()));
  if (gemm_ == Gemm::kFp8 || head_gemm_ == Gemm::kFp8) carve_weight_casts();
}

template <OpSet Ops>
model::GptMemoryShape GptModel<Ops>::memory_shape() const {
  model::GptMemoryShape s = model::memory_shape(cfg_.model, tps_, maxB_, Vp_, cps_);
  MYRIAD_CHECK(s.Cl == Cl_ && s.Ql == Ql_ && s.Fl == Fl_ && s.Pl == Pl_ && s.Vl == Vl_ && s.Hl == Hl_,
               "the memory plan's widths differ from the model's");
  s.tp = tp_ != nullptr, s.parallel_block = parallel_block_, s.recompute = cfg_.train.recompute;
  s.act_bytes = sizeof(Act);
  s.ep = eps_;
  s.logits_rows = model::logits_rows(cfg_.train.logits_mib, Vl_, sizeof(Act));
  s.fp8 = gemm_ == Gemm::kFp8, s.fp8_head = head_gemm_ == Gemm::kFp8;
  s.fp8_block = s.fp8 && cfg_.train.fp8_scaling == "block";
  s.micro_batches = micro_batches_;
  s.saved_per_row = ops_.attention_saved(1, 1, static_cast<int>(maxT_), static_cast<int>(seqT_)) / maxT_;
  return s;
}

template <OpSet Ops>
void GptModel<Ops>::carve_layer(LayerActs& l, int64_t& acts, int64_t& floats, int64_t& ints, Act* a, float* st,
                                int32_t* id, bool set, bool mlp, bool dense, bool moe, bool norms) const {
  const int64_t BT = maxB_ * maxT_, C = C_, M = BT * k_;
  auto take = [&](int64_t n) { Act* p = a ? a + acts : nullptr; acts += n; return p; };
  auto stat = [&](int64_t n) { float* p = st ? st + floats : nullptr; floats += n; return p; };
  auto index = [&](int64_t n) { int32_t* p = id ? id + ints : nullptr; ints += n; return p; };
  if (norms) {
    l.ln1 = take(BT * C);
    if (!parallel_block_) l.ln2 = take(BT * C);
  }
  if (set) {
    l.ln1_mean = stat(BT), l.ln1_rstd = stat(BT);
    l.qkv = take(BT * Ql_);
    l.saved = stat(ops_.attention_saved(maxB_, Hl_, maxT_, seqT_));
    l.atty = take(BT * Cl_);
    if (!parallel_block_) l.mid = take(BT * C), l.ln2_mean = stat(BT), l.ln2_rstd = stat(BT);
    if (qk_norm_.kind != QkNormKind::kNone)
      l.qkv_raw = take(BT * Ql_), l.qk_rstd = stat(BT * (qk_norm_.kind == QkNormKind::kHead ? Hl_ + Hkvl_ : 2));
  }
  // The dense MLP's activation output is not kept: the projection's forward reads it at once and
  // its backward recomputes it from fc (linear_backward without inp), so every layer writes it
  // into the one act_.
  if (mlp && dense) l.fc = take(BT * Pl_), l.act = const_cast<Act*>(act_.data());
  if (set && moe) {
    l.logits = stat(BT * E_), l.weights = stat(BT * k_);
    l.choice = index(M), l.order = index(M), l.pos = index(M);
    l.ys = take(M * C);
  }
  if (mlp && moe)
    l.xin = take(M * C), l.xfc = take(M * 2 * Fe_), l.xact = take(M * Fe_), l.sfc = take(BT * 2 * Fs_),
    l.sact = take(BT * Fs_);
}

template <OpSet Ops>
typename GptModel<Ops>::Slot& GptModel<Ops>::acquire(Chunk& ch, int mb, int B) {
  for (auto& s : ch.slots)
    MYRIAD_CHECK(s->mb != mb, "micro-batch ", mb, " is already in flight in layers [", ch.l0,
                 ", ", ch.l1, ")");
  for (auto& s : ch.slots)
    if (s->mb < 0) {
      s->mb = mb, s->B = B;
      return *s;
    }
  // A new slot: the schedule keeps one more micro-batch in flight than so far. Each layer
  // keeps `in` and what train.recompute does not share (shared_ holds the rest).
  auto s = std::make_unique<Slot>();
  const int64_t BT = maxB_ * maxT_, C = C_, layers = ch.l1 - ch.l0;
  const bool set = recompute_ != Recompute::kFull;
  const bool mlp = recompute_ == Recompute::kNone || recompute_ == Recompute::kNorms;
  // FP8 keeps each GEMM input's cast scalars, and with none the norms' outputs as FP8 casts in
  // place of their bf16.
  const bool fp8 = gemm_ == Gemm::kFp8, norms_fp8 = norm_casts_;
  const bool norms = recompute_ == Recompute::kNone && !norms_fp8;
  int64_t acts = 0, floats = 0, ints = 0, moe_layers = 0;
  for (int64_t l = ch.l0; l < ch.l1; ++l) {
    const bool moe = cfg_.model.layer_is_moe(l);
    LayerActs probe{};
    carve_layer(probe, acts, floats, ints, nullptr, nullptr, nullptr, set, mlp, !moe, moe, norms);
    moe_layers += moe;
  }
  s->storage.zeros(acts + BT * C * layers + BT * C * 2);
  s->stats.zeros(floats + BT * 2);
  s->ids.zeros(ints);
  const int64_t kf = fp8::kept_floats(tps_), norm_casts = parallel_block_ ? 1 : 2;
  s->fp8_scalars.zeros(fp8 ? layers * 4 * kf : 0);
  s->fp8_bytes.zeros(norms_fp8 ? layers * norm_casts * BT * C : 0);
  acts = 0, floats = 0, ints = 0;
  Act* a = s->storage.data();
  float* st = s->stats.data();
  auto take = [&](int64_t n) { Act* p = a + acts; acts += n; return p; };
  s->layers.assign(layers, shared_);
  for (int64_t i = 0; i < layers; ++i) {
    const bool moe = cfg_.model.layer_is_moe(ch.l0 + i);
    LayerActs& l = s->layers[i];
    l.in = take(BT * C);
    carve_layer(l, acts, floats, ints, a, st, s->ids.data(), set, mlp, !moe, moe, norms);
    if (mlp && moe) l.spill = static_cast<int>(spills_.size()), spills_.emplace_back();
    if (fp8) {
      float* k = s->fp8_scalars.data() + i * 4 * kf;
      l.ln1_fp8.scalars = k, l.atty_fp8.scalars = k + kf, l.ln2_fp8.scalars = k + 2 * kf, l.act_fp8.scalars = k + 3 * kf;
      // The producers measure their outputs' amaxes: the norms (forward), the activation (mlp_forward).
      l.ln1_fp8.producer_amax = l.ln2_fp8.producer_amax = l.act_fp8.producer_amax = true;
    }
    if (norms_fp8) {
      uint8_t* b = s->fp8_bytes.data() + i * norm_casts * BT * C;
      l.ln1_fp8.bytes = b;
      if (!parallel_block_) l.ln2_fp8.bytes = b + BT * C;
    }
  }
  s->out = take(BT * C);
  s->lnf = take(BT * C), s->lnf_mean = st + floats, s->lnf_rstd = st + floats + BT;
  floats += 2 * BT;
  MYRIAD_CHECK(acts <= s->storage.size() && floats <= s->stats.size());
  s->inputs.zeros(BT);
  s->targets.zeros(BT);
  if (documents_) s->doc_starts.zeros(maxB_ * seqT_);  // the whole rows' (attention's mask)
  if (ch.head) {
    s->logits.zeros(head_rows_ * Vl_);
    s->losses.zeros(BT);
    if (tp_) s->ce_max.zeros(BT), s->ce_sum.zeros(BT), s->ce_parts.zeros(2 * BT);
  }
  const int64_t held = (s->storage.size() + s->logits.size()) * int64_t(sizeof(Act)) +
                       (s->stats.size() + s->ids.size() + s->losses.size() + s->ce_max.size() + s->ce_sum.size() +
                        s->ce_parts.size() + s->fp8_scalars.size()) * 4 + s->fp8_bytes.size();
  const int64_t plan = model::slot_bytes(memory_shape(), layers, ch.head, moe_layers);
  MYRIAD_CHECK(held == plan, "a slot holds ", held, " bytes, the memory plan (model/memory_plan.h) says ", plan);
  s->mb = mb, s->B = B;
  ch.slots.push_back(std::move(s));
  return *ch.slots.back();
}

template <OpSet Ops>
typename GptModel<Ops>::Slot& GptModel<Ops>::held(int c, int mb) const {
  MYRIAD_CHECK(c >= 0 && c < num_chunks(), "chunk ", c, " of ", num_chunks());
  Slot* found = nullptr;
  for (auto& s : chunks_[c].slots)
    if (s->mb == mb) found = s.get();
  MYRIAD_CHECK(found != nullptr, "micro-batch ", mb, " is not in flight in chunk ", c);
  return *found;
}

template <OpSet Ops>
void GptModel<Ops>::set_shape(int B, int T) {
  MYRIAD_CHECK(B <= maxB_ && T <= seqT_, "batch ", B, "x", T, " exceeds ", maxB_, "x", seqT_);
  MYRIAD_CHECK(!cp_ || T == seqT_, "a forward of ", T, " tokens per row under context parallelism: its rows are "
               "whole sequences of model.seq_len (", seqT_, ")");
  Tw_ = T, T_ = T / cps_, B_ = B, N_ = B * T_;
  rows_ = context_rows(T, cps_, cpr_);
  sp_ = sp_cfg_ && N_ % tps_ == 0;
  R_ = sp_ ? N_ / tps_ : N_;
  r0_ = sp_ ? tpr_ * R_ : 0;
}

template <OpSet Ops>
int64_t GptModel<Ops>::boundary_elems(int B) const {
  const int64_t N = int64_t(B) * maxT_;
  return (sp_cfg_ && N % tps_ == 0 ? N / tps_ : N) * C_;
}

template <OpSet Ops>
template <class T>
typename GptModel<Ops>::template Tensors<T> GptModel<Ops>::tensors_in(T* base) const {
  auto at = [&](const std::string& name) -> T* {
    const ParamSpec* p = layout_.get(name);
    return p ? base + p->offset : nullptr;
  };
  Tensors<T> t{at("wte"), at("wpe"), at("lnf.w"), at("lnf.b"), at(cfg_.model.tied_embeddings ? "wte" : "lm_head"), {}};
  for (int64_t l = 0; l < L_; ++l) {
    std::string h = "h." + std::to_string(l) + ".";
    t.layers.push_back({at(h + "ln1.w"), at(h + "ln1.b"), at(h + "attn.qkv.w"),
                        at(h + "attn.qkv.b"), at(h + "attn.proj.w"), at(h + "attn.proj.b"),
                        at(h + "ln2.w"), at(h + "ln2.b"), at(h + "mlp.fc.w"), at(h + "mlp.fc.b"),
                        at(h + "mlp.proj.w"), at(h + "mlp.proj.b"), at(h + "attn.q_norm.w"),
                        at(h + "attn.k_norm.w"), at(h + "mlp.router.w"),
                        at(h + "mlp.router.bias"), at(h + "mlp.experts.fc.w"), at(h + "mlp.experts.proj.w"), at(h + "mlp.shared.fc.w"),
                        at(h + "mlp.shared.proj.w")});
  }
  return t;
}

template <OpSet Ops>
void GptModel<Ops>::zero_grads() { ops_.zero(grads_.data(), grads_.size()); }

// Each rank's amax meets the group's before a cast, so a shard is scaled as the whole tensor. On a
// stream-ordered communicator (NCCL) the scale kernel that reads the gather follows it on the
// stream, and the host goes on without waiting; a failure or a hang surfaces at the layer's next
// tensor-parallel collective, which the host waits for.
template <OpSet Ops>
fp8::AmaxGroup GptModel<Ops>::amax_group() const {
  if (!tp_) return {};
  return {tps_, [tp = tp_, s = stream()](const float* local, float* all) {
            comm::WorkPtr w = tp->all_gather(local, all, 1, s);
            if (!tp->stream_ordered()) w->wait();
          }};
}

template <OpSet Ops>
void GptModel<Ops>::carve_weight_casts() {
  const model::GptMemoryShape ms = memory_shape();
  const fp8::Scaling sc = ms.fp8_block ? fp8::Scaling::block : fp8::Scaling::tensor;
  struct Want {
    fp8::WeightCast* cast;
    int64_t OC, IC;
  };
  std::vector<Want> want;
  casts_.assign(L_, {});
  int64_t layers = 0, moe_layers = 0;
  for (int64_t l = 0; l < L_; ++l) {
    if (!part_.has_layer(l)) continue;
    const bool moe = cfg_.model.layer_is_moe(l);
    ++layers, moe_layers += moe;
    if (!model::casts_block_weights_once(ms)) continue;
    LayerCasts& c = casts_[l];
    c.shape = model::fp8_layer_weights(ms, moe);
    c.w.resize(c.shape.size());
    for (size_t i = 0; i < c.w.size(); ++i) want.push_back({&c.w[i], c.shape[i].first, c.shape[i].second});
  }
  if (part_.head && model::casts_head_once(ms)) want.push_back({&head_cast_, Vl_, C_});
  // Each W and W^T on a 256-byte boundary (the shapes are multiples of 16), each one's scales on
  // a 64-byte one (fp8::weight_cast_floats).
  std::vector<int64_t> at(want.size() + 1, 0), scales_at(want.size() + 1, 0);
  for (size_t i = 0; i < want.size(); ++i) {
    at[i + 1] = at[i] + 2 * want[i].OC * want[i].IC;
    scales_at[i + 1] = scales_at[i] + fp8::weight_cast_floats(want[i].OC, want[i].IC, sc, tps_);
  }
  cast_bytes_.zeros(at.back()), cast_scales_.zeros(scales_at.back());
  for (size_t i = 0; i < want.size(); ++i) {
    fp8::WeightCast& c = *want[i].cast;
    c.bytes = cast_bytes_.data() + at[i], c.bytes_t = c.bytes + want[i].OC * want[i].IC;
    c.scales = cast_scales_.data() + scales_at[i];
    c.scales_t = sc == fp8::Scaling::block ? c.scales + fp8::weight_cast_t_offset(want[i].OC, want[i].IC) : c.scales;
  }
  const int64_t held = cast_bytes_.size() + cast_scales_.size() * 4,
                plan = model::weight_cast_bytes(ms, layers, moe_layers, part_.head);
  MYRIAD_CHECK(held == plan, "the weights' casts hold ", held, " bytes, the memory plan (model/memory_plan.h) says ",
               plan);
}

template <OpSet Ops>
const fp8::WeightCast* GptModel<Ops>::weight_cast(int64_t l, int i) {
  if (block_gemm() != Gemm::kFp8 || casts_.empty() || casts_[l].w.empty()) return nullptr;
  LayerCasts& c = casts_[l];
  const LayerTensors<Param>& w = p_.layers[l];
  const bool moe = cfg_.model.layer_is_moe(l);
  const Param* ws[4];
  ws[model::kQkvWeight] = w.qkv_w, ws[model::kProjWeight] = w.proj_w;
  ws[model::kFcWeight] = moe ? w.shared_fc_w : w.fc_w, ws[model::kFcProjWeight] = moe ? w.shared_proj_w : w.fcproj_w;
  auto cast = [&](size_t j) {
    ops_.fp8_cast_weight(c.w[j], ws[j], static_cast<int>(c.shape[j].first), static_cast<int>(c.shape[j].second));
  };
  if (!weights_fixed_) {  // the weights may change before the next call: cast this one now, into its cast
    cast(static_cast<size_t>(i));
    c.epoch = -1;
  } else if (c.epoch != weights_epoch_) {  // the layer's first GEMM of the step: all its weights at once
    for (size_t j = 0; j < c.w.size(); ++j) cast(j);
    c.epoch = weights_epoch_;
  }
  return &c.w[i];
}

template <OpSet Ops>
const fp8::WeightCast* GptModel<Ops>::head_cast() {
  if (!head_cast_.bytes || head_gemm() != Gemm::kFp8) return nullptr;
  if (!weights_fixed_ || head_epoch_ != weights_epoch_) {
    ops_.fp8_cast_weight(head_cast_, p_.head, static_cast<int>(Vl_), C_);
    head_epoch_ = weights_fixed_ ? weights_epoch_ : -1;  // unfixed weights may change before the next call
  }
  return &head_cast_;
}

// ---- the tensor-parallel pieces (the identity, or the plain op, without TP) ----

template <OpSet Ops>
template <class Region>
void GptModel<Ops>::tp_region(const Act* in, int64_t n_in, Act* out, int64_t n_out, Region region) {
  if constexpr (std::is_same_v<Act, float>) {
    region(in, out);
  } else {  // fp32 copies in wide_, laid out as the buffers are (one may lie inside the other)
    float* a = wide_.data();
    if (in >= out && in + n_in <= out + n_out) {
      ops_.widen(a, out, n_out);
      region(a + (in - out), a);
      ops_.narrow(out, a, n_out);
    } else if (out >= in && out + n_out <= in + n_in) {
      ops_.widen(a, in, n_in);
      region(a, a + (out - in));
      ops_.narrow(out, a + (out - in), n_out);
    } else {
      ops_.widen(a, in, n_in);
      region(a, a + n_in);
      ops_.narrow(out, a + n_in, n_out);
    }
  }
}

template <OpSet Ops>
void GptModel<Ops>::reduce_partial(Act* partial, Act* out, int64_t width) {
  const int64_t n = int64_t(N_) * width, chunk = int64_t(R_) * width;
  if (sp_)
    tp_region(partial, n, out, chunk, [&](const float* p, float* o) {
      parallel::ReduceScatterToSequence::forward(tp_, p, o, chunk, stream());
    });
  else
    tp_region(out, n, out, n, [&](const float*, float* x) { parallel::ReduceFromTp::forward(tp_, x, n, stream()); });
}

template <OpSet Ops>
void GptModel<Ops>::gather_rows(const Act* dlocal, Act* dfull, int64_t width) {
  const int64_t chunk = int64_t(R_) * width;
  tp_region(dlocal, chunk, dfull, int64_t(N_) * width, [&](const float* l, float* f) {
    parallel::ReduceScatterToSequence::backward(tp_, l, f, chunk, stream());
  });
}

template <OpSet Ops>
typename GptModel<Ops>::Act* GptModel<Ops>::local_rows(Act* full, int64_t width) const {
  return sp_ ? full + int64_t(r0_) * width : full;
}

template <OpSet Ops>
void GptModel<Ops>::column_input_forward(Act* full, int64_t width) {
  if (!sp_) return;  // without SP, CopyToTp's forward: the identity
  const int64_t chunk = int64_t(R_) * width;
  tp_region(full + int64_t(r0_) * width, chunk, full, int64_t(N_) * width, [&](const float* local, float* f) {
    parallel::GatherFromSequence::forward(tp_, local, f, chunk, stream());
  });
}

template <OpSet Ops>
typename GptModel<Ops>::Act* GptModel<Ops>::column_input_backward(Act* dfull, int64_t width) {
  if (!tp_) return dfull;
  const int64_t n = int64_t(N_) * width, chunk = int64_t(R_) * width;
  if (sp_) {
    Act* local = dfull + int64_t(r0_) * width;
    tp_region(dfull, n, local, chunk, [&](const float* f, float* l) {
      parallel::GatherFromSequence::backward(tp_, f, l, chunk, stream());
    });
    return local;
  }
  tp_region(dfull, n, dfull, n, [&](const float*, float* x) { parallel::CopyToTp::backward(tp_, x, n, stream()); });
  return dfull;
}

template <OpSet Ops>
void GptModel<Ops>::row_parallel_forward(Act* out, const Act* inp, const Param* w, const Param* b, int IC,
                                         int OC, const fp8::Kept* keep, const fp8::WeightCast* wcast) {
  if (!tp_) {
    ops_.linear_forward(out, inp, w, b, N_, IC, OC, block_gemm(), keep, wcast);
    return;
  }
  // The partial product of this rank's input features, reduced over the ranks; the bias once.
  Act* partial = sp_ ? full_.data() : out;
  ops_.linear_forward(partial, inp, w, static_cast<const Param*>(nullptr), N_, IC, OC, block_gemm(), keep, wcast);
  reduce_partial(partial, out, OC);
  if (b) ops_.add_bias(out, b, R_, OC);
}

template <OpSet Ops>
const typename GptModel<Ops>::Act* GptModel<Ops>::row_parallel_dout(const Act* dout, int OC) {
  if (!sp_) return dout;  // ReduceFromTp's backward: the identity
  gather_rows(dout, full_.data(), OC);
  return full_.data();
}

template <OpSet Ops>
void GptModel<Ops>::row_parallel_backward(Act* dinp, float* dw, float* db, const Act* dout_full,
                                          const Act* dout, const Act* inp, const Param* w, int IC, int OC,
                                          const Act* pre, const fp8::Kept* kept, const fp8::WeightCast* wcast,
                                          const fp8::Kept* dinp_amax) {
  ops_.linear_backward(mlp_, dinp, dw, sp_ ? nullptr : db, dout_full, inp, w, pre, N_, IC, OC, /*accumulate=*/false,
                       block_gemm(), kept, dinp_amax, nullptr, wcast);
  if (sp_ && db) ops_.bias_backward(db, dout, R_, OC);  // this rank's rows: summed in finish_grads()
}

template <OpSet Ops>
void GptModel<Ops>::embedding_forward_tp(const Slot& s, Act* out) {
  // This rank's rows of wte for the tokens it owns, zero for the others; summed over the ranks
  // (exactly one rank contributes each row, so the sum is exact).
  Act* partial = sp_ ? full_.data() : out;
  ops_.vocab_rows_forward(partial, s.inputs.data(), p_.wte, v0_, Vl_, N_, C_);
  if (tp_) reduce_partial(partial, out, C_);
  if (p_.wpe) ops_.add_positions(out, p_.wpe, r0_, R_, T_, C_, cp_rows());  // positions (replicated) on the rows held here
}

template <OpSet Ops>
void GptModel<Ops>::embedding_backward_tp(const Slot& s, const Act* dresid) {
  // wpe from the rows held here (with SP a partial sum, completed in finish_grads()).
  if (g_.wpe) ops_.positions_backward(g_.wpe, dresid, r0_, R_, T_, C_, cp_rows());
  // wte: every row's gradient (ReduceFromTp: the identity; SP: gathered), into the rows owned here.
  const Act* dfull = dresid;
  if (sp_) {
    gather_rows(dresid, full_.data(), C_);
    dfull = full_.data();
  }
  ops_.vocab_rows_backward(g_.wte, dfull, s.inputs, v0_, Vl_, N_, C_);
}

template <OpSet Ops>
void GptModel<Ops>::crossentropy(Slot& s, Act* logits, int r, int n, float dloss) {
  float* losses = s.losses.data() + r;
  const int32_t* targets = s.targets.data() + r;
  if (!tp_) {
    if (dloss > 0)
      ops_.crossentropy_forward_backward(losses, logits, targets, dloss, n, V_, Vp_);
    else
      ops_.crossentropy_forward(losses, logits, targets, n, V_, Vp_);
    return;
  }
  // This rank's columns [v0, v0 + Vl) of the vocabulary, the first `live` of them real (the rest
  // padding).
  const int Vl = static_cast<int>(Vl_), live = static_cast<int>(std::clamp<int64_t>(V_ - v0_, 0, Vl_));
  float *mx = s.ce_max.data() + r, *sum = s.ce_sum.data() + r, *parts = s.ce_parts.data() + 2 * int64_t(r);
  ops_.ce_row_max(mx, logits, n, Vl, live);
  std::vector<float> host(static_cast<size_t>(n));  // the maxima meet on the host, in rank order
  ops_.download(host.data(), mx, n);
  parallel::max_over_group(tp_, host.data(), n);
  ops_.upload(mx, host.data(), n);
  ops_.ce_partials(parts, logits, mx, targets, v0_, n, Vl, live);
  parallel::sum_over_group(tp_, parts, 2 * int64_t(n), stream());
  ops_.ce_losses(losses, sum, parts, targets, n);
  if (dloss > 0) ops_.ce_tp_backward(logits, mx, sum, dloss, targets, v0_, n, Vl, live);
}

// ---- the model ----

template <OpSet Ops>
void GptModel<Ops>::forward(Chunk& ch, Slot& s, Rows rows, int64_t stride, const Act* input, bool targets,
                            float grad_scale) {
  const int B = B_, T = T_, C = C_, R = R_;
  const int Cl = static_cast<int>(Cl_);
  const int32_t* tokens = rows.tokens;
  // A forward makes new keys and values: what cp_qkv_ holds is a past forward's, even under the
  // same slot, micro-batch and layer (one micro-batch a step: the last backward's layer 0, then
  // the next step's forward of it, with the weights since updated).
  cp_holds_ = {nullptr, -1, -1};
  Act* first_in = ch.l1 > ch.l0 ? s.layers[0].in : s.out;
  count_routes_ = targets && grad_scale > 0;  // a training forward's routes count in the step's load
  load_documents(s, rows, stride);
  if (ch.embedding) {
    // With a backward to follow, the lookup's backward is prepared from the host's tokens.
    std::vector<int32_t> buf;
    const auto [ids, ids_stride] = rank_ids(tokens, stride, 0, buf);
    ops_.load_tokens(s.inputs, ids, B, T, ids_stride, v0_, grad_scale > 0 ? Vl_ : 0);
    if (tp_ || !p_.wpe)
      embedding_forward_tp(s, first_in);
    else
      ops_.embedding_forward(first_in, s.inputs.data(), p_.wte, p_.wpe, B, T, C, cp_rows());
  } else {
    ops_.copy(first_in, input, int64_t(R) * C);
  }
  // The first norm of the chunk; every later one is fused with the residual add before it.
  if (ch.l1 > ch.l0) {
    LayerActs& a = s.layers[0];
    const LayerTensors<Param>& w = p_.layers[ch.l0];
    ops_.norm_forward(norm_, local_rows(a.ln1, C), a.ln1_mean, a.ln1_rstd, a.in, w.ln1_w, w.ln1_b, R, C,
                      kept(a.ln1_fp8));
  } else if (ch.head) {
    ops_.norm_forward(norm_, local_rows(s.lnf, C), s.lnf_mean, s.lnf_rstd, s.out, p_.lnf_w, p_.lnf_b, R, C);
  }
  for (int64_t l = ch.l0; l < ch.l1; ++l) {
    LayerActs& a = s.layers[l - ch.l0];
    const LayerTensors<Param>& w = p_.layers[l];
    layer_forward(s, l, a);
    // The layer's output (R,C): the residual stream (mid in the sequential block, whose
    // attention branch is in it already; in in the parallel one) plus the branches.
    Act* branches = tmp2_.data();
    mlp_output(l, a, branches);
    const Act* resid = a.mid;
    if (parallel_block_) {
      row_parallel_forward(tmp_.data(), a.atty, w.proj_w, w.proj_b, Cl, C, kept(a.atty_fp8),
                           weight_cast(l, model::kProjWeight));
      ops_.add(branches, branches, tmp_.data(), int64_t(R) * C);
      resid = a.in;
    }
    if (l + 1 < ch.l1) {  // + the next layer's LN1
      LayerActs& n = s.layers[l + 1 - ch.l0];
      const LayerTensors<Param>& nw = p_.layers[l + 1];
      ops_.residual_norm_forward(norm_, n.in, local_rows(n.ln1, C), n.ln1_mean, n.ln1_rstd, resid, branches,
                                 nw.ln1_w, nw.ln1_b, R, C, kept(n.ln1_fp8));
    } else if (ch.head) {  // + the final norm
      ops_.residual_norm_forward(norm_, s.out, local_rows(s.lnf, C), s.lnf_mean, s.lnf_rstd, resid, branches,
                                 p_.lnf_w, p_.lnf_b, R, C);
    } else {
      ops_.add(s.out, resid, branches, int64_t(R) * C);
    }
  }
  if (ch.l1 > ch.l0) shared_holds_ = {&s, s.mb, ch.l1 - 1};
  if (!ch.head) return;
  column_input_forward(s.lnf, C);
  s.head_scale = 0;
  if (!targets) return;  // sampling: last_logits() runs the head on the rows it reads
  load_targets(s, rows, stride);
  head_forward(s, grad_scale);
}

// The head over row chunks of at most head_rows_: each chunk's logits (n, Vl) = lnf rows @ head^T,
// their losses and, in a training forward, at once their gradient (grad_scale / counted a
// counted token's loss: d mean / d loss_i), the head's weight gradient (+=) and the chunk's rows
// of the final norm's output gradient, written over s.lnf's (which no later chunk reads). Under
// tp the last is this rank's partial over its vocabulary columns: the backward sums it
// (column_input_backward).
template <OpSet Ops>
void GptModel<Ops>::head_forward(Slot& s, float grad_scale) {
  const int N = N_, C = C_, Vl = static_cast<int>(Vl_);
  const float dloss = grad_scale > 0 ? grad_scale / s.counted : 0.0f;
  Act* logits = s.logits.data();
  const fp8::WeightCast* const hc = head_cast();  // one cast for every chunk
  for (int r = 0; r < N; r += static_cast<int>(head_rows_)) {
    const int n = std::min(N - r, static_cast<int>(head_rows_));
    Act* lnf = s.lnf + int64_t(r) * C;
    ops_.linear_forward(logits, lnf, p_.head, static_cast<const Param*>(nullptr), n, C, Vl, head_gemm(), nullptr, hc);
    crossentropy(s, logits, r, n, dloss);
    if (grad_scale > 0) {
      ops_.linear_backward(mlp_, dln_.data(), g_.head, static_cast<float*>(nullptr), logits, lnf, p_.head, nullptr,
                           n, C, Vl, /*accumulate=*/false, head_gemm(), nullptr, nullptr, nullptr, hc);
      ops_.copy(lnf, dln_.data(), int64_t(n) * C);
    }
  }
  // The logits stay readable (logits()) when one chunk held them all and they are not gradients.
  last_logits_ = head_rows_ >= N && grad_scale == 0 ? logits : nullptr;
  s.head_scale = grad_scale;
  ops_.mean_into(loss_.data(), s.losses.data(), N, s.counted);
}

// The targets, rows.tokens[:, 1:], with those that begin a document left out (-1) when
// data.document_end_loss is off: each document's last position predicts the next document's
// first token, which nothing before it tells (Megatron's eod_mask_loss, its end-of-text tokens
// here the .idx's boundaries). s.counted: the positions the mean loss is over (at least 1).
// The rows' document starts into s.doc_starts (B,Tw), whole rows whatever this rank holds (the
// positions attention masks by), when the rows carry them.
template <OpSet Ops>
void GptModel<Ops>::load_documents(Slot& s, Rows rows, int64_t stride) {
  s.documents = rows.doc_starts != nullptr;
  if (!s.documents) return;
  MYRIAD_CHECK(documents_, "document starts passed to a model built without data.document_mask");
  // The kernels bound whole blocks of queries by their first row's start: the starts must only
  // grow along a row, each at or before its own position.
  for (int b = 0; b < B_; ++b)
    for (int i = 0; i < Tw_; ++i) {
      const int32_t d = rows.doc_starts[b * stride + i];
      MYRIAD_CHECK(d >= 0 && d <= i && (i == 0 || d >= rows.doc_starts[b * stride + i - 1]), "document start ", d,
                   " at row ", b, ", position ", i, ": starts must grow along a row and not pass their position");
    }
  ops_.load_tokens(s.doc_starts, rows.doc_starts, B_, Tw_, stride);
}

// Under cp the targets are this rank's positions', and the count the whole rows' (each rank's
// mean is its part of the micro-batch's; a rank whose targets all begin documents adds zeros).
template <OpSet Ops>
void GptModel<Ops>::load_targets(Slot& s, Rows rows, int64_t stride) {
  const int B = B_, T = T_;
  s.counted = B_ * Tw_;
  if (document_end_loss_ || !rows.doc_starts) {
    std::vector<int32_t> buf;
    const auto [ids, ids_stride] = rank_ids(rows.tokens, stride, 1, buf);
    ops_.load_tokens(s.targets, ids, B, T, ids_stride);
    return;
  }
  std::vector<int32_t> targets(static_cast<size_t>(B) * T);
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < T; ++i) {
      const int64_t p = rows_.position(i);
      targets[static_cast<size_t>(b) * T + i] = rows.target_begins_document(b, p, stride) ? -1 : rows.tokens[b * stride + p + 1];
    }
  s.counted = static_cast<int>(std::max<int64_t>(rows.counted_targets(B, Tw_, false, stride), 1));
  ops_.load_tokens(s.targets, targets.data(), B, T, T);
}

template <OpSet Ops>
std::pair<const int32_t*, int64_t> GptModel<Ops>::rank_ids(const int32_t* host, int64_t stride, int shift,
                                                           std::vector<int32_t>& buf) const {
  if (!cp_) return {host + shift, stride};
  buf.resize(static_cast<size_t>(B_) * T_);
  for (int b = 0; b < B_; ++b)
    for (int i = 0; i < T_; ++i) buf[size_t(b) * T_ + i] = host[b * stride + rows_.position(i) + shift];
  return {buf.data(), T_};
}

// The collectives move keys and values only: a rank's queries are read for its own rows alone,
// and the gradients of the other ranks' queries are zeros. Rank q's block is its rows' key and
// value heads, (B, T, Hkvl, 2, D); its rows of a sequence are two ranges of the whole one's
// (the micro-batch's context_assignment). The op set packs and places them on its device; the gather moves Act as they
// are (bf16 on a GPU: the communicator's float count is half the elements), the gradients' reduce-
// scatter sums in fp32.
template <OpSet Ops>
comm::WorkPtr GptModel<Ops>::gather_start(const Slot& s, int64_t l, const Act* local) {
  if (cp_holds_ == std::make_tuple(&s, s.mb, l)) return nullptr;
  static_assert(sizeof(Act) == 4 || sizeof(Act) == 2, "the gather moves Act as floats");
  const int64_t block = int64_t(B_) * T_ * 2 * Hkvl_ * D_, floats = block * int64_t(sizeof(Act)) / 4;
  Act* packs = reinterpret_cast<Act*>(cp_pack_.data());
  ops_.cp_pack_kv(packs + cpr_ * block, local, int64_t(B_) * T_, int(Hkvl_), int(G_), int(D_));
  return cp_->all_gather(cp_pack_.data() + cpr_ * floats, cp_pack_.data(), floats, stream());
}

template <OpSet Ops>
void GptModel<Ops>::gather_finish(const Slot& s, int64_t l, const Act* local, comm::WorkPtr& sent) {
  if (cp_holds_ == std::make_tuple(&s, s.mb, l)) return;
  sent->wait();
  sent.reset();
  ops_.cp_unpack_kv(cp_qkv_.data(), reinterpret_cast<const Act*>(cp_pack_.data()), local, B_, T_, ranks_, cps_,
                    cpr_, int(Hkvl_), int(G_), int(D_));
  cp_holds_ = {&s, s.mb, l};
}

template <OpSet Ops>
void GptModel<Ops>::scatter_sequence_grad(Act* dlocal) {
  const int64_t block = int64_t(B_) * T_ * 2 * Hkvl_ * D_;
  ops_.cp_pack_kv_grad(cp_pack_.data(), cp_dqkv_.data(), B_, T_, ranks_, cps_, int(Hkvl_), int(G_), int(D_));
  float* mine = cp_pack_.data() + cpr_ * block;
  cp_->reduce_scatter(cp_pack_.data(), mine, block, stream())->wait();
  // This rank's rows: their queries' gradient from its own kernel, their keys' and values' summed
  // over the ranks.
  ops_.cp_unpack_kv_grad(dlocal, mine, cp_dqkv_.data(), B_, T_, ranks_, cps_, cpr_, int(Hkvl_), int(G_), int(D_));
}

template <OpSet Ops>
void GptModel<Ops>::layer_forward(const Slot& s, int64_t l, LayerActs& a) {
  const int B = B_, T = T_, C = C_, N = N_, R = R_, W = window_;
  const int32_t* docs = doc_starts(s);
  const int Cl = static_cast<int>(Cl_), Hl = static_cast<int>(Hl_);
  const int Hkvl = static_cast<int>(Hkvl_), D = static_cast<int>(D_), G = static_cast<int>(G_);
  const LayerTensors<Param>& w = p_.layers[l];
  column_input_forward(a.ln1, C);
  const bool qk = qk_norm_.kind != QkNormKind::kNone;
  ops_.linear_forward(qk ? a.qkv_raw : a.qkv, a.ln1, w.qkv_w, w.qkv_b, N, C, static_cast<int>(Ql_), block_gemm(),
                      kept(a.ln1_fp8), weight_cast(l, model::kQkvWeight));
  if (qk) ops_.qk_norm_forward(qk_norm_, a.qkv, a.qk_rstd, a.qkv_raw, w.q_norm_w, w.k_norm_w, N, Hkvl, G, D);
  if (rope_) ops_.rope_forward(a.qkv, B, T, Hkvl, G, D, cp_rows());
  if (cp_) {  // this rank's query rows against the whole sequence's keys
    gather_sequence(s, l, a.qkv);
    ops_.attention_forward(a.atty, a.saved, cp_qkv_.data(), B, Tw_, Hl, Hkvl, D, W, docs, &rows_);
  } else {
    ops_.attention_forward(a.atty, a.saved, a.qkv, B, T, Hl, Hkvl, D, W, docs);
  }
  // The MLP reads LN2(mid = in + attention) in the sequential block and the shared LN1(in) in
  // the parallel one, whose attention projection only the layer's output needs.
  const Act* mlp_in = a.ln1;
  if (!parallel_block_) {
    row_parallel_forward(tmp_.data(), a.atty, w.proj_w, w.proj_b, Cl, C, kept(a.atty_fp8),
                         weight_cast(l, model::kProjWeight));
    ops_.residual_norm_forward(norm_, a.mid, local_rows(a.ln2, C), a.ln2_mean, a.ln2_rstd, a.in, tmp_.data(),
                               w.ln2_w, w.ln2_b, R, C, kept(a.ln2_fp8));
    column_input_forward(a.ln2, C);
    mlp_in = a.ln2;
  }
  mlp_forward(l, a, mlp_in, /*route=*/true);
}

template <OpSet Ops>
void GptModel<Ops>::mlp_forward(int64_t l, LayerActs& a, const Act* in, bool route) {
  const LayerTensors<Param>& w = p_.layers[l];
  const int N = N_, C = C_;
  if (!cfg_.model.layer_is_moe(l)) {
    ops_.linear_act_forward(mlp_, a.act, a.fc, in, w.fc_w, w.fc_b, N, C, static_cast<int>(Fl_), block_gemm(),
                            kept(parallel_block_ ? a.ln1_fp8 : a.ln2_fp8), kept(a.act_fp8),
                            weight_cast(l, model::kFcWeight));
    return;
  }
  const int E = static_cast<int>(E_), k = static_cast<int>(k_), Fe = static_cast<int>(Fe_), El = static_cast<int>(El_);
  const auto [first, end] = moe_rows();
  const Act* mine = in + int64_t(first) * C;  // the rows routed here (all of them without tp)
  if (route) {
    ops_.router_forward(a.logits, mine, w.router_w, end - first, C, E);
    Routing r = ops_.route(router_, a.choice, a.weights, a.order, a.pos, a.logits, w.router_bias, end - first);
    if (tp_ || cp_) balance_over_parts(a, r, end - first);
    a.counts = std::move(r.counts);
    if (count_routes_) {
      RouteStats& st = *std::find_if(route_stats_.begin(), route_stats_.end(), [&](const RouteStats& x) { return x.layer == l; });
      for (int e = 0; e < E; ++e) st.counts[e] += a.counts[e];
      st.aux += r.aux, st.z += r.z, st.dropped += r.dropped, ++st.micro_batches;
    }
    exchange_counts(a);
  }
  const int M = static_cast<int>(std::accumulate(a.counts.begin(), a.counts.end(), int64_t(0)));  // rows kept
  // The rows in expert order; with ep they go to their experts' ranks, which take them in their
  // local experts' order.
  const ExpertActs x = expert_acts(a);
  ops_.gather_rows(ep_ ? xs_.data() : x.xin, mine, a.order, M, k, C);
  comm::WorkPtr sent = ep_ ? dispatch_start(a, xs_.data(), C) : nullptr;
  // The shared experts while the rows travel.
  if (Fs_ > 0)
    ops_.linear_act_forward(Mlp::kSwiGlu, a.sact, a.sfc, in, w.shared_fc_w, static_cast<const Param*>(nullptr), N, C,
                            static_cast<int>(Fs_), block_gemm(), nullptr, nullptr, weight_cast(l, model::kFcWeight));
  if (ep_) dispatch_finish(a, sent, x.xin, C);
  ops_.grouped_linear_act_forward(Mlp::kSwiGlu, x.xact, x.xfc, x.xin, w.experts_fc_w, a.local.data(), El, C, Fe);
  if (route) {
    Act* ys = ep_ ? xr_.data() + exchange_rows_ * C : a.ys;  // with ep, the outputs go back to the rows' ranks
    ops_.grouped_linear_forward(ys, x.xact, w.experts_proj_w, a.local.data(), El, Fe, C);
    if (ep_) {
      comm::WorkPtr back = collect_start(a, ys, a.ys, C);
      collect_finish(back);
    }
  }
}

template <OpSet Ops>
void GptModel<Ops>::mlp_output(int64_t l, const LayerActs& a, Act* out) {
  const LayerTensors<Param>& w = p_.layers[l];
  if (!cfg_.model.layer_is_moe(l)) {
    row_parallel_forward(out, a.act, w.fcproj_w, w.fcproj_b, static_cast<int>(Fl_), C_, kept(a.act_fp8),
                         weight_cast(l, model::kFcProjWeight));
    return;
  }
  // The shared experts' partial sum over this rank's features (all rows), plus the routed
  // experts' output on the rows routed here; with tp one partial sum, reduced as a row-parallel
  // GEMM's (each row's routed part comes from one rank).
  const auto [first, end] = moe_rows();
  Act* partial = tp_ && sp_ ? full_.data() : out;
  if (Fs_ > 0)
    ops_.linear_forward(partial, a.sact, w.shared_proj_w, static_cast<const Param*>(nullptr), N_,
                        static_cast<int>(Fs_), C_, block_gemm(), nullptr, weight_cast(l, model::kFcProjWeight));
  else if (tp_)
    ops_.zero(partial, int64_t(N_) * C_);
  ops_.combine_forward(partial + int64_t(first) * C_, a.ys, a.weights, a.pos, end - first, static_cast<int>(k_), C_,
                       /*accumulate=*/Fs_ > 0 || tp_);
  if (tp_) reduce_partial(partial, out, C_);
}

template <OpSet Ops>
void GptModel<Ops>::mlp_backward(int64_t l, const LayerActs& a, const Act* in, const Act* dout, const Act* dlocal,
                                 float grad_scale) {
  const LayerTensors<Param>& w = p_.layers[l];
  const LayerTensors<float>& g = g_.layers[l];
  const int N = N_, C = C_;
  if (!cfg_.model.layer_is_moe(l)) {
    // In FP8 the activation's backward measures dfc's amax as it writes it, for fc's cast of it.
    row_parallel_backward(dfc_.data(), g.fcproj_w, g.fcproj_b, dout, dlocal, /*inp: recomputed from fc*/ nullptr,
                          w.fcproj_w, static_cast<int>(Fl_), C, a.fc, kept(a.act_fp8),
                          weight_cast(l, model::kFcProjWeight), kept(dfc_fp8_));
    ops_.linear_backward(mlp_, dln_.data(), g.fc_w, g.fc_b, dfc_.data(), in, w.fc_w, nullptr, N, C,
                         static_cast<int>(Pl_), /*accumulate=*/false, block_gemm(),
                         kept(parallel_block_ ? a.ln1_fp8 : a.ln2_fp8), nullptr, kept(dfc_fp8_),
                         weight_cast(l, model::kFcWeight));
    return;
  }
  const int E = static_cast<int>(E_), k = static_cast<int>(k_), Fe = static_cast<int>(Fe_), El = static_cast<int>(El_);
  const int Fs = static_cast<int>(Fs_);
  const auto [first, end] = moe_rows();
  const int Nm = end - first;
  const Act* mine = in + int64_t(first) * C;  // the rows routed here
  // The combine: the experts' output rows' gradients and the weights'.
  ops_.combine_backward(dys_.data(), dweights_.data(), dout + int64_t(first) * C, a.ys, a.weights, a.pos, Nm, k, C);
  // The experts (with ep, on the rows' gradients sent to their ranks), back to their input rows
  // in expert order (with ep, returned), then summed into each token's row.
  const ExpertActs x = expert_acts(a);
  Act* dys = dys_.data();
  comm::WorkPtr sent = ep_ ? dispatch_start(a, dys_.data(), C) : nullptr;
  // While the gradients travel: the shared experts' second GEMM, and the router's logits.
  if (Fs > 0)
    ops_.linear_backward(Mlp::kSwiGlu, dsfc_.data(), g.shared_proj_w, static_cast<float*>(nullptr), dout, a.sact,
                         w.shared_proj_w, a.sfc, N, Fs, C, /*accumulate=*/false, block_gemm(), nullptr, nullptr,
                         nullptr, weight_cast(l, model::kFcProjWeight));
  ops_.route_backward(router_, dlogits_.data(), dweights_.data(), a.logits, a.choice, grad_scale, Nm,
                      tp_ || cp_ ? RouteTotals{a.chosen.data(), int64_t(N) * cps_} : RouteTotals{});
  if (ep_) dispatch_finish(a, sent, dys = xr_.data() + exchange_rows_ * C, C);
  ops_.grouped_linear_backward(Mlp::kSwiGlu, dxfc_.data(), g.experts_proj_w, dys, x.xact, w.experts_proj_w, x.xfc,
                               a.local.data(), El, Fe, C);
  Act* dxin = ep_ ? xr_.data() + exchange_rows_ * C : dxs_.data();
  ops_.grouped_linear_backward(Mlp::kSwiGlu, dxin, g.experts_fc_w, dxfc_.data(), x.xin, w.experts_fc_w, nullptr,
                               a.local.data(), El, C, 2 * Fe);
  if (ep_) {
    comm::WorkPtr back = collect_start(a, dxin, dxs_.data(), C);
    collect_finish(back);
  }
  // The input's gradient over all N rows (its other rows' parts come from the other tp ranks).
  ops_.zero(dln_.data(), int64_t(N) * C);
  ops_.gather_rows_backward(dln_.data() + int64_t(first) * C, dxs_.data(), a.pos, Nm, k, C);
  // The router's input gradient (its logits' came from the weights' and the balance and z losses'
  // above), then the shared experts' first GEMM, in that order whatever the overlap.
  ops_.router_backward(dln_.data() + int64_t(first) * C, g.router_w, dlogits_.data(), mine, w.router_w, Nm, C, E);
  if (Fs > 0)
    ops_.linear_backward(Mlp::kSwiGlu, dln_.data(), g.shared_fc_w, static_cast<float*>(nullptr), dsfc_.data(), in,
                         w.shared_fc_w, nullptr, N, C, 2 * Fs, /*accumulate=*/true, block_gemm(), nullptr, nullptr,
                         nullptr, weight_cast(l, model::kFcWeight));
}

// Expert parallelism's counts: each rank's rows per expert of every other rank (an all-to-all of
// El counts per pair), so that each side knows the sizes of the row exchanges that follow; the
// local experts' counts are their sums. Without ep the local experts are all of them.
template <OpSet Ops>
void GptModel<Ops>::exchange_counts(LayerActs& a) {
  if (!ep_) {
    a.local = a.counts;
    return;
  }
  const int64_t El = El_;
  a.received.assign(static_cast<size_t>(eps_ * El), 0);
  const std::vector<int64_t> bytes(static_cast<size_t>(eps_), El * int64_t(sizeof(int64_t)));
  ep_->all_to_all_bytes(a.counts.data(), bytes, a.received.data(), bytes)->wait();
  a.local.assign(static_cast<size_t>(El), 0);
  for (int p = 0; p < eps_; ++p)
    for (int64_t e = 0; e < El; ++e) a.local[e] += a.received[p * El + e];
}

template <OpSet Ops>
void GptModel<Ops>::balance_over_parts(LayerActs& a, Routing& r, int rows) {
  const int64_t E = E_;
  std::vector<double> s(static_cast<size_t>(2 * E + 1));
  for (int64_t e = 0; e < E; ++e) s[e] = double(r.counts[e]), s[E + e] = r.score_sums[e];
  s[2 * E] = r.z * rows;
  parallel::sum_over_group(tp_, s.data(), int64_t(s.size()));
  parallel::sum_over_group(cp_, s.data(), int64_t(s.size()));
  a.chosen.resize(static_cast<size_t>(E));
  r.aux = 0;
  const double n = double(N_) * cps_;  // the micro-batch's tokens: this rank's rows are 1/cp of them
  for (int64_t e = 0; e < E; ++e) {
    a.chosen[e] = std::llround(s[e]);
    r.aux += double(E) * (s[e] / (n * k_)) * (s[E + e] / n);
  }
  r.z = s[2 * E] / n;
}

// Rows arrive grouped by the rank they came from, each rank's in its expert order (rank, expert);
// the grouped GEMMs take them by expert (expert, rank). perm_[i] is the arriving row that expert
// order's row i is; perm_[n + j] the reverse (n arrivals). Ranks in rank order and rows in their order: the
// same for every run, whatever the timing.
template <OpSet Ops>
typename GptModel<Ops>::ExpertActs GptModel<Ops>::expert_acts(const LayerActs& a) {
  const int64_t n = arrivals(a), C = C_, Fe = Fe_;
  if (n > exchange_rows_) {  // the scratch of the exchange and of the experts' backward
    exchange_rows_ = n;
    dxfc_.zeros(n * 2 * Fe);
    if (ep_) xr_.zeros(2 * n * C), perm_.zeros(2 * n);
  }
  if (n <= maxB_ * maxT_ * k_) return {a.xin, a.xfc, a.xact};
  Buffer<Act>& spill = spills_.at(static_cast<size_t>(a.spill));
  if (spill.size() < n * (C + 3 * Fe)) {
    log::info("moe: this rank's experts took ", n, " rows of a micro-batch (", maxB_ * maxT_ * k_,
              " when balanced): a buffer of ", (n * (C + 3 * Fe) * int64_t(sizeof(Act))) >> 10, " KiB grows for them");
    spill.zeros(n * (C + 3 * Fe));
  }
  Act* p = spill.data();
  return {p, p + n * C, p + n * (C + 2 * Fe)};
}

template <OpSet Ops>
void GptModel<Ops>::load_exchange_order(const LayerActs& a) {
  const int64_t El = El_, n = arrivals(a);
  std::vector<int64_t> at(static_cast<size_t>(eps_ * El));  // where (rank p, expert e)'s rows arrive
  int64_t rows = 0;
  for (int64_t i = 0; i < eps_ * El; ++i) at[i] = rows, rows += a.received[i];
  std::vector<int32_t> order(static_cast<size_t>(2 * n), 0);
  int64_t i = 0;
  for (int64_t e = 0; e < El; ++e)
    for (int p = 0; p < eps_; ++p)
      for (int64_t r = 0; r < a.received[p * El + e]; ++r, ++i) {
        order[i] = static_cast<int32_t>(at[p * El + e] + r);
        order[n + at[p * El + e] + r] = static_cast<int32_t>(i);
      }
  ops_.load_tokens(perm_, order.data(), 1, static_cast<int>(2 * n), 2 * n);
}

template <OpSet Ops>
comm::WorkPtr GptModel<Ops>::dispatch_start(const LayerActs& a, const Act* rows, int64_t width) {
  const int64_t El = El_, row_bytes = width * int64_t(sizeof(Act));
  std::vector<int64_t> send(static_cast<size_t>(eps_), 0), recv(static_cast<size_t>(eps_), 0);
  for (int p = 0; p < eps_; ++p)
    for (int64_t e = 0; e < El; ++e)
      send[p] += a.counts[p * El + e] * row_bytes, recv[p] += a.received[p * El + e] * row_bytes;
  // Arriving in xr_'s first half (n, width), by rank, then expert.
  comm::WorkPtr w = ep_->all_to_all_bytes(rows, send, xr_.data(), recv, stream());
  overlap_or_wait(w);
  return w;
}

template <OpSet Ops>
void GptModel<Ops>::dispatch_finish(const LayerActs& a, comm::WorkPtr& sent, Act* out, int64_t width) {
  sent->wait();
  load_exchange_order(a);
  const int64_t n = arrivals(a);
  ops_.gather_rows(out, xr_.data(), perm_.data(), static_cast<int>(n), 1, static_cast<int>(width));
}

template <OpSet Ops>
comm::WorkPtr GptModel<Ops>::collect_start(const LayerActs& a, const Act* rows, Act* out, int64_t width) {
  const int64_t El = El_, row_bytes = width * int64_t(sizeof(Act)), n = arrivals(a);
  std::vector<int64_t> send(static_cast<size_t>(eps_), 0), recv(static_cast<size_t>(eps_), 0);
  for (int p = 0; p < eps_; ++p)
    for (int64_t e = 0; e < El; ++e)
      send[p] += a.received[p * El + e] * row_bytes, recv[p] += a.counts[p * El + e] * row_bytes;
  Act* leaving = xr_.data();  // (n, width) by rank, then expert
  // perm_ holds a's order already: collect_start always follows a's dispatch_finish.
  ops_.gather_rows(leaving, rows, perm_.data() + n, static_cast<int>(n), 1, static_cast<int>(width));
  comm::WorkPtr w = ep_->all_to_all_bytes(leaving, send, out, recv, stream());
  overlap_or_wait(w);
  return w;
}

// With the forward's kernels on the forward's inputs, so the refill is bitwise what the forward
// computed: the norms' outputs in every mode but none, LN1 from in and LN2 from mid (the fused
// residual + norm rounds its residual to Act before its statistics, exactly what norm_forward
// reads back), then what the mode dropped besides. The norms take no FP8 keep here: the amaxes
// the forward's norms wrote into the keeps are those of these same bits.
template <OpSet Ops>
void GptModel<Ops>::recompute(const Chunk& ch, Slot& s, int64_t l) {
  if (recompute_ == Recompute::kNone || shared_holds_ == std::make_tuple(&s, s.mb, l)) return;
  count_routes_ = false;  // the forward counted this micro-batch's routes already
  LayerActs& a = s.layers[l - ch.l0];
  const LayerTensors<Param>& w = p_.layers[l];
  ops_.norm_forward(norm_, local_rows(a.ln1, C_), a.ln1_mean, a.ln1_rstd, a.in, w.ln1_w, w.ln1_b, R_, C_);
  if (recompute_ == Recompute::kFull) {
    layer_forward(s, l, a);  // gathers ln1 and refills ln2 on its way
  } else {
    column_input_forward(a.ln1, C_);
    if (!parallel_block_) {
      ops_.norm_forward(norm_, local_rows(a.ln2, C_), a.ln2_mean, a.ln2_rstd, a.mid, w.ln2_w, w.ln2_b, R_, C_);
      column_input_forward(a.ln2, C_);
    }
    if (recompute_ == Recompute::kSelective) mlp_forward(l, a, parallel_block_ ? a.ln1 : a.ln2, /*route=*/false);
  }
  shared_holds_ = {&s, s.mb, l};
}

template <OpSet Ops>
std::vector<typename GptModel<Ops>::RouteStats> GptModel<Ops>::take_route_stats() {
  std::vector<RouteStats> out = route_stats_;
  for (RouteStats& st : route_stats_)
    std::fill(st.counts.begin(), st.counts.end(), 0), st.aux = st.z = 0, st.dropped = 0, st.micro_batches = 0;
  return out;
}

template <OpSet Ops>
double GptModel<Ops>::take_loss() {
  double sum = 0;
  ops_.download(&sum, loss_.data(), 1);
  ops_.zero(loss_.data(), 1);
  return sum;
}

template <OpSet Ops>
void GptModel<Ops>::backward(Chunk& ch, Slot& s, const Act* doutput, Act* dinput, float grad_scale) {
  // FP8 with recompute none keeps the norms' outputs as FP8 casts only: a bf16 backward (tokens
  // off a multiple of 16) would read their shared transient, another layer's.
  MYRIAD_CHECK(block_gemm() == gemm_ || !norm_casts_, "an FP8 model's backward of ", N_,
               " tokens, not a multiple of 16: its norms' outputs are kept only as FP8 casts");
  const int B = B_, T = T_, C = C_, N = N_, R = R_, W = window_;
  const int Cl = static_cast<int>(Cl_), Hl = static_cast<int>(Hl_);
  const int Hkvl = static_cast<int>(Hkvl_), D = static_cast<int>(D_), G = static_cast<int>(G_);
  const int Ql = static_cast<int>(Ql_);
  if (ch.head) {
    // The head's own backward ran in the forward (head_forward): s.lnf holds its input gradient.
    MYRIAD_CHECK(grad_scale > 0 && s.head_scale == grad_scale, "the head's backward at grad_scale ", grad_scale,
                 " after a forward at ", s.head_scale);
    s.head_scale = 0;
    Act* dlnf = column_input_backward(s.lnf, C);
    ops_.zero(dresid_.data(), int64_t(R) * C);
    ops_.norm_backward(norm_, dresid_.data(), g_.lnf_w, g_.lnf_b, dlnf, s.out, p_.lnf_w, s.lnf_mean, s.lnf_rstd,
                       R, C);
  } else {
    ops_.copy(dresid_.data(), doutput, int64_t(R) * C);
  }

  // dresid_ holds the gradient of the residual stream; walking down a layer adds each
  // branch's input gradient into it in place (the LayerNorm backwards accumulate).
  for (int64_t l = ch.l1 - 1; l >= ch.l0; --l) {
    recompute(ch, s, l);
    LayerActs& a = s.layers[l - ch.l0];
    const LayerTensors<Param>& w = p_.layers[l];
    const LayerTensors<float>& g = g_.layers[l];
    Act* dresid = dresid_.data();
    // cp: the layer's keys and values travel while its MLP's backward runs (parallel.overlap_cp).
    comm::WorkPtr kv = cp_ && overlap_cp_ ? gather_start(s, l, a.qkv) : nullptr;
    // The gradient at the layer's output as the row-parallel GEMMs need it (all rows).
    const Act* dout = row_parallel_dout(dresid, C);

    // MLP branch: its output gradient is the residual gradient at the layer's output; the
    // projection's input gradient goes through the activation's derivative in the same op.
    const Act* mlp_in = parallel_block_ ? a.ln1 : a.ln2;
    mlp_backward(l, a, mlp_in, dout, dresid, grad_scale);
    if (!parallel_block_) {
      // dresid becomes the gradient at mid: the pass-through plus LN2's input gradient.
      Act* dln2 = column_input_backward(dln_.data(), C);
      ops_.norm_backward(norm_, dresid, g.ln2_w, g.ln2_b, dln2, a.mid, w.ln2_w, a.ln2_mean, a.ln2_rstd, R, C);
      dout = row_parallel_dout(dresid, C);
    }
    // Attention branch (in the parallel block dln_ still holds the MLP's share of LN1's output
    // gradient, and the attention's share adds to it).
    row_parallel_backward(datty_.data(), g.proj_w, g.proj_b, dout, dresid, a.atty, w.proj_w, Cl, C, nullptr,
                          kept(a.atty_fp8), weight_cast(l, model::kProjWeight));
    if (cp_) {  // the sequence's keys gathered again; their gradients go back to their ranks
      if (!overlap_cp_) kv = gather_start(s, l, a.qkv);
      gather_finish(s, l, a.qkv, kv);
      ops_.attention_backward(cp_dqkv_.data(), datty_.data(), a.atty, cp_qkv_.data(), a.saved, B, Tw_, Hl, Hkvl, D,
                              W, doc_starts(s), &rows_);
      scatter_sequence_grad(dqkv_.data());
    } else {
      ops_.attention_backward(dqkv_.data(), datty_.data(), a.atty, a.qkv, a.saved, B, T, Hl, Hkvl, D, W,
                              doc_starts(s));
    }
    if (rope_) ops_.rope_backward(dqkv_.data(), B, T, Hkvl, G, D, cp_rows());
    if (qk_norm_.kind != QkNormKind::kNone)
      ops_.qk_norm_backward(qk_norm_, dqkv_.data(), g.q_norm_w, g.k_norm_w, a.qkv_raw, w.q_norm_w, w.k_norm_w,
                            a.qk_rstd, N, Hkvl, G, D);
    ops_.linear_backward(mlp_, dln_.data(), g.qkv_w, g.qkv_b, dqkv_.data(), a.ln1, w.qkv_w, nullptr, N, C, Ql,
                         /*accumulate=*/parallel_block_, block_gemm(), kept(a.ln1_fp8), nullptr, nullptr,
                         weight_cast(l, model::kQkvWeight));
    Act* dln1 = column_input_backward(dln_.data(), C);
    ops_.norm_backward(norm_, dresid, g.ln1_w, g.ln1_b, dln1, a.in, w.ln1_w, a.ln1_mean, a.ln1_rstd, R, C);
  }
  if (!ch.embedding)
    ops_.copy(dinput, dresid_.data(), int64_t(R) * C);
  else if (tp_ || !g_.wpe)
    embedding_backward_tp(s, dresid_.data());
  else
    ops_.embedding_backward(g_.wte, g_.wpe, dresid_.data(), s.inputs, B, T, C, cp_rows());
}

template <OpSet Ops>
void GptModel<Ops>::forward_chunk(int c, int mb, int B, Rows rows, const Act* input, float grad_scale) {
  MYRIAD_CHECK(c >= 0 && c < num_chunks(), "chunk ", c, " of ", num_chunks());
  Chunk& ch = chunks_[c];
  set_shape(B, static_cast<int>(seqT_));
  Slot& s = acquire(ch, mb, B);
  if (cp_) {  // the ranks' chunks for this micro-batch's documents: every rank and stage alike
    s.cp_ranks = context_assignment(seqT_, cps_, rows.doc_starts, B, seqT_ + 1, window_);
    use_rows(s);
  }
  forward(ch, s, rows, seqT_ + 1, input, /*targets=*/true, grad_scale);
}

template <OpSet Ops>
const typename GptModel<Ops>::Act* GptModel<Ops>::chunk_output(int c, int mb) const {
  return held(c, mb).out;
}

template <OpSet Ops>
void GptModel<Ops>::backward_chunk(int c, int mb, const Act* doutput, Act* dinput, float grad_scale) {
  Slot& s = held(c, mb);
  set_shape(s.B, static_cast<int>(seqT_));
  use_rows(s);
  backward(chunks_[c], s, doutput, dinput, grad_scale);
  s.mb = -1;
}

template <OpSet Ops>
void GptModel<Ops>::drop_chunk(int c, int mb) { held(c, mb).mb = -1; }

// ---- the whole model in this process ----

// The micro-batch number of the whole-model forwards (loss, sampling): never a schedule's.
inline constexpr int kWholeModel = 1 << 30;

template <OpSet Ops>
float GptModel<Ops>::forward_backward(Rows rows, int B, float grad_scale) {
  for (int c = 0; c < num_chunks(); ++c)
    forward_chunk(c, 0, B, rows, c > 0 ? chunk_output(c - 1, 0) : nullptr, grad_scale);
  // Several chunks here (pp = 1 with virtual stages) pass their gradients in memory.
  for (int c = num_chunks() - 1; c >= 0; --c) {
    if (c > 0) din_.zeros(boundary_elems(B));
    backward_chunk(c, 0, c + 1 < num_chunks() ? dout_.data() : nullptr, c > 0 ? din_.data() : nullptr,
                   grad_scale);
    std::swap(dout_, din_);
  }
  return static_cast<float>(take_loss());
}

template <OpSet Ops>
float GptModel<Ops>::loss(Rows rows, int B) {
  for (int c = 0; c < num_chunks(); ++c)
    forward_chunk(c, kWholeModel, B, rows, c > 0 ? chunk_output(c - 1, kWholeModel) : nullptr, 0.0f);
  for (int c = 0; c < num_chunks(); ++c) drop_chunk(c, kWholeModel);
  return static_cast<float>(take_loss());
}

template <OpSet Ops>
void GptModel<Ops>::last_logits(const int32_t* tokens, int B, int T, float* out) {
  MYRIAD_CHECK(part_.embedding && part_.head, "last_logits needs the whole model in one process");
  if (cp_) throw_input("sampling runs on the whole sequence in one process: use myriad sample on the checkpoint");
  set_shape(B, T);
  for (int c = 0; c < num_chunks(); ++c) {
    Slot& s = acquire(chunks_[c], kWholeModel, B);
    forward(chunks_[c], s, tokens, T, c > 0 ? held(c - 1, kWholeModel).out : nullptr,
            /*targets=*/false, 0.0f);
  }
  // The head on each row's last position only: those rows of lnf side by side in dln_ (B, C),
  // their logits (B, Vl) in the slot's logits, head_rows_ at a time.
  Slot& s = held(num_chunks() - 1, kWholeModel);
  const int64_t C = C_, chunk = int64_t(B) * Vl_;
  for (int b = 0; b < B; ++b) ops_.copy(dln_.data() + b * C, s.lnf + (int64_t(b) * T + T - 1) * C, C);
  // This rank's vocabulary columns (all of them without tp), gathered over the ranks: rank q's
  // block is columns [q Vl, (q+1) Vl).
  std::vector<float> all(chunk * tps_);
  float* mine = all.data() + tpr_ * chunk;
  for (int b0 = 0; b0 < B; b0 += static_cast<int>(head_rows_)) {
    const int n = std::min(B - b0, static_cast<int>(head_rows_));
    // n rows, not the B T that head_gemm() judged: FP8 only on a multiple of 16, the head's weight
    // from its cast where the model holds one (the cast buffers are not planned for it).
    const Gemm g = n % 16 == 0 ? head_gemm() : Gemm::kBf16;
    ops_.linear_forward(s.logits.data(), dln_.data() + b0 * C, p_.head, static_cast<const Param*>(nullptr), n,
                        static_cast<int>(C), static_cast<int>(Vl_), g, nullptr,
                        g == Gemm::kFp8 ? head_cast() : nullptr);
    ops_.download(mine + b0 * Vl_, s.logits.data(), int64_t(n) * Vl_);
  }
  for (int c = 0; c < num_chunks(); ++c) drop_chunk(c, kWholeModel);
  last_logits_ = nullptr;
  if (!tp_) {
    std::memcpy(out, mine, chunk * sizeof(float));
    return;
  }
  parallel::GatherFromSequence::forward(tp_, mine, all.data(), chunk);
  for (int q = 0; q < tps_; ++q)
    for (int b = 0; b < B; ++b)
      std::memcpy(out + b * Vp_ + q * Vl_, all.data() + q * chunk + b * Vl_, Vl_ * sizeof(float));
}

template <OpSet Ops>
bool GptModel<Ops>::partial_over_tp(const ParamSpec& p) const {
  if (!tp_ || !p.replicated()) return false;
  if (sp_cfg_) return true;
  // Qwen3's query and key norms: one weight per head feature, shared by the heads of every rank.
  if (p.name.ends_with(".attn.q_norm.w") || p.name.ends_with(".attn.k_norm.w")) return true;
  return p.layer >= 0 && cfg_.model.layer_is_moe(p.layer) && (p.expert || p.name.ends_with(".mlp.router.w"));
}

template <OpSet Ops>
void GptModel<Ops>::finish_grads(int64_t begin, int64_t end) {
  if (!tp_) return;
  // The tensors that saw only this rank's tokens (partial_over_tp: with SP the norms, row-
  // parallel biases and wpe): one all-reduce of their elements in [begin, end), packed in layout
  // order. Every tp rank has the same layout shape, so the ranks pack the same elements.
  std::vector<std::pair<int64_t, int64_t>> runs;
  int64_t n = 0;
  for (const ParamSpec& p : layout_.tensors()) {
    const int64_t a = std::max(begin, p.offset), b = std::min(end, p.offset + p.numel);
    if (partial_over_tp(p) && a < b) runs.emplace_back(a, b), n += b - a;
  }
  if (n == 0) return;
  Buffer<float> packed;
  packed.zeros(n);
  int64_t at = 0;
  for (auto [a, b] : runs) ops_.copy(packed.data() + at, grads_.data() + a, b - a), at += b - a;
  parallel::sum_over_group(tp_, packed.data(), n, stream());
  at = 0;
  for (auto [a, b] : runs) ops_.copy(grads_.data() + a, packed.data() + at, b - a), at += b - a;
}

template <OpSet Ops>
double GptModel<Ops>::flops_per_token() const {
  // One formula for every MFU (model/flops.h); this layout's matmul weights are what it counts.
  MYRIAD_CHECK(model::matmul_params(cfg_.model, Vp_) == double(layout_.matmul_params()), "model/flops.h counts ",
               model::matmul_params(cfg_.model, Vp_), " matmul weights, the layout holds ", layout_.matmul_params());
  return model::flops_per_token(cfg_.model, Vp_);
}

}  // namespace myriad
