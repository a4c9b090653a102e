// Rotary positions, in place on the query and key heads of the fused QKV activation, the CUDA
// side of ops/cpu/rope.cc (rotate-half convention; the value heads are not touched).
//
// One block per token: the cosines and sines depend only on (position, pair), so the block
// tabulates its token's D/2 of them once in shared memory and every query and key head of the
// token rotates with them; the threads then take (head, vector of pairs) items in turn, each item
// a vector of VW pairs: VW elements of the first half and the matching VW of the second half
// (VW = 8: 16-byte accesses; VW = 1 when D/2 % 8 != 0 or qkv is unaligned).
//
// Angles: a = pos * freq in fp64 (the product of an integer below 2^31 and an fp32 frequency is
// exact in a double's 53 bits), and sincos in fp64, rounded to fp32 as the CPU op rounds to
// Real. An fp32 product would be off by up to a * 2^-24 radians (8e-3 for a = 2^17), as much
// as a bf16 rounding; the fp64 work is D/2 sincos per token, shared by all of its heads, so it costs
// nothing measurable next to the memory traffic. What remains different from the CPU op is
// only the frequency, rounded to fp32 by the caller: an angle error of at most pos * freq * 2^-24
// (8e-3 rad at position 2^17 for the fastest pair, freq = 1).
#include <algorithm>

#include "core/error.h"
#include "ops/cuda/kernel_util.cuh"

namespace myriad::cuda {

using namespace detail;

namespace {

constexpr int kThreads = 128;
constexpr int kMaxHalf = 256;  // D <= 512

// grid (B*T), block kThreads. sign = +1 forward, -1 backward (the rotation back).
template <int VW>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(bf16* __restrict__ qkv, const float* __restrict__ freqs, int T, int Hkv, int G,
                int D, int pos0, RowPositions at, float sign) {
  __shared__ float cs[kMaxHalf], sn[kMaxHalf];
  const int half = D / 2;
  const int64_t bt = blockIdx.x;
  const double pos = static_cast<double>(pos0) + static_cast<double>(at(bt % T));
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    double s, c;
    sincos(pos * static_cast<double>(freqs[i]), &s, &c);
    cs[i] = static_cast<float>(c);
    sn[i] = sign * static_cast<float>(s);  // negating after rounding: exactly -sin rounded
  }
  __syncthreads();
  bf16* row = qkv + bt * static_cast<int64_t>(Hkv) * (G + 2) * D;  // (Hkv, G+2, D)
  const int vecs = half / VW;                                      // per head
  const int items = Hkv * (G + 1) * vecs;  // the G query heads and the key head of each group
  for (int it = threadIdx.x; it < items; it += blockDim.x) {
    const int v = it % vecs;
    const int h = it / vecs;  // over the Hkv*(G+1) rotated heads
    const int g = h / (G + 1), j = h % (G + 1);
    bf16* lo = row + (static_cast<int64_t>(g) * (G + 2) + j) * D + v * VW;  // (VW)
    bf16* hi = lo + half;                                                   // (VW)
    float a[VW], b[VW], x[VW], y[VW];
    load_bf16<VW>(a, lo);
    load_bf16<VW>(b, hi);
#pragma unroll
    for (int e = 0; e < VW; ++e) {
      const float c = cs[v * VW + e], s = sn[v * VW + e];
      x[e] = a[e] * c - b[e] * s;
      y[e] = b[e] * c + a[e] * s;
    }
    store_bf16<VW>(lo, x);
    store_bf16<VW>(hi, y);
  }
}

void launch(bf16* qkv, const float* freqs, int B, int T, int Hkv, int G, int D, int pos0, RowPositions at,
            float sign, cudaStream_t stream, const char* what) {
  if (B <= 0 || T <= 0 || Hkv <= 0) return;
  MYRIAD_CHECK(D > 0 && D % 2 == 0 && D / 2 <= kMaxHalf, what, ": head size ", D,
               " must be even and at most ", 2 * kMaxHalf);
  MYRIAD_CHECK(G >= 1, what, ": G = ", G);
  MYRIAD_CHECK(pos0 >= 0, what, ": pos0 = ", pos0);
  const int64_t rows = static_cast<int64_t>(B) * T;
  MYRIAD_CHECK(rows <= 0x7fffffff, what, ": too many rows");
  // 16-byte access to both halves needs D/2 a multiple of 8 (then every head starts aligned).
  if ((D / 2) % 8 == 0 && aligned16(qkv))
    rope_kernel<8><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(qkv, freqs, T, Hkv, G, D,
                                                                          pos0, at, sign);
  else
    rope_kernel<1><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(qkv, freqs, T, Hkv, G, D,
                                                                          pos0, at, sign);
  check_launch(what);
}

}  // namespace

void rope_forward(bf16* qkv, const float* freqs, int B, int T, int Hkv, int G, int D, int pos0,
                  cudaStream_t stream, RowPositions pos) {
  launch(qkv, freqs, B, T, Hkv, G, D, pos0, pos, 1.0f, stream, "rope_forward");
}

void rope_backward(bf16* dqkv, const float* freqs, int B, int T, int Hkv, int G, int D, int pos0,
                   cudaStream_t stream, RowPositions pos) {
  launch(dqkv, freqs, B, T, Hkv, G, D, pos0, pos, -1.0f, stream, "rope_backward");
}

}  // namespace myriad::cuda
