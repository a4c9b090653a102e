// The CUDA op set: the one layer schedule (model/gpt.h) on one GPU, bf16 activations and
// weights, fp32 statistics and parameter gradients, the kernels of ops/cuda and cuBLASLt
// (matmul.h). Every op is enqueued on the op set's stream; the ops that hand results to the host
// (download, sum) synchronize it. Copies of a CudaOps share its stream and scratch.
//
// Contracts as the CPU op set's (ops/cpu/cpu_ops.h), with these CUDA facts:
// - attention keeps the log-sum-exp of each score row (B,H,T) for its backward, and needs a
//   head size of 64, 80 or 128;
// - cross-entropy's losses and dlogits come from one pass over the logits, in place;
// - a lookup's backward (embedding, vocabulary rows) sums the rows of each id in order,
//   deterministic without atomics: load_tokens groups the positions by id on the host, from
//   the host's tokens, and uploads the groups with the ids (pinned, asynchronously);
// - the tensor-parallel regions move fp32: the schedule widens bf16 activations around them;
// - nothing on the step's hot path waits for the device except the reads of its few results
//   (the loss, the norms' sums), once each per step.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ops/fp8.h"
#include "ops/kinds.h"

namespace myriad {
struct ContextRows;  // core/parallel_layout.h
}

namespace myriad::cuda {

class Matmul;

// Peak dense bf16 tensor FLOP/s of a device (the H100/H200 SXM and A100 datasheets); 0 unknown.
double peak_bf16_flops(const cudaDeviceProp& p);

class CudaOps {
 public:
  using Act = __nv_bfloat16;
  using Param = __nv_bfloat16;

  // Device memory of n elements of T, zeroed; moves, never copies.
  template <class T>
  class Buffer {
   public:
    void zeros(int64_t n);
    T* data() { return p_.get(); }
    const T* data() const { return p_.get(); }
    int64_t size() const { return n_; }

   private:
    struct Free {
      size_t bytes;  // counted in held_bytes() until freed (no initializer: Buffer is used inside CudaOps)
      void operator()(T* p) const;
    };
    std::unique_ptr<T, Free> p_;
    int64_t n_ = 0;
  };

  // Token ids (B*T) in device memory; with a vocabulary range, also their positions grouped by
  // id for the lookup's backward: [positions (N)] [starts (G+1)] [ids (G)].
  class Tokens {
   public:
    Tokens();
    Tokens(Tokens&&) noexcept;
    Tokens& operator=(Tokens&&) noexcept;
    ~Tokens();
    void zeros(int64_t n);
    int32_t* data() { return ids_.data(); }
    const int32_t* data() const { return ids_.data(); }

   private:
    friend class CudaOps;
    Buffer<int32_t> ids_, groups_;
    int64_t n_ = 0, loaded_ = 0;  // capacity, and ids of the last load
    int64_t v0_ = 0, Vl_ = 0;     // the vocabulary rows the groups are for (Vl 0: none)
    int summed_ = 0, groups_count_ = 0;  // groups of ids held in [v0, v0 + Vl), and of all ids
    int32_t *h_ids_ = nullptr, *h_groups_ = nullptr;  // pinned staging
    cudaEvent_t staged_ = nullptr;  // the last uploads from the staging have been read
  };

  // The current device's op set, on a stream of its own.
  CudaOps();
  // Device memory in this process's Buffers and cuDNN's attention workspace: now and at most so
  // far. A Buffer that does not fit is an input error naming its size and what to change.
  static int64_t held_bytes();
  static int64_t peak_bytes();
  const char* name() const { return "cuda"; }
  cudaStream_t stream() const;

