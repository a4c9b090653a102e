// LayerNorm forward (plain and fused with the residual add) and backward.
//
// A row is held in registers by a row group of 32*W threads (W warps), each thread owning ITEMS
// vectors of VW columns (VW = 8: one 16-byte access; VW = 1: the scalar path for C % 8 != 0 or
// unaligned pointers). A block holds R row groups (blockDim = (32*W, R)). Row sums use warp
// shuffles, plus shared memory across the W warps when W > 1; every sum runs in a fixed order.
#include <algorithm>

#include "core/error.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/row_groups.cuh"

namespace myriad::cuda {

using namespace detail;

namespace {

constexpr float kEps = 1e-5f;

// Sum of v over the row group (all its threads get the same bits). red: [2][kMaxGroupWarps]
// float2, alternated by `parity` so that one sync per call suffices; W is uniform in the block.
__device__ __forceinline__ float2 group_sum(float2 v, int W, float2 (*red)[kMaxGroupWarps],
                                            int& parity) {
  v.x = warp_sum(v.x);
  v.y = warp_sum(v.y);
  if (W == 1) return v;
  const int warp = threadIdx.x / kWarp;
  float2* buf = red[parity] + threadIdx.y * W;
  if (threadIdx.x % kWarp == 0) buf[warp] = v;
  __syncthreads();
  float2 t = buf[0];
  for (int w = 1; w < W; ++w) t.x += buf[w].x, t.y += buf[w].y;
  parity ^= 1;
  return t;
}

// grid (ceil(N/R)), block (32*W, R). RESID: inp = resid = a + b (rounded to bf16 first, so the
// statistics are those of the stored residual, which the backward reads). The row stays packed
// in registers (bf16) across the three passes.
template <int VW, int ITEMS, bool RESID>
__global__ void __launch_bounds__(256)
    layernorm_forward_kernel(bf16* __restrict__ out, float* __restrict__ mean,
                             float* __restrict__ rstd, bf16* __restrict__ resid,
                             const bf16* __restrict__ a, const bf16* __restrict__ b,
                             const bf16* __restrict__ weight, const bf16* __restrict__ bias,
                             int N, int C, int W) {
  __shared__ float2 red[2][kMaxGroupWarps];
  int parity = 0;
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  const bool live = row < N;  // dead groups still take part in the syncs
  const int nvec = C / VW;
  const int64_t base = static_cast<int64_t>(live ? row : 0) * C;
  BfPack<VW> x[ITEMS];
  float s = 0.0f;
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
    for (int e = 0; e < VW; ++e) s += x[i][e];
  }
  const float m = group_sum(make_float2(s, 0.0f), W, red, parity).x / C;
  // Two-pass variance from the registers: no cancellation when |mean| >> std.
  float q = 0.0f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = threadIdx.x + i * blockDim.x;
    if (live && v < nvec) {
#pragma unroll
      for (int e = 0; e < VW; ++e) q += (x[i][e] - m) * (x[i][e] - m);
    }
  }
  const float rs = rsqrtf(group_sum(make_float2(q, 0.0f), W, red, parity).x / C + kEps);
  if (!live) return;
  if (threadIdx.x == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = rs;
  }
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = threadIdx.x + i * blockDim.x;
    if (v >= nvec) continue;
    const BfPack<VW> w = load_pack<VW>(weight + v * VW);
    const BfPack<VW> bb = bias ? load_pack<VW>(bias + v * VW) : zero_pack<VW>();
    float o[VW];
#pragma unroll
    for (int e = 0; e < VW; ++e) o[e] = (x[i][e] - m) * rs * w[e] + bb[e];
    store_bf16<VW>(out + base + v * VW, o);
  }
}

