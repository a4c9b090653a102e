// The CPU op set: what the one layer schedule (model/gpt.h) runs on, in fp32 on the host. The
// contract every op set meets is ops/op_set.h's concept OpSet; this class is its reference, and
// the kernels' comments below say what each computes.
//
// Besides the kernels of ops/cpu/ops.h, the pieces of the tensor-parallel layers that are
// row loops (vocabulary-parallel embedding and cross-entropy, biases and positions on the rows a
// rank holds) live here, so that the schedule itself touches no element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/parallel_layout.h"
#include "ops/fp8.h"
#include "ops/kinds.h"

namespace myriad::cpu {

class CpuOps {
 public:
  using Act = float;
  using Param = float;
  template <class T>
  class Buffer {
   public:
    void zeros(int64_t n) { v_.assign(static_cast<size_t>(n), T{}); }
    T* data() { return v_.data(); }
    const T* data() const { return v_.data(); }
    int64_t size() const { return static_cast<int64_t>(v_.size()); }

   private:
    std::vector<T> v_;
  };

  // Token ids of a micro-batch (B,T) in the op set's memory, with whatever the backward of a
  // lookup by them needs (nothing more here; the CUDA op set groups positions by id).
  class Tokens {
   public:
    void zeros(int64_t n) { ids_.zeros(n); }
    int32_t* data() { return ids_.data(); }
    const int32_t* data() const { return ids_.data(); }

   private:
    Buffer<int32_t> ids_;
  };

  const char* name() const { return "cpu"; }

  // ---- moving data ----
  template <class T>
  void zero(T* x, int64_t n) const;
  template <class T>
  void copy(T* dst, const T* src, int64_t n) const;
  // From and to host memory: plain copies here.
  void download(float* host, const float* src, int64_t n) const { copy(host, src, n); }
  void download(double* host, const double* src, int64_t n) const { copy(host, src, n); }
  // B rows of T token ids from the host, `stride` apart, into t (B*T). With Vl > 0 the ids will
  // also be looked up in vocabulary rows [v0, v0 + Vl) (embedding_backward, vocab_rows_backward).
  void load_tokens(Tokens& t, const int32_t* host, int B, int T, int64_t stride, int64_t v0 = 0,
                   int64_t Vl = 0) const;
  // *acc += the sum of x[0, n) / count (0: n, the mean): summed in double in order, rounded to
  // float (a micro-batch's mean loss, over the positions counted), so the step's loss stays in
  // the op set's memory until it is read once.
  void mean_into(double* acc, const float* x, int64_t n, int64_t count = 0) const;

  // ---- what the step needs besides the model (runtime/model_engine.h) ----
  std::string device_name() const;                  // for logs: "cpu (2 threads)"
  double peak_flops() const { return 0; }           // unknown: no MFU
  void* comm_stream() const { return nullptr; }     // collectives on host memory need none
  static int64_t peak_bytes() { return 0; }          // not tracked here (core/memory.h counts)
  void upload(float* dst, const float* host, int64_t n) const { copy(dst, host, n); }
  // The compute copy and the fp32 regions of a narrower op set; here Param and Act are fp32,
  // so each is a copy (the one schedule and the one step call them only where types differ).
  void upload_params(Param* dst, const float* host, int64_t n) const { copy(dst, host, n); }
  void cast_params(Param* dst, const float* master, int64_t n) const { copy(dst, master, n); }
  void widen(float* dst, const Act* src, int64_t n) const { copy(dst, src, n); }
  void narrow(Act* dst, const float* src, int64_t n) const { copy(dst, src, n); }
  // Host memory the device copies from without staging: nothing to pin on the CPU.
  std::shared_ptr<void> pin_host(void*, size_t) const { return nullptr; }
  // The sum of squares of each piece [begin, end) of x, in double, fixed chunk order.
  std::vector<double> sums_of_squares(const float* x, const std::vector<std::pair<int64_t, int64_t>>& pieces) const;
  void accumulate(float* dst, const float* src, int64_t n) const;  // dst += src
  // Phase timers on the op set's timeline (here the host clock; CUDA events on a GPU): mark()
  // is a point after everything issued so far; seconds(a, b) between two marks, waiting for b
  // to be reached; clear_marks() forgets the step's marks.
  int mark() const;
  double seconds(int from, int to) const;
  void clear_marks() const { marks_->clear(); }

