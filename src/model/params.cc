#include "model/params.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "core/rng.h"

namespace myriad {

bool vocab_rows(const ParamSpec& p) { return p.name == "wte" || p.name == "lm_head"; }

int64_t ParamSpec::global_index(int64_t i) const {
  if (split_dim < 0) return i;
  if (split_dim == 0) return global_offset[0] * (numel / shape[0]) + i;
  // Columns of a matrix: local (row, col) -> (row, global_offset[1] + col).
  const int64_t cols = shape[1], gcols = global_shape[1];
  return (i / cols) * gcols + global_offset[1] + i % cols;
}

ModelPart ModelPart::whole(const Config& cfg) {
  return {{{0, static_cast<int>(cfg.model.layers)}}, true, true};
}

bool ModelPart::has_layer(int64_t layer) const {
  for (auto [a, b] : chunks)
    if (layer >= a && layer < b) return true;
  return false;
}

ParamLayout::ParamLayout(const Config& cfg, int tp_rank, int tp_size, const ModelPart* part, ExpertShard experts)
    : tp_rank_(tp_rank), tp_size_(tp_size) {
  const ModelPart all = ModelPart::whole(cfg);
  if (!part) part = &all;
  const ModelConfig& m = cfg.model;
  const int64_t C = m.d_model, Vp = cfg.padded_vocab(), P = cfg.positions();
  const int64_t D = m.head_dim(), H = m.heads, Hkv = m.kv(), F = m.ffn();
  const double std = m.init_std;
  // GPT-2: residual projections scaled by 1/sqrt(2L) so the residual stream's variance does not
  // grow with depth.
  vocab_size_ = m.vocab_size;
  const double proj_std = std / std::sqrt(2.0 * m.layers);

  MYRIAD_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size, "tp rank ", tp_rank, " of ",
               tp_size);
  MYRIAD_CHECK(m.heads % tp_size == 0 && Hkv % tp_size == 0 && F % tp_size == 0 && Vp % tp_size == 0, "tp ",
               tp_size, " must divide heads ", m.heads, ", kv heads ", Hkv, ", the MLP's ", F,
               " features and the padded vocabulary ", Vp);
  MYRIAD_CHECK(experts.size >= 1 && experts.rank >= 0 && experts.rank < experts.size && experts.align >= 1 &&
                   (m.experts == 0 || m.experts % experts.size == 0),
               "ep rank ", experts.rank, " of ", experts.size, " (align ", experts.align, ") for ", m.experts, " experts");
  std::vector<ParamSpec> routed;  // the expert region's tensors, placed after the others

  // split: the dimension TP splits, -1 = replicated. matmul: the share of its elements a token
  // multiplies (1 for a dense layer's weights, k / E for the routed experts', 0 for no matmul).
  auto add = [&](std::string name, std::vector<int64_t> global, int split, bool decay,
                 double init_std, double init_value, int64_t layer, double matmul, bool expert = false) {
    // N counts the whole model's matmul weights, whatever part this rank holds.
    if (matmul > 0) {
      int64_t n = 1;
      for (int64_t d : global) n *= d;
      matmul_params_ += static_cast<int64_t>(std::llround(double(n) * matmul));
    }
    const bool held = layer >= 0 ? part->has_layer(layer)
                      : name == "wte"  ? part->embedding || (m.tied_embeddings && part->head)
                      : name == "wpe"  ? part->embedding
                                       : part->head;  // lnf, lm_head
    if (!held) return;
    // A tensor split over `parts` ranks along `split`, rank `at`'s block: tp's, or the experts' ep.
    const int parts = expert ? experts.size : tp_size, at = expert ? experts.rank : tp_rank;
    ParamSpec p{std::move(name), global, total_, 1, decay, init_std, init_value, layer,
                global, std::vector<int64_t>(global.size(), 0), parts > 1 ? split : -1};
    p.expert = expert;
    if (p.split_dim >= 0) {
      const int64_t part = global[p.split_dim] / parts;
      p.shape[p.split_dim] = part;
      p.global_offset[p.split_dim] = part * at;
    }
    for (int64_t d : p.shape) p.numel *= d;
    if (expert) {
      routed.push_back(std::move(p));
      return;
    }
    total_ += p.numel;
    tensors_.push_back(std::move(p));
  };
  auto norm = [&](const std::string& prefix, int64_t layer) {
    add(prefix + ".w", {C}, -1, false, 0, 1.0, layer, 0);
    if (m.bias && !m.rmsnorm()) add(prefix + ".b", {C}, -1, false, 0, 0.0, layer, 0);
  };
  // Column-parallel: output rows split, bias split with them. Row-parallel: input columns
  // split, bias whole (added once, after the reduction).
  auto linear = [&](const std::string& prefix, int64_t out, int64_t in, double init_std,
                    int64_t layer, bool column_parallel) {
    add(prefix + ".w", {out, in}, column_parallel ? 0 : 1, true, init_std, 0, layer, 1);
    if (m.bias) add(prefix + ".b", {out}, column_parallel ? 0 : -1, false, 0, 0.0, layer, 0);
  };

