// The tensor-parallel ops (ops.cuh): the row ops of a split embedding, bias and positions, and
// the vocabulary-parallel cross-entropy's parts, and the plain elementwise helpers of the step
// (accumulate, widen, mean_into). Simple kernels, correctness first: one GPU runs them for
// parity with the CPU's.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "ops/cuda/ops.cuh"

namespace myriad::cuda {
namespace {

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65536)); }

__global__ void accumulate_kernel(float* dst, const float* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] += src[i];
}
// ---- tensor parallelism's row ops: simple kernels (correctness first; one GPU runs them
// for parity) ----
__global__ void add_bias_kernel(__nv_bfloat16* out, const __nv_bfloat16* bias, int64_t n, int C) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(__bfloat162float(out[i]) + __bfloat162float(bias[i % C]));
}
__global__ void vocab_rows_kernel(__nv_bfloat16* out, const int32_t* tokens, const __nv_bfloat16* wte, int64_t v0,
                                  int64_t Vl, int64_t n, int C) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t v = int64_t(tokens[i / C]) - v0;
    out[i] = v >= 0 && v < Vl ? wte[v * C + i % C] : __float2bfloat16(0.0f);
  }
}
__global__ void add_positions_kernel(__nv_bfloat16* out, const __nv_bfloat16* wpe, int r0, int64_t n, int T, int C,
                                     RowPositions pos) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / C;
    out[i] = __float2bfloat16(__bfloat162float(out[i]) +
                              __bfloat162float(wpe[pos((r0 + row) % T) * C + i % C]));
  }
}
// dwpe[pos(t), c] += dout[i, c] over the rows i whose row of the sequence (r0 + i) % T is t, in order.
__global__ void positions_backward_kernel(float* dwpe, const __nv_bfloat16* dout, int r0, int rows, int T, int C,
                                          RowPositions pos) {
  const int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (k >= int64_t(T) * C) return;
  const int t = static_cast<int>(k / C), c = static_cast<int>(k % C);
  float* to = dwpe + pos(t) * C + c;
  float acc = *to;
  for (int i = ((t - r0) % T + T) % T; i < rows; i += T) acc += __bfloat162float(dout[int64_t(i) * C + c]);
  *to = acc;
}
// Cross-entropy over this rank's vocabulary columns: one block per row, a fixed reduction order.
constexpr int kRowThreads = 256;
__device__ float block_reduce(float v, bool max, float* shared) {
  for (int o = 16; o > 0; o /= 2) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = max ? fmaxf(v, u) : v + u;
  }
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < kRowThreads / 32 ? shared[threadIdx.x] : (max ? -INFINITY : 0.0f);
    for (int o = 16; o > 0; o /= 2) {
      const float u = __shfl_xor_sync(0xffffffffu, v, o);
      v = max ? fmaxf(v, u) : v + u;
    }
    if (threadIdx.x == 0) shared[0] = v;
  }
  __syncthreads();
  const float r = shared[0];
  __syncthreads();
  return r;
}
__global__ void ce_row_max_kernel(float* mx, const __nv_bfloat16* logits, int64_t Vl, int live) {
  __shared__ float shared[32];
  const __nv_bfloat16* x = logits + blockIdx.x * Vl;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < live; j += kRowThreads) m = fmaxf(m, __bfloat162float(x[j]));
  m = block_reduce(m, true, shared);
  if (threadIdx.x == 0) mx[blockIdx.x] = m;
}
__global__ void ce_partials_kernel(float* parts, const __nv_bfloat16* logits, const float* mx, const int32_t* targets,
                                   int64_t v0, int64_t Vl, int live) {
  __shared__ float shared[32];
  const int64_t n = blockIdx.x;
  const __nv_bfloat16* x = logits + n * Vl;
  const float m = mx[n];
  float sum = 0;
  for (int j = threadIdx.x; j < live; j += kRowThreads) sum += __expf(__bfloat162float(x[j]) - m);
  sum = block_reduce(sum, false, shared);
  if (threadIdx.x == 0) {
    const int64_t t = int64_t(targets[n]) - v0;
    parts[2 * n] = sum;
    parts[2 * n + 1] = t >= 0 && t < live ? __bfloat162float(x[t]) - m : 0.0f;
  }
}
__global__ void ce_losses_kernel(float* losses, float* sums, const float* parts, const int32_t* targets, int N) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  sums[n] = parts[2 * n];
  losses[n] = targets[n] < 0 ? 0.0f : logf(parts[2 * n]) - parts[2 * n + 1];  // negative: left out
}
__global__ void ce_tp_backward_kernel(__nv_bfloat16* d, const float* mx, const float* sums, float dloss,
                                      const int32_t* targets, int64_t v0, int64_t Vl, int live) {
  const int64_t n = blockIdx.x;
  __nv_bfloat16* row = d + n * Vl;
  const float m = mx[n], scale = dloss / sums[n];
  const bool out = targets[n] < 0;  // left out of the loss: no gradient
  const int64_t t = int64_t(targets[n]) - v0;
  for (int64_t j = threadIdx.x; j < Vl; j += kRowThreads) {
    float g = 0.0f;
    if (j < live && !out) g = __expf(__bfloat162float(row[j]) - m) * scale - (j == t ? dloss : 0.0f);
    row[j] = __float2bfloat16(g);
  }
}
__global__ void widen_kernel(float* dst, const __nv_bfloat16* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = __bfloat162float(src[i]);
}

