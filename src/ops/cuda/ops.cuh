// CUDA backend kernels: bf16 activations, fp32 statistics, fp32 gradients of parameters.
//
// Conventions (the CUDA counterpart of ops/cpu/ops.h; the CPU backend is their oracle):
// - Raw device pointers with the shape of each buffer in a comment, row-major, the same
//   layouts as the CPU ops (QKV per token (H,3,D), attention output (H,D)).
// - Every function takes the stream it runs on and only enqueues work (no synchronization, no
//   allocation): completion is signalled by events the caller records, so communication can
//   later overlap compute without changing the ops.
// - Parameter gradients are fp32 and ACCUMULATED (+=); activation gradients are bf16 and
//   accumulated (+=) where marked, written (=) where marked.
// - Deterministic: no floating-point atomics; every reduction runs in a fixed order, so the
//   same inputs give bitwise equal outputs run after run.
// - Scratch buffers are the caller's; each function that needs one says how many floats.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/fp8.h"

namespace myriad::cuda {

using bf16 = __nv_bfloat16;

// Where row t of a sequence's rows sits in the sequence: t itself, or under context parallelism
// a rank's two ranges of it (core/parallel_layout.h's ContextRows): rows [0, n0) at p0 + t, the
// rest at p1 + (t - n0). The kernels that read positions (RoPE, learned positions, attention's
// masks) take one by value.
struct RowPositions {
  int64_t p0 = 0, n0 = INT64_MAX, p1 = 0;
  __host__ __device__ int64_t operator()(int64_t t) const { return t < n0 ? p0 + t : p1 + (t - n0); }
};

// out[b,t,:] = wte[tokens[b,t],:] + wpe[pos(t),:]
void embedding_forward(bf16* out,             // (B,T,C)
                       const int32_t* tokens,  // (B,T)
                       const bf16* wte,        // (Vp,C)
                       const bf16* wpe,        // (P,C)
                       int B, int T, int C, cudaStream_t stream, RowPositions pos = {});

// dwpe[t] += sum_b dout[b,t]; dwte[v] += sum of dout over the positions holding token v.
// Deterministic without atomics: the caller passes the B*T positions grouped by token
// (`positions`, ascending within a group), with group g covering positions[starts[g] ..
// starts[g+1]) and holding token ids[g] (built on the host, where the tokens come from).
void embedding_backward(float* dwte,               // (Vp,C) +=
                        float* dwpe,               // (P,C) +=; may be null (then B, T only shape dout)
                        const bf16* dout,          // (B,T,C)
                        const int32_t* positions,  // (B*T) flat indices b*T+t grouped by token
                        const int32_t* starts,     // (groups+1)
                        const int32_t* ids,        // (groups)
                        int groups, int B, int T, int C, cudaStream_t stream,
                        RowPositions pos = {});  // dwpe's row of row t: pos(t)

// The host side of embedding_backward: writes the groups of tokens[N] (ids in [0, vocab)) into
// out (3N + 1 ints): [positions (N)] [starts (G+1)] [ids (G)], a counting sort, positions
// ascending within a group; returns G, the number of distinct tokens.
int group_positions_by_token(const int32_t* tokens, int N, int vocab, int32_t* out);

// LayerNorm over the last dimension, eps 1e-5, statistics in fp32. bias may be null. The four
// norm forwards take amax (device, or null): out's amax as cuda::amax would measure it (FP8: the
// next linear's cast's).
void layernorm_forward(bf16* out, float* mean, float* rstd,  // (N,C), (N), (N)
                       const bf16* inp,                        // (N,C)
                       const bf16* weight, const bf16* bias,   // (C), (C) or null
                       int N, int C, cudaStream_t stream, float* amax = nullptr);
// resid = a + b, then out = LayerNorm(resid): the residual add fused into the norm.
void residual_layernorm_forward(bf16* resid, bf16* out, float* mean, float* rstd,  // (N,C) (N,C) (N) (N)
                                const bf16* a, const bf16* b,                      // (N,C)
                                const bf16* weight, const bf16* bias,              // (C)
                                int N, int C, cudaStream_t stream, float* amax = nullptr);
// dinp += ..., dweight += ..., dbias += ... (dbias may be null).
// scratch: at least layernorm_scratch_floats(N, C) floats.
size_t layernorm_scratch_floats(int N, int C);
void layernorm_backward(bf16* dinp,                     // (N,C) +=
                        float* dweight, float* dbias,   // (C) +=
                        float* scratch,
                        const bf16* dout,               // (N,C)
                        const bf16* inp,                // (N,C)
                        const bf16* weight,             // (C)
                        const float* mean, const float* rstd,  // (N)
                        int N, int C, cudaStream_t stream);

// GELU, tanh approximation (as the CPU op).
// amax (device, or null): out's amax as cuda::amax would measure it (FP8: the next cast's).
void gelu_forward(bf16* out, const bf16* inp, int64_t n, cudaStream_t stream, float* amax = nullptr);
// dinp = dout * gelu'(inp)  (written, not accumulated; dinp may alias dout).
// amax (device, or null): dinp's amax as cuda::amax would measure it (FP8: the next cast's).
void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int64_t n, cudaStream_t stream,
                   float* amax = nullptr);

