// CPU backend: forward and backward of every op the GPT needs (OpenBLAS GEMMs, OpenMP loops).
// Every function is a template over Real, instantiated for float (what training uses) and double
// (so that tests can check gradients by finite differences); the definitions live in the .cc files.
//
// Conventions, shared by every function here:
// - Raw pointers with the shape of each buffer in a comment; row-major; B batch, T time,
//   C channels, H heads, D = C / H head size, N rows (usually B*T), V vocabulary.
// - Every backward ACCUMULATES (+=) into its gradient outputs, parameters and inputs alike;
//   the caller zeroes them. This lets residual branches and shared weights add up for free.
// - Results do not depend on thread timing: work is split statically and every reduction runs
//   in a fixed order, so the same inputs and the same thread count give bitwise equal results
//   (the resume test relies on it).
// - Linear layers follow PyTorch: weight (OC, IC), out = inp @ weight^T + bias.
// - The fused QKV activation of a token is laid out (Hkv, G+2, D), Hkv key/value heads and
//   G = H / Hkv query heads per key/value head: group g owns the contiguous (G+2)*D values
//   [q_{gG}, ..., q_{gG+G-1}, k_g, v_g], so that a split by key/value heads (tensor parallelism)
//   is a split into contiguous blocks. With G = 1 (plain multi-head attention) this is (H, 3, D):
//   head h owns [q_h, k_h, v_h].
#pragma once

#include <cstdint>

#include "core/parallel_layout.h"

