// Model FLOPs per trained token: the one count behind every MFU (the trainer's and `myriad
// bench`'s through GptModel::flops_per_token, the planner's), header-only so that plan/ reads it
// without linking the model, as it reads the memory plan.
//
//   6 N + 12 L d T_att
//
// N: the weights of every matmul once (each layer's QKV, projection and MLP: 12 d^2 for GPT-2's
// block, less with fewer key/value heads, 3 d F for SwiGLU's; and the LM head, tied or not,
// vocab_rows x d); 6 for their forward and backward GEMMs. 12 L d
// T_att: attention's score and value products, T_att the keys a query sees (seq_len, or the
// window when it is shorter). Megatron-LM's count, with the window.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/config.h"

namespace myriad::model {

// The matmul weights of a GPT of `m` whose LM head has `vocab_rows` rows (the padded vocabulary
// the engine computes; GptModel checks this against its own layout).
inline double matmul_params(const ModelConfig& m, int64_t vocab_rows) {
  const double L = double(m.layers), d = double(m.d_model), D = double(m.head_dim());
  const double qkv = d * (double(m.heads) + 2 * double(m.kv())) * D, proj = double(m.heads) * D * d;
  const double mlp = d * double(m.ffn()) * (m.swiglu() ? 3 : 2);
  return L * (qkv + proj + mlp) + double(vocab_rows) * d;
}

// T_att: the keys a query sees.
inline double attended_keys(const ModelConfig& m) {
  return double(m.window > 0 ? std::min(m.window, m.seq_len) : m.seq_len);
}

inline double flops_per_token(const ModelConfig& m, int64_t vocab_rows) {
  return 6 * matmul_params(m, vocab_rows) + 12 * double(m.layers) * double(m.d_model) * attended_keys(m);
}

// Forward FLOPs per token of one layer (its GEMMs and attention's two products) and of the LM
// head: the terms of flops_per_token, forward only, which the pipeline's stages balance.
inline double layer_forward_flops(const ModelConfig& m) {
  return 2 * matmul_params(m, 0) / double(m.layers) + 4 * double(m.d_model) * attended_keys(m);
}
inline double head_forward_flops(const ModelConfig& m, int64_t vocab_rows) { return 2 * double(vocab_rows) * double(m.d_model); }

}  // namespace myriad::model