// *acc += float(sum of x / count), the sum in double over one block in a fixed order.
constexpr int kMeanThreads = 512;
__global__ void mean_into_kernel(double* acc, const float* x, int64_t n, int64_t count) {
  __shared__ double part[kMeanThreads];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += kMeanThreads) s += x[i];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = kMeanThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *acc += static_cast<float>(part[0] / count);
}

}  // namespace

void accumulate(float* dst, const float* src, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  accumulate_kernel<<<grid_for(n), 256, 0, stream>>>(dst, src, n);
  check_launch("accumulate");
}

void widen(float* dst, const bf16* src, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  widen_kernel<<<grid_for(n), 256, 0, stream>>>(dst, src, n);
  check_launch("widen");
}

void mean_into(double* acc, const float* x, int64_t n, int64_t count, cudaStream_t stream) {
  if (n <= 0) return;
  mean_into_kernel<<<1, kMeanThreads, 0, stream>>>(acc, x, n, count > 0 ? count : n);
  check_launch("mean_into");
}

void add_bias(bf16* out, const bf16* bias, int rows, int C, cudaStream_t stream) {
  const int64_t n = int64_t(rows) * C;
  if (n <= 0) return;
  add_bias_kernel<<<grid_for(n), 256, 0, stream>>>(out, bias, n, C);
  check_launch("add_bias");
}

void vocab_rows_forward(bf16* out, const int32_t* tokens, const bf16* wte, int64_t v0, int64_t Vl, int N, int C,
                        cudaStream_t stream) {
  const int64_t n = int64_t(N) * C;
  if (n <= 0) return;
  vocab_rows_kernel<<<grid_for(n), 256, 0, stream>>>(out, tokens, wte, v0, Vl, n, C);
  check_launch("vocab_rows_forward");
}

void add_positions(bf16* out, const bf16* wpe, int r0, int rows, int T, int C, cudaStream_t stream,
                   RowPositions pos) {
  const int64_t n = int64_t(rows) * C;
  if (n <= 0) return;
  add_positions_kernel<<<grid_for(n), 256, 0, stream>>>(out, wpe, r0, n, T, C, pos);
  check_launch("add_positions");
}

void positions_backward(float* dwpe, const bf16* dout, int r0, int rows, int T, int C, cudaStream_t stream,
                        RowPositions pos) {
  const int64_t n = int64_t(T) * C;
  if (rows <= 0) return;
  positions_backward_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(dwpe, dout, r0, rows, T, C, pos);
  check_launch("positions_backward");
}

void ce_row_max(float* mx, const bf16* logits, int N, int64_t Vl, int live, cudaStream_t stream) {
  if (N <= 0) return;
  ce_row_max_kernel<<<N, kRowThreads, 0, stream>>>(mx, logits, Vl, live);
  check_launch("ce_row_max");
}

void ce_partials(float* parts, const bf16* logits, const float* mx, const int32_t* targets, int64_t v0, int N,
                 int64_t Vl, int live, cudaStream_t stream) {
  if (N <= 0) return;
  ce_partials_kernel<<<N, kRowThreads, 0, stream>>>(parts, logits, mx, targets, v0, Vl, live);
  check_launch("ce_partials");
}

void ce_losses(float* losses, float* sums, const float* parts, const int32_t* targets, int N, cudaStream_t stream) {
  if (N <= 0) return;
  ce_losses_kernel<<<(N + 255) / 256, 256, 0, stream>>>(losses, sums, parts, targets, N);
  check_launch("ce_losses");
}

void ce_tp_backward(bf16* dlogits, const float* mx, const float* sums, float dloss, const int32_t* targets, int64_t v0,
                    int N, int64_t Vl, int live, cudaStream_t stream) {
  if (N <= 0) return;
  ce_tp_backward_kernel<<<N, kRowThreads, 0, stream>>>(dlogits, mx, sums, dloss, targets, v0, Vl, live);
  check_launch("ce_tp_backward");
}

}  // namespace myriad::cuda
