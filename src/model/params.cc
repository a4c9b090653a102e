#include "model/params.h"

#include <cmath>

#include "core/error.h"
#include "core/rng.h"

namespace myriad {

ParamLayout::ParamLayout(const Config& cfg) {
  const ModelConfig& m = cfg.model;
  const int64_t C = m.d_model, Vp = cfg.padded_vocab(), P = cfg.positions();
  const double std = m.init_std;
  // GPT-2: residual projections scaled by 1/sqrt(2L) so the residual stream's variance does not
  // grow with depth.
  vocab_size_ = m.vocab_size;
  const double proj_std = std / std::sqrt(2.0 * m.layers);

  auto add = [&](std::string name, std::vector<int64_t> shape, bool decay, double init_std,
                 double init_value, int64_t layer, bool matmul) {
    ParamSpec p{std::move(name), std::move(shape), total_, 1, decay, init_std, init_value, layer};
    for (int64_t d : p.shape) p.numel *= d;
    total_ += p.numel;
    if (matmul) matmul_params_ += p.numel;
    tensors_.push_back(std::move(p));
  };
  auto norm = [&](const std::string& prefix, int64_t layer) {
    add(prefix + ".w", {C}, false, 0, 1.0, layer, false);
    if (m.bias) add(prefix + ".b", {C}, false, 0, 0.0, layer, false);
  };
  auto linear = [&](const std::string& prefix, int64_t out, int64_t in, double init_std,
                    int64_t layer) {
    add(prefix + ".w", {out, in}, true, init_std, 0, layer, true);
    if (m.bias) add(prefix + ".b", {out}, false, 0, 0.0, layer, false);
  };

  add("wte", {Vp, C}, true, std, 0, -1, true);
  add("wpe", {P, C}, true, std, 0, -1, false);
  for (int64_t l = 0; l < m.layers; ++l) {
    std::string h = "h." + std::to_string(l) + ".";
    norm(h + "ln1", l);
    linear(h + "attn.qkv", 3 * C, C, std, l);
    linear(h + "attn.proj", C, C, proj_std, l);
    if (!m.parallel_block) norm(h + "ln2", l);
    linear(h + "mlp.fc", 4 * C, C, std, l);
    linear(h + "mlp.proj", C, 4 * C, proj_std, l);
  }
  norm("lnf", -1);
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
    const int64_t live = p.name == "wte" ? layout.vocab_size() * p.shape[1] : p.numel;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < p.numel; ++i)
      w[i] = i < live ? static_cast<float>(p.init_std * rng::normal(k, i)) : 0.0f;
  }
}

}  // namespace myriad