// out = a + b (out may alias a or b).
void add(bf16* out, const bf16* a, const bf16* b, int64_t n, cudaStream_t stream);

// dbias += column sums of dout. scratch: at least bias_scratch_floats(N, OC) floats.
size_t bias_scratch_floats(int N, int OC);
void bias_backward(float* dbias,       // (OC) +=
                   float* scratch,
                   const bf16* dout,   // (N,OC)
                   int N, int OC, cudaStream_t stream);

// Softmax cross-entropy over the first V of Vp columns, one pass over each row:
// losses[n] = -log softmax(logits[n])[targets[n]]; when dloss != 0, logits is overwritten in
// place by dlogits = (softmax - onehot(target)) * dloss on the first V columns and 0 on the
// padding (dloss = grad_scale / tokens: the mean's derivative). A negative target leaves its
// row out: loss 0, dlogits 0.
void crossentropy(float* losses,          // (N)
                  bf16* logits,           // (N,Vp) in: logits, out: dlogits when dloss != 0
                  const int32_t* targets, // (N) in [0, V), or negative
                  float dloss, int N, int V, int Vp, cudaStream_t stream);

// out = bf16(in)
void cast_to_bf16(bf16* out, const float* in, int64_t n, cudaStream_t stream);

// Sum of squares of x[segments[i] .. segments[i+1]) for each of the `count` segments, into
// out[count] (fp32 accumulated in a fixed order, written with =). One launch for all tensors:
// the global gradient norm is sqrt(sum(out)), LAMB's per-tensor norms are sqrt(out[i]).
// scratch: at least sumsq_scratch_floats(total, count) floats.
size_t sumsq_scratch_floats(int64_t total, int count);
void segment_sum_squares(float* out, float* scratch, const float* x, const int64_t* segments,
                         int count, int64_t total, cudaStream_t stream);

// x *= *scale (scale on the device: the clipping coefficient computed there).
void scale_inplace(float* x, const float* scale, int64_t n, cudaStream_t stream);

// Fused AdamW over every tensor at once: for each element of segment i (tensor i), with
// g = grad_scale x the stored gradient (the clipping coefficient, applied as it is read),
// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w = w (1 - lr wd_i) - lr (m/c1) / (sqrt(v/c2) + eps);
// then w_bf16 = bf16(w). wd_i = weight_decay when decay[i] else 0. c1 = 1 - b1^t, c2 = 1 - b2^t.
struct AdamParams {
  float lr, beta1, beta2, eps, weight_decay, c1, c2;
  float grad_scale = 1.0f;
};
void adamw_step(float* w, bf16* w_bf16, float* m, float* v, const float* g,
                const int64_t* segments, const uint8_t* decay, int count, int64_t total,
                AdamParams p, cudaStream_t stream);
// Fused LAMB in two passes: u = (m/c1)/(sqrt(v/c2)+eps) + wd_i w into `update` (total floats),
// per-tensor norms of w and u (segment_sum_squares), then w -= lr * trust_i * u with
// trust_i = ||w_i|| / ||u_i|| (1 when either is 0); w_bf16 refreshed.
// scratch: at least lamb_scratch_floats(total, count) floats.
// Its two passes apart, for a sharded LAMB whose norms are completed over ranks in between:
// lamb_direction writes u and leaves the norms to the caller; lamb_apply takes ||w_i||^2 and
// ||u_i||^2 per segment.
void lamb_direction(const float* w, float* m, float* v, const float* g, float* update,
                    const int64_t* segments, const uint8_t* decay, int count, int64_t total,
                    AdamParams p, cudaStream_t stream);
