// The block's variants that an op set computes: which norm and which MLP activation, chosen by
// the model's config (model.norm, model.mlp), and the arithmetic of a linear layer's GEMMs
// (train.precision). Also compiled as CUDA C++17.
#pragma once

#include <cstdint>
#include <vector>

namespace myriad {

enum class NormKind { kLayerNorm, kRMSNorm };
struct Norm {
  NormKind kind = NormKind::kLayerNorm;
  float eps = 1e-5f;  // RMSNorm's (LayerNorm's is fixed at 1e-5)
};

// RMSNorm of the queries and keys after the QKV GEMM (model.qk_norm): over each head's D
// features, one weight (D) for the queries and one for the keys (Qwen3's), or over a token's
// H D query and Hkv D key features with weights of those sizes (OLMoE's).
enum class QkNormKind { kNone, kHead, kAll };
struct QkNorm {
  QkNormKind kind = QkNormKind::kNone;
  float eps = 1e-6f;
};

// The MLP's activation over the first GEMM's output `pre`: GELU of F features, or SwiGLU of F
// (gate, up) pairs laid out (F, 2), silu(gate) x up.
enum class Mlp { kGelu, kSwiGlu };
inline int pre_width(Mlp m) { return m == Mlp::kSwiGlu ? 2 : 1; }  // elements of pre per feature

// A linear layer's GEMMs: bf16 operands, or FP8 (e4m3 activations and weights, e5m2 gradients,
// per-tensor power-of-two scales: ops/fp8.h). The CPU op set computes every linear in fp32 and
// takes kBf16 only.
enum class Gemm { kBf16, kFp8 };

// A mixture of experts' router (docs/notes/moe.md, "Routing, exactly"): each of N tokens' logits
// over E experts become scores (softmax or sigmoid); the k largest of score + bias (the bias only
// for the choice; ties to the lower expert) are the token's experts, their scores its weights,
// renormalized to sum 1 when norm_topk, times scale. With groups > 1 the choice is limited to
// the top_groups groups of E / groups consecutive experts whose two best keys sum highest (ties
// to the lower group: DeepSeek-V3's node-limited routing). With capacity_factor > 0 an expert
// takes at most ceil(capacity_factor N k / E) rows, those of the highest weights (ties to the
// lower slot); the others are dropped: they add nothing to their token's output.
enum class RouterScore { kSoftmax, kSigmoid };
struct Router {
  RouterScore score = RouterScore::kSoftmax;
  int experts = 0, top_k = 0;
  bool norm_topk = true;
  float scale = 1;
  int groups = 1, top_groups = 1;
  float capacity_factor = 0;  // 0: dropless
  float aux_loss = 0;  // the load-balancing loss's coefficient (moe.aux_loss)
  float z_loss = 0;    // the router z-loss's (moe.z_loss)
};
// What a route leaves on the host: the rows each expert got (E; after any drop), the rows
// dropped, and the layer's load-balancing and z losses (before their coefficients).
struct Routing {
  std::vector<int64_t> counts;
  int64_t dropped = 0;
  double aux = 0, z = 0;
  std::vector<double> score_sums;  // (E) each expert's scores summed over the tokens: P_e = this / N
};
// A micro-batch routed in parts (each tensor-parallel rank routes its share of the tokens): the
// balance loss's statistics over every part, the choice's rows per expert (E) and the tokens,
// so that each part's gradient is the whole micro-batch's. Null counts: the part is the whole.
struct RouteTotals {
  const int64_t* chosen = nullptr;
  int64_t tokens = 0;
};

}  // namespace myriad
