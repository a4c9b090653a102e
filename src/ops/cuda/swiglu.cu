// SwiGLU, out = silu(gate) * up, on the interleaved (F,2) output of the fused gate/up GEMM: the
// CUDA side of ops/cpu/swiglu.cc. Elementwise over the N*F features, so (N,F) is one flat run.
// When the pointers allow, a forward thread takes 8 features at a time (16 bf16 of gu in two
// 16-byte loads, 8 of out in one store), a backward thread 4 (8 of gu and of dgu in one 16-byte
// access each, 4 of dout in 8 bytes); the remaining features take the scalar tail.
//
// silu and its derivative in fp32. The backward needs sigmoid(g) and 1 - sigmoid(g) both to full
// relative precision (1 - sigmoid is tiny for large g and is what d silu / dg hinges on there):
// from t = exp(-|g|), which cannot overflow, and r = 1 / (1 + t), they are r and t r, in one
// order or the other by the sign of g. The forward's division is the fast one: with IEEE
// division it was compute-bound on an H200 (2.7 TB/s against 4.1 with __fdividef).
#include <algorithm>

#include "core/error.h"
#include "ops/cuda/activations.cuh"
#include "ops/cuda/kernel_util.cuh"

namespace myriad::cuda {

using namespace detail;

namespace {

constexpr int kThreads = 256;
constexpr int kFeat = 4;  // features per vector of the backward (twice that in the forward)

using activation::silu;

// d out / d gate and d out / d up, times dout.
__device__ __forceinline__ float2 silu_grads(float g, float u, float d) {
  const float t = __expf(-fabsf(g));
  const float r = 1.0f / (1.0f + t);
  const float tr = t * r;
  const bool neg = g < 0.0f;
  const float sig = neg ? tr : r, one_minus_sig = neg ? r : tr;
  return make_float2(d * u * (sig * (1.0f + g * one_minus_sig)), d * (g * sig));
}

// amax: where out's amax goes, or null.
template <bool VEC>
__global__ void swiglu_forward_kernel(bf16* __restrict__ out, const bf16* __restrict__ gu,
                                      int64_t n, unsigned* amax) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  int64_t done = 0;
  float m = 0.0f;
  if constexpr (VEC) {
    // 8 features: two 16-byte loads in flight and one 16-byte store of out.
    constexpr int kF = 2 * kFeat;
    const int64_t nv = n / kF;
    for (int64_t i = tid; i < nv; i += stride) {
      const BfPack<8> x0 = load_pack<8>(gu + 2 * kF * i);
      const BfPack<8> x1 = load_pack<8>(gu + 2 * kF * i + 8);
      float o[kF];
#pragma unroll
      for (int e = 0; e < kFeat; ++e) {
        o[e] = silu(x0[2 * e]) * x0[2 * e + 1];
        o[kFeat + e] = silu(x1[2 * e]) * x1[2 * e + 1];
        m = amax_fold(amax_fold(m, o[e]), o[kFeat + e]);
      }
      store_bf16<kF>(out + kF * i, o);
    }
    done = nv * kF;
  }
  for (int64_t j = done + tid; j < n; j += stride) {
    const float o = silu(__bfloat162float(gu[2 * j])) * __bfloat162float(gu[2 * j + 1]);
    out[j] = __float2bfloat16(o);
    m = amax_fold(m, o);
  }
  if (amax) amax_publish(amax, m);
}

// dgu may alias gu: each element is read before it is written, by the same thread.
// amax: where dgu's amax goes, or null.
template <bool VEC>
__global__ void swiglu_backward_kernel(bf16* dgu, const bf16* gu, const bf16* __restrict__ dout,
                                       int64_t n, unsigned* amax) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  int64_t done = 0;
  float m = 0.0f;
  if constexpr (VEC) {
    const int64_t nv = n / kFeat;
    for (int64_t i = tid; i < nv; i += stride) {
      const BfPack<2 * kFeat> x = load_pack<2 * kFeat>(gu + 2 * kFeat * i);
      const BfPack<kFeat> d = load_pack<kFeat>(dout + kFeat * i);
      float o[2 * kFeat];
#pragma unroll
      for (int e = 0; e < kFeat; ++e) {
        const float2 r = silu_grads(x[2 * e], x[2 * e + 1], d[e]);
        o[2 * e] = r.x;
        o[2 * e + 1] = r.y;
        m = amax_fold(amax_fold(m, r.x), r.y);
      }
      store_bf16<2 * kFeat>(dgu + 2 * kFeat * i, o);
    }
    done = nv * kFeat;
  }
  for (int64_t j = done + tid; j < n; j += stride) {
    const float2 r = silu_grads(__bfloat162float(gu[2 * j]), __bfloat162float(gu[2 * j + 1]),
                                __bfloat162float(dout[j]));
    dgu[2 * j] = __float2bfloat16(r.x);
    dgu[2 * j + 1] = __float2bfloat16(r.y);
    m = amax_fold(amax_fold(m, r.x), r.y);
  }
  if (amax) amax_publish(amax, m);
}

// One full wave of blocks at most (grid-stride loops), fewer when there is little work.
template <class K>
int grid_for(K kernel, int64_t items) {
  const int wave = resident_blocks(reinterpret_cast<const void*>(kernel), kThreads, 0);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(ceil_div(items, kThreads), wave)));
}

inline bool aligned8(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 7u) == 0; }

}  // namespace

void swiglu_forward(bf16* out, const bf16* gu, int64_t N, int64_t F, cudaStream_t stream, float* amax) {
  const int64_t n = N * F;
  unsigned* const a = reinterpret_cast<unsigned*>(amax);
  MYRIAD_CHECK(!a || cudaMemsetAsync(a, 0, sizeof(float), stream) == cudaSuccess, "swiglu_forward: cannot clear its amax");
  if (n <= 0) return;
  if (all_aligned16(gu, out)) {
    auto k = swiglu_forward_kernel<true>;
    k<<<grid_for(k, std::max<int64_t>(1, n / (2 * kFeat))), kThreads, 0, stream>>>(out, gu, n, a);
  } else {
    auto k = swiglu_forward_kernel<false>;
    k<<<grid_for(k, n), kThreads, 0, stream>>>(out, gu, n, a);
  }
  check_launch("swiglu_forward");
}

void swiglu_backward(bf16* dgu, const bf16* gu, const bf16* dout, int64_t N, int64_t F,
                     cudaStream_t stream, float* amax) {
  const int64_t n = N * F;
  unsigned* const a = reinterpret_cast<unsigned*>(amax);
  MYRIAD_CHECK(!a || cudaMemsetAsync(a, 0, sizeof(float), stream) == cudaSuccess, "swiglu_backward: cannot clear its amax");
  if (n <= 0) return;
  if (all_aligned16(dgu, gu) && aligned8(dout)) {
    auto k = swiglu_backward_kernel<true>;
    k<<<grid_for(k, std::max<int64_t>(1, n / kFeat)), kThreads, 0, stream>>>(dgu, gu, dout, n, a);
  } else {
    auto k = swiglu_backward_kernel<false>;
    k<<<grid_for(k, n), kThreads, 0, stream>>>(dgu, gu, dout, n, a);
  }
  check_launch("swiglu_backward");
}

}  // namespace myriad::cuda
