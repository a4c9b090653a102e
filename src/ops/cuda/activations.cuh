// The MLP's activations per element, in fp32: one definition for the kernels that write them
// (elementwise.cu's GELU, swiglu.cu's SwiGLU) and for the FP8 cast that recomputes them
// (fp8.cu), so that a recomputed activation has the bits of the one the forward wrote.
#pragma once

#include <cuda_runtime.h>

namespace myriad::cuda::activation {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

// gelu(x) = 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): the sigmoid
// form has no cancellation for negative x (1 + tanh(u) would lose the small values).
__device__ __forceinline__ float gelu(float x) {
  const float z = 2.0f * kSqrt2OverPi * x * (1.0f + kCubic * x * x);
  return __fdividef(x, 1.0f + __expf(-z));  // exp overflow gives x / inf = 0: the right limit
}

// silu(g) = g sigmoid(g). exp(-g) overflows to inf for g < -88: g * rcp(inf) = -0, silu's limit.
// The fast division (2 ulp) is far below the bf16 rounding of the result.
__device__ __forceinline__ float silu(float g) { return __fdividef(g, 1.0f + __expf(-g)); }

}  // namespace myriad::cuda::activation
