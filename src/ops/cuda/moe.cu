// A mixture of experts' memory-bound kernels (the CUDA side of ops/cpu/moe.cc, its oracle): the
// rows gathered into expert order and summed back, the weighted combine and its backward, and
// the router's two backward products. The experts' GEMMs and the router's forward GEMM are
// cuBLAS's (model/cuda/cuda_ops.cu); the routing itself runs on the host there.
//
// Every sum runs in a fixed order (a token's slots in slot order, a column's rows in row order,
// a block's warps in warp order), so results are bitwise repeatable; sums are fp32 and each
// bf16 output is rounded once.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/ops.cuh"

namespace myriad::cuda {

using namespace detail;

namespace {

constexpr int kRowThreads = 128;  // one block per row: C / 8 = 256 vectors at d_model 2048

// xs row i = x row order[i] / k.
template <bool VEC>
__global__ void gather_rows_kernel(bf16* __restrict__ xs, const bf16* __restrict__ x, const int32_t* __restrict__ order,
                                   int k, int C) {
  const int64_t i = blockIdx.x;
  const bf16* src = x + int64_t(order[i] / k) * C;
  bf16* dst = xs + i * C;
  if constexpr (VEC) {
    for (int c = threadIdx.x * 8; c < C; c += blockDim.x * 8)
      *reinterpret_cast<int4*>(dst + c) = *reinterpret_cast<const int4*>(src + c);
  } else {
    for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
  }
}

// dx row n += the rows pos[n k + j] of dxs, j in order (a dropped slot, pos < 0, none).
template <int VW>
__global__ void gather_rows_backward_kernel(bf16* dx, const bf16* __restrict__ dxs, const int32_t* __restrict__ pos,
                                            int k, int C) {
  const int64_t n = blockIdx.x;
  const int32_t* p = pos + n * k;
  for (int c = threadIdx.x * VW; c < C; c += blockDim.x * VW) {
    float acc[VW], t[VW];
    load_bf16<VW>(acc, dx + n * C + c);
    for (int j = 0; j < k; ++j) {
      if (p[j] < 0) continue;
      load_bf16<VW>(t, dxs + int64_t(p[j]) * C + c);
#pragma unroll
      for (int e = 0; e < VW; ++e) acc[e] += t[e];
    }
    store_bf16<VW>(dx + n * C + c, acc);
  }
}

// out row n (= or +=) the sum over j in order of weights[n,j] x ys row pos[n k + j].
template <int VW>
__global__ void combine_forward_kernel(bf16* out, const bf16* __restrict__ ys, const float* __restrict__ weights,
                                       const int32_t* __restrict__ pos, int k, int C, bool accumulate) {
  const int64_t n = blockIdx.x;
  const int32_t* p = pos + n * k;
  const float* w = weights + n * k;
  for (int c = threadIdx.x * VW; c < C; c += blockDim.x * VW) {
    float acc[VW], t[VW];
    if (accumulate) {
      load_bf16<VW>(acc, out + n * C + c);
    } else {
#pragma unroll
      for (int e = 0; e < VW; ++e) acc[e] = 0.0f;
    }
    for (int j = 0; j < k; ++j) {
      if (p[j] < 0) continue;
      const float wt = w[j];
      load_bf16<VW>(t, ys + int64_t(p[j]) * C + c);
#pragma unroll
      for (int e = 0; e < VW; ++e) acc[e] += wt * t[e];
    }
    store_bf16<VW>(out + n * C + c, acc);
  }
}

// The sum of v over the block, the same bits for every run: each warp's butterfly, then the
// warps' sums in warp order. Every thread gets the result. red: blockDim.x / 32 floats.
__device__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // red may still be read from the previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.0f;
  for (int i = 0; i < warps; ++i) s += red[i];
  return s;
}

// Per token n and slot j kept: dys row pos = weights[n,j] x dout row n (=), dweights[n,j] (=) the
// dot product of dout row n and ys row pos; a dropped slot's weight gradient is 0.
template <int VW>
__global__ void combine_backward_kernel(bf16* __restrict__ dys, float* __restrict__ dweights,
                                        const bf16* __restrict__ dout, const bf16* __restrict__ ys,
                                        const float* __restrict__ weights, const int32_t* __restrict__ pos, int k,
                                        int C) {
  __shared__ float red[kRowThreads / kWarp];
  const int64_t n = blockIdx.x;
  for (int j = 0; j < k; ++j) {
    const int32_t row = pos[n * k + j];
    if (row < 0) {  // uniform over the block
      if (threadIdx.x == 0) dweights[n * k + j] = 0.0f;
      continue;
    }
    const float wt = weights[n * k + j];
    float dot = 0.0f;
    for (int c = threadIdx.x * VW; c < C; c += blockDim.x * VW) {
      float d[VW], y[VW], o[VW];
      load_bf16<VW>(d, dout + n * C + c);
      load_bf16<VW>(y, ys + int64_t(row) * C + c);
#pragma unroll
      for (int e = 0; e < VW; ++e) o[e] = wt * d[e], dot += d[e] * y[e];
      store_bf16<VW>(dys + int64_t(row) * C + c, o);
    }
    dot = block_sum(dot, red);
    if (threadIdx.x == 0) dweights[n * k + j] = dot;
  }
}

// dx (N,C) += dlogits (N,E) . w (E,C): a block takes kRows rows, their logits' gradients in
// shared memory, and walks the columns; each output a sum over e in order.
constexpr int kRouterRows = 16, kRouterThreads = 256;
__global__ void router_backward_dx_kernel(bf16* dx, const float* __restrict__ dlogits, const bf16* __restrict__ w,
                                          int N, int C, int E) {
  extern __shared__ float dl[];  // (kRouterRows, E)
  const int64_t n0 = int64_t(blockIdx.x) * kRouterRows;
  const int rows = N - n0 < kRouterRows ? static_cast<int>(N - n0) : kRouterRows;
  for (int i = threadIdx.x; i < kRouterRows * E; i += blockDim.x)
    dl[i] = i / E < rows ? dlogits[n0 * E + i] : 0.0f;
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc[kRouterRows];
#pragma unroll
    for (int r = 0; r < kRouterRows; ++r) acc[r] = 0.0f;
    for (int e = 0; e < E; ++e) {
      const float we = __bfloat162float(w[int64_t(e) * C + c]);
#pragma unroll
      for (int r = 0; r < kRouterRows; ++r) acc[r] += dl[r * E + e] * we;
    }
#pragma unroll
    for (int r = 0; r < kRouterRows; ++r)
      if (r < rows) {
        bf16* p = dx + (n0 + r) * C + c;
        *p = __float2bfloat16(__bfloat162float(*p) + acc[r]);
      }
  }
}