  template <class T>
  void zero(T* x, int64_t n) const;
  template <class T>
  void copy(T* dst, const T* src, int64_t n) const;
  void load_tokens(Tokens& t, const int32_t* host, int B, int T, int64_t stride, int64_t v0 = 0,
                   int64_t Vl = 0) const;
  void upload_params(Param* dst, const float* host, int64_t n) const;  // rounded to bf16
  void download(float* host, const Act* src, int64_t n) const;         // widened to fp32
  void download(double* host, const double* src, int64_t n) const;
  void mean_into(double* acc, const float* x, int64_t n, int64_t count = 0) const;  // one block, fixed order

  // ---- what the step needs besides the model (runtime/model_engine.h) ----
  std::string device_name() const;  // "cuda:0 NVIDIA H200"
  double peak_flops() const;        // dense bf16, for MFU; 0 when unknown
  void* comm_stream() const { return stream(); }  // collectives run in order with the ops
  void upload(float* dst, const float* host, int64_t n) const;
  void download(float* host, const float* src, int64_t n) const;
  // Page-locks `bytes` of host memory at `host` while the handle lives, so that copies to and
  // from it (a checkpoint's snapshot) run at the bus's speed; null below 16 MiB, and, with a
  // warning, when the system refuses.
  std::shared_ptr<void> pin_host(void* host, size_t bytes) const;
  void cast_params(Param* dst, const float* src, int64_t n) const;  // the compute copy of master
  // One launch over every piece, one read of the results (synchronizes).
  std::vector<double> sums_of_squares(const float* x, const std::vector<std::pair<int64_t, int64_t>>& pieces) const;
  void accumulate(float* dst, const float* src, int64_t n) const;   // dst += src
  // Phase timers: CUDA events recorded on the stream (cpu_ops.h has the contract); seconds()
  // waits for its later event only, never for the device.
  int mark() const;
  double seconds(int from, int to) const;
  void clear_marks() const;

