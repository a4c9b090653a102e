// The linear layers' GEMMs through cuBLASLt: bf16 operands, fp32 accumulation, the bias fused
// into the forward epilogue, weight gradients accumulated in fp32. Not thread-safe (one per
// stream).
//
// The algorithm for each shape (sizes, layouts, epilogue, the pointers' alignment) is chosen at
// its first use: cuBLASLt's heuristic proposes up to 8, each is timed on the call's own operands
// (the output to a scratch buffer when the call accumulates), and the fastest is kept for the
// whole process, so that every model of a process computes alike. Given a file
// (persist_gemm_choices: the engine's builder passes RUN_DIR/gemm_algos.rank<R>.txt) the choices
// are saved there and read back at the next start: a restart does not retune, and a resumed run
// computes bit for bit as the run it continues. MYRIAD_GEMM_TUNE=0 takes the heuristic's first choice (for measuring).
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "ops/fp8.h"

namespace myriad::cuda {

using bf16 = __nv_bfloat16;

// The file the process's choices persist in ("" keeps them in memory only); set before the
// first GEMM.
void persist_gemm_choices(const std::string& path);

class Matmul {
 public:
  Matmul();
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  // For shapes that change at every call (a mixture of experts' per-expert GEMMs, whose rows
  // follow the routing): the heuristic's first algorithm, untimed, kept in this Matmul's memory
  // only (bounded), so that no call pays a tuning, a repeated shape no second heuristic query,
  // and the process's choices (and their file) do not grow with every row count.
  void forget_shapes();

  // out (N,OC) = inp (N,IC) @ weight (OC,IC)^T + bias (OC, or null)
  void forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, int N, int IC,
               int OC, cudaStream_t stream);
  // out (N,OC) = inp (N,IC) @ weight (OC,IC)^T in fp32 (a mixture of experts' router logits,
  // which route in fp32 on every device), no bias.
  void forward_f32(float* out, const bf16* inp, const bf16* weight, int N, int IC, int OC, cudaStream_t stream);
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

  // FP8 (train.precision = "fp8"): the products above on FP8 operands (cast_fp8's bytes and the
  // inverse of their scale, on the device), each operand K-major as Hopper requires. A product
  // accumulates in fp32 (fast_accum: cuBLASLt's faster, coarser accumulation, the forward's
  // option, with per-tensor scales only); outputs as above. Block scaling (fp8::Scaling::block)
  // takes the weight in 128 x 128 blocks and the activation or gradient in 1 x 128 tiles, or both
  // weight-gradient operands in tiles: cuBLASLt's block-scaled GEMMs (Hopper, CUDA 12.9 and later).
  // What an operand's inverse scales cover: the tensor (one float), or block scaling's tiles
  // along K (1 x 128) or blocks (128 x 128), laid out as fp8::tile_scales says.
  enum class Scales { kTensor, kTiles, kBlocks };
  struct Fp8Tensor {
    const uint8_t* data;
    const float* inv_scale;  // 1 / the cast's scale, or its tiles' (scales)
    fp8::Format format;
    Scales scales = Scales::kTensor;
  };
  // out (N,OC) = inp (N,IC) @ weight (OC,IC)^T + bias
  void forward_fp8(bf16* out, const Fp8Tensor& inp, const Fp8Tensor& weight, const bf16* bias, int N, int IC, int OC,
                   bool fast_accum, cudaStream_t stream);
  // dinp (N,IC) (= or +=) = dout (N,OC) @ weight (OC,IC), given weight_t (IC,OC)
  void backward_input_fp8(bf16* dinp, const Fp8Tensor& dout, const Fp8Tensor& weight_t, int N, int IC, int OC,
                          bool accumulate, cudaStream_t stream);
  // dweight (OC,IC) += dout (N,OC)^T @ inp (N,IC), in fp32, given dout_t (OC,N) and inp_t (IC,N)
  void backward_weight_fp8(float* dweight, const Fp8Tensor& dout_t, const Fp8Tensor& inp_t, int N, int IC, int OC,
                           cudaStream_t stream);

 private:
  // Column-major D (m,n) = alpha op(A) op(B) + beta C, C = D.
  // The epilogue: BIAS / GELU_AUX(_BIAS) / DGELU with `aux` the (m,n) pre-activation.
  // fp8: A and B in FP8 with their inverse scales (device pointers), else both bf16.
  struct Fp8Operands {
    cudaDataType_t a_type, b_type;
    const float* a_inv_scale;
    const float* b_inv_scale;
    bool fast_accum;
    Scales a_scales = Scales::kTensor, b_scales = Scales::kTensor;
  };
  // The FP8 operands' part of a GEMM's descriptor: the inverse scales (and block scaling's modes,
  // written to scale_a / scale_b for the algorithm's key) and the forward's fast accumulation.
  static void describe_fp8(cublasLtMatmulDesc_t desc, const Fp8Operands& fp8, int32_t& scale_a, int32_t& scale_b);
  void gemm(void* d, cudaDataType_t d_type, const void* a, bool trans_a, int lda, const void* b,
            bool trans_b, int ldb, int m, int n, int k, float beta, const bf16* bias,
            cudaStream_t stream, cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT,
            const void* aux = nullptr, const Fp8Operands* fp8 = nullptr);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  uint32_t reduction_mask_;  // cublasLtReductionScheme_t values cuBLASLt may use
  // Debug switches for measuring (docs/CONFIG.md's table), read once, when the Matmul is made:
  // MYRIAD_GEMM_TUNE=0 takes the heuristic's first algorithm untimed; MYRIAD_GEMM_REPORT=1 logs
  // each shape's candidates; MYRIAD_SPLITK (none | any) sets reduction_mask_.
  bool tune_ = true, report_ = false;
  bool remember_ = true;  // forget_shapes()
  struct LocalChoices;
  std::unique_ptr<LocalChoices> local_;  // forget_shapes()'s choices
};

}  // namespace myriad::cuda
