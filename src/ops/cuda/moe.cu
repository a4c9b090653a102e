// A mixture of experts' memory-bound kernels (the CUDA side of ops/cpu/moe.cc, its oracle): the
// rows gathered into expert order and summed back, the weighted combine and its backward, and
// the router's two backward products. The experts' GEMMs and the router's forward GEMM are
// cuBLAS's (model/cuda/cuda_ops.cu); the routing itself runs on the host there.
//
// Every sum runs in a fixed order (a token's slots in slot order, a column's rows in row order,
// a block's warps in warp order), so results are bitwise repeatable; sums are fp32 and each
// bf16 output is rounded once.
#include <algorithm>

#include "ops/cuda/kernel_util.cuh"

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