void lamb_apply(float* w, bf16* w_bf16, const float* update, const float* wn2, const float* un2,
                const int64_t* segments, int count, int64_t total, float lr, cudaStream_t stream);
size_t lamb_scratch_floats(int64_t total, int count);
void lamb_step(float* w, bf16* w_bf16, float* m, float* v, const float* g, float* update,
               float* scratch, const int64_t* segments, const uint8_t* decay, int count,
               int64_t total, AdamParams p, cudaStream_t stream);

// Flash attention (never materializes T x T), causal with an optional sliding window: query i
// sees keys j <= i with i - j < window when window > 0, and j >= docs[b,i] when docs (B,T), the
// start of each position's document in its row, is set. Scale 1/sqrt(D). D in {64, 80, 128}.
// Grouped-query: H query heads over Hkv key/value heads (H a multiple of Hkv), QKV per token
// (Hkv, G+2, D) with G = H / Hkv (G = 1: (H, 3, D)); query head h reads key/value head h / G.
// Context parallelism: `rows` names a rank's Tq query rows (two ranges of the T positions,
// queries[p0, p0 + n0) then [p1, p1 + Tq - n0)), read from qkv at their positions against all T
// keys; out, dout and lse hold those Tq rows in that order, qkv and dqkv stay (B,T,...): dqkv's
// query rows outside `rows` are not written, its keys and values are, every one. Each range's
// length a multiple of 8. Default: all T rows, Tq = T.
struct QueryRows {
  RowPositions pos;
  int count = -1;  // Tq; -1: T
};
void attention_forward(bf16* out,         // (B,Tq,H,D)
                       float* lse,        // (B,H,Tq) log-sum-exp of each score row (for backward)
                       const bf16* qkv,   // (B,T,Hkv,G+2,D)
                       int B, int T, int H, int Hkv, int D, int window, cudaStream_t stream,
                       const int32_t* docs = nullptr,  // (B,T) or null
                       QueryRows rows = {});
// dqkv written (=); a key/value head's gradients sum its G query heads' in head order.
// scratch: at least attention_scratch_floats(B, Tq, H, D) floats.
size_t attention_scratch_floats(int B, int Tq, int H, int D);
void attention_backward(bf16* dqkv,        // (B,T,Hkv,G+2,D) =
                        float* scratch,
                        const bf16* dout,  // (B,Tq,H,D)
                        const bf16* out,   // (B,Tq,H,D)
                        const bf16* qkv,   // (B,T,Hkv,G+2,D)
                        const float* lse,  // (B,H,Tq)
                        int B, int T, int H, int Hkv, int D, int window, cudaStream_t stream,
                        const int32_t* docs = nullptr,  // (B,T) or null
                        QueryRows rows = {});

// ---- Llama family (ops/cpu/ops.h has their definitions; the CPU op is the oracle) ----------

// RMSNorm over the last dimension (HF's LlamaRMSNorm): out = (inp * rstd) * weight,
// rstd = 1 / sqrt(mean(inp^2) + eps), statistics in fp32 (eps rounded to fp32).
void rmsnorm_forward(bf16* out, float* rstd,  // (N,C), (N)
                     const bf16* inp,         // (N,C)
                     const bf16* weight,      // (C)
                     int N, int C, double eps, cudaStream_t stream, float* amax = nullptr);
// resid = bf16(a + b), then out = RMSNorm(resid) as stored: the residual add fused into the norm.
void residual_rmsnorm_forward(bf16* resid, bf16* out, float* rstd,  // (N,C) (N,C) (N)
                              const bf16* a, const bf16* b,         // (N,C)
                              const bf16* weight,                   // (C)
                              int N, int C, double eps, cudaStream_t stream, float* amax = nullptr);
// dinp += ..., dweight += ... (the weight gradient summed over rows in a fixed order, two passes).
// scratch: at least rmsnorm_scratch_floats(N, C) floats.
size_t rmsnorm_scratch_floats(int N, int C);
void rmsnorm_backward(bf16* dinp,          // (N,C) +=
                      float* dweight,      // (C) +=
                      float* scratch,
                      const bf16* dout,    // (N,C)
                      const bf16* inp,     // (N,C) (the stored residual when fused)
                      const bf16* weight,  // (C)
                      const float* rstd,   // (N) from the forward
                      int N, int C, cudaStream_t stream);

