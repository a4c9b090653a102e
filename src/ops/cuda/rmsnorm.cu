// RMSNorm forward (plain and fused with the residual add) and backward, the CUDA side of
// ops/cpu/rmsnorm.cc.
//
// Laid out as layernorm.cu: a row lives in registers (packed bf16) in a row group of 32*W
// threads, each thread owning ITEMS vectors of VW columns (VW = 8: 16-byte accesses; VW = 1: the
// scalar path for C % 8 != 0 or unaligned pointers); R row groups per block. With no mean to
// subtract, the forward needs one row sum (of squares) instead of two, and the backward one
// (of g * xhat) instead of two, and there is no bias gradient.
#include <algorithm>

#include "core/error.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/row_groups.cuh"

namespace myriad::cuda {

using namespace detail;

namespace {


// Sum of v over the row group, the same bits in every thread of it. red: [2][kMaxGroupWarps],
// used alternately (parity) so that consecutive calls need one __syncthreads each, not two.
// W is uniform in the block, so every thread reaches the same syncs.
__device__ __forceinline__ float row_sum(float v, int W, float (*red)[kMaxGroupWarps], int& parity) {
  v = warp_sum(v);
  if (W == 1) return v;
  float* buf = red[parity] + threadIdx.y * W;
  if (threadIdx.x % kWarp == 0) buf[threadIdx.x / kWarp] = v;
  __syncthreads();
  float t = buf[0];
  for (int w = 1; w < W; ++w) t += buf[w];
  parity ^= 1;
  return t;
}

// grid (ceil(N/R)), block (32*W, R). RESID: the row is resid = bf16(a + b), stored, and then
// normalized as stored (the backward reads the stored residual, so its statistics must be the
// ones of those bits).
template <int VW, int ITEMS, bool RESID>
__global__ void __launch_bounds__(256)
    rmsnorm_forward_kernel(bf16* __restrict__ out, float* __restrict__ rstd,
                           bf16* __restrict__ resid, const bf16* __restrict__ a,
                           const bf16* __restrict__ b, const bf16* __restrict__ weight, int N,
                           int C, int W, float eps) {
  __shared__ float red[2][kMaxGroupWarps];
  int parity = 0;
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  const bool live = row < N;  // a dead group still joins row_sum's syncs
  const int nvec = C / VW;
  const int64_t base = static_cast<int64_t>(live ? row : 0) * C;
  BfPack<VW> x[ITEMS];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = threadIdx.x + i * blockDim.x;
    x[i] = zero_pack<VW>();
    if (live && v < nvec) {
      x[i] = load_pack<VW>(a + base + v * VW);
      if constexpr (RESID) {
        const BfPack<VW> y = load_pack<VW>(b + base + v * VW);
#pragma unroll
        for (int e = 0; e < VW; ++e) x[i].h[e] = __float2bfloat16(x[i][e] + y[e]);
        *reinterpret_cast<BfPack<VW>*>(resid + base + v * VW) = x[i];
      }
    }
#pragma unroll
    for (int e = 0; e < VW; ++e) ss += x[i][e] * x[i][e];
  }
  // 1/sqrtf rather than rsqrtf: rsqrtf is up to 2 ulp off, and rstd is an fp32 result compared
  // at 1e-5 with the CPU's.
  const float rs = 1.0f / sqrtf(row_sum(ss, W, red, parity) / C + eps);
  if (!live) return;
  if (threadIdx.x == 0 && rstd) rstd[row] = rs;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = threadIdx.x + i * blockDim.x;
    if (v >= nvec) continue;
    const BfPack<VW> w = load_pack<VW>(weight + v * VW);
    float o[VW];
#pragma unroll
    for (int e = 0; e < VW; ++e) o[e] = x[i][e] * rs * w[e];  // normalize, then scale (HF's order)
    store_bf16<VW>(out + base + v * VW, o);
  }
}

