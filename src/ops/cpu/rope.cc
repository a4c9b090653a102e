// Rotary positions on the query and key heads of the fused QKV activation, in place.
// The cosines and sines depend only on (position, pair), not on the batch row or the head, so
// they are tabulated once per call, (T, D/2) each, in double and rounded to Real; every head of
// every row then rotates with the same numbers. Rows go in parallel (static split; each row is
// independent and elementwise, so the bits cannot depend on the thread count). The table and
// the rotation share one parallel region, so the threads wake once a call: at the demo's size
// both are smaller than a wake-up.
#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/cpu/ops.h"

namespace myriad::cpu {

namespace {

// Rotates the query and key heads of every row by +angle (forward) or -angle (backward: the
// transpose of a rotation is the rotation back).
template <class Real>
void rope_rotate(Real* qkv, const double* freqs, int B, int T, int Hkv, int G, int D, int pos0,
                 const ContextRows* rows, bool inverse) {
  const int half = D / 2;
  const int64_t row_stride = static_cast<int64_t>(Hkv) * (G + 2) * D;
  std::vector<Real> cos_tab(static_cast<size_t>(T) * half);  // (T, D/2)
  std::vector<Real> sin_tab(static_cast<size_t>(T) * half);  // (T, D/2), negated when inverse
#pragma omp parallel
  {
#pragma omp for schedule(static)
  for (int t = 0; t < T; ++t) {
    const double p = static_cast<double>(rows ? rows->position(t) : int64_t(pos0) + t);
    for (int i = 0; i < half; ++i) {
      const double a = p * freqs[i];
      cos_tab[static_cast<size_t>(t) * half + i] = static_cast<Real>(std::cos(a));
      const double s = std::sin(a);
      sin_tab[static_cast<size_t>(t) * half + i] = static_cast<Real>(inverse ? -s : s);
    }
  }  // (the for's barrier: the table is whole before any row reads it)
#pragma omp for schedule(static)
  for (int64_t bt = 0; bt < static_cast<int64_t>(B) * T; ++bt) {
    const int t = static_cast<int>(bt % T);
    const Real* c = cos_tab.data() + static_cast<size_t>(t) * half;  // (D/2)
    const Real* s = sin_tab.data() + static_cast<size_t>(t) * half;  // (D/2)
    Real* row = qkv + bt * row_stride;                                // (Hkv, G+2, D)
    for (int g = 0; g < Hkv; ++g) {
      // The group's G query heads and its key head are contiguous: G+1 heads from its start.
      for (int j = 0; j < G + 1; ++j) {
        Real* lo = row + (static_cast<int64_t>(g) * (G + 2) + j) * D;  // (D/2) first half
        Real* hi = lo + half;                                          // (D/2) second half
#pragma omp simd
        for (int i = 0; i < half; ++i) {
          const Real a = lo[i];
          const Real b = hi[i];
          lo[i] = a * c[i] - b * s[i];
          hi[i] = b * c[i] + a * s[i];
        }
      }
    }
  }
  }
}

}  // namespace

template <class Real>
void rope_forward(Real* qkv, const double* freqs, int B, int T, int Hkv, int G, int D, int pos0,
                  const ContextRows* rows) {
  rope_rotate(qkv, freqs, B, T, Hkv, G, D, pos0, rows, false);
}

template <class Real>
void rope_backward(Real* dqkv, const double* freqs, int B, int T, int Hkv, int G, int D,
                   int pos0, const ContextRows* rows) {
  rope_rotate(dqkv, freqs, B, T, Hkv, G, D, pos0, rows, true);
}

template void rope_forward<float>(float*, const double*, int, int, int, int, int, int, const ContextRows*);
template void rope_forward<double>(double*, const double*, int, int, int, int, int, int, const ContextRows*);
template void rope_backward<float>(float*, const double*, int, int, int, int, int, int, const ContextRows*);
template void rope_backward<double>(double*, const double*, int, int, int, int, int, int, const ContextRows*);

}  // namespace myriad::cpu