// Rotary positions, rotate-half convention, IN PLACE on the query and key heads of the fused QKV
// activation laid out (Hkv, G+2, D) per token (G query heads, then k, then v per key/value head;
// v untouched); row t of each batch is at position pos0 + pos(t). freqs: D/2 floats on the device,
// rope_frequencies (ops/rope.h) rounded to fp32. Angles and their sincos in fp64, rounded to
// fp32 (rope.cu says why). D even, at most 512.
void rope_forward(bf16* qkv,           // (B,T,Hkv*(G+2)*D) in place
                  const float* freqs,  // (D/2) device
                  int B, int T, int Hkv, int G, int D, int pos0, cudaStream_t stream,
                  RowPositions pos = {});
// The rotation back, IN PLACE (neither = nor +=, as the CPU op): dqkv holds the gradient with
// respect to the rotated q and k on entry and the unrotated ones on return; v parts untouched.
void rope_backward(bf16* dqkv,          // (B,T,Hkv*(G+2)*D) in place
                   const float* freqs,  // (D/2) device
                   int B, int T, int Hkv, int G, int D, int pos0, cudaStream_t stream,
                   RowPositions pos = {});

// SwiGLU: out = silu(gate) * up, silu in fp32; gu interleaved per feature (gate at 2f, up at 2f+1).
void swiglu_forward(bf16* out,       // (N,F)
                    const bf16* gu,  // (N,F,2)
                    int64_t N, int64_t F, cudaStream_t stream,
                    float* amax = nullptr);  // out's amax as cuda::amax measures it, or null
// dgu written (=), not accumulated (the CPU op accumulates); dgu may alias gu.
void swiglu_backward(bf16* dgu,         // (N,F,2) =
                     const bf16* gu,    // (N,F,2)
                     const bf16* dout,  // (N,F)
                     int64_t N, int64_t F, cudaStream_t stream,
                     float* amax = nullptr);  // dgu's amax as cuda::amax measures it, or null

// Grouped-query QKV between Myriad's layout, per token (Hkv, G+2, D) (each key/value head's G
// query heads, then its key, then its value), and the heads' layout, per token [H query heads |
// Hkv keys | Hkv values], where the query heads are one stride apart (what cuDNN's attention
// takes in one call). The same elements, moved; out and in must not overlap.
void qkv_to_heads(bf16* out, const bf16* in, int64_t tokens, int H, int Hkv, int D, cudaStream_t stream);
void qkv_from_heads(bf16* out, const bf16* in, int64_t tokens, int H, int Hkv, int D, cudaStream_t stream);
// dst[b, t, j] += src[b, t, j] for t < rows and the columns j of a token whose j % period lies in
// [c0, c1) (a token's key/value slots: [D, 3D) of each 3D in Myriad's layout with G = 1, [H D,
// width) of the heads' layout); dst holds dst_rows tokens a sequence, src src_rows, each of
// `width` elements. The sum in fp32, rounded once. Multiples of 8: period, c0, c1, width.
void add_token_columns(bf16* dst, const bf16* src, int B, int64_t rows, int64_t dst_rows, int64_t src_rows,
                       int width, int period, int c0, int c1, cudaStream_t stream);

// ---- FP8 (train.precision = "fp8"; ops/fp8.h has the contract and the host emulation) ----
// *amax = the largest |x[i]| (infinite when any x[i] is NaN). Clears *amax first.
void amax(float* amax, const bf16* x, int64_t n, cudaStream_t stream);
// *scale = fp8::scale_for(the largest of amax[count], f); *inv_scale = 1 / *scale (skipped when
// null): on the device, so that no step waits for the host. count > 1: the amaxes of a tensor's
// shards, one per tensor-parallel rank.
void fp8_scales(float* scale, float* inv_scale, const float* amax, int count, fp8::Format f, cudaStream_t stream);
// out (rows,cols) = encode(x * *scale); out_t (cols,rows) the same bytes transposed, written in
// the same pass (the K-major operands Hopper's FP8 GEMMs take for the backward). Either may be
// null, not both.
// cols (and rows, with out_t) multiples of 8; buffers 16-byte aligned.
void cast_fp8(uint8_t* out, uint8_t* out_t, const bf16* x, int rows, int cols, const float* scale, fp8::Format f,
              cudaStream_t stream);
