// The two row norms, forward (plain and fused with the residual add) and backward, one code
// path; the CUDA side of ops/cpu/norm.cc. CENTER picks LayerNorm (subtract the row mean, a
// bias) over RMSNorm (neither):
//   LayerNorm: xhat = (x - mean) rstd, out = xhat w + bias;
//   RMSNorm:   xhat = x rstd,          out = xhat w (normalize, then scale: HF's order).
//
// A row is held in registers (packed bf16) by a row group of 32*W threads (W warps), each thread
// owning ITEMS vectors of VW columns (VW = 8: one 16-byte access; VW = 1: the scalar path for
// C % 8 != 0 or unaligned pointers); a block holds R row groups (blockDim = (32*W, R)); the
// shapes are row_groups.cuh's. Row sums use warp shuffles, plus shared memory across the W
// warps when W > 1; every sum runs in a fixed order. LayerNorm needs two row sums where RMSNorm
// needs one, in both directions.
#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/row_groups.cuh"

namespace myriad::cuda {

using namespace detail;

namespace {

constexpr float kLayerNormEps = 1e-5f;

// Sums each of v[0..K) over the row group (all its threads get the same bits). red:
// [2][K * kMaxGroupWarps] floats, alternated by `parity` so that one sync per call suffices;
// W is uniform in the block, so every thread reaches the same syncs.
template <int K>
__device__ __forceinline__ void group_sum(float (&v)[K], int W,
                                          float (*red)[K * kMaxGroupWarps], int& parity) {
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = warp_sum(v[k]);
  if (W == 1) return;
  float* buf = red[parity] + threadIdx.y * W * K;
  if (threadIdx.x % kWarp == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) buf[threadIdx.x / kWarp * K + k] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float t = buf[k];
    for (int w = 1; w < W; ++w) t += buf[w * K + k];
    v[k] = t;
  }
  parity ^= 1;
}

template <int K>
__device__ __forceinline__ float group_sum1(float v, int W, float (*red)[K * kMaxGroupWarps],
                                            int& parity) {
  static_assert(K == 1);
  float s[1] = {v};
  group_sum(s, W, red, parity);
  return s[0];
}

// grid (ceil(N/R)), block (32*W, R). RESID: the row is resid = bf16(a + b), stored, and then
// normalized as stored (the backward reads the stored residual, so its statistics must be those
// of these bits). mean (CENTER) and rstd may be null. amax (or null): out's amax, folded as
// written (kernel_util.cuh amax_fold): a row group is whole warps, so a dead one leaves whole.
template <bool CENTER, int VW, int ITEMS, bool RESID>
__global__ void __launch_bounds__(256)
    norm_forward_kernel(bf16* __restrict__ out, float* __restrict__ mean,
                        float* __restrict__ rstd, bf16* __restrict__ resid,
                        const bf16* __restrict__ a, const bf16* __restrict__ b,
                        const bf16* __restrict__ weight, const bf16* __restrict__ bias, int N,
                        int C, int W, float eps, unsigned* __restrict__ amax) {
  __shared__ float red[2][kMaxGroupWarps];
  int parity = 0;
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  const bool live = row < N;  // a dead group still joins the row sums' syncs
  const int nvec = C / VW;
  const int64_t base = static_cast<int64_t>(live ? row : 0) * C;
  BfPack<VW> x[ITEMS];
  float s = 0.0f;  // LayerNorm: sum x; RMSNorm: sum x^2
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
    for (int e = 0; e < VW; ++e) s += CENTER ? x[i][e] : x[i][e] * x[i][e];
  }
  float m = 0.0f, rs;
  if constexpr (CENTER) {
    m = group_sum1<1>(s, W, red, parity) / C;
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
    rs = rsqrtf(group_sum1<1>(q, W, red, parity) / C + eps);
  } else {
    // 1/sqrtf rather than rsqrtf: rsqrtf is up to 2 ulp off, and RMSNorm's rstd is compared
    // at 1e-5 with the CPU's (LayerNorm keeps the rsqrtf it was measured with).
    rs = 1.0f / sqrtf(group_sum1<1>(s, W, red, parity) / C + eps);
  }
  if (!live) return;
  if (threadIdx.x == 0) {
    if (CENTER && mean) mean[row] = m;
    if (rstd) rstd[row] = rs;
  }
  float top = 0.0f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = threadIdx.x + i * blockDim.x;
    if (v >= nvec) continue;
    const BfPack<VW> w = load_pack<VW>(weight + v * VW);
    float o[VW];
    if constexpr (CENTER) {
      const BfPack<VW> bb = bias ? load_pack<VW>(bias + v * VW) : zero_pack<VW>();
#pragma unroll
      for (int e = 0; e < VW; ++e) o[e] = (x[i][e] - m) * rs * w[e] + bb[e];
    } else {
#pragma unroll
      for (int e = 0; e < VW; ++e) o[e] = x[i][e] * rs * w[e];
    }
    if (amax) {
#pragma unroll
      for (int e = 0; e < VW; ++e) top = amax_fold(top, o[e]);
    }
    store_bf16<VW>(out + base + v * VW, o);
  }
  if (amax) amax_publish(amax, top);
}

