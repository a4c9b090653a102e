// LayerNorm over the last dimension (eps 1e-5, biased variance, as PyTorch).
// Rows are independent, so forward and the input gradient run in parallel over rows; the mean
// and variance are two-pass lane sums (fixed order, see vecmath.h). The parameter gradients are
// sums over rows: they run in parallel over blocks of columns, each column summed over rows in
// row order, so the bits do not depend on the number of threads.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/cpu/ops.h"
#include "ops/cpu/vecmath.h"

namespace myriad::cpu {

namespace {
constexpr double kEps = 1e-5;
constexpr int kColumnBlock = 16;
}  // namespace

template <class Real>
void layernorm_forward(Real* out, Real* mean, Real* rstd, const Real* inp, const Real* weight,
                       const Real* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const Real* x = inp + static_cast<int64_t>(n) * C;
    Real* o = out + static_cast<int64_t>(n) * C;
    const Real m = detail::lane_sum<Real>(C, [x](int64_t c) { return x[c]; }) / C;
    const auto square = [x, m](int64_t c) { return (x[c] - m) * (x[c] - m); };
    const Real var = detail::lane_sum<Real>(C, square) / C;
    const Real rs = Real(1) / std::sqrt(var + static_cast<Real>(kEps));
    mean[n] = m;
    rstd[n] = rs;
    if (bias) {
#pragma omp simd
      for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * rs * weight[c] + bias[c];
    } else {
#pragma omp simd
      for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * rs * weight[c];
    }
  }
}

template <class Real>
void layernorm_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp,
                        const Real* weight, const Real* mean, const Real* rstd, int N, int C) {
  // Input gradient, per row: dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * w.
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const Real* x = inp + static_cast<int64_t>(n) * C;
    const Real* d = dout + static_cast<int64_t>(n) * C;
    Real* di = dinp + static_cast<int64_t>(n) * C;
    const Real m = mean[n];
    const Real rs = rstd[n];
    const auto g = [=](int64_t c) { return d[c] * weight[c]; };
    const auto gx = [=](int64_t c) { return d[c] * weight[c] * ((x[c] - m) * rs); };
    const Real mg = detail::lane_sum<Real>(C, g) / C;
    const Real mgx = detail::lane_sum<Real>(C, gx) / C;
#pragma omp simd
    for (int c = 0; c < C; ++c) {
      const Real xhat = (x[c] - m) * rs;
      di[c] += rs * (d[c] * weight[c] - mg - xhat * mgx);
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
      const Real* x = inp + static_cast<int64_t>(n) * C + c0;
      const Real* d = dout + static_cast<int64_t>(n) * C + c0;
      const Real m = mean[n];
      const Real rs = rstd[n];
#pragma omp simd
      for (int c = 0; c < c1 - c0; ++c) {
        dw[c] += d[c] * ((x[c] - m) * rs);
        db[c] += d[c];
      }
    }
    for (int c = c0; c < c1; ++c) dweight[c] += dw[c - c0];
    if (dbias) {
      for (int c = c0; c < c1; ++c) dbias[c] += db[c - c0];
    }
  }
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*,
                                       const float*, int, int);
template void layernorm_forward<double>(double*, double*, double*, const double*, const double*,
                                        const double*, int, int);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*,
                                        const float*, const float*, const float*, int, int);
template void layernorm_backward<double>(double*, double*, double*, const double*, const double*,
                                         const double*, const double*, const double*, int, int);

}  // namespace myriad::cpu