// out_t (cols,rows) = the transposed cast of an MLP activation's output (rows,cols), recomputed
// from its input and not written: SwiGLU of pre's (gate, up) pairs (pre (rows,cols,2)) or GELU
// of pre (rows,cols), each value rounded to bf16 as swiglu_forward / gelu_forward write it, then
// cast as cast_fp8 casts it. The MLP projection's weight-gradient operand, at the scale its
// forward kept. rows and cols multiples of 8; buffers 16-byte aligned.
void cast_fp8_activation_t(uint8_t* out_t, const bf16* pre, bool swiglu, int rows, int cols, const float* scale,
                           fp8::Format f, cudaStream_t stream);
// Block scaling (fp8::Scaling::block): x (rows,cols) into out (rows,cols) and/or out_t
// (cols,rows), each as fp8::quantize_tiles casts it with its own rows as the tiles' M: blocks
// false, 1 x 128 tiles along each output's rows (x's rows for out, its columns for out_t: an
// activation's or a gradient's two GEMM layouts); blocks true, 128 x 128 blocks (a weight's).
// inv / inv_t: each output's inverse scales (fp8::tile_scales floats, cuBLASLt's layout). Either
// output may be null, not both. rows and cols multiples of 16; buffers 16-byte aligned.
void cast_fp8_tiles(uint8_t* out, float* inv, uint8_t* out_t, float* inv_t, const bf16* x, int rows, int cols,
                    bool blocks, fp8::Format f, cudaStream_t stream);

// ---- the step's elementwise helpers ----
void accumulate(float* dst, const float* src, int64_t n, cudaStream_t stream);  // dst += src
void widen(float* dst, const bf16* src, int64_t n, cudaStream_t stream);        // fp32 copy of bf16
// *acc += float(sum of x[0, n) / count) (count 0: n), the sum in double in a fixed order.
void mean_into(double* acc, const float* x, int64_t n, int64_t count, cudaStream_t stream);

// ---- context parallelism's key/value exchange (context_parallel.cu; CpuOps's contracts) ----
// CudaOps calls the last three once per rank of the group, pos being that rank's rows of the
// whole sequence of Tw = T cp (its context_rows).
void cp_pack_kv(bf16* pack, const bf16* qkv, int64_t N, int Hkv, int G, int D, cudaStream_t stream);
// Rank's rows of whole (B,Tw,Ql): local's (B,T,Ql) rows whole, or pack's (B,T,Hkv,2,D) keys and
// values (exactly one of local and pack non-null).
void cp_place_rows(bf16* whole, const bf16* local, const bf16* pack, int B, int T, int64_t Tw, RowPositions pos,
                   int Hkv, int G, int D, cudaStream_t stream);
// pack (B,T,Hkv,2,D) fp32 = the keys' and values' gradients at the rank's rows of dwhole.
void cp_take_kv_grad(float* pack, const bf16* dwhole, int B, int T, int64_t Tw, RowPositions pos, int Hkv, int G,
                     int D, cudaStream_t stream);
void cp_unpack_kv_grad(bf16* dlocal, const float* mine, const bf16* dwhole, int B, int T, int64_t Tw,
                       RowPositions pos, int Hkv, int G, int D, cudaStream_t stream);

// ---- tensor parallelism's row ops (tensor_parallel.cu) ----
// out[r, c] += bias[c] for rows r of C.
void add_bias(bf16* out, const bf16* bias, int rows, int C, cudaStream_t stream);
// out[n, :] = wte[tokens[n] - v0, :] for tokens in this rank's rows [v0, v0 + Vl), else 0.
void vocab_rows_forward(bf16* out, const int32_t* tokens, const bf16* wte, int64_t v0, int64_t Vl, int N, int C,
                        cudaStream_t stream);
// out[r, :] += wpe[pos((r0 + r) % T), :]; its backward accumulates dwpe's rows pos(t) over the
// rows, in order.
void add_positions(bf16* out, const bf16* wpe, int r0, int rows, int T, int C, cudaStream_t stream,
                   RowPositions pos = {});
void positions_backward(float* dwpe, const bf16* dout, int r0, int rows, int T, int C, cudaStream_t stream,
                        RowPositions pos = {});