// dw (E,C) += dlogits (N,E)^T . x (N,C): a block owns kDwCols columns of every expert and walks
// all N rows in order, kDwRows at a time through shared memory; thread t owns column t % kDwCols
// of experts t / kDwCols, + kDwStride, ... (at most kDwAcc of them: E <= 256).
constexpr int kDwCols = 16, kDwRows = 32, kDwThreads = 256, kDwStride = kDwThreads / kDwCols, kDwAcc = 16;
__global__ void router_backward_dw_kernel(float* dw, const float* __restrict__ dlogits, const bf16* __restrict__ x,
                                          int N, int C, int E) {
  extern __shared__ float sh[];  // xs (kDwRows, kDwCols), then dls (kDwRows, E)
  float* xs = sh;
  float* dls = sh + kDwRows * kDwCols;
  const int c0 = blockIdx.x * kDwCols, col = threadIdx.x % kDwCols, e0 = threadIdx.x / kDwCols;
  float acc[kDwAcc];
#pragma unroll
  for (int i = 0; i < kDwAcc; ++i) acc[i] = 0.0f;
  for (int n0 = 0; n0 < N; n0 += kDwRows) {
    const int rows = min(kDwRows, N - n0);
    __syncthreads();  // the previous tile is read
    for (int i = threadIdx.x; i < kDwRows * kDwCols; i += blockDim.x) {
      const int r = i / kDwCols, c = c0 + i % kDwCols;
      xs[i] = r < rows && c < C ? __bfloat162float(x[int64_t(n0 + r) * C + c]) : 0.0f;
    }
    for (int i = threadIdx.x; i < kDwRows * E; i += blockDim.x)
      dls[i] = i / E < rows ? dlogits[int64_t(n0) * E + i] : 0.0f;
    __syncthreads();
#pragma unroll
    for (int a = 0; a < kDwAcc; ++a) {
      const int e = e0 + a * kDwStride;
      if (e < E)
        for (int r = 0; r < rows; ++r) acc[a] += dls[r * E + e] * xs[r * kDwCols + col];
    }
  }
  if (c0 + col < C) {
#pragma unroll
    for (int a = 0; a < kDwAcc; ++a) {
      const int e = e0 + a * kDwStride;
      if (e < E) dw[int64_t(e) * C + c0 + col] += acc[a];
    }
  }
}