template <int VW, bool RESID>
void launch_forward(bf16* out, float* mean, float* rstd, bf16* resid, const bf16* a, const bf16* b,
                    const bf16* weight, const bf16* bias, int N, int C, cudaStream_t stream) {
  const RowShape s = row_forward_shape(C / VW, "layernorm_forward");
  const dim3 grid(ceil_div(N, s.R)), block(kWarp * s.W, s.R);
#define MYRIAD_LN_FWD(I)                                                                   \
  case I:                                                                                  \
    layernorm_forward_kernel<VW, I, RESID>                                                 \
        <<<grid, block, 0, stream>>>(out, mean, rstd, resid, a, b, weight, bias, N, C, s.W); \
    break;
  switch (s.items) {
    MYRIAD_LN_FWD(1) MYRIAD_LN_FWD(2) MYRIAD_LN_FWD(3) MYRIAD_LN_FWD(4)
    MYRIAD_LN_FWD(5) MYRIAD_LN_FWD(6) MYRIAD_LN_FWD(7) MYRIAD_LN_FWD(8)
    default: MYRIAD_CHECK(false, "layernorm: items ", s.items);
  }
#undef MYRIAD_LN_FWD
}

// ---------------------------------------------------------------------------------------------

// Backward. dinp += rstd (g - mean(g) - xhat mean(g xhat)), g = dout * w, for one row per group
// iteration; dweight/dbias partial sums stay in registers (each thread owns the same columns in
// every row), the block's groups add theirs in group order through shared memory into
// scratch[block] (2C floats: dweight then dbias), and reduce_partials adds the blocks in order.
// Group gi = blockIdx.x * R + y takes rows gi, gi + G*R, ...: the order of every sum is fixed by
// (N, C, G), and G by the device (its SM count and the kernel's occupancy).
template <int VW, int ITEMS>
__global__ void __launch_bounds__(512, 2)
    layernorm_backward_kernel(bf16* __restrict__ dinp, float* __restrict__ partials,
                              const bf16* __restrict__ dout, const bf16* __restrict__ inp,
                              const bf16* __restrict__ weight, const float* __restrict__ mean,
                              const float* __restrict__ rstd, int N, int C, int W, bool has_bias) {
  __shared__ float2 red[2][kMaxGroupWarps];
  extern __shared__ float combine[];  // (C) when R > 1
  int parity = 0;
  const int nvec = C / VW;
  const int groups = gridDim.x * blockDim.y;
  // Registers: w, dout and inp packed (bf16), the dweight/dbias sums in fp32.
  BfPack<VW> w[ITEMS];
  float dw[ITEMS][VW], db[ITEMS][VW];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = threadIdx.x + i * blockDim.x;
    w[i] = v < nvec ? load_pack<VW>(weight + v * VW) : zero_pack<VW>();
#pragma unroll
    for (int e = 0; e < VW; ++e) dw[i][e] = db[i][e] = 0.0f;
  }
  const int iters = ceil_div(N, groups);  // uniform in the block: the syncs line up
  for (int it = 0, row = blockIdx.x * blockDim.y + threadIdx.y; it < iters; ++it, row += groups) {
    const bool live = row < N;
    const int64_t base = static_cast<int64_t>(live ? row : 0) * C;
    const float m = live ? mean[row] : 0.0f, rs = live ? rstd[row] : 0.0f;
    BfPack<VW> d[ITEMS], x[ITEMS];
    float sg = 0.0f, sgx = 0.0f;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int v = threadIdx.x + i * blockDim.x;
      const bool in = live && v < nvec;
      d[i] = in ? load_pack<VW>(dout + base + v * VW) : zero_pack<VW>();
      x[i] = in ? load_pack<VW>(inp + base + v * VW) : zero_pack<VW>();
    }
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
#pragma unroll
      for (int e = 0; e < VW; ++e) {
        const float xh = (x[i][e] - m) * rs, g = d[i][e] * w[i][e];
        sg += g;
        sgx += g * xh;
        dw[i][e] += d[i][e] * xh;
        db[i][e] += d[i][e];
      }
    }
    const float2 sums = group_sum(make_float2(sg, sgx), W, red, parity);
    const float mg = sums.x / C, mgx = sums.y / C;
    if (!live) continue;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int v = threadIdx.x + i * blockDim.x;
      if (v >= nvec) continue;
      float o[VW];
      load_bf16<VW>(o, dinp + base + v * VW);
#pragma unroll
      for (int e = 0; e < VW; ++e) {
        const float xh = (x[i][e] - m) * rs;
        o[e] += rs * (d[i][e] * w[i][e] - mg - xh * mgx);
      }
      store_bf16<VW>(dinp + base + v * VW, o);
    }
  }
  // Block partials: with one group, straight from registers; else the groups in order.
  float* out = partials + static_cast<int64_t>(blockIdx.x) * (has_bias ? 2 * C : C);
  write_block_partial<VW, ITEMS>(out, dw, combine, nvec, C);
  if (has_bias) write_block_partial<VW, ITEMS>(out + C, db, combine, nvec, C);
}

