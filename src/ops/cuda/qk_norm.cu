// The queries' and keys' RMSNorm on the device (model.qk_norm; the CPU oracle is
// ops/cpu/qk_norm.cc, whose contract cpu_ops.h states). A segment is one head's D features
// (kHead, Qwen3's: one weight of D for every query head, one for every key head) or a token's
// whole query or key block (kAll, OLMoE's: weights of H D and Hkv D), walked head by head in
// canonical order; the heads sit in qkv's (Hkv, G+2, D) layout per token. Sums in fp32 in a
// fixed order (a warp's butterfly, then warps in order), so results repeat bitwise.
#include "core/error.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/ops.cuh"

namespace myriad::cuda {

using namespace detail;

namespace {

// Where token n's query head h (h = g G + j) and key head g start in qkv.
struct Heads {
  int Hkv, G, D;
  __device__ int64_t row() const { return int64_t(Hkv) * (G + 2) * D; }
  __device__ int64_t query(int64_t n, int h) const { return n * row() + (int64_t(h / G) * (G + 2) + h % G) * D; }
  __device__ int64_t key(int64_t n, int g) const { return n * row() + (int64_t(g) * (G + 2) + G) * D; }
};

constexpr int kThreads = 128;

// The sum of v over the block, every thread gets it; red holds kThreads / 32 floats.
__device__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0;
  for (int i = 0; i < kThreads / kWarp; ++i) s += red[i];
  return s;
}

// Element i of segment s of token n (its place in qkv), and its weight.
struct Segment {
  Heads at;
  int H;
  bool per_head;
  __device__ int count(int s) const { return per_head ? at.D : (s == 0 ? H : at.Hkv) * at.D; }
  __device__ int64_t place(int64_t n, int s, int i) const {
    const int h = i / at.D, d = i % at.D;
    if (per_head) return (s < H ? at.query(n, s) : at.key(n, s - H)) + d;
    return (s == 0 ? at.query(n, h) : at.key(n, h)) + d;
  }
  __device__ bool keys(int s) const { return per_head ? s >= H : s == 1; }
};

// One block per token: each segment's rstd, the normalized q and k, v copied.
__global__ void qk_norm_forward_kernel(bf16* qkv, float* rstd, const bf16* __restrict__ raw, const bf16* __restrict__ wq,
                                       const bf16* __restrict__ wk, Segment sg, float eps) {
  __shared__ float red[kThreads / kWarp];
  const int64_t n = blockIdx.x;
  const int segments = sg.per_head ? sg.H + sg.at.Hkv : 2;
  for (int s = 0; s < segments; ++s) {
    const int c = sg.count(s);
    const bf16* w = sg.keys(s) ? wk : wq;
    float ss = 0;
    for (int i = threadIdx.x; i < c; i += blockDim.x) {
      const float x = __bfloat162float(raw[sg.place(n, s, i)]);
      ss += x * x;
    }
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / float(c) + eps);
    if (threadIdx.x == 0) rstd[n * segments + s] = inv;
    for (int i = threadIdx.x; i < c; i += blockDim.x) {
      const int64_t p = sg.place(n, s, i);
      qkv[p] = __float2bfloat16(__bfloat162float(raw[p]) * inv * __bfloat162float(w[i]));
    }
  }
  const Heads& at = sg.at;
  for (int i = threadIdx.x; i < at.Hkv * at.D; i += blockDim.x) {
    const int64_t p = at.key(n, i / at.D) + at.D + i % at.D;  // value head g follows key head g
    qkv[p] = raw[p];
  }
}