// ---- the routing (the oracle's route and route_backward, ops/cpu/moe.cc, on the device) ----
//
// One thread per token, in the oracle's double arithmetic and order, so that the choice, the
// weights and the logits' gradient are the oracle's: nvcc would contract a product into a sum
// (an FMA) where the CPU build rounds twice, so those are written with _rn intrinsics. CUDA's
// exp and log are within an ulp of glibc's in double, which rounding to float hides but for a
// value within an ulp of a float boundary. The sums over tokens (the scores' and the z-loss's)
// run in a fixed tree order, not the oracle's sequence: the same bits every run.

// A token's scores into s (E) from its logits; returns the log-sum-exp.
__device__ double token_scores(const float* l, float* s, int E, bool softmax) {
  double mx = -INFINITY;
  for (int e = 0; e < E; ++e) mx = fmax(mx, double(l[e]));
  double sum = 0;
  for (int e = 0; e < E; ++e) sum += exp(double(l[e]) - mx);
  const double lse = mx + log(sum);
  for (int e = 0; e < E; ++e)
    s[e] = softmax ? static_cast<float>(exp(double(l[e]) - lse)) : static_cast<float>(1 / (1 + exp(-double(l[e]))));
  return lse;
}

constexpr int kMaxGroups = 64;

__global__ void route_tokens_kernel(int32_t* __restrict__ choice, float* __restrict__ weights,
                                    float* __restrict__ scores, double* __restrict__ lse2, int* __restrict__ counts,
                                    const float* __restrict__ logits, const bf16* __restrict__ bias, RouteArgs a,
                                    int N) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const int E = a.experts, k = a.top_k, G = a.groups, per = E / G;
  float* s = scores + int64_t(n) * E;
  const double lse = token_scores(logits + int64_t(n) * E, s, E, a.softmax);
  lse2[n] = lse * lse;
  auto key = [&](int e) { return bias ? s[e] + __bfloat162float(bias[e]) : s[e]; };
  // The groups allowed (all with one group): the top_groups of the highest best-two sums.
  uint64_t allowed = G == 1 ? ~uint64_t(0) : 0;
  if (G > 1) {
    float gk[kMaxGroups];
    for (int g = 0; g < G; ++g) {
      float x = -INFINITY, y = -INFINITY;
      for (int e = g * per; e < (g + 1) * per; ++e) {
        const float v = key(e);
        if (v > x) y = x, x = v;
        else if (v > y) y = v;
      }
      gk[g] = per > 1 ? x + y : x;
    }
    for (int t = 0; t < a.top_groups; ++t) {
      int best = -1;
      for (int g = 0; g < G; ++g)
        if (!(allowed >> g & 1) && (best < 0 || gk[g] > gk[best])) best = g;
      allowed |= uint64_t(1) << best;
    }
  }
  int32_t* c = choice + int64_t(n) * k;
  float* wt = weights + int64_t(n) * k;
  double sum = 0;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    float bk = 0;
    for (int e = 0; e < E; ++e) {
      bool taken = !(allowed >> (e / per) & 1);
      for (int i = 0; i < j; ++i) taken |= c[i] == e;
      if (taken) continue;
      const float v = key(e);
      if (best < 0 || v > bk) best = e, bk = v;
    }
    c[j] = best;
    wt[j] = s[best];
    sum += s[best];
    atomicAdd(counts + best, 1);  // an integer count: the same whatever the order
  }
  for (int j = 0; j < k; ++j)
    wt[j] = static_cast<float>(__dmul_rn(a.norm_topk ? double(wt[j]) / sum : double(wt[j]), double(a.scale)));
}