  // ---- the kernels of ops/cpu/ops.h ----
  // rows (a context-parallel rank's, T = rows->count()): the positions of the T rows; null: 0..T-1.
  void embedding_forward(Act* out, const int32_t* tokens, const Param* wte, const Param* wpe, int B, int T, int C,
                         const ContextRows* rows = nullptr) const;
  // tokens loaded with the vocabulary rows [0, Vp).
  void embedding_backward(float* dwte, float* dwpe, const Act* dout, const Tokens& tokens, int B, int T, int C,
                          const ContextRows* rows = nullptr) const;
  // The block's norm, LayerNorm or RMSNorm (`n`): mean (N) is LayerNorm's only, b (bias, may be
  // null) too; rstd (N) both keep for backward. out_keep: FP8's (never here: fp8_refusal).
  void norm_forward(Norm n, Act* out, float* mean, float* rstd, const Act* inp, const Param* w, const Param* b, int N,
                    int C, const fp8::Kept* out_keep = nullptr) const;
  // resid (N,C) = a + b, then out (N,C) = norm(resid): the residual add and the next norm.
  void residual_norm_forward(Norm n, Act* resid, Act* out, float* mean, float* rstd, const Act* a, const Act* b,
                             const Param* w, const Param* bias, int N, int C, const fp8::Kept* out_keep = nullptr) const;
  void norm_backward(Norm n, Act* dinp, float* dw, float* db, const Act* dout, const Act* inp, const Param* w,
                     const float* mean, const float* rstd, int N, int C) const;
  // The linears take the GEMMs' arithmetic (ops/kinds.h): the CPU computes in fp32, kBf16 only
  // (train.precision = "fp8" is refused before a CPU model is built: fp8_refusal), so the FP8
  // casts a forward keeps for its backward (fp8::Kept, CudaOps's) and the weights' casts
  // (fp8::WeightCast) are never given here.
  void linear_forward(Act* out, const Act* inp, const Param* w, const Param* b, int N, int IC, int OC,
                      Gemm g = Gemm::kBf16, const fp8::Kept* keep = nullptr,
                      const fp8::WeightCast* wcast = nullptr) const;
  // The MLP's first GEMM and its activation: pre (N, F x pre_width(m)) = inp @ w^T + b (kept for
  // backward), out (N,F) = gelu(pre) or SwiGLU of pre's (gate, up) pairs.
  void linear_act_forward(Mlp m, Act* out, Act* pre, const Act* inp, const Param* w, const Param* b, int N, int IC,
                          int F, Gemm g = Gemm::kBf16, const fp8::Kept* keep = nullptr,
                          const fp8::Kept* out_keep = nullptr, const fp8::WeightCast* wcast = nullptr) const;
  // A linear's whole backward, both GEMMs from one dout (so that an FP8 GEMM casts it once):
  // dw (OC,IC) += dout^T @ inp; db (OC) += column sums of dout (db may be null); and the input
  // gradient dout (N,OC) @ w (OC,IC) into dinp (N,IC) (+= when `accumulate`) or, when `pre` is
  // given (the MLP's second linear, IC = F), through the activation m into dinp = dpre
  // (N, F x pre_width(m)) (=, the gradient of linear_act_forward's pre; `accumulate` false).
  // With `pre`, inp may be null: the activation's output is recomputed from pre by the forward's
  // own kernel, so that a model need not keep it (GptModel does not). The same bits, but where
  // the CUDA forward took GELU from cuBLASLt's bf16 epilogue: there the two may differ in a last
  // bit.
  void linear_backward(Mlp m, Act* dinp, float* dw, float* db, const Act* dout, const Act* inp, const Param* w,
                       const Act* pre, int N, int IC, int OC, bool accumulate, Gemm g = Gemm::kBf16,
                       const fp8::Kept* kept = nullptr, const fp8::Kept* dinp_amax = nullptr,
                       const fp8::Kept* dout_amax = nullptr, const fp8::WeightCast* wcast = nullptr) const;
  void fp8_cast_weight(const fp8::WeightCast&, const Param*, int, int) const;  // never called: fp8_refusal
  // Why this op set cannot compute Gemm::kFp8 ("" when it can).
  std::string fp8_refusal(const fp8::Recipe&) const {
    return "train.precision = \"fp8\": the CPU engine computes in fp32 (FP8 needs a Hopper GPU); use train.precision = \"bf16\"";
  }
  void set_fp8(const fp8::Recipe&, fp8::AmaxGroup) const {}  // never called: fp8_refusal comes first
  void add(Act* out, const Act* a, const Act* b, int64_t n) const;  // out may alias a or b
  // Which attention kernel, and whether its backward must be bitwise repeatable (train.attention,
  // train.deterministic): the CPU has one kernel, always deterministic.
  void select_attention(const std::string&, bool) const {}
  // Floats attention keeps for its backward, per micro-batch: the softmax rows (B,H,T,Tk) of T
  // query rows against Tk keys (0: T; a context-parallel rank's rows against the sequence's).
  int64_t attention_saved(int B, int H, int T, int Tk = 0) const { return int64_t(B) * H * T * (Tk > 0 ? Tk : T); }
  // H query heads, Hkv key/value heads, of D features: qkv (B,T,Hkv*(H/Hkv+2)*D) as ops/cpu/ops.h
  // lays it out, out (B,T,H*D). docs (B,T): where each position's document begins in its row
  // (data.document_mask), in the op set's memory; null: every row one document. rows: a context-
  // parallel rank's query rows (ops/cpu/ops.h): out, dout and saved hold those rows, qkv, dqkv and
  // docs the whole sequence of T.
  void attention_forward(Act* out, float* saved, const Act* qkv, int B, int T, int H, int Hkv, int D,
                         int window, const int32_t* docs = nullptr, const ContextRows* rows = nullptr) const;
  // dqkv (=); out is attention_forward's output.
  void attention_backward(Act* dqkv, const Act* dout, const Act* out, const Act* qkv, const float* saved, int B,
                          int T, int H, int Hkv, int D, int window, const int32_t* docs = nullptr,
                          const ContextRows* rows = nullptr) const;
  // The queries' and keys' RMSNorm (ops/kinds.h's QkNorm) on qkv (N tokens, (Hkv, G+2, D) each,
  // as attention reads it): qkv (=) from raw, the QKV GEMM's output, the values copied; rstd
  // (N, Hkv (G+1)) per head (kHead: each group's G query heads, then its key head), or (N, 2)
  // (kAll: the token's queries, its keys). wq and wk: (D) each (kHead), or (Hkv G D) and (Hkv D)
  // in the canonical head order (kAll). The backward turns dqkv, the gradient of qkv, into the
  // gradient of raw in place (the values' passes through) and adds the weights' gradients.
  void qk_norm_forward(QkNorm n, Act* qkv, float* rstd, const Act* raw, const Param* wq, const Param* wk, int N,
                       int Hkv, int G, int D) const;
  void qk_norm_backward(QkNorm n, Act* dqkv, float* dwq, float* dwk, const Act* raw, const Param* wq, const Param* wk,
                        const float* rstd, int N, int Hkv, int G, int D) const;
  // Rotary positions on the query and key heads of qkv, in place (ops/cpu/ops.h): the rotation
  // frequencies (D/2, ops/rope.h) are set once; each row of a micro-batch starts at position 0.
  // The backward rotates dqkv's query and key parts back, in place.
  void set_rope(const std::vector<double>& freqs) const { *freqs_ = freqs; }
  // rows: a context-parallel rank's (T = rows->count()), row t at position rows->position(t).
  void rope_forward(Act* qkv, int B, int T, int Hkv, int G, int D, const ContextRows* rows = nullptr) const;
  void rope_backward(Act* dqkv, int B, int T, int Hkv, int G, int D, const ContextRows* rows = nullptr) const;
  // The CPU runs context parallelism (the oracle of it), chunks of any length.
  std::string context_parallel_refusal(int64_t /*chunk*/) const { return ""; }
  // Context parallelism's key/value exchange (GptModel's gather and reduce-scatter over the cp
  // group). A rank's block is its T rows' key and value heads, (B,T,Hkv,2,D); rank q's rows of a
  // sequence of Tw = cp T are ranks[q] (the micro-batch's context_assignment, cp of them); qkv
  // rows are (Hkv,G+2,D).
  // pack (N,Hkv,2,D) = the key and value heads of qkv (N,Hkv,G+2,D).
  void cp_pack_kv(Act* pack, const Act* qkv, int64_t N, int Hkv, int G, int D) const;
  // whole (B,Tw,Hkv,G+2,D): rank q's rows take their keys and values from packs' block q (cp blocks),
  // this rank's rows all of local (B,T,...), queries too; other rows' query heads are not written.
  void cp_unpack_kv(Act* whole, const Act* packs, const Act* local, int B, int T, const ContextRows* ranks, int cp,
                    int rank, int Hkv, int G, int D) const;
  // packs' block q (fp32, for the reduce-scatter) = dwhole's key and value heads at rank q's rows.
  void cp_pack_kv_grad(float* packs, const Act* dwhole, int B, int T, const ContextRows* ranks, int cp, int Hkv, int G,
                       int D) const;
  // dlocal (B,T,...) = dwhole's rows of this rank, their key and value heads from mine (B,T,Hkv,2,D).
  void cp_unpack_kv_grad(Act* dlocal, const float* mine, const Act* dwhole, int B, int T, const ContextRows* ranks,
                         int cp, int rank, int Hkv, int G, int D) const;
  // A negative target leaves its position out (loss 0, gradient 0), in these and the
  // vocabulary-parallel ops below.
  void crossentropy_forward(float* losses, const Act* logits, const int32_t* targets, int N, int V, int Vp) const;
  // The losses, and the logits turned into dlogits (=) in place, every token's loss having the
  // derivative dloss (the mean's): one pass where the device can.
  void crossentropy_forward_backward(float* losses, Act* logits, const int32_t* targets, float dloss, int N, int V,
                                     int Vp) const;

