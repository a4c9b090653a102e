// CPU backend: fp32 forward and backward of every op the GPT needs (OpenBLAS GEMMs, OpenMP loops).
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
// - The fused QKV activation of a token is laid out (H, 3, D): head h owns the contiguous
//   3*D values [q_h, k_h, v_h], so that a split by heads (tensor parallelism) is a split into
//   contiguous blocks.
#pragma once

#include <cstdint>

namespace myriad::cpu {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]
void embedding_forward(float* out,              // (B,T,C)
                       const int32_t* tokens,   // (B,T)
                       const float* wte,        // (Vp,C)
                       const float* wpe,        // (maxT,C), only the first T rows read
                       int B, int T, int C);
void embedding_backward(float* dwte,            // (Vp,C) +=
                        float* dwpe,            // (maxT,C) +=
                        const float* dout,      // (B,T,C)
                        const int32_t* tokens,  // (B,T)
                        int B, int T, int C);

// LayerNorm over the last dimension, eps 1e-5 (as PyTorch). bias may be null (model.bias=false).
void layernorm_forward(float* out,           // (N,C)
                       float* mean,          // (N) saved for backward
                       float* rstd,          // (N) saved for backward
                       const float* inp,     // (N,C)
                       const float* weight,  // (C)
                       const float* bias,    // (C) or null
                       int N, int C);
void layernorm_backward(float* dinp,          // (N,C) +=
                        float* dweight,       // (C) +=
                        float* dbias,         // (C) += or null
                        const float* dout,    // (N,C)
                        const float* inp,     // (N,C)
                        const float* weight,  // (C)
                        const float* mean, const float* rstd,  // (N)
                        int N, int C);

// out = inp @ weight^T + bias. bias may be null.
void linear_forward(float* out,           // (N,OC)
                    const float* inp,     // (N,IC)
                    const float* weight,  // (OC,IC)
                    const float* bias,    // (OC) or null
                    int N, int IC, int OC);
void linear_backward(float* dinp,          // (N,IC) +=
                     float* dweight,       // (OC,IC) +=
                     float* dbias,         // (OC) += or null
                     const float* dout,    // (N,OC)
                     const float* inp,     // (N,IC)
                     const float* weight,  // (OC,IC)
                     int N, int IC, int OC);

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(float* out, const float* inp, int64_t n);
void gelu_backward(float* dinp /* += */, const float* inp, const float* dout, int64_t n);

// out = a + b (out may alias a or b).
void residual_forward(float* out, const float* a, const float* b, int64_t n);

// Causal self-attention, softmax(q k^T / sqrt(D)) v per head. Query i sees key j when
// j <= i and, with window > 0, i - j < window (window 0 = full causal).
void attention_forward(float* out,         // (B,T,C) laid out (H,D) per token
                       float* probs,       // (B,H,T,T) softmax rows saved for backward; masked = 0
                       const float* qkv,   // (B,T,3C) laid out (H,3,D) per token
                       int B, int T, int C, int H, int window);
void attention_backward(float* dqkv,        // (B,T,3C) +=
                        const float* dout,  // (B,T,C)
                        const float* qkv,   // (B,T,3C)
                        const float* probs, // (B,H,T,T)
                        int B, int T, int C, int H, int window);

// Softmax cross-entropy over the first V of Vp columns (the padded columns are not part of the
// vocabulary and never enter the softmax).
void crossentropy_forward(float* losses,           // (N) -log p[target]
                          const float* logits,     // (N,Vp)
                          const int32_t* targets,  // (N), each in [0, V)
                          int N, int V, int Vp);
// dlogits = (softmax(logits) - onehot(target)) * dlosses[n] on the first V columns, 0 on the
// padding. Written (=), not accumulated; dlogits may alias logits (computed in place).
void crossentropy_backward(float* dlogits,          // (N,Vp)
                           const float* logits,     // (N,Vp)
                           const int32_t* targets,  // (N)
                           const float* dlosses,    // (N)
                           int N, int V, int Vp);

}  // namespace myriad::cpu