  // The LM head is a matmul whichever tensor it is; the embedding's lookup is not.
  add("wte", {Vp, C}, 0, true, std, 0, -1, m.tied_embeddings ? 1 : 0);
  if (!m.rope()) add("wpe", {P, C}, -1, true, std, 0, -1, 0);
  for (int64_t l = 0; l < m.layers; ++l) {
    std::string h = "h." + std::to_string(l) + ".";
    norm(h + "ln1", l);
    linear(h + "attn.qkv", (H + 2 * Hkv) * D, C, std, l, true);
    if (!m.qk_norm.empty()) {  // RMSNorm weights, 1 at init
      const bool head = m.qk_norm == "head";
      add(h + "attn.q_norm.w", {head ? D : H * D}, -1, false, 0, 1.0, l, 0);
      add(h + "attn.k_norm.w", {head ? D : Hkv * D}, -1, false, 0, 1.0, l, 0);
    }
    linear(h + "attn.proj", C, H * D, proj_std, l, false);
    if (!m.parallel_block) norm(h + "ln2", l);
    if (m.layer_is_moe(l)) {
      // The router, the routed experts stacked (expert e's rows, each a SwiGLU as the dense MLP's,
      // without biases), and the shared experts as one SwiGLU. A token multiplies k of E experts.
      const int64_t E = m.experts, Fe = m.expert_ffn(), Fs = m.shared_ffn();
      add(h + "mlp.router.w", {E, C}, -1, true, std, 0, l, 1);
      if (m.router_bias) {
        add(h + "mlp.router.bias", {E}, -1, false, 0, 0.0, l, 0);
        if (!tensors_.empty() && tensors_.back().name == h + "mlp.router.bias") tensors_.back().trained = false;
      }
      add(h + "mlp.experts.fc.w", {E * 2 * Fe, C}, 0, true, std, 0, l, double(m.experts_per_token) / E, true);
      add(h + "mlp.experts.proj.w", {E * C, Fe}, 0, true, proj_std, 0, l, double(m.experts_per_token) / E, true);
      if (Fs > 0) {
        add(h + "mlp.shared.fc.w", {2 * Fs, C}, 0, true, std, 0, l, 1);
        add(h + "mlp.shared.proj.w", {C, Fs}, 1, true, proj_std, 0, l, 1);
      }
      continue;
    }
    linear(h + "mlp.fc", F * (m.swiglu() ? 2 : 1), C, std, l, true);
    linear(h + "mlp.proj", C, F, proj_std, l, false);
  }
  norm("lnf", -1);
  if (!m.tied_embeddings) add("lm_head", {Vp, C}, 0, true, std, 0, -1, 1);
  // The expert region: from the next multiple of the alignment (no gap without experts).
  dense_total_ = total_;
  if (!routed.empty()) total_ = (total_ + experts.align - 1) / experts.align * experts.align;
  expert_begin_ = total_;
  for (ParamSpec& p : routed) {
    p.offset = total_;
    total_ += p.numel;
    tensors_.push_back(std::move(p));
  }
}