  // ---- rows a rank holds (tensor parallelism) ----
  void add_bias(Act* out, const Param* bias, int rows, int C) const;             // out (rows,C) += bias
  void bias_backward(float* db, const Act* dout, int rows, int OC) const;        // db += column sums
  // out (N,C): row n = wte row tokens[n] - v0 when this rank holds it (in [0, Vl)), else 0.
  void vocab_rows_forward(Act* out, const int32_t* tokens, const Param* wte, int64_t v0, int64_t Vl, int N,
                          int C) const;
  // dwte (Vl,C) += the rows of dfull (N,C) whose token this rank holds; tokens loaded with [v0, v0 + Vl).
  void vocab_rows_backward(float* dwte, const Act* dfull, const Tokens& tokens, int64_t v0, int64_t Vl, int N,
                           int C) const;
  // out (rows,C) += wpe[p] for row i, p = (r0 + i) % T, or with cr (a context-parallel rank's rows,
  // T of them per sequence) cr->position((r0 + i) % T); its gradient the same way round.
  void add_positions(Act* out, const Param* wpe, int r0, int rows, int T, int C, const ContextRows* cr = nullptr) const;
  void positions_backward(float* dwpe, const Act* dout, int r0, int rows, int T, int C,
                          const ContextRows* cr = nullptr) const;
  // Vocabulary-parallel cross-entropy over logits (N,Vl), columns [v0, v0 + Vl) of the
  // vocabulary, the first `live` of them real: the row maxima; then each row's sum of
  // exp(x - max) and its target's shifted logit (0 unless held here) into parts (N,2); then,
  // once parts are summed over the ranks, the losses; and the backward, in place.
  void ce_row_max(float* mx, const Act* logits, int N, int64_t Vl, int live) const;
  void ce_partials(float* parts, const Act* logits, const float* mx, const int32_t* targets, int64_t v0, int N,
                   int64_t Vl, int live) const;
  void ce_losses(float* losses, float* sums, const float* parts, const int32_t* targets, int N) const;
  void ce_tp_backward(Act* dlogits, const float* mx, const float* sums, float dloss, const int32_t* targets,
                      int64_t v0, int N, int64_t Vl, int live) const;

