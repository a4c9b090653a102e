// Device helpers shared by the memory-bound kernels (private to src/ops/cuda): 16-byte vector
// loads and stores of bf16 and fp32, fixed-order warp reductions, and the choice between the
// vector and the scalar path.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/ops.cuh"

namespace myriad::cuda::detail {

constexpr int kWarp = 32;

// True when every pointer is 16-byte aligned, so that 8 bf16 (or 4 floats) move in one access.
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
template <class... P>
inline bool all_aligned16(const P*... p) {
  return (aligned16(p) && ...);
}

__host__ __device__ inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// VW consecutive bf16 as floats: VW = 8 is one 16-byte access, else scalar accesses.
template <int VW>
__device__ __forceinline__ void load_bf16(float (&f)[VW], const bf16* p) {
  if constexpr (VW == 8) {
    const int4 raw = *reinterpret_cast<const int4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 t = __bfloat1622float2(h[i]);
      f[2 * i] = t.x;
      f[2 * i + 1] = t.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < VW; ++i) f[i] = __bfloat162float(p[i]);
  }
}

// VW = 8: one 16-byte store; VW = 4: one 8-byte store; else scalar stores.
template <int VW>
__device__ __forceinline__ void store_bf16(bf16* p, const float (&f)[VW]) {
  if constexpr (VW == 8) {
    int4 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    *reinterpret_cast<int4*>(p) = raw;
  } else if constexpr (VW == 4) {
    uint2 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
    h[0] = __floats2bfloat162_rn(f[0], f[1]);
    h[1] = __floats2bfloat162_rn(f[2], f[3]);
    *reinterpret_cast<uint2*>(p) = raw;
  } else {
#pragma unroll
    for (int i = 0; i < VW; ++i) p[i] = __float2bfloat16(f[i]);
  }
}

// VW bf16 kept packed in registers (half the registers of floats), moved in one access.
template <int VW>
struct alignas(2 * VW) BfPack {
  bf16 h[VW];
  __device__ __forceinline__ float operator[](int e) const { return __bfloat162float(h[e]); }
};
template <int VW>
__device__ __forceinline__ BfPack<VW> load_pack(const bf16* p) {
  return *reinterpret_cast<const BfPack<VW>*>(p);
}
template <int VW>
__device__ __forceinline__ BfPack<VW> zero_pack() {
  BfPack<VW> z;
#pragma unroll
  for (int e = 0; e < VW; ++e) z.h[e] = __float2bfloat16(0.0f);
  return z;
}

// VW consecutive floats; VW = 8 is two 16-byte accesses.
template <int VW>
__device__ __forceinline__ void load_f32(float (&f)[VW], const float* p) {
  if constexpr (VW % 4 == 0) {
#pragma unroll
    for (int i = 0; i < VW; i += 4) {
      const float4 t = *reinterpret_cast<const float4*>(p + i);
      f[i] = t.x, f[i + 1] = t.y, f[i + 2] = t.z, f[i + 3] = t.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < VW; ++i) f[i] = p[i];
  }
}

template <int VW>
__device__ __forceinline__ void store_f32(float* p, const float (&f)[VW]) {
  if constexpr (VW % 4 == 0) {
#pragma unroll
    for (int i = 0; i < VW; i += 4)
      *reinterpret_cast<float4*>(p + i) = make_float4(f[i], f[i + 1], f[i + 2], f[i + 3]);
  } else {
#pragma unroll
    for (int i = 0; i < VW; ++i) p[i] = f[i];
  }
}

// Butterfly sum over the warp: every lane gets the same bits (the order is fixed).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Reduces `partials` (R, M) over R into out0[0..split) and out1[0..M-split) (+= or =), summing
// the rows of each column in a fixed order: warp w takes rows w, w+W, ... in turn, then the
// warps' sums are added in warp order. out1 may be null when split == M.
void reduce_partials(float* out0, float* out1, int split, const float* partials, int R, int M,
                     bool accumulate, cudaStream_t stream);

// Number of SMs of the current device (cached per device).
int sm_count();

// Blocks of `kernel` (threads, dynamic smem) the current device holds at once: a grid of this
// size is one full wave (cached per device and configuration).
int resident_blocks(const void* kernel, int threads, size_t smem);

// The amax a kernel measures of the bf16 it writes (FP8's current scaling: the cast then needs no
// pass of its own). A thread folds each value in as written before its rounding; rounding to bf16
// is monotonic and symmetric, so the largest rounded magnitude is the largest one rounded, once.
// A NaN makes the amax infinite, as cuda::amax does.
__device__ __forceinline__ float amax_fold(float m, float x) { return fmaxf(m, fabsf(x)) + (x != x ? INFINITY : 0.0f); }
// Every thread of the block calls it (a warp shuffle): the warp's largest, then one atomicMax on
// the float's bits (non-negative floats order as their bits; order-independent, so exact).
__device__ __forceinline__ void amax_publish(unsigned* out, float m) {
  m = __bfloat162float(__float2bfloat16(m));
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & (kWarp - 1)) == 0) atomicMax(out, __float_as_uint(m));
}

}  // namespace myriad::cuda::detail
