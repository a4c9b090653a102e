#include "model/cuda/cuda_ops.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "core/error.h"
#include "model/cuda/cuda_check.h"
#include "model/cuda/matmul.h"
#include "ops/cuda/ops.cuh"

namespace myriad::cuda {

struct CudaOps::State {
  cudaStream_t stream = nullptr;
  Matmul mm;
  float* scratch = nullptr;
  size_t scratch_floats = 0;
  int32_t* groups = nullptr;  // the embedding backward's positions, starts and ids
  size_t groups_ints = 0;
  std::vector<cudaEvent_t> events;  // the phase timers' marks, reused step after step
  int marks = 0;                    // of them in use
  ~State() {
    if (stream) cudaStreamSynchronize(stream);
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    cudaFree(scratch);
    cudaFree(groups);
    if (stream) cudaStreamDestroy(stream);
  }
};

namespace {
std::atomic<int64_t> g_held{0}, g_peak{0};
}  // namespace

int64_t CudaOps::held_bytes() { return g_held.load(); }
int64_t CudaOps::peak_bytes() { return g_peak.load(); }

template <class T>
void CudaOps::Buffer<T>::Free::operator()(T* p) const {
  cudaFree(p);
  g_held -= static_cast<int64_t>(bytes);
}

template <class T>
void CudaOps::Buffer<T>::zeros(int64_t n) {
  p_.reset();
  n_ = 0;
  T* p = nullptr;
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 0)) * sizeof(T);
  if (bytes > 0) {
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw_input("GPU memory: a buffer of ", bytes >> 20, " MiB does not fit (", g_held.load() >> 20,
                  " MiB held by this rank, ", free_b >> 20, " MiB of ", total_b >> 20,
                  " MiB free): lower train.micro_batch, or split the model further (parallel.tp, "
                  "parallel.pp)");
    }
    CUDA_CHECK(cudaMemset(p, 0, bytes));
    // cudaMemset runs on the legacy stream, which the op set's stream does not wait for: the
    // zeros must be there before any op or staging copy writes the buffer.
    CUDA_CHECK(cudaStreamSynchronize(nullptr));
    const int64_t held = g_held += static_cast<int64_t>(bytes);
    for (int64_t peak = g_peak.load(); held > peak && !g_peak.compare_exchange_weak(peak, held);) {
    }
  }
  p_ = std::unique_ptr<T, Free>(p, Free{bytes});
  n_ = n;
}
template class CudaOps::Buffer<__nv_bfloat16>;
template class CudaOps::Buffer<float>;
template class CudaOps::Buffer<int32_t>;
template class CudaOps::Buffer<int64_t>;
template class CudaOps::Buffer<uint8_t>;

CudaOps::CudaOps() : st_(std::make_shared<State>()) {
  CUDA_CHECK(cudaStreamCreateWithFlags(&st_->stream, cudaStreamNonBlocking));
}

cudaStream_t CudaOps::stream() const { return st_->stream; }

float* CudaOps::scratch(size_t n) const {
  if (n > st_->scratch_floats) {
    CUDA_CHECK(cudaStreamSynchronize(st_->stream));
    cudaFree(st_->scratch);
    st_->scratch = nullptr;
    CUDA_CHECK(cudaMalloc(&st_->scratch, n * sizeof(float)));
    st_->scratch_floats = n;
  }
  return st_->scratch;
}

template <class T>
void CudaOps::zero(T* x, int64_t n) const {
  if (n > 0) CUDA_CHECK(cudaMemsetAsync(x, 0, static_cast<size_t>(n) * sizeof(T), st_->stream));
}
template <class T>
void CudaOps::copy(T* dst, const T* src, int64_t n) const {
  if (n > 0 && dst != src)
    CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(T), cudaMemcpyDeviceToDevice, st_->stream));
}
template void CudaOps::zero<__nv_bfloat16>(__nv_bfloat16*, int64_t) const;
template void CudaOps::zero<float>(float*, int64_t) const;
template void CudaOps::zero<int32_t>(int32_t*, int64_t) const;
template void CudaOps::copy<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, int64_t) const;
template void CudaOps::copy<float>(float*, const float*, int64_t) const;
template void CudaOps::copy<int32_t>(int32_t*, const int32_t*, int64_t) const;