  // rows: a context-parallel rank's (as CpuOps's), or null.
  void embedding_forward(Act* out, const int32_t* tokens, const Param* wte, const Param* wpe, int B, int T, int C,
                         const ContextRows* rows = nullptr) const;
  void embedding_backward(float* dwte, float* dwpe, const Act* dout, const Tokens& tokens, int B, int T, int C,
                          const ContextRows* rows = nullptr) const;
  // out_keep (FP8, per-tensor scaling): with producer_amax, out's amax goes to its scalars as the
  // norm writes out, for the next linear's cast (ops/fp8.h Kept).
  void norm_forward(Norm n, Act* out, float* mean, float* rstd, const Act* inp, const Param* w, const Param* b, int N,
                    int C, const fp8::Kept* out_keep = nullptr) const;
  void residual_norm_forward(Norm n, Act* resid, Act* out, float* mean, float* rstd, const Act* a, const Act* b,
                             const Param* w, const Param* bias, int N, int C, const fp8::Kept* out_keep = nullptr) const;
  void norm_backward(Norm n, Act* dinp, float* dw, float* db, const Act* dout, const Act* inp, const Param* w,
                     const float* mean, const float* rstd, int N, int C) const;
  // Gemm::kFp8: each operand cast per call (its amax, over the group set_fp8 names, a power-of-two
  // scale and the bytes, in the layout Hopper's FP8 GEMMs take: ops/fp8.h), in set_fp8's recipe's
  // formats; only the forward's GEMM may use fast accumulation (the recipe's fast_accum). `keep`
  // (Gemm::kFp8): where the input's cast scalars (and, with bytes, its transposed cast) go for
  // the backward (ops/fp8.h Kept). Under the recipe's block scaling each operand is cast in its
  // tiles instead (weights in 128 x 128 blocks, the others in 1 x 128 tiles along K), and keeps
  // are not used: no cast of the backward's is the forward's.
  // `wcast` (Gemm::kFp8): the weight's cast for the step (fp8_cast_weight), read instead of casting
  // w (w is then not read).
  void linear_forward(Act* out, const Act* inp, const Param* w, const Param* b, int N, int IC, int OC,
                      Gemm g = Gemm::kBf16, const fp8::Kept* keep = nullptr,
                      const fp8::WeightCast* wcast = nullptr) const;
  // GELU fused into the GEMM's epilogue (in bf16; after an FP8 GEMM a kernel of its own); SwiGLU
  // a kernel after the GEMM (its pairs span columns).
  // out_keep (Gemm::kFp8): the output's keep for the next linear; with producer_amax the
  // activation writes out's amax there as it writes out.
  void linear_act_forward(Mlp m, Act* out, Act* pre, const Act* inp, const Param* w, const Param* b, int N, int IC,
                          int F, Gemm g = Gemm::kBf16, const fp8::Kept* keep = nullptr,
                          const fp8::Kept* out_keep = nullptr, const fp8::WeightCast* wcast = nullptr) const;
  // As CpuOps::linear_backward. In FP8 dout is cast once (e5m2) into both layouts, W^T (or `wcast`'s)
  // and inp^T (e4m3) each once; GELU's backward is then a kernel of its own (in bf16, the GEMM's epilogue).
  // `kept`, the forward's keep: inp^T is its bytes (inp is then not read, nor recomputed), or is
  // cast at its scale without an amax pass, a recomputed activation straight from pre.
  // dinp_amax (with pre): where the activation's backward writes dinp's amax as it writes dinp;
  // dout_amax: dout's amax is there already (an earlier backward's dinp_amax), so its cast skips
  // the amax pass.
  void linear_backward(Mlp m, Act* dinp, float* dw, float* db, const Act* dout, const Act* inp, const Param* w,
                       const Act* pre, int N, int IC, int OC, bool accumulate, Gemm g = Gemm::kBf16,
                       const fp8::Kept* kept = nullptr, const fp8::Kept* dinp_amax = nullptr,
                       const fp8::Kept* dout_amax = nullptr, const fp8::WeightCast* wcast = nullptr) const;
  // W (OC, IC) into its cast for the step, both layouts in one pass at one scale (per tensor: its
  // amax over set_fp8's group; per block: 128 x 128 blocks), in the recipe's forward format.
  void fp8_cast_weight(const fp8::WeightCast& c, const Param* w, int OC, int IC) const;
  // Why this GPU cannot compute Gemm::kFp8 in recipe r ("" when it can: fp8::gpu_refusal of its
  // capability).
  std::string fp8_refusal(const fp8::Recipe& r) const;
  // The recipe of the Gemm::kFp8 linears, and the group whose amaxes meet (ops/fp8.h); before the
  // first of them. The defaults: fp8::Recipe{}, one rank.
  void set_fp8(const fp8::Recipe& r, fp8::AmaxGroup group) const;
  void add(Act* out, const Act* a, const Act* b, int64_t n) const;
  void bias_backward(float* db, const Act* dout, int rows, int OC) const;  // db += column sums
  // train.attention (auto, cudnn, myriad) and train.deterministic; auto picks cuDNN's fused
  // attention per shape where it builds a plan (ops/cuda/cudnn_attention.h), else Myriad's kernel.
  // Either keeps the log-sum-exp rows (B,H,T) for its backward (cuDNN's in natural log, Myriad's in
  // log2): one shape always runs on one kernel.
  void select_attention(const std::string& kernel, bool deterministic) const;
  int64_t attention_saved(int B, int H, int T, int /*Tk*/ = 0) const { return int64_t(B) * H * T; }
  // docs (B,T) on the device, or null, and a context-parallel rank's query rows, or null: as
  // CpuOps's. Only Myriad's kernel takes either (cuDNN's fused attention would need each document
  // as a ragged sequence of its own, and takes whole sequences of queries).
  void attention_forward(Act* out, float* saved, const Act* qkv, int B, int T, int H, int Hkv, int D,
                         int window, const int32_t* docs = nullptr, const ContextRows* rows = nullptr) const;
  void attention_backward(Act* dqkv, const Act* dout, const Act* out, const Act* qkv, const float* saved, int B,
                          int T, int H, int Hkv, int D, int window, const int32_t* docs = nullptr,
                          const ContextRows* rows = nullptr) const;
  // The rotation frequencies go to the device once (fp32); the rotations as the CPU op set's.
  void set_rope(const std::vector<double>& freqs) const;
  void rope_forward(Act* qkv, int B, int T, int Hkv, int G, int D, const ContextRows* rows = nullptr) const;
  void rope_backward(Act* dqkv, int B, int T, int Hkv, int G, int D, const ContextRows* rows = nullptr) const;
  void crossentropy_forward(float* losses, const Act* logits, const int32_t* targets, int N, int V, int Vp) const;
  void crossentropy_forward_backward(float* losses, Act* logits, const int32_t* targets, float dloss, int N, int V,
                                     int Vp) const;

