// The block's variants that an op set computes: which norm and which MLP activation, chosen by
// the model's config (model.norm, model.mlp), and the arithmetic of a linear layer's GEMMs
// (train.precision). Also compiled as CUDA C++17.
#pragma once

namespace myriad {

enum class NormKind { kLayerNorm, kRMSNorm };
struct Norm {
  NormKind kind = NormKind::kLayerNorm;
  float eps = 1e-5f;  // RMSNorm's (LayerNorm's is fixed at 1e-5)
};

// The MLP's activation over the first GEMM's output `pre`: GELU of F features, or SwiGLU of F
// (gate, up) pairs laid out (F, 2), silu(gate) x up.
enum class Mlp { kGelu, kSwiGlu };
inline int pre_width(Mlp m) { return m == Mlp::kSwiGlu ? 2 : 1; }  // elements of pre per feature

// A linear layer's GEMMs: bf16 operands, or FP8 (e4m3 activations and weights, e5m2 gradients,
// per-tensor power-of-two scales: ops/fp8.h). The CPU op set computes every linear in fp32 and
// takes kBf16 only.
enum class Gemm { kBf16, kFp8 };

}  // namespace myriad