__device__ double block_sum_double(double v, double* red) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  double s = 0;
  for (int i = 0; i < warps; ++i) s += red[i];
  return s;
}

// sums[e] = the scores of expert e summed over the N tokens (e < E); sums[E] = the lse^2 summed.
constexpr int kSumThreads = 256;
__global__ void route_sums_kernel(double* sums, const float* __restrict__ scores, const double* __restrict__ lse2,
                                  int N, int E) {
  __shared__ double red[kSumThreads / kWarp];
  const int e = blockIdx.x;
  double v = 0;
  for (int n = threadIdx.x; n < N; n += blockDim.x) v += e < E ? double(scores[int64_t(n) * E + e]) : lse2[n];
  v = block_sum_double(v, red);
  if (threadIdx.x == 0) sums[e] = v;
}

// The stable counting sort of the M = N k slots by expert: one block per expert, walking the
// slots in order; order[at] = s and pos[s] = at for expert e's i-th slot s, at = (rows of the
// experts before e) + i.
constexpr int kSortThreads = 1024;
__global__ void route_order_kernel(int32_t* __restrict__ order, int32_t* __restrict__ pos,
                                   const int32_t* __restrict__ choice, const int* __restrict__ counts, int64_t M) {
  __shared__ int warp_total[kSortThreads / kWarp];
  __shared__ int64_t base;
  const int e = blockIdx.x, lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (threadIdx.x == 0) {
    int64_t b = 0;
    for (int i = 0; i < e; ++i) b += counts[i];
    base = b;
  }
  __syncthreads();
  int64_t at = base;
  for (int64_t s0 = 0; s0 < M; s0 += blockDim.x) {
    const int64_t s = s0 + threadIdx.x;
    const bool mine = s < M && choice[s] == e;
    const unsigned ballot = __ballot_sync(0xffffffffu, mine);
    const int before_in_warp = __popc(ballot & ((1u << lane) - 1));
    if (lane == 0) warp_total[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) {
      if (w < warp) before += warp_total[w];
      total += warp_total[w];
    }
    if (mine) {
      const int64_t where = at + before + before_in_warp;
      order[where] = static_cast<int32_t>(s);
      pos[s] = static_cast<int32_t>(where);
    }
    at += total;
    __syncthreads();  // warp_total is rewritten by the next chunk
  }
}

// The rows each expert was chosen for (the choice's, before any drop): counts (E) +=.
__global__ void count_choice_kernel(int* counts, const int32_t* __restrict__ choice, int64_t M) {
  for (int64_t s = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; s < M; s += int64_t(gridDim.x) * blockDim.x)
    atomicAdd(counts + choice[s], 1);
}