  // ---- rows a rank holds (tensor parallelism; ops/cpu/cpu_ops.h has the contracts) ----
  void add_bias(Act* out, const Param* bias, int rows, int C) const;
  void vocab_rows_forward(Act* out, const int32_t* tokens, const Param* wte, int64_t v0, int64_t Vl, int N,
                          int C) const;
  // Deterministic: the rows of each token summed in order (tokens loaded with [v0, v0 + Vl)).
  void vocab_rows_backward(float* dwte, const Act* dfull, const Tokens& tokens, int64_t v0, int64_t Vl, int N,
                           int C) const;
  void add_positions(Act* out, const Param* wpe, int r0, int rows, int T, int C,
                     const ContextRows* cr = nullptr) const;
  void positions_backward(float* dwpe, const Act* dout, int r0, int rows, int T, int C,
                          const ContextRows* cr = nullptr) const;
  void ce_row_max(float* mx, const Act* logits, int N, int64_t Vl, int live) const;
  void ce_partials(float* parts, const Act* logits, const float* mx, const int32_t* targets, int64_t v0, int N,
                   int64_t Vl, int live) const;
  void ce_losses(float* losses, float* sums, const float* parts, const int32_t* targets, int N) const;
  void ce_tp_backward(Act* dlogits, const float* mx, const float* sums, float dloss, const int32_t* targets,
                      int64_t v0, int N, int64_t Vl, int live) const;
  // ---- a mixture of experts' layer (the contracts are CpuOps's, ops/cpu/cpu_ops.h) ----
  // train.precision = "fp8" with experts is refused by cuda_unsupported_model (the experts'
  // grouped GEMMs are bf16 only), so there is nothing left to refuse here.
  std::string moe_refusal() const { return ""; }
  // Context parallelism: the kernels above take a rank's rows (Myriad's attention kernel only:
  // train.attention = "cudnn" is refused with cp), and the key/value exchange's packing runs on
  // the device (cpu_ops.h has the contracts).
  // Why cp cannot run here with chunks of `chunk` tokens (seq_len / (2 cp)), "" when it can.
  std::string context_parallel_refusal(int64_t chunk) const;
  void cp_pack_kv(Act* pack, const Act* qkv, int64_t N, int Hkv, int G, int D) const;
  void cp_unpack_kv(Act* whole, const Act* packs, const Act* local, int B, int T, const ContextRows* ranks, int cp,
                    int rank, int Hkv, int G, int D) const;
  void cp_pack_kv_grad(float* packs, const Act* dwhole, int B, int T, const ContextRows* ranks, int cp, int Hkv, int G,
                       int D) const;
  void cp_unpack_kv_grad(Act* dlocal, const float* mine, const Act* dwhole, int B, int T, const ContextRows* ranks,
                         int cp, int rank, int Hkv, int G, int D) const;
  // The router's logits in fp32 (cuBLASLt, bf16 operands, fp32 output); its backward's two
  // products in fp32 (ops/cuda/moe.cu), dx += and dw +=.
  void router_forward(float* logits, const Act* x, const Param* w, int N, int C, int E) const;
  void router_backward(Act* dx, float* dw, const float* dlogits, const Act* x, const Param* w, int N, int C,
                       int E) const;
  // The routing and its backward run on the host, through the CPU op set's own code (the oracle):
  // the logits go down, choice / weights / order / pos (or dlogits) come back up. Why: the counts
  // per expert must reach the host anyway (the grouped GEMMs' shapes are host arguments), so
  // route() synchronizes whatever computes it, and running the oracle's code gives exactly its
  // choice, ties and capacity drops included. Both synchronize the stream.
  Routing route(const Router& r, int32_t* choice, float* weights, int32_t* order, int32_t* pos, const float* logits,
                const Param* bias, int N) const;
  void route_backward(const Router& r, float* dlogits, const float* dweights, const float* logits,
                      const int32_t* choice, float grad_scale, int N, RouteTotals totals = {}) const;
  void gather_rows(Act* xs, const Act* x, const int32_t* order, int M, int k, int C) const;
  void gather_rows_backward(Act* dx, const Act* dxs, const int32_t* pos, int N, int k, int C) const;
  // The experts' GEMMs: one cuBLAS grouped GEMM (cublasGemmGroupedBatchedEx, bf16 operands, fp32
  // accumulation) over every expert that has rows, per product; the activation one kernel over
  // all rows. Where cuBLAS refuses the grouped call (or MYRIAD_MOE_GEMM=loop), a loop of the
  // cuBLASLt GEMMs, one per expert with rows (logged once): cuBLAS 13.1 takes the forward and
  // the input gradient but refuses the weight gradient (bf16 operands into fp32 C), so that one
  // product loops over the experts for now.
  void grouped_linear_act_forward(Mlp m, Act* out, Act* pre, const Act* inp, const Param* w, const int64_t* counts,
                                  int E, int IC, int F) const;
  void grouped_linear_forward(Act* out, const Act* inp, const Param* w, const int64_t* counts, int E, int IC,
                              int OC) const;
  void grouped_linear_backward(Mlp m, Act* dinp, float* dw, const Act* dout, const Act* inp, const Param* w,
                               const Act* pre, const int64_t* counts, int E, int IC, int OC) const;
  void combine_forward(Act* out, const Act* ys, const float* weights, const int32_t* pos, int N, int k, int C,
                       bool accumulate) const;
  void combine_backward(Act* dys, float* dweights, const Act* dout, const Act* ys, const float* weights,
                        const int32_t* pos, int N, int k, int C) const;
  // The queries' and keys' RMSNorm (model.qk_norm; the contract is CpuOps's): one block per
  // token, fp32 sums in a fixed order (ops/cuda/qk_norm.cu).
  void qk_norm_forward(QkNorm n, Act* qkv, float* rstd, const Act* raw, const Param* wq, const Param* wk, int N,
                       int Hkv, int G, int D) const;
  void qk_norm_backward(QkNorm n, Act* dqkv, float* dwq, float* dwk, const Act* raw, const Param* wq, const Param* wk,
                        const float* rstd, int N, int Hkv, int G, int D) const;
  // The tensor-parallel regions reduce in fp32: activations widened before, narrowed after.
  void widen(float* dst, const Act* src, int64_t n) const;
  void narrow(Act* dst, const float* src, int64_t n) const;

 struct State;  // cuda_ops.cu

 private:
  // Scratch of at least n floats, shared by the ops (one runs at a time).
  float* scratch(size_t n) const;
  // dwte rows += the rows of dout (B*T, C) of each id of t held in its vocabulary rows; dwpe as
  // the embedding's (may be null). Deterministic.
  void rows_by_id_backward(float* dwte, float* dwpe, const Act* dout, const Tokens& t, int B, int T, int C,
                           const ContextRows* rows = nullptr) const;
  // The device's copy of boundaries (cached while they stay the same).
  const int64_t* segments(const std::vector<int64_t>& bounds) const;
  std::shared_ptr<State> st_;
};

}  // namespace myriad::cuda
