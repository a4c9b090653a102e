#include "model/cuda/matmul.h"

#include <cstdlib>
#include <string>

#include "core/error.h"
#include "model/cuda/cuda_check.h"

namespace myriad::cuda {

Matmul::Matmul() {
  CUBLAS_CHECK(cublasLtCreate(&handle_));
  // 32 MiB: what cuBLASLt's Hopper kernels ask for at most.
  workspace_bytes_ = 32u << 20;
  reduction_mask_ = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE |
                    CUBLASLT_REDUCTION_SCHEME_NONE;
  if (const char* k = std::getenv("MYRIAD_SPLITK")) {
    if (std::string(k) == "none") reduction_mask_ = CUBLASLT_REDUCTION_SCHEME_NONE;
    if (std::string(k) == "any") reduction_mask_ = CUBLASLT_REDUCTION_SCHEME_MASK;
  }
  CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

Matmul::~Matmul() {
  cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

void Matmul::gemm(void* d, cudaDataType_t d_type, const void* a, bool trans_a, int lda,
                  const void* b, bool trans_b, int ldb, int m, int n, int k, float beta,
                  const bf16* bias, cudaStream_t stream, cublasLtEpilogue_t epi, const void* aux) {
  cublasLtMatmulDesc_t desc;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (bias) {
    if (epi == CUBLASLT_EPILOGUE_DEFAULT) epi = CUBLASLT_EPILOGUE_BIAS;
    if (epi == CUBLASLT_EPILOGUE_GELU_AUX) epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    cudaDataType_t bias_type = CUDA_R_16BF;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
  }
  if (epi != CUBLASLT_EPILOGUE_DEFAULT)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (aux) {
    const int64_t ld = m;
    cudaDataType_t aux_type = CUDA_R_16BF;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof aux_type));
  }
  cublasLtMatrixLayout_t la, lb, ld;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, trans_a ? k : m, trans_a ? m : k, lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, trans_b ? n : k, trans_b ? k : n, ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, d_type, m, n, m));

  // Parameters sit at arbitrary offsets of the flat buffers: tell the heuristic the alignment
  // the pointers really have (it assumes 256 bytes otherwise).
  auto alignment = [](const void* p) {
    uint32_t a = 256;
    while (a > 2 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
    return a;
  };
  const uint32_t align_a = alignment(a), align_b = alignment(b), align_d = alignment(d);
  Key key{m, n, k, trans_a, trans_b, lda, ldb, static_cast<int>(epi), d_type == CUDA_R_32F,
          align_a, align_b, align_d};
  auto it = algos_.find(key);
  if (it == algos_.end()) {
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &workspace_bytes_, sizeof workspace_bytes_));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof align_d));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof align_d));
    // Split-K only with a reduction in the workspace, which adds the K slices in a fixed order;
    // the in-place scheme adds them into D in whatever order they finish. MYRIAD_SPLITK=none
    // (no split-K) or =any (cuBLASLt's choice) are for measuring.
    const uint32_t reduction = reduction_mask_;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction, sizeof reduction));
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, desc, la, lb, ld, ld, pref, 1, &result, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0)
      throw_runtime("cuBLASLt: no algorithm for a ", m, "x", n, "x", k, " bf16 GEMM");
    it = algos_.emplace(key, result.algo).first;
  }
  const float alpha = 1.0f;
  CUBLAS_CHECK(cublasLtMatmul(handle_, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &it->second,
                              workspace_, workspace_bytes_, stream));
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
}

// Row-major (R,C) buffers are column-major (C,R): each product below is written for cuBLAS's
// column-major view of the same memory.
void Matmul::forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, int N,
                     int IC, int OC, cudaStream_t stream) {
  // out^T (OC,N) = W (OC,IC) . inp^T (IC,N); W's memory is (IC,OC) column-major: transpose it.
  gemm(out, CUDA_R_16BF, weight, true, IC, inp, false, IC, OC, N, IC, 0.0f, bias, stream);
}

void Matmul::forward_gelu(bf16* out, bf16* pre, const bf16* inp, const bf16* weight,
                          const bf16* bias, int N, int IC, int OC, cudaStream_t stream) {
  gemm(out, CUDA_R_16BF, weight, true, IC, inp, false, IC, OC, N, IC, 0.0f, bias, stream,
       CUBLASLT_EPILOGUE_GELU_AUX, pre);
}

void Matmul::backward_input_dgelu(bf16* dpre, const bf16* dout, const bf16* weight,
                                  const bf16* pre, int N, int IC, int OC, cudaStream_t stream) {
  gemm(dpre, CUDA_R_16BF, weight, false, IC, dout, false, OC, IC, N, OC, 0.0f, nullptr, stream,
       CUBLASLT_EPILOGUE_DGELU, pre);
}

void Matmul::backward_input(bf16* dinp, const bf16* dout, const bf16* weight, int N, int IC,
                            int OC, bool accumulate, cudaStream_t stream) {
  // dinp^T (IC,N) = W^T (IC,OC) . dout^T (OC,N)
  gemm(dinp, CUDA_R_16BF, weight, false, IC, dout, false, OC, IC, N, OC, accumulate ? 1.0f : 0.0f,
       nullptr, stream);
}

void Matmul::backward_weight(float* dweight, const bf16* dout, const bf16* inp, int N, int IC,
                             int OC, cudaStream_t stream) {
  // dW^T (IC,OC) += inp^T (IC,N) . dout (N,OC)
  gemm(dweight, CUDA_R_32F, inp, false, IC, dout, true, OC, IC, OC, N, 1.0f, nullptr, stream);
}

}  // namespace myriad::cuda
