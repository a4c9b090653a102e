// The CPU attention kernel as it was before grouped-query attention (src/ops/cpu/attention.cc at
// commit 693c482), frozen here verbatim apart from "inline" on the two entry points, so that a
// test can check that the GQA kernel with Hkv = H gives bitwise the same results: the project's
// bitwise tests (resume, engine parity, layouts) rely on the CPU attention not changing. Only
// attention_test.cc includes it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/cpu/blas.h"
#include "ops/cpu/vecmath.h"

namespace myriad::cpu::frozen_mha {

namespace {

constexpr int kRowBlock = 32;

// The first key that query i sees.
inline int first_key(int i, int window) { return window > 0 ? std::max(0, i - window + 1) : 0; }

// Softmax of rows i0..i1-1 of P (T,T) in place over the keys each row sees, zeros elsewhere.
template <class Real>
MYRIAD_ALWAYS_INLINE void softmax_rows(Real* P, int T, int i0, int i1, int window) {
  for (int i = i0; i < i1; ++i) {
    Real* row = P + static_cast<int64_t>(i) * T;
    const int lo = first_key(i, window);
    const int n = i - lo + 1;
    Real* x = row + lo;
    const Real m = detail::max_of(x, n);
#pragma omp simd
    for (int j = 0; j < n; ++j) x[j] = detail::exp_real(x[j] - m);
    const Real inv = Real(1) / detail::lane_sum<Real>(n, [x](int64_t j) { return x[j]; });
#pragma omp simd
    for (int j = 0; j < n; ++j) x[j] *= inv;
    std::fill(row, row + lo, Real(0));
    std::fill(row + i + 1, row + T, Real(0));
  }
}

// dS = P * (dP - rowsum(dP * P)) in place over dS (rows, keys); P rows have stride T.
template <class Real>
MYRIAD_ALWAYS_INLINE void softmax_backward_rows(Real* dS, const Real* P, int rows, int keys,
                                                int T) {
  for (int r = 0; r < rows; ++r) {
    const Real* p = P + static_cast<int64_t>(r) * T;
    Real* d = dS + static_cast<int64_t>(r) * keys;
    const Real dot = detail::lane_sum<Real>(keys, [p, d](int64_t j) { return d[j] * p[j]; });
#pragma omp simd
    for (int j = 0; j < keys; ++j) d[j] = p[j] * (d[j] - dot);
  }
}

// float: also compiled for AVX2; double (tests only): baseline.
MYRIAD_AVX2_CLONE void softmax_rows_kernel(float* P, int T, int i0, int i1, int window) {
  softmax_rows(P, T, i0, i1, window);
}
void softmax_rows_kernel(double* P, int T, int i0, int i1, int window) {
  softmax_rows(P, T, i0, i1, window);
}
MYRIAD_AVX2_CLONE void softmax_backward_kernel(float* dS, const float* P, int rows, int keys,
                                               int T) {
  softmax_backward_rows(dS, P, rows, keys, T);
}
void softmax_backward_kernel(double* dS, const double* P, int rows, int keys, int T) {
  softmax_backward_rows(dS, P, rows, keys, T);
}

}  // namespace

template <class Real>
inline void attention_forward(Real* out, Real* probs, const Real* qkv, int B, int T, int C, int H,
                       int window) {
  const int D = C / H;
  const int C3 = 3 * C;
  const Real scale = Real(1) / std::sqrt(static_cast<Real>(D));
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * H; ++bh) {
    const int b = bh / H;
    const int h = bh % H;
    const Real* q = qkv + static_cast<int64_t>(b) * T * C3 + h * 3 * D;  // (T,D), stride 3C
    const Real* k = q + D;
    const Real* v = q + 2 * D;
    Real* P = probs + static_cast<int64_t>(bh) * T * T;       // (T,T)
    Real* o = out + static_cast<int64_t>(b) * T * C + h * D;  // (T,D), stride C
    for (int i0 = 0; i0 < T; i0 += kRowBlock) {
      const int i1 = std::min(T, i0 + kRowBlock);
      const int j0 = first_key(i0, window);
      const int rows = i1 - i0;
      const int keys = i1 - j0;
      Real* Pb = P + static_cast<int64_t>(i0) * T + j0;  // (rows, keys), stride T
      // S = q k^T / sqrt(D) for the keys this block may see, straight into probs.
      detail::gemm(false, true, rows, keys, D, scale, q + static_cast<int64_t>(i0) * C3, C3,
                   k + static_cast<int64_t>(j0) * C3, C3, Real(0), Pb, T);
      softmax_rows_kernel(P, T, i0, i1, window);
      // out = P v
      detail::gemm(false, false, rows, D, keys, Real(1), Pb, T, v + static_cast<int64_t>(j0) * C3,
                   C3, Real(0), o + static_cast<int64_t>(i0) * C, C);
    }
  }
}

template <class Real>
inline void attention_backward(Real* dqkv, const Real* dout, const Real* qkv, const Real* probs, int B,
                        int T, int C, int H, int window) {
  const int D = C / H;
  const int C3 = 3 * C;
  const Real scale = Real(1) / std::sqrt(static_cast<Real>(D));
#pragma omp parallel
  {
    std::vector<Real> dS_buf(static_cast<size_t>(std::min(T, kRowBlock)) * T);
    Real* dS = dS_buf.data();
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * H; ++bh) {
      const int b = bh / H;
      const int h = bh % H;
      const int64_t qkv_off = static_cast<int64_t>(b) * T * C3 + h * 3 * D;
      const Real* q = qkv + qkv_off;  // (T,D), stride 3C, and so on
      const Real* k = q + D;
      const Real* v = q + 2 * D;
      Real* dq = dqkv + qkv_off;
      Real* dk = dq + D;
      Real* dv = dq + 2 * D;
      const Real* dO = dout + static_cast<int64_t>(b) * T * C + h * D;  // (T,D), stride C
      const Real* P = probs + static_cast<int64_t>(bh) * T * T;
      for (int i0 = 0; i0 < T; i0 += kRowBlock) {
        const int i1 = std::min(T, i0 + kRowBlock);
        const int j0 = first_key(i0, window);
        const int rows = i1 - i0;
        const int keys = i1 - j0;
        const Real* Pb = P + static_cast<int64_t>(i0) * T + j0;  // (rows, keys), stride T
        const Real* dOb = dO + static_cast<int64_t>(i0) * C;
        // dv += P^T dout
        detail::gemm(true, false, keys, D, rows, Real(1), Pb, T, dOb, C, Real(1),
                     dv + static_cast<int64_t>(j0) * C3, C3);
        // dP = dout v^T, into the scratch (rows, keys)
        detail::gemm(false, true, rows, keys, D, Real(1), dOb, C, v + static_cast<int64_t>(j0) * C3,
                     C3, Real(0), dS, keys);
        // dS = P * (dP - rowsum(dP * P)); masked entries have P = 0, hence dS = 0.
        softmax_backward_kernel(dS, Pb, rows, keys, T);
        // dq += dS k / sqrt(D);  dk += dS^T q / sqrt(D)
        detail::gemm(false, false, rows, D, keys, scale, dS, keys,
                     k + static_cast<int64_t>(j0) * C3, C3, Real(1),
                     dq + static_cast<int64_t>(i0) * C3, C3);
        detail::gemm(true, false, keys, D, rows, scale, dS, keys, q + static_cast<int64_t>(i0) * C3,
                     C3, Real(1), dk + static_cast<int64_t>(j0) * C3, C3);
      }
    }
  }
}

}  // namespace myriad::cpu::frozen_mha
