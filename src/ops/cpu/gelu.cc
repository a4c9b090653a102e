// GELU (tanh approximation) and the residual add: elementwise, parallel and vectorized.
// 0.5 x (1 + tanh(u)) is computed as x * s with s = sigmoid(2u) = 1 / (1 + exp(-2u)), the same
// function written with a single exp, which the float path evaluates with the vectorizable
// fast_exp (glibc's tanhf is a scalar call, several times slower). The backward is the exact
// derivative, s + x * 2 s (1 - s) u'. It takes t = exp(-|2u|), which never overflows, so that
// with r = 1 / (1 + t): s (1 - s) = t r^2, and s is r or t r depending on the sign of u; both
// keep full precision where s is close to 0 or 1.
// The float loops are compiled for AVX2 too (MYRIAD_AVX2_CLONE): elementwise, same bits.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/cpu/ops.h"
#include "ops/cpu/vecmath.h"

namespace myriad::cpu {

namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kCubic = 0.044715;
constexpr int64_t kParallelMin = 1 << 14;  // below this, threads cost more than they save

// Splits [0, n) into one contiguous span per thread (static, so elementwise results cannot
// depend on it anyway) and calls f(begin, end) on each.
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
MYRIAD_ALWAYS_INLINE void gelu_forward_span(Real* out, const Real* inp, int64_t n) {
  const Real a = static_cast<Real>(-2.0 * kSqrt2OverPi);
  const Real b = static_cast<Real>(-2.0 * kSqrt2OverPi * kCubic);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const Real x = inp[i];
    const Real e = detail::exp_real(x * (a + b * x * x));  // exp(-2u)
    out[i] = x / (Real(1) + e);
  }
}

template <class Real>
MYRIAD_ALWAYS_INLINE void gelu_backward_span(Real* dinp, const Real* inp, const Real* dout,
                                             int64_t n) {
  const Real a = static_cast<Real>(-2.0 * kSqrt2OverPi);
  const Real b = static_cast<Real>(-2.0 * kSqrt2OverPi * kCubic);
  const Real two_du0 = static_cast<Real>(2.0 * kSqrt2OverPi);               // 2 du/dx at x = 0
  const Real two_du2 = static_cast<Real>(2.0 * kSqrt2OverPi * 3 * kCubic);  // its x^2 term
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const Real x = inp[i];
    const Real x2 = x * x;
    const Real z = x * (a + b * x2);  // -2u
    const Real t = detail::exp_real(-std::abs(z));
    const Real r = Real(1) / (Real(1) + t);
    const Real tr = t * r;
    const Real s = std::islessequal(z, Real(0)) ? r : tr;  // quiet compare: stays vectorized
    const Real grad = s + x * (tr * r) * (two_du0 + two_du2 * x2);
    dinp[i] += grad * dout[i];
  }
}

// float: also compiled for AVX2; double (tests only): baseline.
MYRIAD_AVX2_CLONE void gelu_forward_kernel(float* out, const float* inp, int64_t n) {
  gelu_forward_span(out, inp, n);
}
void gelu_forward_kernel(double* out, const double* inp, int64_t n) {
  gelu_forward_span(out, inp, n);
}
MYRIAD_AVX2_CLONE void gelu_backward_kernel(float* dinp, const float* inp, const float* dout,
                                            int64_t n) {
  gelu_backward_span(dinp, inp, dout, n);
}
void gelu_backward_kernel(double* dinp, const double* inp, const double* dout, int64_t n) {
  gelu_backward_span(dinp, inp, dout, n);
}

}  // namespace

template <class Real>
void gelu_forward(Real* out, const Real* inp, int64_t n) {
  parallel_spans(n,
                 [=](int64_t i0, int64_t i1) { gelu_forward_kernel(out + i0, inp + i0, i1 - i0); });
}

template <class Real>
void gelu_backward(Real* dinp, const Real* inp, const Real* dout, int64_t n) {
  parallel_spans(n, [=](int64_t i0, int64_t i1) {
    gelu_backward_kernel(dinp + i0, inp + i0, dout + i0, i1 - i0);
  });
}

template <class Real>
void residual_forward(Real* out, const Real* a, const Real* b, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template void gelu_forward<float>(float*, const float*, int64_t);
template void gelu_forward<double>(double*, const double*, int64_t);
template void gelu_backward<float>(float*, const float*, const float*, int64_t);
template void gelu_backward<double>(double*, const double*, const double*, int64_t);
template void residual_forward<float>(float*, const float*, const float*, int64_t);
template void residual_forward<double>(double*, const double*, const double*, int64_t);

}  // namespace myriad::cpu