template <int VW, int ITEMS>
void launch_backward_items(bf16* dinp, float* dweight, float* dbias, float* scratch,
                           const bf16* dout, const bf16* inp, const bf16* weight,
                           const float* mean, const float* rstd, int N, int C, RowShape s,
                           cudaStream_t stream) {
  auto kernel = layernorm_backward_kernel<VW, ITEMS>;
  const size_t smem = s.R > 1 ? C * sizeof(float) : 0;
  const int threads = kWarp * s.W * s.R;
  const int G = std::min({resident_blocks(reinterpret_cast<const void*>(kernel), threads, smem),
                          ceil_div(N, s.R), kMaxPartialBlocks});
  kernel<<<G, dim3(kWarp * s.W, s.R), smem, stream>>>(dinp, scratch, dout, inp, weight, mean, rstd,
                                                      N, C, s.W, dbias != nullptr);
  check_launch("layernorm_backward");
  reduce_partials(dweight, dbias, C, scratch, G, dbias ? 2 * C : C, true, stream);
}

template <int VW>
void launch_backward(bf16* dinp, float* dweight, float* dbias, float* scratch, const bf16* dout,
                     const bf16* inp, const bf16* weight, const float* mean, const float* rstd,
                     int N, int C, cudaStream_t stream) {
  const RowShape s = row_backward_shape(C / VW, "layernorm_backward");
  switch (s.items) {
    case 1:
      return launch_backward_items<VW, 1>(dinp, dweight, dbias, scratch, dout, inp, weight, mean,
                                          rstd, N, C, s, stream);
    case 2:
      return launch_backward_items<VW, 2>(dinp, dweight, dbias, scratch, dout, inp, weight, mean,
                                          rstd, N, C, s, stream);
    case 4:
      return launch_backward_items<VW, 4>(dinp, dweight, dbias, scratch, dout, inp, weight, mean,
                                          rstd, N, C, s, stream);
    default:
      return launch_backward_items<VW, 8>(dinp, dweight, dbias, scratch, dout, inp, weight, mean,
                                          rstd, N, C, s, stream);
  }
}

}  // namespace

void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight,
                       const bf16* bias, int N, int C, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  if (C % 8 == 0 && all_aligned16(out, inp, weight) && (!bias || aligned16(bias)))
    launch_forward<8, false>(out, mean, rstd, nullptr, inp, nullptr, weight, bias, N, C, stream);
  else
    launch_forward<1, false>(out, mean, rstd, nullptr, inp, nullptr, weight, bias, N, C, stream);
  check_launch("layernorm_forward");
}

void residual_layernorm_forward(bf16* resid, bf16* out, float* mean, float* rstd, const bf16* a,
                                const bf16* b, const bf16* weight, const bf16* bias, int N, int C,
                                cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  if (C % 8 == 0 && all_aligned16(resid, out, a, b, weight) && (!bias || aligned16(bias)))
    launch_forward<8, true>(out, mean, rstd, resid, a, b, weight, bias, N, C, stream);
  else
    launch_forward<1, true>(out, mean, rstd, resid, a, b, weight, bias, N, C, stream);
  check_launch("residual_layernorm_forward");
}

size_t layernorm_scratch_floats(int N, int C) {
  return static_cast<size_t>(std::min(std::max(N, 1), kMaxPartialBlocks)) * 2 *
         static_cast<size_t>(std::max(C, 0));
}

void layernorm_backward(bf16* dinp, float* dweight, float* dbias, float* scratch,
                        const bf16* dout, const bf16* inp, const bf16* weight, const float* mean,
                        const float* rstd, int N, int C, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  if (C % 8 == 0 && all_aligned16(dinp, dout, inp, weight, scratch))
    launch_backward<8>(dinp, dweight, dbias, scratch, dout, inp, weight, mean, rstd, N, C, stream);
  else
    launch_backward<1>(dinp, dweight, dbias, scratch, dout, inp, weight, mean, rstd, N, C, stream);
}

}  // namespace myriad::cuda
