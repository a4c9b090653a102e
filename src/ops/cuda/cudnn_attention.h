// cuDNN's fused flash attention (its graph API), in Myriad's layouts: QKV per token (Hkv,G+2,D)
// (grouped-query attention: G = H / Hkv query heads per key/value head; G = 1 is (H,3,D)),
// the output (H,D), and the softmax statistics (B,H,T) as natural-log log-sum-exp of the scaled
// scores. Causal, with an optional sliding window (key j seen by query i when i - window < j <= i)
// and documents packed in a row (key j seen only from the query's document start on).
// Under context parallelism the queries are a rank's rows, one or two ranges of the positions,
// against the whole sequence's keys and values: each range is one call whose keys end where its
// queries end (causal aligned bottom-right, so cuDNN skips the tiles past the diagonal as it does
// for a whole sequence); the second call's key/value gradients go to a scratch and are added.
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

// A context-parallel rank's query rows: n ranges [begin, end) of the T positions whose keys and
// values qkv holds (every position's). Their rows follow each other, range 0 first, in out, the
// stats and dout; their queries' gradients go to their positions in dqkv. Null: all T rows.
struct QueryRanges {
  int n = 1;
  int64_t begin[2] = {0, 0}, end[2] = {0, 0};
  int64_t count() const { return end[0] - begin[0] + (n > 1 ? end[1] - begin[1] : 0); }
};

// Whether cuDNN's fused attention can take this shape here; if not, why (the library is missing
// or too old, the GPU or the head size is not supported, or cuDNN refused the graph).
bool supports(int B, int T, int H, int Hkv, int D, int window, std::string* why, const QueryRanges* rows = nullptr,
              bool documents = false);

// out (B,Tq,H,D) =; stats (B,H,Tq) = log-sum-exp of each query's scaled scores (Tq = T, or the
// ranges' rows).
void attention_forward(__nv_bfloat16* out, float* stats, const __nv_bfloat16* qkv, int B, int T, int H, int Hkv,
                       int D, int window, cudaStream_t stream, const QueryRanges* rows = nullptr,
                       const int32_t* docs = nullptr);
// dqkv (B,T,Hkv,G+2,D) = the gradients of Q, K and V, from the forward's out and stats. Under
// ranges: every position's K and V (zero past the last range's end), the ranges' positions' Q
// (the other positions' Q undefined).
// docs: null, or (B,T) int32, each position's document start (data.document_mask): a query sees
// only the keys of its document (cuDNN computes the tiles before it and masks them).
void attention_backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* out,
                        const __nv_bfloat16* qkv, const float* stats, int B, int T, int H, int Hkv, int D, int window,
                        cudaStream_t stream, const QueryRanges* rows = nullptr, const int32_t* docs = nullptr);

// Whether the backward is deterministic (default): dQ comes straight from its GEMM. Off, cuDNN
// adds the blocks' parts of dQ into an fp32 accumulator in whatever order they finish.
void set_deterministic(bool on);
bool deterministic();

// Device bytes held for cuDNN's plans (one workspace, grown to the largest shape's need).
size_t workspace_bytes();

// The cuDNN version loaded (e.g. 91400), 0 when none.
int version();

}  // namespace myriad::cuda::cudnn
