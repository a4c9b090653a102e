// Elementwise ops: GELU forward/backward, add, cast to bf16, in-place scale. 16-byte accesses
// when every pointer is aligned (any n: the last n % VW elements take a scalar tail).
#include <algorithm>

#include "core/error.h"
#include "ops/cuda/activations.cuh"
#include "ops/cuda/kernel_util.cuh"

namespace myriad::cuda {

using namespace detail;

namespace {

constexpr int kThreads = 256;
using activation::kCubic;
using activation::kSqrt2OverPi;

struct GeluForward {
  __device__ float operator()(float x, float) const { return activation::gelu(x); }
};

// d/dx [x s(z)] = s + x s (1 - s) z', z' = 2 sqrt(2/pi) (1 + 3 0.044715 x^2).
struct GeluBackward {
  __device__ float operator()(float x, float dout) const {
    const float x2 = x * x;
    const float z = 2.0f * kSqrt2OverPi * x * (1.0f + kCubic * x2);
    const float s = __fdividef(1.0f, 1.0f + __expf(-z));
    const float dz = 2.0f * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x2);
    return dout * (s + x * s * (1.0f - s) * dz);
  }
};

struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// out[i] = f(x[i], y[i]) over n elements (y may be null for unary f). Vectors of VW, then the
// scalar tail by the first threads of the grid.
// amax: where out's amax goes, or null.
template <int VW, class F>
__global__ void map_kernel(bf16* out, const bf16* x, const bf16* y, int64_t n, F f, unsigned* amax) {
  float m = 0.0f;
  const int64_t nv = n / VW;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  // Two vectors per iteration: both loads in flight before the math.
  for (int64_t i = tid; i < nv; i += 2 * stride) {
    const bool two = i + stride < nv;
    BfPack<VW> a[2], b[2];
    a[0] = load_pack<VW>(x + i * VW);
    b[0] = y ? load_pack<VW>(y + i * VW) : zero_pack<VW>();
    if (two) {
      a[1] = load_pack<VW>(x + (i + stride) * VW);
      b[1] = y ? load_pack<VW>(y + (i + stride) * VW) : zero_pack<VW>();
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      if (u == 1 && !two) break;
      float r[VW];
#pragma unroll
      for (int e = 0; e < VW; ++e) r[e] = f(a[u][e], b[u][e]), m = amax_fold(m, r[e]);
      store_bf16<VW>(out + (i + u * stride) * VW, r);
    }
  }
  const int64_t j = nv * VW + tid;
  if (j < n) {
    const float r = f(__bfloat162float(x[j]), y ? __bfloat162float(y[j]) : 0.0f);
    out[j] = __float2bfloat16(r);
    m = amax_fold(m, r);
  }
  if (amax) amax_publish(amax, m);
}

// Grid-stride kernels get one full wave of blocks (or fewer when there is little work).
template <class K>
int grid_for(K kernel, int64_t vectors) {
  const int wave = resident_blocks(reinterpret_cast<const void*>(kernel), kThreads, 0);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(ceil_div(vectors, kThreads), wave)));
}

template <class F>
void launch_map(bf16* out, const bf16* x, const bf16* y, int64_t n, F f, cudaStream_t stream,
                float* amax = nullptr) {
  unsigned* const a = reinterpret_cast<unsigned*>(amax);
  MYRIAD_CHECK(!a || cudaMemsetAsync(a, 0, sizeof(float), stream) == cudaSuccess, "an elementwise kernel: cannot clear its amax");
  if (all_aligned16(out, x) && (!y || aligned16(y))) {
    auto k = map_kernel<8, F>;
    k<<<grid_for(k, n / 8), kThreads, 0, stream>>>(out, x, y, n, f, a);
  } else {
    auto k = map_kernel<1, F>;
    k<<<grid_for(k, n), kThreads, 0, stream>>>(out, x, y, n, f, a);
  }
}

template <int VW>
__global__ void cast_kernel(bf16* out, const float* in, int64_t n) {
  const int64_t nv = n / VW;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (int64_t i = tid; i < nv; i += 2 * stride) {
    const bool two = i + stride < nv;
    float a[VW], b[VW];
    load_f32<VW>(a, in + i * VW);
    if (two) load_f32<VW>(b, in + (i + stride) * VW);
    store_bf16<VW>(out + i * VW, a);
    if (two) store_bf16<VW>(out + (i + stride) * VW, b);
  }
  const int64_t j = nv * VW + tid;
  if (j < n) out[j] = __float2bfloat16(in[j]);
}

template <int VW>
__global__ void scale_kernel(float* x, const float* scale, int64_t n) {
  const float s = *scale;
  const int64_t nv = n / VW;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (int64_t i = tid; i < nv; i += stride) {
    float a[VW];
    load_f32<VW>(a, x + i * VW);
#pragma unroll
    for (int e = 0; e < VW; ++e) a[e] *= s;
    store_f32<VW>(x + i * VW, a);
  }
  const int64_t j = nv * VW + tid;
  if (j < n) x[j] *= s;
}

}  // namespace

void gelu_forward(bf16* out, const bf16* inp, int64_t n, cudaStream_t stream, float* amax) {
  if (n <= 0 && !amax) return;
  launch_map(out, inp, nullptr, n, GeluForward{}, stream, amax);
  check_launch("gelu_forward");
}

void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int64_t n, cudaStream_t stream, float* amax) {
  if (n <= 0 && !amax) return;
  launch_map(dinp, inp, dout, n, GeluBackward{}, stream, amax);
  check_launch("gelu_backward");
}

