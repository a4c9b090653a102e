// The two row norms over the last dimension, one code path:
//   LayerNorm (kCenter): xhat = (x - mean) rstd, rstd = 1 / sqrt(var + 1e-5) (biased variance,
//                         as PyTorch), out = xhat w + bias;
//   RMSNorm:             xhat = x rstd,          rstd = 1 / sqrt(mean(x^2) + eps),
//                         out = xhat w (Hugging Face's LlamaRMSNorm: normalize, then scale).
// Rows are independent, so the forward and the input gradient run in parallel over rows, each
// row's sums fixed-order lane sums (vecmath.h; LayerNorm's variance two-pass). The parameter
// gradients are sums over rows: they run in parallel over blocks of columns, each column summed
// over rows in row order, so the bits do not depend on the number of threads.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/cpu/ops.h"
#include "ops/cpu/vecmath.h"

namespace myriad::cpu {

namespace {

constexpr double kLayerNormEps = 1e-5;
constexpr int kColumnBlock = 16;

// mean: (N) written when kCenter, else unused; bias: (C) or null, kCenter only.
template <bool kCenter, class Real>
void norm_forward(Real* out, Real* mean, Real* rstd, const Real* inp, const Real* weight,
                  const Real* bias, int N, int C, Real eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const Real* x = inp + static_cast<int64_t>(n) * C;  // (C)
    Real* o = out + static_cast<int64_t>(n) * C;        // (C)
    if constexpr (kCenter) {
      const Real m = detail::lane_sum<Real>(C, [x](int64_t c) { return x[c]; }) / C;
      const auto square = [x, m](int64_t c) { return (x[c] - m) * (x[c] - m); };
      const Real var = detail::lane_sum<Real>(C, square) / C;
      const Real rs = Real(1) / std::sqrt(var + eps);
      mean[n] = m;
      rstd[n] = rs;
      if (bias) {
#pragma omp simd
        for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * rs * weight[c] + bias[c];
      } else {
#pragma omp simd
        for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * rs * weight[c];
      }
    } else {
      const Real ms = detail::lane_sum<Real>(C, [x](int64_t c) { return x[c] * x[c]; }) / C;
      const Real rs = Real(1) / std::sqrt(ms + eps);
      rstd[n] = rs;
#pragma omp simd
      for (int c = 0; c < C; ++c) o[c] = x[c] * rs * weight[c];
    }
  }
}

// dinp += rstd (g - [mean(g)] - xhat mean(g xhat)), g = dout w, the bracket LayerNorm's only
// (RMSNorm's rstd depends on every x of the row through mean(x^2), hence its xhat term too);
// dweight += sum over rows of dout xhat; dbias += sum over rows of dout (LayerNorm, if given).
template <bool kCenter, class Real>
void norm_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp,
                   const Real* weight, const Real* mean, const Real* rstd, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const Real* x = inp + static_cast<int64_t>(n) * C;   // (C)
    const Real* d = dout + static_cast<int64_t>(n) * C;  // (C)
    Real* di = dinp + static_cast<int64_t>(n) * C;       // (C)
    const Real rs = rstd[n];
    if constexpr (kCenter) {
      const Real m = mean[n];
      const auto g = [=](int64_t c) { return d[c] * weight[c]; };
      const auto gx = [=](int64_t c) { return d[c] * weight[c] * ((x[c] - m) * rs); };
      const Real mg = detail::lane_sum<Real>(C, g) / C;
      const Real mgx = detail::lane_sum<Real>(C, gx) / C;
#pragma omp simd
      for (int c = 0; c < C; ++c) {
        const Real xhat = (x[c] - m) * rs;
        di[c] += rs * (d[c] * weight[c] - mg - xhat * mgx);
      }
    } else {
      const auto gx = [=](int64_t c) { return d[c] * weight[c] * (x[c] * rs); };
      const Real mgx = detail::lane_sum<Real>(C, gx) / C;
#pragma omp simd
      for (int c = 0; c < C; ++c) di[c] += rs * (d[c] * weight[c] - (x[c] * rs) * mgx);
    }
  }
  // Parameter gradients: column blocks in parallel, rows in order within a column.
  const int blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kColumnBlock;
    const int c1 = std::min(C, c0 + kColumnBlock);
    Real dw[kColumnBlock] = {};
    Real db[kColumnBlock] = {};
    for (int n = 0; n < N; ++n) {
      const Real* x = inp + static_cast<int64_t>(n) * C + c0;   // (c1-c0)
      const Real* d = dout + static_cast<int64_t>(n) * C + c0;  // (c1-c0)
      const Real rs = rstd[n];
      if constexpr (kCenter) {
        const Real m = mean[n];
#pragma omp simd
        for (int c = 0; c < c1 - c0; ++c) {
          dw[c] += d[c] * ((x[c] - m) * rs);
          db[c] += d[c];
        }
      } else {
#pragma omp simd
        for (int c = 0; c < c1 - c0; ++c) dw[c] += d[c] * (x[c] * rs);
      }
    }
    for (int c = c0; c < c1; ++c) dweight[c] += dw[c - c0];
    if (kCenter && dbias) {
      for (int c = c0; c < c1; ++c) dbias[c] += db[c - c0];
    }
  }
}

}  // namespace

template <class Real>
void layernorm_forward(Real* out, Real* mean, Real* rstd, const Real* inp, const Real* weight,
                       const Real* bias, int N, int C) {
  norm_forward<true>(out, mean, rstd, inp, weight, bias, N, C, static_cast<Real>(kLayerNormEps));
}

template <class Real>
void layernorm_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp,
                        const Real* weight, const Real* mean, const Real* rstd, int N, int C) {
  norm_backward<true>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

template <class Real>
void rmsnorm_forward(Real* out, Real* rstd, const Real* inp, const Real* weight, int N, int C,
                     double eps) {
  norm_forward<false>(out, static_cast<Real*>(nullptr), rstd, inp, weight,
                      static_cast<const Real*>(nullptr), N, C, static_cast<Real>(eps));
}

template <class Real>
void rmsnorm_backward(Real* dinp, Real* dweight, const Real* dout, const Real* inp,
                      const Real* weight, const Real* rstd, int N, int C) {
  norm_backward<false>(dinp, dweight, static_cast<Real*>(nullptr), dout, inp, weight,
                       static_cast<const Real*>(nullptr), rstd, N, C);
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*,
                                       const float*, int, int);
template void layernorm_forward<double>(double*, double*, double*, const double*, const double*,
                                        const double*, int, int);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*,
                                        const float*, const float*, const float*, int, int);
template void layernorm_backward<double>(double*, double*, double*, const double*, const double*,
                                         const double*, const double*, const double*, int, int);
template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int, int, double);
template void rmsnorm_forward<double>(double*, double*, const double*, const double*, int, int,
                                      double);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*,
                                      const float*, int, int);
template void rmsnorm_backward<double>(double*, double*, const double*, const double*,
                                       const double*, const double*, int, int);

}  // namespace myriad::cpu