void CudaOps::upload(int32_t* dst, const int32_t* host, int64_t n) const {
  // Pageable host memory: the copy has left `host` when the call returns.
  CUDA_CHECK(cudaMemcpyAsync(dst, host, static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice, st_->stream));
}

void CudaOps::upload_params(Param* dst, const float* host, int64_t n) const {
  float* f = scratch(static_cast<size_t>(n));
  CUDA_CHECK(cudaMemcpyAsync(f, host, static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice, st_->stream));
  cast_to_bf16(dst, f, n, st_->stream);
  CUDA_CHECK(cudaStreamSynchronize(st_->stream));
}

void CudaOps::download(float* host, const Act* src, int64_t n) const {
  std::vector<Act> h(static_cast<size_t>(n));
  CUDA_CHECK(cudaMemcpyAsync(h.data(), src, static_cast<size_t>(n) * 2, cudaMemcpyDeviceToHost, st_->stream));
  CUDA_CHECK(cudaStreamSynchronize(st_->stream));
  for (int64_t i = 0; i < n; ++i) host[i] = __bfloat162float(h[static_cast<size_t>(i)]);
}

double CudaOps::sum(const float* x, int64_t n) const {
  std::vector<float> h(static_cast<size_t>(n));
  CUDA_CHECK(cudaMemcpyAsync(h.data(), x, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToHost, st_->stream));
  CUDA_CHECK(cudaStreamSynchronize(st_->stream));
  double s = 0;
  for (float v : h) s += v;  // in order: reproducible
  return s;
}

double peak_bf16_flops(const cudaDeviceProp& p) {
  if (p.major == 9) return 989.4e12;                // H100 / H200 SXM
  if (p.major == 8 && p.minor == 0) return 312e12;  // A100
  return 0;
}

namespace {

__global__ void scale_kernel(float* x, int64_t n, float c) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= c;
}
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
__global__ void add_positions_kernel(__nv_bfloat16* out, const __nv_bfloat16* wpe, int r0, int64_t n, int T, int C) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / C;
    out[i] = __float2bfloat16(__bfloat162float(out[i]) +
                              __bfloat162float(wpe[((r0 + row) % T) * C + i % C]));
  }
}
// dwpe[p, c] += dout[i, c] over the rows i whose position (r0 + i) % T is p, in order.
__global__ void positions_backward_kernel(float* dwpe, const __nv_bfloat16* dout, int r0, int rows, int T, int C) {
  const int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (k >= int64_t(T) * C) return;
  const int p = static_cast<int>(k / C), c = static_cast<int>(k % C);
  float acc = dwpe[k];
  for (int i = ((p - r0) % T + T) % T; i < rows; i += T) acc += __bfloat162float(dout[int64_t(i) * C + c]);
  dwpe[k] = acc;
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
__global__ void ce_losses_kernel(float* losses, float* sums, const float* parts, int N) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  sums[n] = parts[2 * n];
  losses[n] = logf(parts[2 * n]) - parts[2 * n + 1];
}
__global__ void ce_tp_backward_kernel(__nv_bfloat16* d, const float* mx, const float* sums, float dloss,
                                      const int32_t* targets, int64_t v0, int64_t Vl, int live) {
  const int64_t n = blockIdx.x;
  __nv_bfloat16* row = d + n * Vl;
  const float m = mx[n], scale = dloss / sums[n];
  const int64_t t = int64_t(targets[n]) - v0;
  for (int64_t j = threadIdx.x; j < Vl; j += kRowThreads) {
    float g = 0.0f;
    if (j < live) g = __expf(__bfloat162float(row[j]) - m) * scale - (j == t ? dloss : 0.0f);
    row[j] = __float2bfloat16(g);
  }
}
__global__ void widen_kernel(float* dst, const __nv_bfloat16* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = __bfloat162float(src[i]);
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65536)); }

}  // namespace

std::string CudaOps::device_name() const {
  int d = 0;
  CUDA_CHECK(cudaGetDevice(&d));
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, d));
  return "cuda:" + std::to_string(d) + " " + p.name;
}

double CudaOps::peak_flops() const {
  int d = 0;
  CUDA_CHECK(cudaGetDevice(&d));
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, d));
  return peak_bf16_flops(p);
}