// dlogits (N,E) =: the oracle's route_backward, one thread per token. scores (N,E) is scratch.
__global__ void route_backward_kernel(float* __restrict__ dlogits, float* __restrict__ scores,
                                      const float* __restrict__ dweights, const float* __restrict__ logits,
                                      const int32_t* __restrict__ choice, const int* __restrict__ counts,
                                      double tokens, float grad_scale, RouteArgs a, int N) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const int E = a.experts, k = a.top_k;
  const float* l = logits + int64_t(n) * E;
  float* s = scores + int64_t(n) * E;
  const double lse = token_scores(l, s, E, a.softmax);
  const int32_t* c = choice + int64_t(n) * k;
  const float* dw = dweights + int64_t(n) * k;
  double S = 0, dot1 = 0;
  if (a.norm_topk) {
    for (int j = 0; j < k; ++j) S += s[c[j]];
    for (int j = 0; j < k; ++j) dot1 = __dadd_rn(dot1, __dmul_rn(double(dw[j]), double(s[c[j]])));
  }
  // ds[e]: the chosen slots' terms in slot order, then the balance loss's.
  auto ds = [&](int e) {
    double d = 0;
    for (int j = 0; j < k; ++j)
      if (c[j] == e)
        d += a.norm_topk ? __dmul_rn(double(a.scale) / S, double(dw[j]) - dot1 / S) : __dmul_rn(double(a.scale), double(dw[j]));
    if (a.aux_loss > 0)
      d += double(grad_scale) * a.aux_loss * E * (double(counts[e]) / (tokens * k)) / tokens;
    return d;
  };
  float* dl = dlogits + int64_t(n) * E;
  if (a.softmax) {
    double dot = 0;
    for (int e = 0; e < E; ++e) dot = __dadd_rn(dot, __dmul_rn(ds(e), double(s[e])));
    for (int e = 0; e < E; ++e) dl[e] = static_cast<float>(__dmul_rn(double(s[e]), ds(e) - dot));
  } else {
    for (int e = 0; e < E; ++e) dl[e] = static_cast<float>(__dmul_rn(__dmul_rn(ds(e), double(s[e])), 1.0 - s[e]));
  }
  if (a.z_loss > 0)
    for (int e = 0; e < E; ++e)
      dl[e] += static_cast<float>(double(grad_scale) * a.z_loss * 2 * lse * exp(double(l[e]) - lse) / tokens);
}

// The vector width every pointer and the row length allow: 8 bf16 in one 16-byte access, or 1.
template <class... P>
bool vec8(int C, const P*... p) {
  return C % 8 == 0 && all_aligned16(p...);
}

}  // namespace

void gather_rows(bf16* xs, const bf16* x, const int32_t* order, int M, int k, int C, cudaStream_t stream) {
  if (M <= 0 || C <= 0) return;
  if (vec8(C, xs, x))
    gather_rows_kernel<true><<<M, kRowThreads, 0, stream>>>(xs, x, order, k, C);
  else
    gather_rows_kernel<false><<<M, kRowThreads, 0, stream>>>(xs, x, order, k, C);
  check_launch("gather_rows");
}

void gather_rows_backward(bf16* dx, const bf16* dxs, const int32_t* pos, int N, int k, int C, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  if (vec8(C, dx, dxs))
    gather_rows_backward_kernel<8><<<N, kRowThreads, 0, stream>>>(dx, dxs, pos, k, C);
  else
    gather_rows_backward_kernel<1><<<N, kRowThreads, 0, stream>>>(dx, dxs, pos, k, C);
  check_launch("gather_rows_backward");
}

void combine_forward(bf16* out, const bf16* ys, const float* weights, const int32_t* pos, int N, int k, int C,
                     bool accumulate, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  if (vec8(C, out, ys))
    combine_forward_kernel<8><<<N, kRowThreads, 0, stream>>>(out, ys, weights, pos, k, C, accumulate);
  else
    combine_forward_kernel<1><<<N, kRowThreads, 0, stream>>>(out, ys, weights, pos, k, C, accumulate);
  check_launch("combine_forward");
}

