// SwiGLU, out = silu(gate) * up, on the interleaved (F,2) output of the fused gate/up GEMM.
// Elementwise per feature, so a static split into contiguous spans of features cannot change the
// bits. As in gelu.cc the float loops use the vectorizable fast_exp and are also compiled for
// AVX2 (MYRIAD_AVX2_CLONE), which gives the same bits.
// The backward needs sigmoid(g) and 1 - sigmoid(g) both to full precision (the latter is tiny
// for large g): from t = exp(-|g|), which never overflows, and r = 1 / (1 + t), they are r and
// t r in one order or the other depending on the sign of g.
// d silu / dg = sigmoid(g) (1 + g (1 - sigmoid(g))).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/cpu/ops.h"
#include "ops/cpu/vecmath.h"

namespace myriad::cpu {

namespace {

constexpr int64_t kParallelMin = 1 << 14;  // features; below this, threads cost more than they save

// One contiguous span of [0, n) per thread; f(begin, end).
template <class F>
void parallel_spans(int64_t n, F f) {
#pragma omp parallel if (n >= kParallelMin)
  {
    const int64_t threads = omp_get_num_threads();
    const int64_t per = ((n + threads - 1) / threads + 15) / 16 * 16;
    const int64_t begin = std::min(n, per * omp_get_thread_num());
    const int64_t end = std::min(n, begin + per);
    if (begin < end) f(begin, end);
  }
}

template <class Real>
MYRIAD_ALWAYS_INLINE void swiglu_forward_span(Real* out, const Real* gu, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const Real g = gu[2 * i];
    const Real u = gu[2 * i + 1];
    out[i] = g / (Real(1) + detail::exp_real(-g)) * u;
  }
}

template <class Real>
MYRIAD_ALWAYS_INLINE void swiglu_backward_span(Real* dgu, const Real* gu, const Real* dout,
                                               int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const Real g = gu[2 * i];
    const Real u = gu[2 * i + 1];
    const Real t = detail::exp_real(-std::abs(g));
    const Real r = Real(1) / (Real(1) + t);
    const Real tr = t * r;
    const bool neg = std::isless(g, Real(0));  // quiet compare: stays vectorized
    const Real sig = neg ? tr : r;
    const Real one_minus_sig = neg ? r : tr;
    const Real d = dout[i];
    dgu[2 * i] += d * u * (sig * (Real(1) + g * one_minus_sig));
    dgu[2 * i + 1] += d * (g * sig);
  }
}

// float: also compiled for AVX2; double (tests only): baseline.
MYRIAD_AVX2_CLONE void swiglu_forward_kernel(float* out, const float* gu, int64_t n) {
  swiglu_forward_span(out, gu, n);
}
void swiglu_forward_kernel(double* out, const double* gu, int64_t n) {
  swiglu_forward_span(out, gu, n);
}
MYRIAD_AVX2_CLONE void swiglu_backward_kernel(float* dgu, const float* gu, const float* dout,
                                              int64_t n) {
  swiglu_backward_span(dgu, gu, dout, n);
}
void swiglu_backward_kernel(double* dgu, const double* gu, const double* dout, int64_t n) {
  swiglu_backward_span(dgu, gu, dout, n);
}

}  // namespace

// (N,F) and (N,F,2) are one flat run of N*F features: split that, not rows.
template <class Real>
void swiglu_forward(Real* out, const Real* gu, int64_t N, int64_t F) {
  parallel_spans(N * F, [=](int64_t i0, int64_t i1) {
    swiglu_forward_kernel(out + i0, gu + 2 * i0, i1 - i0);
  });
}

template <class Real>
void swiglu_backward(Real* dgu, const Real* gu, const Real* dout, int64_t N, int64_t F) {
  parallel_spans(N * F, [=](int64_t i0, int64_t i1) {
    swiglu_backward_kernel(dgu + 2 * i0, gu + 2 * i0, dout + i0, i1 - i0);
  });
}

template void swiglu_forward<float>(float*, const float*, int64_t, int64_t);
template void swiglu_forward<double>(double*, const double*, int64_t, int64_t);
template void swiglu_backward<float>(float*, const float*, const float*, int64_t, int64_t);
template void swiglu_backward<double>(double*, const double*, const double*, int64_t, int64_t);

}  // namespace myriad::cpu