template <bool CENTER, int VW, bool RESID>
void launch_forward(bf16* out, float* mean, float* rstd, bf16* resid, const bf16* a, const bf16* b,
                    const bf16* weight, const bf16* bias, int N, int C, float eps,
                    cudaStream_t stream, unsigned* amax) {
  const RowShape s = row_forward_shape(C / VW, CENTER ? "layernorm_forward" : "rmsnorm_forward");
  const dim3 grid(ceil_div(N, s.R)), block(kWarp * s.W, s.R);
#define MYRIAD_NORM_FWD(I)                                                               \
  case I:                                                                                \
    norm_forward_kernel<CENTER, VW, I, RESID><<<grid, block, 0, stream>>>(               \
        out, mean, rstd, resid, a, b, weight, bias, N, C, s.W, eps, amax);               \
    break;
  switch (s.items) {
    MYRIAD_NORM_FWD(1) MYRIAD_NORM_FWD(2) MYRIAD_NORM_FWD(3) MYRIAD_NORM_FWD(4)
    MYRIAD_NORM_FWD(5) MYRIAD_NORM_FWD(6) MYRIAD_NORM_FWD(7) MYRIAD_NORM_FWD(8)
    default: MYRIAD_CHECK(false, "norm forward: items ", s.items);
  }
#undef MYRIAD_NORM_FWD
}

// Plain (b null) or fused with the residual add; the 16-byte path when every pointer allows.
template <bool CENTER>
void run_forward(bf16* resid, bf16* out, float* mean, float* rstd, const bf16* a, const bf16* b,
             const bf16* weight, const bf16* bias, int N, int C, float eps, const char* name,
             cudaStream_t stream, float* amax_out) {
  MYRIAD_CHECK(!amax_out || cudaMemsetAsync(amax_out, 0, sizeof(float), stream) == cudaSuccess, name,
               ": cannot clear its amax");
  if (N <= 0 || C <= 0) return;
  unsigned* const amax = reinterpret_cast<unsigned*>(amax_out);
  const bool vec = C % 8 == 0 && all_aligned16(out, a, weight) && (!b || all_aligned16(resid, b)) &&
                   (!bias || aligned16(bias));
  if (b) {
    if (vec) launch_forward<CENTER, 8, true>(out, mean, rstd, resid, a, b, weight, bias, N, C, eps, stream, amax);
    else launch_forward<CENTER, 1, true>(out, mean, rstd, resid, a, b, weight, bias, N, C, eps, stream, amax);
  } else {
    if (vec) launch_forward<CENTER, 8, false>(out, mean, rstd, nullptr, a, nullptr, weight, bias, N, C, eps, stream, amax);
    else launch_forward<CENTER, 1, false>(out, mean, rstd, nullptr, a, nullptr, weight, bias, N, C, eps, stream, amax);
  }
  check_launch(name);
}

// ---------------------------------------------------------------------------------------------

