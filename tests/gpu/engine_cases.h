// What the engine tests share: the small model they train (with per-case --set overrides), its
// random batches, and the relative error ||a - b|| / ||b|| against the oracle.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"

namespace engine_cases {

struct Case {
  const char* name;
  std::vector<std::string> sets;
  // How far bf16 carries this model from the CPU's fp32 in six steps, as a multiple of GPT-2's
  // block's bounds (engine_test.cc).
  double drift = 1.0;
};

// The Llama block on the test model (d 256, 4 heads of 64): RMSNorm, RoPE, SwiGLU, 2 key/value
// heads, an untied LM head.
inline const std::vector<std::string> kLlama = {
    "model.norm=rmsnorm", "model.position_encoding=rope", "model.rope_theta=10000", "model.mlp=swiglu",
    "model.mlp_hidden=688", "model.kv_heads=2", "model.tied_embeddings=false", "model.bias=false"};
inline std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

inline myriad::Config config(const Case& c, const char* device) {
  std::vector<std::string> sets = {"model.layers=2", "model.d_model=256", "model.heads=4",
                                   "model.seq_len=96", "model.vocab_size=300", "train.micro_batch=2",
                                   "train.global_batch=4", "optim.lr=3e-3", "optim.warmup_steps=0",
                                   "train.steps=6", myriad::cat("train.device=", device)};
  sets.insert(sets.end(), c.sets.begin(), c.sets.end());
  return myriad::parse_config("", "gpu test", sets);
}

// (global_batch, seq_len + 1) token ids, fresh for each seed.
inline std::vector<int32_t> batch(const myriad::Config& cfg, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<int32_t> t(cfg.train.global_batch * (cfg.model.seq_len + 1));
  for (auto& x : t) x = static_cast<int32_t>(gen() % cfg.model.vocab_size);
  return t;
}

inline double rel(const float* a, const float* b, int64_t n) {
  double d = 0, r = 0;
  for (int64_t i = 0; i < n; ++i) d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), r += double(b[i]) * b[i];
  return std::sqrt(d / std::max(r, 1e-30));
}

}  // namespace engine_cases
