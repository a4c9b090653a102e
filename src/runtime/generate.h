// Inference from a checkpoint: load the model, then sample tokens one at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "model/engine.h"

namespace myriad {

struct LoadedModel {
  Config cfg;
  std::unique_ptr<Engine> engine;
  std::string dir;  // the checkpoint directory actually loaded
};

// `path` is a checkpoint directory, or a directory holding checkpoints (a run's checkpoints/
// or the run directory itself), in which case the latest committed one is used.
LoadedModel load_for_inference(const std::string& path);

struct SampleOptions {
  int64_t tokens = 200;
  double temperature = 0.8;  // 0 = greedy
  int64_t top_k = 40;        // 0 = the whole vocabulary
  int64_t seed = 0;
  int32_t stop = -1;         // token that ends the sample (the tokenizer's end-of-text), -1 none
  std::function<void(int32_t)> on_token;  // called with each new token as it is drawn
};

// The most tokens one sample may ask for: a bound on the time a typo can cost.
inline constexpr int64_t kMaxSampleTokens = 1 << 20;

// A prompt the model can read: at least one token, every id in [0, model.vocab_size) (a
// tokenizer larger than the model's table would read past it). An input error naming the first
// id outside, with its position, otherwise.
void check_prompt(const std::vector<int32_t>& prompt, const Config& cfg);

// Continues `prompt` (at least one token) and returns the new tokens only. The context is the
// last seq_len tokens. Deterministic for a given seed.
std::vector<int32_t> generate(Engine& engine, const Config& cfg, std::vector<int32_t> prompt,
                              const SampleOptions& opt);

}  // namespace myriad
