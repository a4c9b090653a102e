// Fused optimizers over the flat fp32 parameter buffer: one launch covers every tensor. Each
// block takes a contiguous chunk of elements; a thread finds the tensor (segment) of its first
// element by binary search and walks forward from there (its elements ascend).
#include "ops/cuda/kernel_util.cuh"

namespace myriad::cuda {

using namespace detail;

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;                         // float4s per thread
constexpr int kChunk = kThreads * 4 * kUnroll;     // elements per block

// Tracks the segment of ascending element indices: segments[i] <= j < segments[i + 1].
struct SegmentCursor {
  const int64_t* segments;
  int i;
  int64_t end;
  __device__ SegmentCursor(const int64_t* s, int count, int64_t j) : segments(s) {
    int lo = 0, hi = count - 1;  // last i with segments[i] <= j
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (s[mid] <= j) lo = mid; else hi = mid - 1;
    }
    i = lo;
    end = s[i + 1];
  }
  // Moves to the segment of j (>= every earlier j); true when the segment changed.
  __device__ bool seek(int64_t j) {
    if (j < end) return false;
    do end = segments[++i + 1]; while (j >= end);
    return true;
  }
};

// The CPU optimizer's arithmetic, in its order.
__device__ __forceinline__ float adam_direction(float& m, float& v, float g, const AdamParams& p) {
  g *= p.grad_scale;
  m = p.beta1 * m + (1.0f - p.beta1) * g;
  v = p.beta2 * v + (1.0f - p.beta2) * g * g;
  return (m / p.c1) / (sqrtf(v / p.c2) + p.eps);
}

// One element or a float4 of elements; VW in {1, 4}. Elements past `total` are skipped.
template <int VW>
__device__ __forceinline__ bool load_group(float (&w)[VW], float (&m)[VW], float (&v)[VW],
                                           float (&g)[VW], const float* W, const float* M,
                                           const float* Vv, const float* G, int64_t j,
                                           int64_t total) {
  if (j + VW <= total) {
    load_f32<VW>(w, W + j), load_f32<VW>(m, M + j), load_f32<VW>(v, Vv + j), load_f32<VW>(g, G + j);
    return true;
  }
#pragma unroll
  for (int e = 0; e < VW; ++e) {
    const bool in = j + e < total;
    w[e] = in ? W[j + e] : 0.0f, m[e] = in ? M[j + e] : 0.0f;
    v[e] = in ? Vv[j + e] : 0.0f, g[e] = in ? G[j + e] : 0.0f;
  }
  return false;
}

template <int VW>
__global__ void adamw_kernel(float* __restrict__ W, bf16* __restrict__ Wb, float* __restrict__ M,
                             float* __restrict__ Vv, const float* __restrict__ G,
                             const int64_t* __restrict__ segments, const uint8_t* __restrict__ decay,
                             int count, int64_t total, AdamParams p) {
  const int64_t j0 = blockIdx.x * int64_t(kThreads * VW * kUnroll) + threadIdx.x * int64_t(VW);
  if (j0 >= total) return;
  SegmentCursor cur(segments, count, j0);
  const float decayed = 1.0f - p.lr * p.weight_decay;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t j = j0 + int64_t(u) * kThreads * VW;
    if (j >= total) break;
    float w[VW], m[VW], v[VW], g[VW];
    const bool full = load_group<VW>(w, m, v, g, W, M, Vv, G, j, total);
#pragma unroll
    for (int e = 0; e < VW; ++e) {
      if (j + e >= total) break;  // the cursor must not walk past the last segment
      cur.seek(j + e);
      const float dir = adam_direction(m[e], v[e], g[e], p);
      w[e] = w[e] * (decay[cur.i] ? decayed : 1.0f) - p.lr * dir;
    }
    if (full) {
      store_f32<VW>(W + j, w), store_f32<VW>(M + j, m), store_f32<VW>(Vv + j, v);
      if (Wb) store_bf16<VW>(Wb + j, w);
    } else {
      for (int e = 0; e < VW && j + e < total; ++e) {
        W[j + e] = w[e], M[j + e] = m[e], Vv[j + e] = v[e];
        if (Wb) Wb[j + e] = __float2bfloat16(w[e]);
      }
    }
  }
}

// LAMB pass 1: moments and update u = adam direction + wd_i w.
template <int VW>
__global__ void lamb_update_kernel(const float* __restrict__ W, float* __restrict__ M,
                                   float* __restrict__ Vv, const float* __restrict__ G,
                                   float* __restrict__ U, const int64_t* __restrict__ segments,
                                   const uint8_t* __restrict__ decay, int count, int64_t total,
                                   AdamParams p) {
  const int64_t j0 = blockIdx.x * int64_t(kThreads * VW * kUnroll) + threadIdx.x * int64_t(VW);
  if (j0 >= total) return;
  SegmentCursor cur(segments, count, j0);
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t j = j0 + int64_t(u) * kThreads * VW;
    if (j >= total) break;
    float w[VW], m[VW], v[VW], g[VW];
    const bool full = load_group<VW>(w, m, v, g, W, M, Vv, G, j, total);
#pragma unroll
    for (int e = 0; e < VW; ++e) {
      if (j + e >= total) break;
      cur.seek(j + e);
      const float wd = decay[cur.i] ? p.weight_decay : 0.0f;
      w[e] = adam_direction(m[e], v[e], g[e], p) + wd * w[e];  // w[] now holds u
    }
    if (full) {
      store_f32<VW>(M + j, m), store_f32<VW>(Vv + j, v), store_f32<VW>(U + j, w);
    } else {
      for (int e = 0; e < VW && j + e < total; ++e) M[j + e] = m[e], Vv[j + e] = v[e], U[j + e] = w[e];
    }
  }
}

