// cuDNN's fused flash attention (its graph API), in Myriad's layouts: QKV per token (Hkv,G+2,D)
// (grouped-query attention: G = H / Hkv query heads per key/value head; G = 1 is (H,3,D)),
// the output (H,D), and the softmax statistics (B,H,T) as natural-log log-sum-exp of the scaled
// scores. Causal, with an optional sliding window (key j seen by query i when i - window < j <= i).
//
// cuDNN is loaded at run time (dlopen of libcudnn_graph.so.9): a build or a machine without it
// still runs, on Myriad's own kernel (attention.cu). One plan per shape is built at the shape's
// first call and kept for the process. The plans share one workspace: calls on two streams at
// once would race on it (a process runs its op set on one stream).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

namespace myriad::cuda::cudnn {

// Whether cuDNN's fused attention can take this shape here; if not, why (the library is missing
// or too old, the GPU or the head size is not supported, or cuDNN refused the graph).
bool supports(int B, int T, int H, int Hkv, int D, int window, std::string* why);

// out (B,T,H,D) =; stats (B,H,T) = log-sum-exp of each query's scaled scores.
void attention_forward(__nv_bfloat16* out, float* stats, const __nv_bfloat16* qkv, int B, int T, int H, int Hkv,
                       int D, int window, cudaStream_t stream);
// dqkv (B,T,Hkv,G+2,D) = the gradients of Q, K and V, from the forward's out and stats.
void attention_backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* out,
                        const __nv_bfloat16* qkv, const float* stats, int B, int T, int H, int Hkv, int D, int window,
                        cudaStream_t stream);

// Whether the backward is deterministic (default): dQ comes straight from its GEMM. Off, cuDNN
// adds the blocks' parts of dQ into an fp32 accumulator in whatever order they finish.
void set_deterministic(bool on);

// Device bytes held for cuDNN's plans (one workspace, grown to the largest shape's need).
size_t workspace_bytes();

// The cuDNN version loaded (e.g. 91400), 0 when none.
int version();

}  // namespace myriad::cuda::cudnn