template <int VW, bool RESID>
void launch_forward(bf16* out, float* rstd, bf16* resid, const bf16* a, const bf16* b,
                    const bf16* weight, int N, int C, float eps, cudaStream_t stream) {
  const RowShape s = row_forward_shape(C / VW, "rmsnorm_forward");
  const dim3 grid(ceil_div(N, s.R)), block(kWarp * s.W, s.R);
#define MYRIAD_RMS_FWD(I)                                                                       \
  case I:                                                                                       \
    rmsnorm_forward_kernel<VW, I, RESID>                                                        \
        <<<grid, block, 0, stream>>>(out, rstd, resid, a, b, weight, N, C, s.W, eps);           \
    break;
  switch (s.items) {
    MYRIAD_RMS_FWD(1) MYRIAD_RMS_FWD(2) MYRIAD_RMS_FWD(3) MYRIAD_RMS_FWD(4)
    MYRIAD_RMS_FWD(5) MYRIAD_RMS_FWD(6) MYRIAD_RMS_FWD(7) MYRIAD_RMS_FWD(8)
    default: MYRIAD_CHECK(false, "rmsnorm: items ", s.items);
  }
#undef MYRIAD_RMS_FWD
}

// ---------------------------------------------------------------------------------------------
// Backward. Per row, with xhat = x rstd and g = dout w: dinp += rstd (g - xhat mean(g xhat)).
// dweight = sum over rows of dout xhat: each thread owns the same columns in every row, so its
// share of the sum stays in registers across the rows it visits; then the R groups of the block
// add theirs in group order (shared memory) into scratch[block] (C floats), and
// reduce_partials adds the blocks in block order. Group gi = blockIdx.x * R + y takes rows
// gi, gi + G R, ...: the order of every sum is fixed by (N, C, G), G by the device.
template <int VW, int ITEMS>
__global__ void __launch_bounds__(512, 2)
    rmsnorm_backward_kernel(bf16* __restrict__ dinp, float* __restrict__ partials,
                            const bf16* __restrict__ dout, const bf16* __restrict__ inp,
                            const bf16* __restrict__ weight, const float* __restrict__ rstd,
                            int N, int C, int W) {
  __shared__ float red[2][kMaxGroupWarps];
  extern __shared__ float combine[];  // (C) when R > 1
  int parity = 0;
  const int nvec = C / VW;
  const int groups = gridDim.x * blockDim.y;
  BfPack<VW> w[ITEMS];
  float dw[ITEMS][VW];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = threadIdx.x + i * blockDim.x;
    w[i] = v < nvec ? load_pack<VW>(weight + v * VW) : zero_pack<VW>();
#pragma unroll
    for (int e = 0; e < VW; ++e) dw[i][e] = 0.0f;
  }
  const int iters = ceil_div(N, groups);  // the same in every group: the syncs line up
  for (int it = 0, row = blockIdx.x * blockDim.y + threadIdx.y; it < iters; ++it, row += groups) {
    const bool live = row < N;
    const int64_t base = static_cast<int64_t>(live ? row : 0) * C;
    const float rs = live ? rstd[row] : 0.0f;
    BfPack<VW> d[ITEMS], x[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int v = threadIdx.x + i * blockDim.x;
      const bool in = live && v < nvec;
      d[i] = in ? load_pack<VW>(dout + base + v * VW) : zero_pack<VW>();
      x[i] = in ? load_pack<VW>(inp + base + v * VW) : zero_pack<VW>();
    }
    float sgx = 0.0f;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
#pragma unroll
      for (int e = 0; e < VW; ++e) {
        const float xh = x[i][e] * rs;
        sgx += d[i][e] * w[i][e] * xh;
        dw[i][e] += d[i][e] * xh;
      }
    }
    const float mgx = row_sum(sgx, W, red, parity) / C;
    if (!live) continue;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int v = threadIdx.x + i * blockDim.x;
      if (v >= nvec) continue;
      float o[VW];
      load_bf16<VW>(o, dinp + base + v * VW);
