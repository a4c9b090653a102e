// The row shapes of the norms (norm.cu): a row lives in registers in a
// row group of 32*W threads (W warps), each thread owning `items` vectors of VW columns, R row
// groups per block; the backward keeps each thread's share of the weight gradients in registers
// and writes one partial per block, which reduce_partials adds in block order.
#pragma once

#include <algorithm>

#include "core/error.h"
#include "ops/cuda/kernel_util.cuh"

namespace myriad::cuda::detail {

constexpr int kMaxGroupWarps = 16;      // warps per block at most (512 threads)
constexpr int kMaxPartialBlocks = 1024;  // bound on a backward's blocks (its scratch rows)

struct RowShape {
  int W, R, items;
};

// Forward: one warp per row while a lane's share is at most 8 vectors, else up to 8 warps
// (C <= 16384, or 2048 on the scalar path); blocks of at most 256 threads. `op` names the kernel
// in the error.
inline RowShape row_forward_shape(int nvec, const char* op) {
  if (nvec <= kWarp * 8) return {1, 4, std::max(1, ceil_div(nvec, kWarp))};
  const int W = ceil_div(nvec, kWarp * 8);
  MYRIAD_CHECK(W <= 8, op, ": C too large (or not a multiple of 8): ", nvec, " vectors");
  return {W, std::max(1, 8 / W), ceil_div(nvec, kWarp * W)};
}

// Backward: few columns per thread keep the weight-gradient sums in registers; at most 16 warps
// per row and 512 threads per block (64 registers, 2 blocks per SM).
inline RowShape row_backward_shape(int nvec, const char* op) {
  int items = 1;
  while (items < 8 && ceil_div(nvec, kWarp * items) > 16) items *= 2;
  const int W = ceil_div(nvec, kWarp * items);
  MYRIAD_CHECK(W <= 16, op, ": C too large (or not a multiple of 8): ", nvec, " vectors");
  return {W, std::max(1, 16 / W), items};
}

// Writes the block's sum of acc (the R groups added in group order) to out[0..C).
template <int VW, int ITEMS>
__device__ __forceinline__ void write_block_partial(float* out, const float (&acc)[ITEMS][VW],
                                                    float* combine, int nvec, int C) {
  if (blockDim.y == 1) {
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int v = threadIdx.x + i * blockDim.x;
      if (v < nvec) store_f32<VW>(out + v * VW, acc[i]);
    }
    return;
  }
  for (int y = 0; y < static_cast<int>(blockDim.y); ++y) {
    if (threadIdx.y == y) {
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
        const int v = threadIdx.x + i * blockDim.x;
        if (v >= nvec) continue;
#pragma unroll
        for (int e = 0; e < VW; ++e)
          combine[v * VW + e] = y == 0 ? acc[i][e] : combine[v * VW + e] + acc[i][e];
      }
    }
    __syncthreads();
  }
  for (int j = threadIdx.y * blockDim.x + threadIdx.x; j < C; j += blockDim.x * blockDim.y)
    out[j] = combine[j];
  __syncthreads();  // before a second call overwrites `combine`
}

}  // namespace myriad::cuda::detail