void CudaOps::upload(float* dst, const float* host, int64_t n) const {
  if (n <= 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, host, static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice, st_->stream));
  CUDA_CHECK(cudaStreamSynchronize(st_->stream));
}

void CudaOps::download(float* host, const float* src, int64_t n) const {
  if (n <= 0) return;
  CUDA_CHECK(cudaMemcpyAsync(host, src, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToHost, st_->stream));
  CUDA_CHECK(cudaStreamSynchronize(st_->stream));
}

void CudaOps::cast_params(Param* dst, const float* src, int64_t n) const {
  if (n > 0) cast_to_bf16(dst, src, n, st_->stream);
}

int CudaOps::mark() const {
  if (st_->marks == static_cast<int>(st_->events.size())) {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    st_->events.push_back(e);
  }
  CUDA_CHECK(cudaEventRecord(st_->events[st_->marks], st_->stream));
  return st_->marks++;
}

double CudaOps::seconds(int from, int to) const {
  CUDA_CHECK(cudaEventSynchronize(st_->events[to]));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, st_->events[from], st_->events[to]));
  return ms / 1e3;
}

void CudaOps::clear_marks() const { st_->marks = 0; }

double CudaOps::sum_squares(const float* x, int64_t n) const {
  if (n <= 0) return 0;
  // [0, n) as one segment of segment_sum_squares: its fixed order makes the sum reproducible.
  const size_t need = 1 + sumsq_scratch_floats(n, 1) + 1;  // result, scratch, the segments (2 int64)
  float* f = scratch(need + 4);
  int64_t* seg = reinterpret_cast<int64_t*>((reinterpret_cast<uintptr_t>(f + need) + 7) & ~uintptr_t(7));
  const int64_t h_seg[2] = {0, n};
  CUDA_CHECK(cudaMemcpyAsync(seg, h_seg, sizeof h_seg, cudaMemcpyHostToDevice, st_->stream));
  segment_sum_squares(f, f + 1, x, seg, 1, n, st_->stream);
  float out = 0;
  CUDA_CHECK(cudaMemcpyAsync(&out, f, 4, cudaMemcpyDeviceToHost, st_->stream));
  CUDA_CHECK(cudaStreamSynchronize(st_->stream));
  return out;
}

void CudaOps::scale(float* x, int64_t n, float c) const {
  if (n <= 0) return;
  scale_kernel<<<grid_for(n), 256, 0, st_->stream>>>(x, n, c);
  check_launch("scale");
}

void CudaOps::accumulate(float* dst, const float* src, int64_t n) const {
  if (n <= 0) return;
  accumulate_kernel<<<grid_for(n), 256, 0, st_->stream>>>(dst, src, n);
  check_launch("accumulate");
}

void CudaOps::embedding_forward(Act* out, const int32_t* tokens, const Param* wte, const Param* wpe, int B, int T,
                                int C) const {
  cuda::embedding_forward(out, tokens, wte, wpe, B, T, C, st_->stream);
}

// Positions grouped by id (a counting sort over the ids present), for a deterministic backward:
// [positions (N)] [starts (G+1)] [ids (G)], uploaded for cuda::embedding_backward.
void CudaOps::rows_by_id_backward(float* dwte, float* dwpe, const Act* dout, const std::vector<int32_t>& ids,
                                  int vocab, int skip, int B, int T, int C) const {
  const int N = B * T;
  std::vector<int32_t> g(3 * static_cast<size_t>(N) + 1);
  const int groups = group_positions_by_token(ids.data(), N, vocab, g.data());
  const int32_t* last = g.data() + N + groups + 1 + groups - 1;  // ids ascend: skip is the last
  const int summed = groups > 0 && *last == skip ? groups - 1 : groups;
  if (g.size() > st_->groups_ints) {
    CUDA_CHECK(cudaStreamSynchronize(st_->stream));
    cudaFree(st_->groups);
    st_->groups = nullptr;
    CUDA_CHECK(cudaMalloc(&st_->groups, g.size() * 4));
    st_->groups_ints = g.size();
  }
  CUDA_CHECK(cudaMemcpyAsync(st_->groups, g.data(), g.size() * 4, cudaMemcpyHostToDevice, st_->stream));
  const int32_t* d = st_->groups;
  cuda::embedding_backward(dwte, dwpe, dout, d, d + N, d + N + groups + 1, summed, B, T, C, st_->stream);
  CUDA_CHECK(cudaStreamSynchronize(st_->stream));  // `g` is pageable and leaves with this call
}