// The vocabulary-parallel cross-entropy over this rank's columns (`live` of Vl hold vocabulary):
// each row's max, its sum of exp and target logit (parts (N,2)), the losses (negative targets
// left out: 0), and the logits' gradient, written over them.
void ce_row_max(float* mx, const bf16* logits, int N, int64_t Vl, int live, cudaStream_t stream);
void ce_partials(float* parts, const bf16* logits, const float* mx, const int32_t* targets, int64_t v0, int N,
                 int64_t Vl, int live, cudaStream_t stream);
void ce_losses(float* losses, float* sums, const float* parts, const int32_t* targets, int N, cudaStream_t stream);
void ce_tp_backward(bf16* dlogits, const float* mx, const float* sums, float dloss, const int32_t* targets, int64_t v0,
                    int N, int64_t Vl, int live, cudaStream_t stream);

// Throws a runtime Error naming the call site when the last launch failed.
// A mixture of experts' layer (ops/cuda/moe.cu; the contracts are CpuOps's, ops/cpu/cpu_ops.h):
// rows in expert order and back, the weighted combine, the router's backward products.
void gather_rows(bf16* xs,              // (M,C) =
                 const bf16* x,         // (N,C)
                 const int32_t* order,  // (M): slot n k + j, so row order[i] / k of x
                 int M, int k, int C, cudaStream_t stream);
void gather_rows_backward(bf16* dx,            // (N,C) +=
                          const bf16* dxs,     // (M,C)
                          const int32_t* pos,  // (N,k): each slot's row of dxs, -1 dropped
                          int N, int k, int C, cudaStream_t stream);
void combine_forward(bf16* out,             // (N,C) = or += (accumulate)
                     const bf16* ys,        // (M,C)
                     const float* weights,  // (N,k)
                     const int32_t* pos,    // (N,k)
                     int N, int k, int C, bool accumulate, cudaStream_t stream);
void combine_backward(bf16* dys,        // (M,C) = (rows of dropped slots untouched)
                      float* dweights,  // (N,k) =
                      const bf16* dout, const bf16* ys, const float* weights, const int32_t* pos, int N, int k, int C,
                      cudaStream_t stream);
// dx (N,C) += dlogits (N,E) . w (E,C) and dw (E,C) += dlogits^T . x (N,C), in fp32; either
// output may be null. E at most router_backward_max_experts().
void router_backward(bf16* dx, float* dw, const float* dlogits, const bf16* x, const bf16* w, int N, int C, int E,
                     cudaStream_t stream);
// The queries' and keys' RMSNorm (ops/cuda/qk_norm.cu; CpuOps::qk_norm_* is the contract):
// per head (Qwen3's) or over a token's whole query and key blocks (per_head false, OLMoE's).
void qk_norm_forward(bool per_head, bf16* qkv, float* rstd, const bf16* raw, const bf16* wq, const bf16* wk, int N,
                     int Hkv, int G, int D, float eps, cudaStream_t stream);
void qk_norm_backward(bool per_head, bf16* dqkv, float* dwq, float* dwk, const bf16* raw, const bf16* wq,
                      const bf16* wk, const float* rstd, int N, int Hkv, int G, int D, cudaStream_t stream);
int router_backward_max_experts();
// The routing on the device (the oracle's, ops/cpu/moe.cc: its choice, weights and gradient, see
// moe.cu), dropless: a capacity runs on the host. route_tokens writes choice and weights (N,k),
// order and pos (N k), the rows per expert into counts (E), sums (E + 1: each expert's scores
// summed over the tokens, then the lse^2 summed); scores (N,E) and lse2 (N) are its scratch.
// route_backward writes dlogits (N,E) (=), counts (E) and scores (N,E) its scratch; chosen (E,
// host, or null: these N tokens' own choice) and tokens are the balance loss's micro-batch.
struct RouteArgs {
  int experts, top_k, groups, top_groups;
  bool softmax, norm_topk;
  float scale, aux_loss, z_loss;
};
bool route_on_device(const RouteArgs& a);
void route_tokens(int32_t* choice, float* weights, int32_t* order, int32_t* pos, int* counts, double* sums,
                  float* scores, double* lse2, const float* logits, const bf16* bias, const RouteArgs& a, int N,
                  cudaStream_t stream);
void route_backward(float* dlogits, float* scores, int* counts, const float* dweights, const float* logits,
                    const int32_t* choice, const int64_t* chosen, double tokens, float grad_scale, const RouteArgs& a,
                    int N, cudaStream_t stream);

void check_launch(const char* what);

}  // namespace myriad::cuda