#pragma unroll
      for (int e = 0; e < VW; ++e) o[e] += rs * (d[i][e] * w[i][e] - x[i][e] * rs * mgx);
      store_bf16<VW>(dinp + base + v * VW, o);
    }
  }
  write_block_partial<VW, ITEMS>(partials + static_cast<int64_t>(blockIdx.x) * C, dw, combine, nvec, C);
}

template <int VW, int ITEMS>
void launch_backward_items(bf16* dinp, float* dweight, float* scratch, const bf16* dout,
                           const bf16* inp, const bf16* weight, const float* rstd, int N, int C,
                           RowShape s, cudaStream_t stream) {
  auto kernel = rmsnorm_backward_kernel<VW, ITEMS>;
  const size_t smem = s.R > 1 ? C * sizeof(float) : 0;
  const int threads = kWarp * s.W * s.R;
  const int G = std::min({resident_blocks(reinterpret_cast<const void*>(kernel), threads, smem),
                          ceil_div(N, s.R), kMaxPartialBlocks});
  kernel<<<G, dim3(kWarp * s.W, s.R), smem, stream>>>(dinp, scratch, dout, inp, weight, rstd, N,
                                                      C, s.W);
  check_launch("rmsnorm_backward");
  reduce_partials(dweight, nullptr, C, scratch, G, C, true, stream);
}

template <int VW>
void launch_backward(bf16* dinp, float* dweight, float* scratch, const bf16* dout,
                     const bf16* inp, const bf16* weight, const float* rstd, int N, int C,
                     cudaStream_t stream) {
  const RowShape s = row_backward_shape(C / VW, "rmsnorm_backward");
  switch (s.items) {
    case 1:
      return launch_backward_items<VW, 1>(dinp, dweight, scratch, dout, inp, weight, rstd, N, C,
                                          s, stream);
    case 2:
      return launch_backward_items<VW, 2>(dinp, dweight, scratch, dout, inp, weight, rstd, N, C,
                                          s, stream);
    case 4:
      return launch_backward_items<VW, 4>(dinp, dweight, scratch, dout, inp, weight, rstd, N, C,
                                          s, stream);
    default:
      return launch_backward_items<VW, 8>(dinp, dweight, scratch, dout, inp, weight, rstd, N, C,
                                          s, stream);
  }
}

}  // namespace

void rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, const bf16* weight, int N, int C,
                     double eps, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  const float e = static_cast<float>(eps);  // as the CPU op in float: eps rounded to Real
  if (C % 8 == 0 && all_aligned16(out, inp, weight))
    launch_forward<8, false>(out, rstd, nullptr, inp, nullptr, weight, N, C, e, stream);
  else
    launch_forward<1, false>(out, rstd, nullptr, inp, nullptr, weight, N, C, e, stream);
  check_launch("rmsnorm_forward");
}

void residual_rmsnorm_forward(bf16* resid, bf16* out, float* rstd, const bf16* a, const bf16* b,
                              const bf16* weight, int N, int C, double eps, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  const float e = static_cast<float>(eps);
  if (C % 8 == 0 && all_aligned16(resid, out, a, b, weight))
    launch_forward<8, true>(out, rstd, resid, a, b, weight, N, C, e, stream);
  else
    launch_forward<1, true>(out, rstd, resid, a, b, weight, N, C, e, stream);
  check_launch("residual_rmsnorm_forward");
}

size_t rmsnorm_scratch_floats(int N, int C) {
  return static_cast<size_t>(std::min(std::max(N, 1), kMaxPartialBlocks)) *
         static_cast<size_t>(std::max(C, 0));
}

void rmsnorm_backward(bf16* dinp, float* dweight, float* scratch, const bf16* dout,
                      const bf16* inp, const bf16* weight, const float* rstd, int N, int C,
                      cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  if (C % 8 == 0 && all_aligned16(dinp, dout, inp, weight, scratch))
    launch_backward<8>(dinp, dweight, scratch, dout, inp, weight, rstd, N, C, stream);
  else
    launch_backward<1>(dinp, dweight, scratch, dout, inp, weight, rstd, N, C, stream);
}

}  // namespace myriad::cuda