bool ParamLayout::Stored::empty() const {
  for (int64_t d : shape)
    if (d == 0) return true;
  return false;
}

ParamLayout::Stored ParamLayout::stored(const ParamSpec& p) const {
  std::vector<StoredRegion> r = stored_regions(p, 0, p.numel);
  if (!r.empty()) return {r[0].global_shape, r[0].offset, r[0].shape};
  // Nothing stored (a TP shard of wte holding padding rows only): keep the tensor's identity.
  Stored s{p.global_shape, p.global_offset, p.shape};
  if (vocab_rows(p)) s.global_shape[0] = vocab_size_;
  s.offset[0] = 0, s.shape[0] = 0;
  return s;
}

std::vector<ParamLayout::StoredRegion> ParamLayout::stored_regions(const ParamSpec& p, int64_t begin,
                                                                   int64_t end) const {
  MYRIAD_CHECK(0 <= begin && begin <= end && end <= p.numel, p.name, ": range [", begin, ", ", end,
               ") outside its ", p.numel, " elements");
  MYRIAD_CHECK(p.shape.size() <= 2, p.name, ": stored_regions handles vectors and matrices");
  std::vector<StoredRegion> out;
  if (begin == end) return out;
  std::vector<int64_t> gshape = p.global_shape;
  if (vocab_rows(p)) gshape[0] = vocab_size_;
  if (p.shape.size() == 1) {
    out.push_back({gshape, {p.global_offset[0] + begin}, {end - begin}, begin});
    return out;
  }
  const int64_t cols = p.shape[1];
  // Local rows [r, r + rows), columns [c, c + n): clipped to the stored rows (wte's padding).
  auto add = [&](int64_t r, int64_t rows, int64_t c, int64_t n) {
    const int64_t g = p.global_offset[0] + r;
    rows = std::min(rows, gshape[0] - g);
    if (rows <= 0 || n <= 0) return;
    out.push_back({gshape, {g, p.global_offset[1] + c}, {rows, n}, r * cols + c});
  };
  int64_t r0 = begin / cols, c0 = begin % cols;
  const int64_t r1 = end / cols, c1 = end % cols;
  if (r0 == r1) {
    add(r0, 1, c0, c1 - c0);
    return out;
  }
  if (c0 > 0) add(r0++, 1, c0, cols - c0);
  add(r0, r1 - r0, 0, cols);
  add(r1, 1, 0, c1);
  return out;
}

const ParamSpec* ParamLayout::get(const std::string& name) const {
  for (const auto& p : tensors_)
    if (p.name == name) return &p;
  return nullptr;
}

const ParamSpec& ParamLayout::find(const std::string& name) const {
  const ParamSpec* p = get(name);
  MYRIAD_CHECK(p != nullptr, "no parameter named ", name);
  return *p;
}

void init_params(float* params, const ParamLayout& layout, int64_t seed) {
  for (const ParamSpec& p : layout.tensors()) {
    float* w = params + p.offset;
    if (p.init_std <= 0) {
      for (int64_t i = 0; i < p.numel; ++i) w[i] = static_cast<float>(p.init_value);
      continue;
    }
    const uint64_t k = rng::key(static_cast<uint64_t>(seed), rng::hash(p.name));
    // The embedding's padded rows stay zero: they are not part of the vocabulary.
    const int64_t live = vocab_rows(p) ? layout.vocab_size() * p.global_shape[1] : INT64_MAX;
    if (p.replicated()) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < p.numel; ++i)
        w[i] = i < live ? static_cast<float>(p.init_std * rng::normal(k, i)) : 0.0f;
    } else {  // a TP shard: each element drawn at its canonical index
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < p.numel; ++i) {
        const int64_t g = p.global_index(i);
        w[i] = g < live ? static_cast<float>(p.init_std * rng::normal(k, g)) : 0.0f;
      }
    }
  }
}

}  // namespace myriad
