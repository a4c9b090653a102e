// Softmax cross-entropy with the logits' gradient written in place: one block per row. Pass 1
// reads the row once (16-byte accesses) keeping a running (max, sum of exp) per thread in fp32,
// combined over the block in a fixed order; pass 2 re-reads the row (mostly from L2: several
// rows per SM are in flight, not the whole batch) and writes dlogits in bf16. The exponentials
// (one per logit and pass) make this kernel about as much SFU-bound as memory-bound, so the
// inner loops are kept to an FMA, an ex2 and an add per logit.
#include <algorithm>
#include <cfloat>

#include "ops/cuda/kernel_util.cuh"

namespace myriad::cuda {

using namespace detail;

namespace {

constexpr int kMaxThreads = 512;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 2^x on the special-function unit (what __expf uses): the math runs in base 2, so that each
// exponent is one FMA, x * log2(e) - m.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

struct MaxSum {
  float m, s;  // running max of x * log2(e), and sum of 2^(x log2(e) - m)
};

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  // The -FLT_MAX start (not -inf) keeps 2^(a.m - m) finite: an empty side adds 0.
  return {m, a.s * ex2(a.m - m) + b.s * ex2(b.m - m)};
}

// Folds VW logits into the running state; only columns < V count. The per-column test runs
// only for the vector that straddles V.
template <int VW>
__device__ __forceinline__ void fold(MaxSum& st, const BfPack<VW>& x, int col, int V) {
  const bool full = col + VW <= V;
  float mx = -FLT_MAX;
#pragma unroll
  for (int e = 0; e < VW; ++e)
    if (full || col + e < V) mx = fmaxf(mx, x[e]);
  mx *= kLog2e;
  if (mx > st.m) {
    st.s *= ex2(st.m - mx);
    st.m = mx;
  }
  if (full) {
#pragma unroll
    for (int e = 0; e < VW; ++e) st.s += ex2(fmaf(x[e], kLog2e, -st.m));
  } else {
#pragma unroll
    for (int e = 0; e < VW; ++e)
      if (col + e < V) st.s += ex2(fmaf(x[e], kLog2e, -st.m));
  }
}

// dlogits of VW columns: (softmax - onehot) * dloss, 0 past V. `shift` = -lse2 + log2(dloss)
// folds the scale into the exponent (dloss > 0); the target's and the padding's vector take the
// general path.
template <int VW>
__device__ __forceinline__ void grad(float (&g)[VW], const BfPack<VW>& x, int col, int V,
                                     int target, float lse2, float shift, float dloss) {
  if (col + VW <= V && (target < col || target >= col + VW) && dloss > 0.0f) {
#pragma unroll
    for (int e = 0; e < VW; ++e) g[e] = ex2(fmaf(x[e], kLog2e, shift));
    return;
  }
#pragma unroll
  for (int e = 0; e < VW; ++e) {
    const float p = col + e < V ? ex2(fmaf(x[e], kLog2e, -lse2)) : 0.0f;
    g[e] = (col + e == target ? p - 1.0f : p) * dloss;
  }
}

// grid (N), block (threads, a multiple of 32 up to kMaxThreads). Two vectors per thread in
// flight per iteration.
template <int VW>
__global__ void __launch_bounds__(kMaxThreads)
    crossentropy_kernel(float* __restrict__ losses, bf16* __restrict__ logits,
                        const int32_t* __restrict__ targets, float dloss, int V, int Vp) {
  __shared__ MaxSum red[kMaxThreads / kWarp];
  const int64_t row = blockIdx.x;
  bf16* x = logits + row * Vp;
  const int target = targets[row];
  if (target < 0) {  // left out of the loss (data.document_end_loss): loss 0, gradient 0
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (dloss != 0.0f)
      for (int j = threadIdx.x; j < Vp; j += blockDim.x) x[j] = __float2bfloat16(0.0f);
    return;
  }
  // Read before the sync below, so before any thread overwrites the row.
  const float xt = threadIdx.x == 0 ? __bfloat162float(x[target]) : 0.0f;
  const int nvec = Vp / VW;
  const int stride = blockDim.x;

  MaxSum st{-FLT_MAX, 0.0f};
  int v = threadIdx.x;
  for (; v + stride < nvec; v += 2 * stride) {
    const BfPack<VW> a = load_pack<VW>(x + v * VW), b = load_pack<VW>(x + (v + stride) * VW);
    fold<VW>(st, a, v * VW, V);
    fold<VW>(st, b, (v + stride) * VW, V);
  }
  if (v < nvec) fold<VW>(st, load_pack<VW>(x + v * VW), v * VW, V);
  // Block combine: butterfly in the warp, then the warps in order.
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const MaxSum other{__shfl_xor_sync(0xffffffffu, st.m, o), __shfl_xor_sync(0xffffffffu, st.s, o)};
    st = combine(st, other);
  }
  if (threadIdx.x % kWarp == 0) red[threadIdx.x / kWarp] = st;
  __syncthreads();
  MaxSum tot = red[0];
  for (int w = 1; w < stride / kWarp; ++w) tot = combine(tot, red[w]);
  const float lse2 = tot.m + log2f(tot.s);  // log2 of the sum of 2^(x log2 e)
  if (threadIdx.x == 0) losses[row] = lse2 * kLn2 - xt;
  if (dloss == 0.0f) return;

  const float shift = dloss > 0.0f ? log2f(dloss) - lse2 : 0.0f;
  for (v = threadIdx.x; v + stride < nvec; v += 2 * stride) {
    const BfPack<VW> a = load_pack<VW>(x + v * VW), b = load_pack<VW>(x + (v + stride) * VW);
    float g[VW];
    grad<VW>(g, a, v * VW, V, target, lse2, shift, dloss);
    store_bf16<VW>(x + v * VW, g);
    grad<VW>(g, b, (v + stride) * VW, V, target, lse2, shift, dloss);
    store_bf16<VW>(x + (v + stride) * VW, g);
  }
  if (v < nvec) {
    float g[VW];
    grad<VW>(g, load_pack<VW>(x + v * VW), v * VW, V, target, lse2, shift, dloss);
    store_bf16<VW>(x + v * VW, g);
  }
}

}  // namespace

void crossentropy(float* losses, bf16* logits, const int32_t* targets, float dloss, int N, int V,
                  int Vp, cudaStream_t stream) {
  if (N <= 0) return;
  const bool vec = Vp % 8 == 0 && aligned16(logits);
  const int nvec = vec ? Vp / 8 : Vp;
  const int threads = std::min(kMaxThreads, std::max(kWarp, ceil_div(nvec, kWarp) * kWarp));
  if (vec)
    crossentropy_kernel<8><<<N, threads, 0, stream>>>(losses, logits, targets, dloss, V, Vp);
  else
    crossentropy_kernel<1><<<N, threads, 0, stream>>>(losses, logits, targets, dloss, V, Vp);
  check_launch("crossentropy");
}

}  // namespace myriad::cuda