void CudaOps::embedding_backward(float* dwte, float* dwpe, const Act* dout, const int32_t* tokens, int B, int T,
                                 int C) const {
  const int N = B * T;
  std::vector<int32_t> ids(static_cast<size_t>(N));
  CUDA_CHECK(cudaMemcpyAsync(ids.data(), tokens, static_cast<size_t>(N) * 4, cudaMemcpyDeviceToHost, st_->stream));
  CUDA_CHECK(cudaStreamSynchronize(st_->stream));
  rows_by_id_backward(dwte, dwpe, dout, ids, *std::max_element(ids.begin(), ids.end()) + 1, -1, B, T, C);
}

void CudaOps::layernorm_forward(Act* out, float* mean, float* rstd, const Act* inp, const Param* w, const Param* b,
                                int N, int C) const {
  cuda::layernorm_forward(out, mean, rstd, inp, w, b, N, C, st_->stream);
}

void CudaOps::layernorm_backward(Act* dinp, float* dw, float* db, const Act* dout, const Act* inp, const Param* w,
                                 const float* mean, const float* rstd, int N, int C) const {
  cuda::layernorm_backward(dinp, dw, db, scratch(layernorm_scratch_floats(N, C)), dout, inp, w, mean, rstd, N, C,
                           st_->stream);
}

void CudaOps::linear_forward(Act* out, const Act* inp, const Param* w, const Param* b, int N, int IC, int OC) const {
  st_->mm.forward(out, inp, w, b, N, IC, OC, st_->stream);
}

void CudaOps::linear_backward(Act* dinp, float* dw, float* db, const Act* dout, const Act* inp, const Param* w, int N,
                              int IC, int OC) const {
  if (dinp) st_->mm.backward_input(dinp, dout, w, N, IC, OC, /*accumulate=*/true, st_->stream);
  st_->mm.backward_weight(dw, dout, inp, N, IC, OC, st_->stream);
  if (db) bias_backward(db, dout, N, OC);
}

void CudaOps::bias_backward(float* db, const Act* dout, int rows, int OC) const {
  cuda::bias_backward(db, scratch(bias_scratch_floats(rows, OC)), dout, rows, OC, st_->stream);
}

void CudaOps::gelu_forward(Act* out, const Act* inp, int64_t n) const {
  cuda::gelu_forward(out, inp, n, st_->stream);
}
void CudaOps::gelu_backward(Act* dinp, const Act* inp, const Act* dout, int64_t n) const {
  cuda::gelu_backward(dinp, inp, dout, n, st_->stream);
}
void CudaOps::add(Act* out, const Act* a, const Act* b, int64_t n) const { cuda::add(out, a, b, n, st_->stream); }

void CudaOps::attention_forward(Act* out, float* saved, const Act* qkv, int B, int T, int C, int H,
                                int window) const {
  cuda::attention_forward(out, saved, qkv, B, T, H, C / H, window, st_->stream);
}
void CudaOps::attention_backward(Act* dqkv, const Act* dout, const Act* out, const Act* qkv, const float* saved,
                                 int B, int T, int C, int H, int window) const {
  const int D = C / H;
  cuda::attention_backward(dqkv, scratch(attention_scratch_floats(B, T, H, D)), dout, out, qkv, saved, B, T, H, D,
                           window, st_->stream);
}

void CudaOps::crossentropy_forward(float* losses, const Act* logits, const int32_t* targets, int N, int V,
                                   int Vp) const {
  // dloss 0: the losses only, the logits untouched.
  cuda::crossentropy(losses, const_cast<Act*>(logits), targets, 0.0f, N, V, Vp, st_->stream);
}
void CudaOps::crossentropy_backward(Act* dlogits, const Act* logits, const int32_t* targets, float dloss, int N,
                                    int V, int Vp) const {
  MYRIAD_CHECK(dlogits == logits, "the CUDA cross-entropy backward runs in place");
  cuda::crossentropy(scratch(static_cast<size_t>(N)), dlogits, targets, dloss, N, V, Vp, st_->stream);
}

