// Softmax cross-entropy over the first V of Vp columns, parallel over rows (rows are
// independent, so the result does not depend on the thread count).
// With a large vocabulary the time goes into exp, so each row takes as few exp passes as it
// can: the forward one (after the max), the backward one too: it writes exp(x - max) into
// dlogits while summing, then scales. The exps use the vectorizable fast_exp, and the row
// functions are also compiled for AVX2 (MYRIAD_AVX2_CLONE; elementwise work and fixed-order
// lane sums, so the same bits either way). Sums run chunk by chunk, each chunk a lane sum,
// chunks in order, in both passes alike. The backward reads each logit before it writes the
// same element, so dlogits may be logits itself (the target's logit is saved first).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/cpu/ops.h"
#include "ops/cpu/vecmath.h"

namespace myriad::cpu {

namespace {

// -log softmax(x)[t] over x[0..V).
template <class Real>
MYRIAD_ALWAYS_INLINE Real row_loss(const Real* x, int t, int V) {
  const Real m = detail::max_of(x, V);
  return std::log(detail::exp_sum(x, V, m)) - (x[t] - m);
}

// d[0..Vp) = (softmax(x[0..V)) - onehot(t)) * dl, zero on the padding; d may be x.
template <class Real>
MYRIAD_ALWAYS_INLINE void row_grad(Real* d, const Real* x, int t, Real dl, int V, int Vp) {
  const Real xt = x[t];
  const Real m = detail::max_of(x, V);
  const Real sum = detail::exp_sum(x, V, m, d);  // d[j] = exp(x[j] - m) for now
  const Real inv = Real(1) / sum;
  const Real scale = inv * dl;
#pragma omp simd
  for (int j = 0; j < V; ++j) d[j] *= scale;
  d[t] = (detail::exp_real(xt - m) * inv - Real(1)) * dl;
  std::fill(d + V, d + Vp, Real(0));
}

MYRIAD_AVX2_CLONE float row_loss_kernel(const float* x, int t, int V) { return row_loss(x, t, V); }
double row_loss_kernel(const double* x, int t, int V) { return row_loss(x, t, V); }
MYRIAD_AVX2_CLONE void row_grad_kernel(float* d, const float* x, int t, float dl, int V, int Vp) {
  row_grad(d, x, t, dl, V, Vp);
}
void row_grad_kernel(double* d, const double* x, int t, double dl, int V, int Vp) {
  row_grad(d, x, t, dl, V, Vp);
}

}  // namespace

template <class Real>
void crossentropy_forward(Real* losses, const Real* logits, const int32_t* targets, int N, int V,
                          int Vp) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    losses[n] = targets[n] < 0 ? Real(0) : row_loss_kernel(logits + static_cast<int64_t>(n) * Vp, targets[n], V);
  }
}

template <class Real>
void crossentropy_backward(Real* dlogits, const Real* logits, const int32_t* targets,
                           const Real* dlosses, int N, int V, int Vp) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const int64_t off = static_cast<int64_t>(n) * Vp;
    if (targets[n] < 0)
      std::fill(dlogits + off, dlogits + off + Vp, Real(0));
    else
      row_grad_kernel(dlogits + off, logits + off, targets[n], dlosses[n], V, Vp);
  }
}

template void crossentropy_forward<float>(float*, const float*, const int32_t*, int, int, int);
template void crossentropy_forward<double>(double*, const double*, const int32_t*, int, int, int);
template void crossentropy_backward<float>(float*, const float*, const int32_t*, const float*, int,
                                           int, int);
template void crossentropy_backward<double>(double*, const double*, const int32_t*, const double*,
                                            int, int, int);

}  // namespace myriad::cpu