// LAMB pass 2: w -= lr trust_i u, trust_i = ||w_i|| / ||u_i|| (1 when either is 0).
template <int VW>
__global__ void lamb_apply_kernel(float* __restrict__ W, bf16* __restrict__ Wb,
                                  const float* __restrict__ U, const float* __restrict__ wn2,
                                  const float* __restrict__ un2, const int64_t* __restrict__ segments,
                                  int count, int64_t total, float lr) {
  const int64_t j0 = blockIdx.x * int64_t(kThreads * VW * kUnroll) + threadIdx.x * int64_t(VW);
  if (j0 >= total) return;
  SegmentCursor cur(segments, count, j0);
  const auto step_of = [&](int i) {
    const float a = wn2[i], b = un2[i];
    return lr * (a > 0.0f && b > 0.0f ? sqrtf(a) / sqrtf(b) : 1.0f);
  };
  float step = step_of(cur.i);
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t j = j0 + int64_t(u) * kThreads * VW;
    if (j >= total) break;
    float w[VW], d[VW];
    const bool full = j + VW <= total;
    if (full) {
      load_f32<VW>(w, W + j), load_f32<VW>(d, U + j);
    } else {
#pragma unroll
      for (int e = 0; e < VW; ++e) w[e] = j + e < total ? W[j + e] : 0.0f, d[e] = j + e < total ? U[j + e] : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < VW; ++e) {
      if (j + e >= total) break;
      if (cur.seek(j + e)) step = step_of(cur.i);
      w[e] -= step * d[e];
    }
    if (full) {
      store_f32<VW>(W + j, w);
      if (Wb) store_bf16<VW>(Wb + j, w);
    } else {
      for (int e = 0; e < VW && j + e < total; ++e) {
        W[j + e] = w[e];
        if (Wb) Wb[j + e] = __float2bfloat16(w[e]);
      }
    }
  }
}

bool vec_ok(const float* a, const float* b, const float* c, const float* d, const bf16* wb) {
  return all_aligned16(a, b, c, d) && (reinterpret_cast<uintptr_t>(wb) & 7u) == 0;
}

unsigned blocks_for(int64_t total, int vw) {
  return static_cast<unsigned>((total + int64_t(kThreads) * vw * kUnroll - 1) /
                               (int64_t(kThreads) * vw * kUnroll));
}

}  // namespace

void adamw_step(float* w, bf16* w_bf16, float* m, float* v, const float* g,
                const int64_t* segments, const uint8_t* decay, int count, int64_t total,
                AdamParams p, cudaStream_t stream) {
  if (total <= 0 || count <= 0) return;
  if (vec_ok(w, m, v, g, w_bf16))
    adamw_kernel<4><<<blocks_for(total, 4), kThreads, 0, stream>>>(w, w_bf16, m, v, g, segments,
                                                                   decay, count, total, p);
  else
    adamw_kernel<1><<<blocks_for(total, 1), kThreads, 0, stream>>>(w, w_bf16, m, v, g, segments,
                                                                   decay, count, total, p);
  check_launch("adamw_step");
}

size_t lamb_scratch_floats(int64_t total, int count) {
  return 2 * static_cast<size_t>(count) + sumsq_scratch_floats(total, count);
}

void lamb_direction(const float* w, float* m, float* v, const float* g, float* update,
                    const int64_t* segments, const uint8_t* decay, int count, int64_t total,
                    AdamParams p, cudaStream_t stream) {
  if (total <= 0 || count <= 0) return;
  if (all_aligned16(w, m, v, g) && aligned16(update))
    lamb_update_kernel<4><<<blocks_for(total, 4), kThreads, 0, stream>>>(w, m, v, g, update,
                                                                         segments, decay, count,
                                                                         total, p);
  else
    lamb_update_kernel<1><<<blocks_for(total, 1), kThreads, 0, stream>>>(w, m, v, g, update,
                                                                         segments, decay, count,
                                                                         total, p);
  check_launch("lamb_step (update)");
}

void lamb_apply(float* w, bf16* w_bf16, const float* update, const float* wn2, const float* un2,
                const int64_t* segments, int count, int64_t total, float lr, cudaStream_t stream) {
  if (total <= 0 || count <= 0) return;
  if (vec_ok(w, update, update, update, w_bf16))
    lamb_apply_kernel<4><<<blocks_for(total, 4), kThreads, 0, stream>>>(w, w_bf16, update, wn2,
                                                                        un2, segments, count,
                                                                        total, lr);
  else
    lamb_apply_kernel<1><<<blocks_for(total, 1), kThreads, 0, stream>>>(w, w_bf16, update, wn2,
                                                                        un2, segments, count,
                                                                        total, lr);
  check_launch("lamb_step (apply)");
}

void lamb_step(float* w, bf16* w_bf16, float* m, float* v, const float* g, float* update,
               float* scratch, const int64_t* segments, const uint8_t* decay, int count,
               int64_t total, AdamParams p, cudaStream_t stream) {
  if (total <= 0 || count <= 0) return;
  float* wn2 = scratch;          // (count) ||w_i||^2
  float* un2 = scratch + count;  // (count) ||u_i||^2
  float* rest = scratch + 2 * count;
  lamb_direction(w, m, v, g, update, segments, decay, count, total, p, stream);
  segment_sum_squares(wn2, rest, w, segments, count, total, stream);
  segment_sum_squares(un2, rest, update, segments, count, total, stream);
  lamb_apply(w, w_bf16, update, wn2, un2, segments, count, total, p.lr, stream);
}

}  // namespace myriad::cuda
