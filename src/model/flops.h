// Model FLOPs per trained token: the one count behind every MFU (the trainer's and `myriad
// bench`'s through GptModel::flops_per_token, the planner's), header-only so that plan/ reads it
// without linking the model, as it reads the memory plan.
//
//   6 N + 12 L d T_att
//
// N: the weights of every matmul once (each layer's QKV, projection and MLP: 12 d^2 for GPT-2's
// block, less with fewer key/value heads, 3 d F for SwiGLU's; a mixture of experts' layer its
// active ones; and the LM head, tied or not, vocab_rows x d); 6 for their forward and backward
// GEMMs. 12 L d
// T_att: attention's score and value products, T_att the keys a query sees (seq_len, or the
// window when it is shorter). Megatron-LM's count, with the window.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/config.h"

namespace myriad::model {

// The matmul weights of a GPT of `m` whose LM head has `vocab_rows` rows (the padded vocabulary
// the engine computes; GptModel checks this against its own layout).
// A mixture of experts' layer counts what one token multiplies: its router (E x d), its k
// routed experts (3 d Fe each) and the shared experts (3 d Fs): the active weights.
inline double matmul_params(const ModelConfig& m, int64_t vocab_rows) {
  const double L = double(m.layers), d = double(m.d_model), D = double(m.head_dim());
  const double qkv = d * (double(m.heads) + 2 * double(m.kv())) * D, proj = double(m.heads) * D * d;
  const double mlp = d * double(m.ffn()) * (m.swiglu() ? 3 : 2);
  const double moe = double(m.experts) * d + double(m.experts_per_token) * 3 * d * double(m.expert_ffn()) +
                     3 * d * double(m.shared_ffn());
  const double moe_layers = double(m.moe_layers());
  return L * (qkv + proj) + (L - moe_layers) * mlp + moe_layers * moe + double(vocab_rows) * d;
}

// Every parameter of the model, as transformers counts them (the vocabulary unpadded; the
// position table, norms and biases in): `total`; and those one token uses, with only k of each
// MoE layer's E routed experts: `active` (the two are equal for a dense model).
struct ParamCounts {
  double total = 0, active = 0;
};
inline ParamCounts param_counts(const ModelConfig& m) {
  const double d = double(m.d_model), D = double(m.head_dim()), V = double(m.vocab_size);
  const double norm = m.bias && !m.rmsnorm() ? 2 * d : d;  // LayerNorm's bias too
  const double qkv = d * (double(m.heads) + 2 * double(m.kv())) * D, attn_out = double(m.heads) * D * d;
  const double qk_norm = m.qk_norm == "head" ? 2 * D : m.qk_norm == "all" ? (double(m.heads) + double(m.kv())) * D : 0;
  const double attn = qkv + attn_out + qk_norm + (m.bias ? (double(m.heads) + 2 * double(m.kv())) * D + d : 0);
  const double norms = norm * (m.parallel_block ? 1 : 2);
  const double F = double(m.ffn());
  const double dense_mlp = d * F * (m.swiglu() ? 3 : 2) + (m.bias ? F * (m.swiglu() ? 2 : 1) + d : 0);
  const double Fe = double(m.expert_ffn()), Fs = double(m.shared_ffn()), E = double(m.experts);
  const double expert = 3 * d * Fe, shared = 3 * d * Fs, router = E * d;
  ParamCounts c;
  for (int64_t l = 0; l < m.layers; ++l) {
    const double base = attn + norms;
    if (m.layer_is_moe(l)) {
      c.total += base + router + E * expert + shared;
      c.active += base + router + double(m.experts_per_token) * expert + shared;
    } else {
      c.total += base + dense_mlp;
      c.active += base + dense_mlp;
    }
  }
  const double outer = V * d * (m.tied_embeddings ? 1 : 2) + norm + (m.rope() ? 0 : double(m.positions > 0 ? m.positions : m.seq_len) * d);
  c.total += outer, c.active += outer;
  return c;
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