// Backward. Per row, with g = dout w: dinp += rstd (g - [mean(g)] - xhat mean(g xhat)), the
// bracket LayerNorm's only. dweight (and LayerNorm's dbias) are sums over rows: each thread owns
// the same columns in every row, so its share stays in registers across the rows it visits; the
// block's groups add theirs in group order through shared memory into partials[block] (C floats,
// 2C with a bias: dweight then dbias), and reduce_partials adds the blocks in block order. Group
// gi = blockIdx.x * R + y takes rows gi, gi + G*R, ...: the order of every sum is fixed by
// (N, C, G), and G by the device (its SM count and the kernel's occupancy).
template <bool CENTER, int VW, int ITEMS>
__global__ void __launch_bounds__(512, 2)
    norm_backward_kernel(bf16* __restrict__ dinp, float* __restrict__ partials,
                         const bf16* __restrict__ dout, const bf16* __restrict__ inp,
                         const bf16* __restrict__ weight, const float* __restrict__ mean,
                         const float* __restrict__ rstd, int N, int C, int W, bool has_bias) {
  constexpr int K = CENTER ? 2 : 1;  // row sums: LayerNorm's g and g xhat, RMSNorm's g xhat
  __shared__ float red[2][K * kMaxGroupWarps];
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
  const int iters = ceil_div(N, groups);  // the same in every group: the syncs line up
  for (int it = 0, row = blockIdx.x * blockDim.y + threadIdx.y; it < iters; ++it, row += groups) {
    const bool live = row < N;
    const int64_t base = static_cast<int64_t>(live ? row : 0) * C;
    const float m = CENTER && live ? mean[row] : 0.0f, rs = live ? rstd[row] : 0.0f;
    BfPack<VW> d[ITEMS], x[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int v = threadIdx.x + i * blockDim.x;
      const bool in = live && v < nvec;
      d[i] = in ? load_pack<VW>(dout + base + v * VW) : zero_pack<VW>();
      x[i] = in ? load_pack<VW>(inp + base + v * VW) : zero_pack<VW>();
    }
    float sums[K] = {};  // LayerNorm: {sum g, sum g xhat}; RMSNorm: {sum g xhat}
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
#pragma unroll
      for (int e = 0; e < VW; ++e) {
        if constexpr (CENTER) {
          const float xh = (x[i][e] - m) * rs, g = d[i][e] * w[i][e];
          sums[0] += g;
          sums[1] += g * xh;
          dw[i][e] += d[i][e] * xh;
          db[i][e] += d[i][e];
        } else {
          const float xh = x[i][e] * rs;
          sums[0] += d[i][e] * w[i][e] * xh;
          dw[i][e] += d[i][e] * xh;
        }
      }
    }
    group_sum(sums, W, red, parity);
    const float mg = CENTER ? sums[0] / C : 0.0f, mgx = sums[K - 1] / C;
    if (!live) continue;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int v = threadIdx.x + i * blockDim.x;
      if (v >= nvec) continue;
      float o[VW];
      load_bf16<VW>(o, dinp + base + v * VW);
#pragma unroll
      for (int e = 0; e < VW; ++e) {
        if constexpr (CENTER) {
          const float xh = (x[i][e] - m) * rs;
          o[e] += rs * (d[i][e] * w[i][e] - mg - xh * mgx);
        } else {
          o[e] += rs * (d[i][e] * w[i][e] - x[i][e] * rs * mgx);
        }
      }
      store_bf16<VW>(dinp + base + v * VW, o);
    }
  }
  // Block partials: with one group, straight from registers; else the groups in order.
  float* out = partials + static_cast<int64_t>(blockIdx.x) * (has_bias ? 2 * C : C);
  write_block_partial<VW, ITEMS>(out, dw, combine, nvec, C);
  if (CENTER && has_bias) write_block_partial<VW, ITEMS>(out + C, db, combine, nvec, C);
}

template <bool CENTER, int VW, int ITEMS>
void launch_backward_items(bf16* dinp, float* dweight, float* dbias, float* scratch,
                           const bf16* dout, const bf16* inp, const bf16* weight,
                           const float* mean, const float* rstd, int N, int C, RowShape s,
                           const char* name, cudaStream_t stream) {
  auto kernel = norm_backward_kernel<CENTER, VW, ITEMS>;
  const size_t smem = s.R > 1 ? C * sizeof(float) : 0;
  const int threads = kWarp * s.W * s.R;
  const int G = std::min({resident_blocks(reinterpret_cast<const void*>(kernel), threads, smem),
                          ceil_div(N, s.R), kMaxPartialBlocks});
  kernel<<<G, dim3(kWarp * s.W, s.R), smem, stream>>>(dinp, scratch, dout, inp, weight, mean, rstd,
                                                      N, C, s.W, dbias != nullptr);
  check_launch(name);
  reduce_partials(dweight, dbias, C, scratch, G, dbias ? 2 * C : C, true, stream);
}