// dw[j] += the sum over tokens (and, per head, over the segments that share it) of dy x^, for
// the query weights (keys = false) or the key weights: one block per weight element.
__global__ void qk_norm_dw_kernel(float* dw, const bf16* __restrict__ dqkv, const bf16* __restrict__ raw,
                                  const float* __restrict__ rstd, Segment sg, int N, bool keys) {
  __shared__ float red[kThreads / kWarp];
  const int j = blockIdx.x;
  const int segments = sg.per_head ? sg.H + sg.at.Hkv : 2;
  // The segments this weight serves: per head, the H query heads or the Hkv key heads.
  const int first = sg.per_head ? (keys ? sg.H : 0) : (keys ? 1 : 0);
  const int span = sg.per_head ? (keys ? sg.at.Hkv : sg.H) : 1;
  float acc = 0;
  for (int64_t idx = threadIdx.x; idx < int64_t(N) * span; idx += blockDim.x) {
    const int64_t n = idx / span;
    const int s = first + static_cast<int>(idx % span);
    const int64_t p = sg.place(n, s, j);
    acc += __bfloat162float(dqkv[p]) * __bfloat162float(raw[p]) * rstd[n * segments + s];
  }
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) dw[j] += acc;
}

// One block per token: dx = r (w dy - x^ mean(x^ w dy)) over each segment, written over dy.
__global__ void qk_norm_dx_kernel(bf16* dqkv, const bf16* __restrict__ raw, const bf16* __restrict__ wq,
                                  const bf16* __restrict__ wk, const float* __restrict__ rstd, Segment sg) {
  __shared__ float red[kThreads / kWarp];
  const int64_t n = blockIdx.x;
  const int segments = sg.per_head ? sg.H + sg.at.Hkv : 2;
  for (int s = 0; s < segments; ++s) {
    const int c = sg.count(s);
    const bf16* w = sg.keys(s) ? wk : wq;
    const float r = rstd[n * segments + s];
    float dot = 0;
    for (int i = threadIdx.x; i < c; i += blockDim.x) {
      const int64_t p = sg.place(n, s, i);
      dot += __bfloat162float(raw[p]) * r * __bfloat162float(w[i]) * __bfloat162float(dqkv[p]);
    }
    const float mean = block_sum(dot, red) / float(c);
    for (int i = threadIdx.x; i < c; i += blockDim.x) {
      const int64_t p = sg.place(n, s, i);
      const float xh = __bfloat162float(raw[p]) * r, gw = __bfloat162float(w[i]) * __bfloat162float(dqkv[p]);
      dqkv[p] = __float2bfloat16(r * (gw - xh * mean));
    }
  }
}

}  // namespace

void qk_norm_forward(bool per_head, bf16* qkv, float* rstd, const bf16* raw, const bf16* wq, const bf16* wk, int N,
                     int Hkv, int G, int D, float eps, cudaStream_t stream) {
  if (N <= 0) return;
  const Segment sg{{Hkv, G, D}, Hkv * G, per_head};
  qk_norm_forward_kernel<<<N, kThreads, 0, stream>>>(qkv, rstd, raw, wq, wk, sg, eps);
  check_launch("qk_norm_forward");
}

void qk_norm_backward(bool per_head, bf16* dqkv, float* dwq, float* dwk, const bf16* raw, const bf16* wq,
                      const bf16* wk, const float* rstd, int N, int Hkv, int G, int D, cudaStream_t stream) {
  if (N <= 0) return;
  const int H = Hkv * G;
  const Segment sg{{Hkv, G, D}, H, per_head};
  // The weights' gradients first: they read dy, which the inputs' gradient then overwrites.
  if (dwq) qk_norm_dw_kernel<<<per_head ? D : H * D, kThreads, 0, stream>>>(dwq, dqkv, raw, rstd, sg, N, false);
  if (dwk) qk_norm_dw_kernel<<<per_head ? D : Hkv * D, kThreads, 0, stream>>>(dwk, dqkv, raw, rstd, sg, N, true);
  check_launch("qk_norm_backward dw");
  qk_norm_dx_kernel<<<N, kThreads, 0, stream>>>(dqkv, raw, wq, wk, rstd, sg);
  check_launch("qk_norm_backward dx");
}

}  // namespace myriad::cuda