namespace myriad::cpu {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:], or with `rows` (a context-parallel rank's,
// T = rows->count()) wpe[rows->position(t),:]
template <class Real>
void embedding_forward(Real* out,               // (B,T,C)
                       const int32_t* tokens,   // (B,T)
                       const Real* wte,         // (Vp,C)
                       const Real* wpe,         // (maxT,C), only the rows of the T positions read
                       int B, int T, int C, const ContextRows* rows = nullptr);
template <class Real>
void embedding_backward(Real* dwte,             // (Vp,C) +=
                        Real* dwpe,             // (maxT,C) +=
                        const Real* dout,       // (B,T,C)
                        const int32_t* tokens,  // (B,T)
                        int B, int T, int C, const ContextRows* rows = nullptr);

// LayerNorm over the last dimension, eps 1e-5 (as PyTorch). bias may be null (model.bias=false).
template <class Real>
void layernorm_forward(Real* out,            // (N,C)
                       Real* mean,           // (N) saved for backward
                       Real* rstd,           // (N) saved for backward
                       const Real* inp,      // (N,C)
                       const Real* weight,   // (C)
                       const Real* bias,     // (C) or null
                       int N, int C);
template <class Real>
void layernorm_backward(Real* dinp,           // (N,C) +=
                        Real* dweight,        // (C) +=
                        Real* dbias,          // (C) += or null
                        const Real* dout,     // (N,C)
                        const Real* inp,      // (N,C)
                        const Real* weight,   // (C)
                        const Real* mean, const Real* rstd,  // (N)
                        int N, int C);

// out = inp @ weight^T + bias. bias may be null.
template <class Real>
void linear_forward(Real* out,            // (N,OC)
                    const Real* inp,      // (N,IC)
                    const Real* weight,   // (OC,IC)
                    const Real* bias,     // (OC) or null
                    int N, int IC, int OC);
template <class Real>
void linear_backward(Real* dinp,           // (N,IC) += or null
                     Real* dweight,        // (OC,IC) += or null
                     Real* dbias,          // (OC) += or null
                     const Real* dout,     // (N,OC)
                     const Real* inp,      // (N,IC)
                     const Real* weight,   // (OC,IC)
                     int N, int IC, int OC);

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <class Real>
void gelu_forward(Real* out, const Real* inp, int64_t n);
template <class Real>
void gelu_backward(Real* dinp /* += */, const Real* inp, const Real* dout, int64_t n);

// out = a + b (out may alias a or b).
template <class Real>
void residual_forward(Real* out, const Real* a, const Real* b, int64_t n);

// Causal self-attention, softmax(q k^T / sqrt(D)) v per query head, with grouped-query
// attention: query head h attends with key/value head h / G, G = H / Hkv (Hkv = H: multi-head,
// Hkv = 1: multi-query). H must be a multiple of Hkv. Query i sees key j when j <= i and, with
// window > 0, i - j < window (window 0 = full causal), and with docs, j >= docs[b,i]: docs (B,T)
// holds where each position's document begins in its row (non-decreasing along a row, docs[b,i]
// <= i), so that packed documents do not see each other. docs null: one document per row.
// rows: the query rows a context-parallel rank takes (core/parallel_layout.h), Tq of them, against
// all T keys; null: all T rows (Tq = T). out, dout and probs hold those rows in order, qkv and dqkv
// every row; docs are the whole row's, positions in the sequence.
template <class Real>
void attention_forward(Real* out,          // (B,Tq,H*D) laid out (H,D) per token
                       Real* probs,        // (B,H,Tq,T) softmax rows saved for backward; masked = 0
                       const Real* qkv,    // (B,T,Hkv*(G+2)*D) laid out (Hkv,G+2,D) per token
                       int B, int T, int H, int Hkv, int D, int window,
                       const int32_t* docs = nullptr,  // (B,T) or null
                       const ContextRows* rows = nullptr);
// The key/value gradients of a group sum its G query heads' terms, added in head order.
template <class Real>
void attention_backward(Real* dqkv,         // (B,T,Hkv*(G+2)*D) +=
                        const Real* dout,   // (B,Tq,H*D)
                        const Real* qkv,    // (B,T,Hkv*(G+2)*D)
                        const Real* probs,  // (B,H,Tq,T)
                        int B, int T, int H, int Hkv, int D, int window,
                        const int32_t* docs = nullptr,  // (B,T) or null
                        const ContextRows* rows = nullptr);

// RMSNorm over the last dimension, as Hugging Face's LlamaRMSNorm: out = inp * rstd * weight,
// rstd = 1 / sqrt(mean(inp^2) + eps), the mean of squares taken in Real (float or double).
template <class Real>
void rmsnorm_forward(Real* out,           // (N,C)
                     Real* rstd,          // (N) saved for backward
                     const Real* inp,     // (N,C)
                     const Real* weight,  // (C)
                     int N, int C, double eps);
template <class Real>
void rmsnorm_backward(Real* dinp,          // (N,C) +=
                      Real* dweight,       // (C) +=
                      const Real* dout,    // (N,C)
                      const Real* inp,     // (N,C)
                      const Real* weight,  // (C)
                      const Real* rstd,    // (N) from rmsnorm_forward
                      int N, int C);

// Rotary positions (RoPE), rotate-half convention (Hugging Face's, so HF Llama weights need no
// permutation): for a head vector x of size D at position p and i < D/2, with a = p * freqs[i],
//   x'[i]       = x[i] cos a - x[i+D/2] sin a
//   x'[i+D/2]   = x[i+D/2] cos a + x[i] sin a.
// Applied IN PLACE to every query and key head of the fused QKV activation (layout above,
// G = H / Hkv); the value heads are left as they are. Row t is at position pos0 + t, or with
// `rows` (a context-parallel rank's, T = rows->count()) at rows->position(t). The angles
// and their cosines and sines are computed in double, then rounded to Real. freqs comes from
// rope_frequencies (ops/rope.h).
template <class Real>
void rope_forward(Real* qkv,            // (B,T,Hkv*(G+2)*D) in place
                  const double* freqs,  // (D/2)
                  int B, int T, int Hkv, int G, int D, int pos0, const ContextRows* rows = nullptr);
// The gradient through rope_forward: rotates the query and key parts of dqkv back by the same
// angles (the transpose of a rotation is its inverse), IN PLACE. Unlike the other backwards it
// does not accumulate: dqkv holds the gradient with respect to the rotated q and k on entry and
// with respect to the unrotated ones on return; the value parts are left as they are.
template <class Real>
void rope_backward(Real* dqkv,           // (B,T,Hkv*(G+2)*D) in place
                   const double* freqs,  // (D/2)
                   int B, int T, int Hkv, int G, int D, int pos0, const ContextRows* rows = nullptr);

// SwiGLU: out = silu(gate) * up, silu(x) = x / (1 + exp(-x)). The gate and up projections are
// one GEMM whose output is laid out (F,2) per row: feature f's gate at 2f, its up at 2f+1, so
// that a contiguous split of features (tensor parallelism) gives each rank matching halves.
template <class Real>
void swiglu_forward(Real* out,       // (N,F)
                    const Real* gu,  // (N,F,2)
                    int64_t N, int64_t F);
template <class Real>
void swiglu_backward(Real* dgu,         // (N,F,2) +=
                     const Real* gu,    // (N,F,2)
                     const Real* dout,  // (N,F)
                     int64_t N, int64_t F);

// Softmax cross-entropy over the first V of Vp columns (the padded columns are not part of the
// vocabulary and never enter the softmax). A negative target leaves its position out: loss 0,
// gradient 0 (data.document_end_loss).
template <class Real>
void crossentropy_forward(Real* losses,            // (N) -log p[target]
                          const Real* logits,      // (N,Vp)
                          const int32_t* targets,  // (N), each in [0, V) or negative
                          int N, int V, int Vp);
// dlogits = (softmax(logits) - onehot(target)) * dlosses[n] on the first V columns, 0 on the
// padding and on rows left out. Written (=), not accumulated; dlogits may alias logits.
template <class Real>
void crossentropy_backward(Real* dlogits,           // (N,Vp)
                           const Real* logits,      // (N,Vp)
                           const int32_t* targets,  // (N)
                           const Real* dlosses,     // (N)
                           int N, int V, int Vp);

}  // namespace myriad::cpu