template <bool CENTER, int VW>
void launch_backward(bf16* dinp, float* dweight, float* dbias, float* scratch, const bf16* dout,
                     const bf16* inp, const bf16* weight, const float* mean, const float* rstd,
                     int N, int C, const char* name, cudaStream_t stream) {
  const RowShape s = row_backward_shape(C / VW, name);
  const auto items = [&](auto I) {
    launch_backward_items<CENTER, VW, decltype(I)::value>(dinp, dweight, dbias, scratch, dout, inp,
                                                          weight, mean, rstd, N, C, s, name, stream);
  };
  switch (s.items) {
    case 1: return items(std::integral_constant<int, 1>{});
    case 2: return items(std::integral_constant<int, 2>{});
    case 4: return items(std::integral_constant<int, 4>{});
    default: return items(std::integral_constant<int, 8>{});
  }
}

template <bool CENTER>
void run_backward(bf16* dinp, float* dweight, float* dbias, float* scratch, const bf16* dout,
              const bf16* inp, const bf16* weight, const float* mean, const float* rstd, int N,
              int C, const char* name, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  if (C % 8 == 0 && all_aligned16(dinp, dout, inp, weight, scratch))
    launch_backward<CENTER, 8>(dinp, dweight, dbias, scratch, dout, inp, weight, mean, rstd, N, C,
                               name, stream);
  else
    launch_backward<CENTER, 1>(dinp, dweight, dbias, scratch, dout, inp, weight, mean, rstd, N, C,
                               name, stream);
}

size_t scratch_floats(int N, int C, int per_column) {
  return static_cast<size_t>(std::min(std::max(N, 1), kMaxPartialBlocks)) * per_column *
         static_cast<size_t>(std::max(C, 0));
}

}  // namespace

void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight,
                       const bf16* bias, int N, int C, cudaStream_t stream, float* amax) {
  run_forward<true>(nullptr, out, mean, rstd, inp, nullptr, weight, bias, N, C, kLayerNormEps,
                "layernorm_forward", stream, amax);
}

void residual_layernorm_forward(bf16* resid, bf16* out, float* mean, float* rstd, const bf16* a,
                                const bf16* b, const bf16* weight, const bf16* bias, int N, int C,
                                cudaStream_t stream, float* amax) {
  run_forward<true>(resid, out, mean, rstd, a, b, weight, bias, N, C, kLayerNormEps,
                "residual_layernorm_forward", stream, amax);
}

size_t layernorm_scratch_floats(int N, int C) { return scratch_floats(N, C, 2); }

void layernorm_backward(bf16* dinp, float* dweight, float* dbias, float* scratch,
                        const bf16* dout, const bf16* inp, const bf16* weight, const float* mean,
                        const float* rstd, int N, int C, cudaStream_t stream) {
  run_backward<true>(dinp, dweight, dbias, scratch, dout, inp, weight, mean, rstd, N, C,
                 "layernorm_backward", stream);
}

// eps arrives as a double (the config's); the kernel takes it rounded to float, as the CPU op
// rounds it to Real.
void rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, const bf16* weight, int N, int C,
                     double eps, cudaStream_t stream, float* amax) {
  run_forward<false>(nullptr, out, nullptr, rstd, inp, nullptr, weight, nullptr, N, C,
                 static_cast<float>(eps), "rmsnorm_forward", stream, amax);
}

void residual_rmsnorm_forward(bf16* resid, bf16* out, float* rstd, const bf16* a, const bf16* b,
                              const bf16* weight, int N, int C, double eps, cudaStream_t stream, float* amax) {
  run_forward<false>(resid, out, nullptr, rstd, a, b, weight, nullptr, N, C, static_cast<float>(eps),
                 "residual_rmsnorm_forward", stream, amax);
}

size_t rmsnorm_scratch_floats(int N, int C) { return scratch_floats(N, C, 1); }

void rmsnorm_backward(bf16* dinp, float* dweight, float* scratch, const bf16* dout,
                      const bf16* inp, const bf16* weight, const float* rstd, int N, int C,
                      cudaStream_t stream) {
  run_backward<false>(dinp, dweight, nullptr, scratch, dout, inp, weight, nullptr, rstd, N, C,
                  "rmsnorm_backward", stream);
}

}  // namespace myriad::cuda