void combine_backward(bf16* dys, float* dweights, const bf16* dout, const bf16* ys, const float* weights,
                      const int32_t* pos, int N, int k, int C, cudaStream_t stream) {
  if (N <= 0) return;
  if (vec8(C, dys, dout, ys))
    combine_backward_kernel<8><<<N, kRowThreads, 0, stream>>>(dys, dweights, dout, ys, weights, pos, k, C);
  else
    combine_backward_kernel<1><<<N, kRowThreads, 0, stream>>>(dys, dweights, dout, ys, weights, pos, k, C);
  check_launch("combine_backward");
}

bool route_on_device(const RouteArgs& a) { return a.groups <= kMaxGroups && a.experts % a.groups == 0; }

void route_tokens(int32_t* choice, float* weights, int32_t* order, int32_t* pos, int* counts, double* sums,
                  float* scores, double* lse2, const float* logits, const bf16* bias, const RouteArgs& a, int N,
                  cudaStream_t stream) {
  if (N <= 0) return;
  MYRIAD_CHECK(cudaMemsetAsync(counts, 0, sizeof(int) * a.experts, stream) == cudaSuccess, "route: cannot clear the counts");
  route_tokens_kernel<<<ceil_div(N, 128), 128, 0, stream>>>(choice, weights, scores, lse2, counts, logits, bias, a, N);
  check_launch("route_tokens");
  route_sums_kernel<<<a.experts + 1, kSumThreads, 0, stream>>>(sums, scores, lse2, N, a.experts);
  check_launch("route_sums");
  route_order_kernel<<<a.experts, kSortThreads, 0, stream>>>(order, pos, choice, counts, int64_t(N) * a.top_k);
  check_launch("route_order");
}

void route_backward(float* dlogits, float* scores, int* counts, const float* dweights, const float* logits,
                    const int32_t* choice, const int64_t* chosen, double tokens, float grad_scale, const RouteArgs& a,
                    int N, cudaStream_t stream) {
  if (N <= 0) return;
  if (chosen) {  // the whole micro-batch's counts, from the host (int: a micro-batch's slots fit)
    std::vector<int> c(chosen, chosen + a.experts);
    MYRIAD_CHECK(cudaMemcpyAsync(counts, c.data(), sizeof(int) * a.experts, cudaMemcpyHostToDevice, stream) ==
                         cudaSuccess &&
                     cudaStreamSynchronize(stream) == cudaSuccess,  // c is pageable and about to go
                 "route_backward: cannot upload the counts");
  } else {
    MYRIAD_CHECK(cudaMemsetAsync(counts, 0, sizeof(int) * a.experts, stream) == cudaSuccess, "route: cannot clear the counts");
    const int64_t M = int64_t(N) * a.top_k;
    count_choice_kernel<<<static_cast<unsigned>(std::min<int64_t>(ceil_div(M, 256), 1024)), 256, 0, stream>>>(
        counts, choice, M);
    check_launch("count_choice");
  }
  route_backward_kernel<<<ceil_div(N, 128), 128, 0, stream>>>(dlogits, scores, dweights, logits, choice, counts,
                                                               tokens, grad_scale, a, N);
  check_launch("route_backward");
}

int router_backward_max_experts() { return kDwStride * kDwAcc; }

void router_backward(bf16* dx, float* dw, const float* dlogits, const bf16* x, const bf16* w, int N, int C, int E,
                     cudaStream_t stream) {
  if (N <= 0 || C <= 0 || E <= 0) return;
  if (dx) {
    const size_t smem = size_t(kRouterRows) * E * sizeof(float);
    router_backward_dx_kernel<<<ceil_div(N, kRouterRows), kRouterThreads, smem, stream>>>(dx, dlogits, w, N, C, E);
    check_launch("router_backward dx");
  }
  if (dw) {
    const size_t smem = (size_t(kDwRows) * kDwCols + size_t(kDwRows) * E) * sizeof(float);
    router_backward_dw_kernel<<<ceil_div(C, kDwCols), kDwThreads, smem, stream>>>(dw, dlogits, x, N, C, E);
    check_launch("router_backward dw");
  }
}

}  // namespace myriad::cuda
