// The linear layers' GEMMs through cuBLASLt: bf16 operands, fp32 accumulation, the bias fused
// into the forward epilogue, weight gradients accumulated in fp32. Not thread-safe (one per
// stream).
//
// The algorithm for each shape (sizes, layouts, epilogue, the pointers' alignment) is chosen at
// its first use: cuBLASLt's heuristic proposes up to 8, each is timed on the call's own operands
// (the output to a scratch buffer when the call accumulates), and the fastest is kept for the
// whole process, so that every model of a process computes alike. With MYRIAD_GEMM_ALGOS set
// (the trainer sets RUN_DIR/cuda/gemm_algos.rank<R>.txt) the choices are saved there and read
// back at the next start: a restart does not retune, and a resumed run computes bit for bit as
// the run it continues. MYRIAD_GEMM_TUNE=0 takes the heuristic's first choice (for measuring).
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

namespace myriad::cuda {

using bf16 = __nv_bfloat16;

class Matmul {
 public:
  Matmul();
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  // out (N,OC) = inp (N,IC) @ weight (OC,IC)^T + bias (OC, or null)
  void forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, int N, int IC,
               int OC, cudaStream_t stream);
  // The MLP's first GEMM with GELU fused into the epilogue: pre (N,OC) = inp @ weight^T + bias
  // (kept for backward), out (N,OC) = gelu(pre).
  void forward_gelu(bf16* out, bf16* pre, const bf16* inp, const bf16* weight, const bf16* bias,
                    int N, int IC, int OC, cudaStream_t stream);
  // dinp (N,IC) (= or += when accumulate) = dout (N,OC) @ weight (OC,IC)
  void backward_input(bf16* dinp, const bf16* dout, const bf16* weight, int N, int IC, int OC,
                      bool accumulate, cudaStream_t stream);
  // The MLP's second GEMM's input gradient with GELU's derivative fused: dpre (N,IC) =
  // (dout @ weight) * gelu'(pre), pre (N,IC) from forward_gelu.
  void backward_input_dgelu(bf16* dpre, const bf16* dout, const bf16* weight, const bf16* pre,
                            int N, int IC, int OC, cudaStream_t stream);
  // dweight (OC,IC) += dout (N,OC)^T @ inp (N,IC), in fp32
  void backward_weight(float* dweight, const bf16* dout, const bf16* inp, int N, int IC, int OC,
                       cudaStream_t stream);

 private:
  // Column-major D (m,n) = alpha op(A) op(B) + beta C, C = D.
  // The epilogue: BIAS / GELU_AUX(_BIAS) / DGELU with `aux` the (m,n) pre-activation.
  void gemm(void* d, cudaDataType_t d_type, const void* a, bool trans_a, int lda, const void* b,
            bool trans_b, int ldb, int m, int n, int k, float beta, const bf16* bias,
            cudaStream_t stream, cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT,
            const void* aux = nullptr);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  uint32_t reduction_mask_;  // cublasLtReductionScheme_t values cuBLASLt may use
};

}  // namespace myriad::cuda
