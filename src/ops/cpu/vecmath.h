// Internal to the CPU backend: small numeric helpers shared by the kernels.
//
// lane_sum: a sum in a fixed order that does not depend on the alignment of the data or on how
// the compiler vectorizes it (an OpenMP simd reduction may peel a loop for alignment, which
// changes which elements meet in which partial sum, hence the bits). Eight partial sums taken
// in source order also make long sums more accurate than a single running sum.
//
// MYRIAD_AVX2_CLONE: compiles a function twice, for AVX2 and for baseline x86-64, and picks
// one when the program loads (GNU target_clones / ifunc). The exp-heavy float loops run twice as
// fast on 8-wide vectors. It is only put on elementwise code and on fixed-order sums (lane_sum),
// whose results do not depend on the vector width; target "avx2" does not enable FMA, and the
// project compiles in ISO mode (no FP contraction), so both versions give the same bits.
//
// The code meant for such a function must be inlined into it to be compiled for AVX2 at all,
// hence MYRIAD_ALWAYS_INLINE on the helpers and kernels it calls.
//
// fast_exp: an exp that the compiler can vectorize.
// glibc's expf is a scalar call, and without -ffast-math GCC will not map it to a vector
// routine; softmax rows, cross-entropy over a large vocabulary and GELU spend most of their time
// in exp, so the float path uses this branch-free version (range reduction by ln 2, a degree-7
// Taylor polynomial on |r| <= ln2/2, exponent built from integer bits; error under 2 ulp).
// It uses only IEEE adds and multiplies (no FMA contraction in the project's ISO C++ mode), so
// it gives the same bits on every x86-64 machine.
// The double path (tests only) keeps std::exp.
//
// How it is written matters for vectorization under GCC's default -ftrapping-math: the
// arithmetic runs unconditionally on the raw x, and out-of-range inputs are patched at the end
// with integer masks. Clamping x first, or a select at the end, lets GCC move the arithmetic
// into a branch, and it may not speculate floating-point operations out of one, so the loop
// would stay scalar. The comparisons are the quiet ones (std::isless) for the same reason.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__x86_64__) && defined(__ELF__) && (defined(__GNUC__) || defined(__clang__))
#define MYRIAD_AVX2_CLONE __attribute__((target_clones("avx2", "default")))
#else
#define MYRIAD_AVX2_CLONE
#endif
#define MYRIAD_ALWAYS_INLINE inline __attribute__((always_inline))

namespace myriad::cpu::detail {

MYRIAD_ALWAYS_INLINE float fast_exp(float x) {
  // n = round(x / ln2) by adding 1.5 * 2^23 (exact under round-to-nearest); the low bits of t
  // then hold n + 2^22 as an integer, which gives 2^n without a float to int conversion.
  const float shifter = 12582912.0f;
  const float t = x * 1.44269504088896341f + shifter;
  const float n = t - shifter;
  // r = x - n ln2, with ln2 split so that n * hi is exact; |r| <= ln2 / 2.
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.0f / 5040.0f + r * (1.0f / 40320.0f);
  p = 1.0f / 720.0f + r * p;
  p = 1.0f / 120.0f + r * p;
  p = 1.0f / 24.0f + r * p;
  p = 1.0f / 6.0f + r * p;
  p = 0.5f + r * p;
  p = 1.0f + r * p;
  p = 1.0f + r * p;
  // Unsigned, so that garbage from out-of-range x (patched below) wraps instead of overflowing.
  const uint32_t bits = (std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(shifter) + 127u)
                        << 23;
  const float v = p * std::bit_cast<float>(bits);  // valid while 2^n is a normal float
  // Below -87 the result would leave the normal range (flush to 0); above 88 it would overflow
  // (give inf). Patched with bit masks: with a select, GCC sinks the arithmetic into a branch.
  const uint32_t under = 0u - static_cast<uint32_t>(std::isless(x, -87.0f));   // all ones or 0
  const uint32_t over = 0u - static_cast<uint32_t>(std::isgreater(x, 88.0f));  // all ones or 0
  const uint32_t inf_bits = 0x7f800000u;
  const uint32_t out = (std::bit_cast<uint32_t>(v) & ~(under | over)) | (inf_bits & over);
  return std::bit_cast<float>(out);  // NaN in, NaN out (p is NaN)
}

// Sum of f(i) for i in [0, n): element i goes to partial sum i % 8, partials combined pairwise.
template <class Real, class F>
MYRIAD_ALWAYS_INLINE Real lane_sum(int64_t n, F f) {
  Real acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) acc[k] += f(i + k);
  }
  for (int k = 0; i < n; ++i, ++k) acc[k] += f(i);
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// Largest of x[0..n), n >= 1 (ties and order do not matter, so it can run in any order).
// The quiet comparison lets GCC vectorize it (see fast_exp). It may skip a NaN, but callers
// then take exp(x - m) of every element, which carries the NaN on.
template <class Real>
MYRIAD_ALWAYS_INLINE Real max_of(const Real* x, int64_t n) {
  Real m = x[0];
#pragma omp simd reduction(max : m)
  for (int64_t j = 1; j < n; ++j) m = std::isgreater(x[j], m) ? x[j] : m;
  return m;
}

MYRIAD_ALWAYS_INLINE float exp_real(float x) { return fast_exp(x); }
MYRIAD_ALWAYS_INLINE double exp_real(double x) { return std::exp(x); }

// Softmax's denominator: the sum of exp(x[j] - m) over j in [0, n), in chunks of kExpChunk, each
// chunk a lane sum, chunks in order (so the full-vocabulary cross-entropy and the vocabulary-
// parallel one's partial sums take the same bits from the same logits). With `out`, the exps are
// also written to out[0..n) (out may be x: each element is read before it is written).
constexpr int kExpChunk = 256;
template <class Real>
MYRIAD_ALWAYS_INLINE Real exp_sum(const Real* x, int64_t n, Real m, Real* out = nullptr) {
  Real buf[kExpChunk];
  Real sum = 0;
  for (int64_t j0 = 0; j0 < n; j0 += kExpChunk) {
    const int len = static_cast<int>(std::min<int64_t>(kExpChunk, n - j0));
    Real* e = out ? out + j0 : buf;
    const Real* xs = x + j0;
#pragma omp simd
    for (int j = 0; j < len; ++j) e[j] = exp_real(xs[j] - m);
    sum += lane_sum<Real>(len, [e](int64_t j) { return e[j]; });
  }
  return sum;
}

}  // namespace myriad::cpu::detail
