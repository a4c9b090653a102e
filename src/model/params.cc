#include <algorithm>
#include "model/params.h"

#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "core/rng.h"

namespace myriad {

int64_t ParamSpec::global_index(int64_t i) const {
  if (split_dim < 0) return i;
  if (split_dim == 0) return global_offset[0] * (numel / shape[0]) + i;
  // Columns of a matrix: local (row, col) -> (row, global_offset[1] + col).
  const int64_t cols = shape[1], gcols = global_shape[1];
  return (i / cols) * gcols + global_offset[1] + i % cols;
}

ParamLayout::ParamLayout(const Config& cfg, int tp_rank, int tp_size)
    : tp_rank_(tp_rank), tp_size_(tp_size) {
  const ModelConfig& m = cfg.model;
  const int64_t C = m.d_model, Vp = cfg.padded_vocab(), P = cfg.positions();
  const double std = m.init_std;
  // GPT-2: residual projections scaled by 1/sqrt(2L) so the residual stream's variance does not
  // grow with depth.
  vocab_size_ = m.vocab_size;
  const double proj_std = std / std::sqrt(2.0 * m.layers);

  MYRIAD_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size, "tp rank ", tp_rank, " of ",
               tp_size);
  MYRIAD_CHECK(m.heads % tp_size == 0 && Vp % tp_size == 0, "tp ", tp_size, " must divide heads ",
               m.heads, " and the padded vocabulary ", Vp);

  // split: the dimension TP splits, -1 = replicated.
  auto add = [&](std::string name, std::vector<int64_t> global, int split, bool decay,
                 double init_std, double init_value, int64_t layer, bool matmul) {
    ParamSpec p{std::move(name), global, total_, 1, decay, init_std, init_value, layer,
                global, std::vector<int64_t>(global.size(), 0), tp_size > 1 ? split : -1};
    if (p.split_dim >= 0) {
      const int64_t part = global[p.split_dim] / tp_size;
      p.shape[p.split_dim] = part;
      p.global_offset[p.split_dim] = part * tp_rank;
    }
    for (int64_t d : p.shape) p.numel *= d;
    total_ += p.numel;
    if (matmul) {
      int64_t n = 1;
      for (int64_t d : global) n *= d;
      matmul_params_ += n;
    }
    tensors_.push_back(std::move(p));
  };
  auto norm = [&](const std::string& prefix, int64_t layer) {
    add(prefix + ".w", {C}, -1, false, 0, 1.0, layer, false);
    if (m.bias) add(prefix + ".b", {C}, -1, false, 0, 0.0, layer, false);
  };
  // Column-parallel: output rows split, bias split with them. Row-parallel: input columns
  // split, bias whole (added once, after the reduction).
  auto linear = [&](const std::string& prefix, int64_t out, int64_t in, double init_std,
                    int64_t layer, bool column_parallel) {
    add(prefix + ".w", {out, in}, column_parallel ? 0 : 1, true, init_std, 0, layer, true);
    if (m.bias) add(prefix + ".b", {out}, column_parallel ? 0 : -1, false, 0, 0.0, layer, false);
  };

  add("wte", {Vp, C}, 0, true, std, 0, -1, true);
  add("wpe", {P, C}, -1, true, std, 0, -1, false);
  for (int64_t l = 0; l < m.layers; ++l) {
    std::string h = "h." + std::to_string(l) + ".";
    norm(h + "ln1", l);
    linear(h + "attn.qkv", 3 * C, C, std, l, true);
    linear(h + "attn.proj", C, C, proj_std, l, false);
    if (!m.parallel_block) norm(h + "ln2", l);
    linear(h + "mlp.fc", 4 * C, C, std, l, true);
    linear(h + "mlp.proj", C, 4 * C, proj_std, l, false);
  }
  norm("lnf", -1);
}

bool ParamLayout::Stored::empty() const {
  for (int64_t d : shape)
    if (d == 0) return true;
  return false;
}

ParamLayout::Stored ParamLayout::stored(const ParamSpec& p) const {
  Stored s{p.global_shape, p.global_offset, p.shape};
  if (p.name == "wte") {
    s.global_shape[0] = vocab_size_;
    s.shape[0] = std::max<int64_t>(0, std::min(p.global_offset[0] + p.shape[0], vocab_size_) - p.global_offset[0]);
    if (s.shape[0] == 0) s.offset[0] = 0;
  }
  return s;
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
    const int64_t live =
        p.name == "wte" ? layout.vocab_size() * p.global_shape[1] : INT64_MAX;
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
