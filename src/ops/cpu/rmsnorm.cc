// RMSNorm over the last dimension (Hugging Face's LlamaRMSNorm): no mean subtracted, no bias.
// Laid out as layernorm.cc, for the same reasons: rows in parallel for the forward and the input
// gradient, each row's sums fixed-order lane sums (vecmath.h); the weight gradient in parallel
// over blocks of columns, each column summed over rows in row order, so the bits do not depend
// on the number of threads.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/cpu/ops.h"
#include "ops/cpu/vecmath.h"

namespace myriad::cpu {

namespace {
constexpr int kColumnBlock = 16;
}  // namespace

template <class Real>
void rmsnorm_forward(Real* out, Real* rstd, const Real* inp, const Real* weight, int N, int C,
                     double eps) {
  const Real e = static_cast<Real>(eps);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const Real* x = inp + static_cast<int64_t>(n) * C;  // (C)
    Real* o = out + static_cast<int64_t>(n) * C;        // (C)
    const Real ms = detail::lane_sum<Real>(C, [x](int64_t c) { return x[c] * x[c]; }) / C;
    const Real rs = Real(1) / std::sqrt(ms + e);
    rstd[n] = rs;
    // (x * rstd) * weight, HF's order: normalize, then scale.
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = x[c] * rs * weight[c];
  }
}

template <class Real>
void rmsnorm_backward(Real* dinp, Real* dweight, const Real* dout, const Real* inp,
                      const Real* weight, const Real* rstd, int N, int C) {
  // Input gradient, per row: with xhat = x * rstd and g = dout * w, rstd depends on every x of
  // the row (d rstd / dx_c = -rstd^3 x_c / C), which gives
  // dinp += rstd * (g - xhat * mean(g xhat)).
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const Real* x = inp + static_cast<int64_t>(n) * C;   // (C)
    const Real* d = dout + static_cast<int64_t>(n) * C;  // (C)
    Real* di = dinp + static_cast<int64_t>(n) * C;       // (C)
    const Real rs = rstd[n];
    const auto gx = [=](int64_t c) { return d[c] * weight[c] * (x[c] * rs); };
    const Real mgx = detail::lane_sum<Real>(C, gx) / C;
#pragma omp simd
    for (int c = 0; c < C; ++c) di[c] += rs * (d[c] * weight[c] - (x[c] * rs) * mgx);
  }
  // Weight gradient: column blocks in parallel, rows in order within a column.
  const int blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kColumnBlock;
    const int c1 = std::min(C, c0 + kColumnBlock);
    Real dw[kColumnBlock] = {};
    for (int n = 0; n < N; ++n) {
      const Real* x = inp + static_cast<int64_t>(n) * C + c0;   // (c1-c0)
      const Real* d = dout + static_cast<int64_t>(n) * C + c0;  // (c1-c0)
      const Real rs = rstd[n];
#pragma omp simd
      for (int c = 0; c < c1 - c0; ++c) dw[c] += d[c] * (x[c] * rs);
    }
    for (int c = c0; c < c1; ++c) dweight[c] += dw[c - c0];
  }
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int, int, double);
template void rmsnorm_forward<double>(double*, double*, const double*, const double*, int, int,
                                      double);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*,
                                      const float*, int, int);
template void rmsnorm_backward<double>(double*, double*, const double*, const double*,
                                       const double*, const double*, int, int);

}  // namespace myriad::cpu