// One thread per 8 elements (16 bytes) of a token's QKV; D is a multiple of 8. Element e of a
// token in Myriad's layout: group g = e / ((G+2) D), slot j = e / D % (G+2) (query head g G + j
// for j < G, then k, then v).
template <bool kToHeads>
__global__ void qkv_heads_kernel(bf16* __restrict__ out, const bf16* __restrict__ in, int64_t vectors, int H,
                                 int Hkv, int D) {
  const int G = H / Hkv, per_token = (H + 2 * Hkv) * D / 8;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < vectors; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t token = i / per_token;
    const int e = int(i % per_token) * 8, g = e / ((G + 2) * D), j = e / D % (G + 2), d = e % D;
    const int h = j < G ? 0 : (j == G ? H : H + Hkv);  // where the slot's block starts in the heads' layout
    const int at = (j < G ? (g * G + j) * D : h * D + g * D) + d;
    const int64_t mine = token * per_token * 8 + e, heads = token * per_token * 8 + at;
    const uint4 v = *reinterpret_cast<const uint4*>(in + (kToHeads ? mine : heads));
    *reinterpret_cast<uint4*>(out + (kToHeads ? heads : mine)) = v;
  }
}

template <bool kToHeads>
void qkv_heads(bf16* out, const bf16* in, int64_t tokens, int H, int Hkv, int D, cudaStream_t stream, const char* what) {
  MYRIAD_CHECK(Hkv > 0 && H % Hkv == 0 && D % 8 == 0 && all_aligned16(out, in), what, ": H ", H, " Hkv ", Hkv, " D ", D);
  const int64_t vectors = tokens * (H + 2 * Hkv) * D / 8;
  if (vectors <= 0) return;
  qkv_heads_kernel<kToHeads><<<grid_for(qkv_heads_kernel<kToHeads>, vectors), kThreads, 0, stream>>>(out, in, vectors,
                                                                                                     H, Hkv, D);
  check_launch(what);
}

void qkv_to_heads(bf16* out, const bf16* in, int64_t tokens, int H, int Hkv, int D, cudaStream_t stream) {
  qkv_heads<true>(out, in, tokens, H, Hkv, D, stream, "qkv_to_heads");
}
void qkv_from_heads(bf16* out, const bf16* in, int64_t tokens, int H, int Hkv, int D, cudaStream_t stream) {
  qkv_heads<false>(out, in, tokens, H, Hkv, D, stream, "qkv_from_heads");
}

// One thread per 8 elements (16 bytes) of the columns added.
__global__ void add_token_columns_kernel(bf16* __restrict__ dst, const bf16* __restrict__ src, int64_t vectors,
                                         int64_t rows, int64_t dst_rows, int64_t src_rows, int width, int period,
                                         int c0, int c1) {
  const int per_period = (c1 - c0) / 8, periods = width / period, per_token = periods * per_period;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < vectors; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t token = i / per_token, b = token / rows, t = token % rows;
    const int k = int(i % per_token), j = k / per_period * period + c0 + k % per_period * 8;
    bf16* d = dst + (b * dst_rows + t) * width + j;
    const bf16* s = src + (b * src_rows + t) * width + j;
    uint4 dv = *reinterpret_cast<uint4*>(d);
    const uint4 sv = *reinterpret_cast<const uint4*>(s);
    bf16* de = reinterpret_cast<bf16*>(&dv);
    const bf16* se = reinterpret_cast<const bf16*>(&sv);
#pragma unroll
    for (int e = 0; e < 8; ++e) de[e] = __float2bfloat16(__bfloat162float(de[e]) + __bfloat162float(se[e]));
    *reinterpret_cast<uint4*>(d) = dv;
  }
}

void add_token_columns(bf16* dst, const bf16* src, int B, int64_t rows, int64_t dst_rows, int64_t src_rows,
                       int width, int period, int c0, int c1, cudaStream_t stream) {
  MYRIAD_CHECK(period > 0 && width % period == 0 && period % 8 == 0 && c0 % 8 == 0 && c1 % 8 == 0 && 0 <= c0 &&
                   c0 < c1 && c1 <= period && rows <= dst_rows && rows <= src_rows && all_aligned16(dst, src),
               "add_token_columns: width ", width, " period ", period, " columns [", c0, ", ", c1, ")");
  const int64_t vectors = int64_t(B) * rows * (width / period) * ((c1 - c0) / 8);
  if (vectors <= 0) return;
  add_token_columns_kernel<<<grid_for(add_token_columns_kernel, vectors), kThreads, 0, stream>>>(
      dst, src, vectors, rows, dst_rows, src_rows, width, period, c0, c1);
  check_launch("add_token_columns");
}

void add(bf16* out, const bf16* a, const bf16* b, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  launch_map(out, a, b, n, Add{}, stream);
  check_launch("add");
}

void cast_to_bf16(bf16* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (all_aligned16(out, in))
    cast_kernel<8><<<grid_for(cast_kernel<8>, n / 8), kThreads, 0, stream>>>(out, in, n);
  else
    cast_kernel<1><<<grid_for(cast_kernel<1>, n), kThreads, 0, stream>>>(out, in, n);
  check_launch("cast_to_bf16");
}

void scale_inplace(float* x, const float* scale, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (aligned16(x))
    scale_kernel<4><<<grid_for(scale_kernel<4>, n / 4), kThreads, 0, stream>>>(x, scale, n);
  else
    scale_kernel<1><<<grid_for(scale_kernel<1>, n), kThreads, 0, stream>>>(x, scale, n);
  check_launch("scale_inplace");
}

}  // namespace myriad::cuda
