// Linear layer, PyTorch layout: weight (OC, IC), out = inp @ weight^T + bias.
// The products go to OpenBLAS (it threads them itself). The bias is written into out first and
// the GEMM adds onto it (beta = 1), which saves a pass over out. The bias gradient is a sum over
// rows: parallel over blocks of columns, rows in order, so it does not depend on thread count.
#include <algorithm>
#include <cstdint>

#include "ops/cpu/blas.h"
#include "ops/cpu/ops.h"

namespace myriad::cpu {

namespace {
constexpr int kColumnBlock = 16;
}

template <class Real>
void linear_forward(Real* out, const Real* inp, const Real* weight, const Real* bias, int N, int IC,
                    int OC) {
  if (bias) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      std::copy(bias, bias + OC, out + static_cast<int64_t>(n) * OC);
    }
  }
  detail::gemm(false, true, N, OC, IC, Real(1), inp, IC, weight, IC, bias ? Real(1) : Real(0), out,
               OC);
}

template <class Real>
void linear_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp,
                     const Real* weight, int N, int IC, int OC) {
  // dinp (N,IC) += dout (N,OC) @ weight (OC,IC)
  if (dinp) detail::gemm(false, false, N, IC, OC, Real(1), dout, OC, weight, IC, Real(1), dinp, IC);
  // dweight (OC,IC) += dout^T (OC,N) @ inp (N,IC)
  if (dweight) detail::gemm(true, false, OC, IC, N, Real(1), dout, OC, inp, IC, Real(1), dweight, IC);
  if (dbias) {
    const int blocks = (OC + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < blocks; ++blk) {
      const int c0 = blk * kColumnBlock;
      const int c1 = std::min(OC, c0 + kColumnBlock);
      Real acc[kColumnBlock] = {};
      for (int n = 0; n < N; ++n) {
        const Real* d = dout + static_cast<int64_t>(n) * OC + c0;
#pragma omp simd
        for (int c = 0; c < c1 - c0; ++c) acc[c] += d[c];
      }
      for (int c = c0; c < c1; ++c) dbias[c] += acc[c - c0];
    }
  }
}

template void linear_forward<float>(float*, const float*, const float*, const float*, int, int,
                                    int);
template void linear_forward<double>(double*, const double*, const double*, const double*, int, int,
                                     int);
template void linear_backward<float>(float*, float*, float*, const float*, const float*,
                                     const float*, int, int, int);
template void linear_backward<double>(double*, double*, double*, const double*, const double*,
                                      const double*, int, int, int);

}  // namespace myriad::cpu