  // ---- a mixture of experts' layer (docs/notes/moe.md); M = N x k routed rows ----
  // Why this op set cannot run an MoE layer ("" when it can).
  std::string moe_refusal() const { return ""; }
  // The router, in fp32 on every op set: logits (N,E) = x (N,C) @ w (E,C)^T; its backward
  // dx (N,C) += dlogits @ w, dw (E,C) += dlogits^T @ x.
  void router_forward(float* logits, const Act* x, const Param* w, int N, int C, int E) const;
  void router_backward(Act* dx, float* dw, const float* dlogits, const Act* x, const Param* w, int N, int C,
                       int E) const;
  // The choice (ops/kinds.h's Router): choice (N,k) each token's experts, best first; weights
  // (N,k) theirs; order (M) the routed slots (n k + j) sorted by expert, then token, then slot (a
  // stable counting sort: deterministic), M the rows kept (N k unless a capacity drops some);
  // pos (N k) each slot's row in that order, -1 for a dropped slot. bias (E) may be null.
  // Returns the rows per expert, the rows dropped and the layer's aux and z losses (its balance
  // that of the choice, before any drop).
  Routing route(const Router& r, int32_t* choice, float* weights, int32_t* order, int32_t* pos, const float* logits,
                const Param* bias, int N) const;
  // dlogits (N,E) (=): from dweights (N,k), the gradient of the weights route() gave, and
  // grad_scale x (r.aux_loss x aux + r.z_loss x z) of this micro-batch's choice; with totals,
  // these N tokens are a part of the micro-batch whose balance statistics totals gives.
  void route_backward(const Router& r, float* dlogits, const float* dweights, const float* logits,
                      const int32_t* choice, float grad_scale, int N, RouteTotals totals = {}) const;
  // xs (M,C): row i is x's row order[i] / k (the token of slot order[i]).
  void gather_rows(Act* xs, const Act* x, const int32_t* order, int M, int k, int C) const;
  // dx (N,C) += the rows pos[n k + j] of dxs (M,C), j = 0..k-1 in order (a dropped slot none).
  void gather_rows_backward(Act* dx, const Act* dxs, const int32_t* pos, int N, int k, int C) const;
  // The experts' linears, one group of consecutive rows each (counts (E), on the host): group e
  // through w + e OC IC, expert e's (OC,IC) of the stacked weights (E OC, IC). As
  // linear_act_forward, linear_forward and linear_backward (dinp =, dw +=), without biases.
  void grouped_linear_act_forward(Mlp m, Act* out, Act* pre, const Act* inp, const Param* w, const int64_t* counts,
                                  int E, int IC, int F) const;
  void grouped_linear_forward(Act* out, const Act* inp, const Param* w, const int64_t* counts, int E, int IC,
                              int OC) const;
  void grouped_linear_backward(Mlp m, Act* dinp, float* dw, const Act* dout, const Act* inp, const Param* w,
                               const Act* pre, const int64_t* counts, int E, int IC, int OC) const;
  // out (N,C) row n = the sum over j = 0..k-1, in order, of weights[n,j] x ys row pos[n k + j]
  // (=, or += when accumulate; a dropped slot adds nothing); its backward: dys (M,C) (=) row
  // pos[n k + j] = weights[n,j] x dout row n, dweights (N,k) (=) the dot products of dout row n
  // and those ys rows (0 for a dropped slot).
  void combine_forward(Act* out, const Act* ys, const float* weights, const int32_t* pos, int N, int k, int C,
                       bool accumulate) const;
  void combine_backward(Act* dys, float* dweights, const Act* dout, const Act* ys, const float* weights,
                        const int32_t* pos, int N, int k, int C) const;

 private:
  std::shared_ptr<std::vector<double>> marks_ = std::make_shared<std::vector<double>>();  // shared by copies
  std::shared_ptr<std::vector<float>> scratch_ = std::make_shared<std::vector<float>>();  // one op at a time
  std::shared_ptr<std::vector<float>> act_scratch_ = std::make_shared<std::vector<float>>();  // linear_backward's act
  std::shared_ptr<std::vector<double>> freqs_ = std::make_shared<std::vector<double>>();  // set_rope's
};

}  // namespace myriad::cpu
