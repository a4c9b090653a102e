// Internal to the CPU backend: one overloaded row-major GEMM over OpenBLAS, so that the templated
// ops call the same name for float (cblas_sgemm) and double (cblas_dgemm).
// C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C, where op transposes when asked.
// OpenBLAS threads itself outside an OpenMP parallel region and runs on the calling thread
// inside one, so the same helper serves the big linear GEMMs and the per-head attention GEMMs.
#pragma once

#include <cblas.h>

namespace myriad::cpu::detail {

inline void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

inline void gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A,
                 int lda, const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace myriad::cpu::detail