// ---- tensor parallelism ----

void CudaOps::add_bias(Act* out, const Param* bias, int rows, int C) const {
  const int64_t n = int64_t(rows) * C;
  if (n <= 0) return;
  add_bias_kernel<<<grid_for(n), 256, 0, st_->stream>>>(out, bias, n, C);
  check_launch("add_bias");
}

void CudaOps::vocab_rows_forward(Act* out, const int32_t* tokens, const Param* wte, int64_t v0, int64_t Vl, int N,
                                 int C) const {
  const int64_t n = int64_t(N) * C;
  if (n <= 0) return;
  vocab_rows_kernel<<<grid_for(n), 256, 0, st_->stream>>>(out, tokens, wte, v0, Vl, n, C);
  check_launch("vocab_rows_forward");
}

void CudaOps::vocab_rows_backward(float* dwte, const Act* dfull, const int32_t* tokens, int64_t v0, int64_t Vl,
                                  int N, int C) const {
  // The tokens this rank does not hold go to one extra id, Vl, whose rows are left out.
  std::vector<int32_t> local(static_cast<size_t>(N));
  CUDA_CHECK(cudaMemcpyAsync(local.data(), tokens, static_cast<size_t>(N) * 4, cudaMemcpyDeviceToHost, st_->stream));
  CUDA_CHECK(cudaStreamSynchronize(st_->stream));
  for (auto& t : local) {
    const int64_t v = int64_t(t) - v0;
    t = static_cast<int32_t>(v >= 0 && v < Vl ? v : Vl);
  }
  rows_by_id_backward(dwte, nullptr, dfull, local, static_cast<int>(Vl) + 1, static_cast<int>(Vl), 1, N, C);
}

void CudaOps::add_positions(Act* out, const Param* wpe, int r0, int rows, int T, int C) const {
  const int64_t n = int64_t(rows) * C;
  if (n <= 0) return;
  add_positions_kernel<<<grid_for(n), 256, 0, st_->stream>>>(out, wpe, r0, n, T, C);
  check_launch("add_positions");
}

void CudaOps::positions_backward(float* dwpe, const Act* dout, int r0, int rows, int T, int C) const {
  const int64_t n = int64_t(T) * C;
  if (rows <= 0) return;
  positions_backward_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, st_->stream>>>(dwpe, dout, r0, rows, T, C);
  check_launch("positions_backward");
}

void CudaOps::ce_row_max(float* mx, const Act* logits, int N, int64_t Vl, int live) const {
  if (N <= 0) return;
  ce_row_max_kernel<<<N, kRowThreads, 0, st_->stream>>>(mx, logits, Vl, live);
  check_launch("ce_row_max");
}

void CudaOps::ce_partials(float* parts, const Act* logits, const float* mx, const int32_t* targets, int64_t v0,
                          int N, int64_t Vl, int live) const {
  if (N <= 0) return;
  ce_partials_kernel<<<N, kRowThreads, 0, st_->stream>>>(parts, logits, mx, targets, v0, Vl, live);
  check_launch("ce_partials");
}

void CudaOps::ce_losses(float* losses, float* sums, const float* parts, int N) const {
  if (N <= 0) return;
  ce_losses_kernel<<<(N + 255) / 256, 256, 0, st_->stream>>>(losses, sums, parts, N);
  check_launch("ce_losses");
}

void CudaOps::ce_tp_backward(Act* dlogits, const float* mx, const float* sums, float dloss, const int32_t* targets,
                             int64_t v0, int N, int64_t Vl, int live) const {
  if (N <= 0) return;
  ce_tp_backward_kernel<<<N, kRowThreads, 0, st_->stream>>>(dlogits, mx, sums, dloss, targets, v0, Vl, live);
  check_launch("ce_tp_backward");
}

void CudaOps::widen(float* dst, const Act* src, int64_t n) const {
  if (n <= 0) return;
  widen_kernel<<<grid_for(n), 256, 0, st_->stream>>>(dst, src, n);
  check_launch("widen");
}

void CudaOps::narrow(Act* dst, const float* src, int64_t n) const {
  if (n > 0) cast_to_bf16(dst, src, n, st_->stream);
}

}  // namespace myriad::cuda
