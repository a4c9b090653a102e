#include "model/cuda/cuda_ops.h"

#include <cublas_v2.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "model/cuda/cuda_check.h"
#include "model/cuda/device.h"
#include "model/cuda/matmul.h"
#include "ops/cuda/cudnn_attention.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cuda/ops.cuh"

namespace myriad {

void cuda_use_device(int index) { CUDA_CHECK(cudaSetDevice(index)); }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

void check_cuda_config(const Config& cfg) {
  int driver = 0, runtime = 0;
  CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver < runtime)
    throw_runtime("CUDA driver supports CUDA ", driver / 1000, ".", (driver % 1000) / 10,
                  " but Myriad was built with CUDA ", runtime / 1000, ".", (runtime % 1000) / 10,
                  ": update the NVIDIA driver or rebuild with an older toolkit");
  const size_t lt = cublasLtGetVersion();
  if (lt / 10000 < CUBLAS_VER_MAJOR)
    throw_runtime("cuBLASLt ", lt, " is older than the ", CUBLAS_VER_MAJOR,
                  ".x Myriad was built with: put a matching libcublasLt on LD_LIBRARY_PATH");
  if (const std::string why = cuda_unsupported_model(cfg); !why.empty())
    throw_input("config: ", why, "; use train.device = cpu");
}

std::string cuda_unsupported_model(const Config& cfg) {
  const int64_t D = cfg.model.head_dim();
  if (D != 64 && D != 80 && D != 128)
    return cat("head size ", D, " (model.head_dim, or d_model / heads) is not supported by the CUDA attention (64, 80 or "
               "128)");
  if (cfg.model.d_model % 8 != 0) return cat("model.d_model must be a multiple of 8 on CUDA, got ", cfg.model.d_model);
  if (cfg.model.moe() && cfg.train.precision == "fp8")
    return "train.precision = \"fp8\" with model.experts > 0 has not run on the CUDA op set (its experts' grouped "
           "GEMMs are bf16 only)";
  return "";
}

}  // namespace myriad

namespace myriad::cuda {

namespace {
std::atomic<int64_t> g_held{0}, g_peak{0};

// Device memory taken (bytes > 0) or given back (< 0) outside a Buffer, counted with them.
void account(int64_t bytes) {
  const int64_t held = g_held += bytes;
  for (int64_t peak = g_peak.load(); held > peak && !g_peak.compare_exchange_weak(peak, held);) {
  }
}
}  // namespace

struct CudaOps::State {
  cudaStream_t stream = nullptr;
  Matmul mm;
  float* scratch = nullptr;
  size_t scratch_floats = 0;
  float* rope_freqs = nullptr;  // (D/2) set_rope's, fp32
  // Gemm::kFp8: the FP8 GEMMs' operands, cast into three buffers (grown to the largest, at a
  // shape's first call): 0 an activation or a gradient, 1 a weight or the backward's input, 2 the
  // gradient transposed. Per buffer a slot of device floats: its amax at 0, scale at 16, 1 / scale
  // at 32 and the group's amaxes from 48 (cuBLASLt reads a scale only where it is aligned to 64
  // bytes). Block scaling: per buffer its tiles' inverse scales instead (fp8::tile_scales floats,
  // grown the same way).
  static constexpr int kFp8Buffers = 3;
  uint8_t* fp8_bytes[kFp8Buffers] = {};
  size_t fp8_capacity[kFp8Buffers] = {};
  float* fp8_tile_scales[kFp8Buffers] = {};
  size_t fp8_tile_capacity[kFp8Buffers] = {};  // bytes
  float* fp8_scalars = nullptr;  // (kFp8Buffers, fp8_slot)
  int fp8_slot = 64;
  fp8::Recipe fp8;         // set_fp8's
  fp8::AmaxGroup amaxes;   // set_fp8's
  std::vector<int64_t> bounds;  // sums_of_squares' segments, cached on the device
  int64_t* d_bounds = nullptr;
  float* h_sums = nullptr;        // pinned: their results
  size_t h_sums_floats = 0;
  std::vector<cudaEvent_t> events;  // the phase timers' marks, reused step after step
  int marks = 0;                    // of them in use
  std::string attention = "auto";   // train.attention
  // per shape (B,T,H,Hkv,D,window,documents)
  // (B, T, H, Hkv, D, window, documents, the query ranges: n, begin 0, end 0, begin 1, end 1)
  std::map<std::tuple<int, int, int, int, int, int, bool, int, int64_t, int64_t, int64_t, int64_t>, bool> cudnn_takes;
  std::set<std::tuple<int, int, int, bool>> fallback_logged;  // (H,D,window,documents) said to use Myriad's
  // A mixture of experts' layer: the CPU op set whose route / route_backward run on the host
  // (the oracle's own code), the pinned staging of their transfers, and cuBLAS for the experts'
  // grouped GEMMs with the device array of their operands' pointers.
  cpu::CpuOps host;
  char* stage = nullptr;
  size_t stage_bytes = 0;
  std::unique_ptr<Matmul> experts_mm;  // the per-expert loop's GEMMs (made at its first use)
  cublasHandle_t blas = nullptr;
  void* blas_workspace = nullptr;
  const void** group_ptrs = nullptr;
  size_t group_ptrs_count = 0;
  // Per product (forward, input gradient, weight gradient): whether the grouped call is still
  // to be used; cleared (with a warning) where cuBLAS refuses it, or by MYRIAD_MOE_GEMM=loop.
  bool grouped_ok[3] = {true, true, true};
  bool misaligned_logged = false;  // a grouped call with an operand not 16-byte aligned (logged once)
  // The op profile (MYRIAD_OP_PROFILE=FILE; off otherwise): a pair of events around each op of
  // the step, [begin, end] at 2i and 2i+1, resolved when the next step clears its marks.
  struct Profile {
    std::FILE* out = nullptr;
    std::vector<cudaEvent_t> events;
    std::vector<std::string> names;  // pair i's op
    int depth = 0;                   // an op that calls another is timed once, as itself
    int64_t steps = 0;
  } profile;
  void flush_profile();
  ~State() {
    if (stream) cudaStreamSynchronize(stream);
    try {
      flush_profile();
    } catch (const std::exception& e) {
      log::warn("op profile: the last step was not written: ", e.what());
    }
    if (profile.out) std::fclose(profile.out);
    for (cudaEvent_t e : profile.events) cudaEventDestroy(e);
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    cudaFree(scratch);
    account(-static_cast<int64_t>(scratch_floats * sizeof(float)));
    cudaFree(rope_freqs);
    for (int i = 0; i < kFp8Buffers; ++i) {
      cudaFree(fp8_bytes[i]);
      cudaFree(fp8_tile_scales[i]);
      account(-static_cast<int64_t>(fp8_capacity[i] + fp8_tile_capacity[i]));
    }
    cudaFree(fp8_scalars);
    cudaFree(d_bounds);
    cudaFreeHost(h_sums);
    cudaFreeHost(stage);
    if (blas) cublasDestroy(blas);
    cudaFree(blas_workspace);
    cudaFree(group_ptrs);
    if (stream) cudaStreamDestroy(stream);
  }
};

namespace {

// Times the op it is declared in when the op profile is on: events on the op set's stream, so
// the op's own kernels are what is measured, not the host's launch.
class OpScope {
 public:
  template <class... Shape>
  OpScope(CudaOps::State& st, const char* op, Shape... shape) : p_(st.profile.out ? &st.profile : nullptr), st_(st) {
    if (!p_ || p_->depth++ > 0) return;
    std::string name = op;
    [[maybe_unused]] const char* sep = " ";
    ((name += sep, name += std::to_string(shape), sep = "x"), ...);
    p_->names.push_back(std::move(name));
    record();
  }
  ~OpScope() {
    if (p_ && --p_->depth == 0) record();
  }

 private:
  void record() {
    const size_t i = 2 * p_->names.size() - (p_->depth > 0 ? 2 : 1);
    while (p_->events.size() <= i) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreate(&e));
      p_->events.push_back(e);
    }
    CUDA_CHECK(cudaEventRecord(p_->events[i], st_.stream));
  }
  CudaOps::State::Profile* p_;
  CudaOps::State& st_;
};
}  // namespace

// One JSON line per step: each op's calls and milliseconds (summed by name), and the step's span
// on the device, from its first op to its last event, the phase marks (the update) included.
void CudaOps::State::flush_profile() {
  Profile& p = profile;
  if (!p.out || p.names.empty()) return;
  const size_t n = p.names.size();
  cudaEvent_t last = p.events[2 * n - 1];
  float span = 0, ms = 0;
  CUDA_CHECK(cudaEventSynchronize(last));
  if (marks > 0) {  // the phase marks come after the last op when the step ends with the update
    CUDA_CHECK(cudaEventSynchronize(events[marks - 1]));
    CUDA_CHECK(cudaEventElapsedTime(&ms, last, events[marks - 1]));
    if (ms > 0) last = events[marks - 1];
  }
  CUDA_CHECK(cudaEventElapsedTime(&span, p.events[0], last));
  std::map<std::string, std::pair<int, double>> by_name;
  for (size_t i = 0; i < n; ++i) {
    CUDA_CHECK(cudaEventElapsedTime(&ms, p.events[2 * i], p.events[2 * i + 1]));
    auto& [calls, total] = by_name[p.names[i]];
    ++calls, total += ms;
  }
  std::fprintf(p.out, "{\"step\": %lld, \"span_ms\": %.4f, \"ops\": {", static_cast<long long>(++p.steps), span);
  const char* sep = "";
  for (const auto& [name, v] : by_name) std::fprintf(p.out, "%s\"%s\": [%d, %.4f]", sep, name.c_str(), v.first, v.second), sep = ", ";
  std::fprintf(p.out, "}}\n");
  std::fflush(p.out);
  p.names.clear();
}

// cuDNN's attention workspace is held from its first use to the end, so it adds to both.
int64_t CudaOps::held_bytes() { return g_held.load() + int64_t(cudnn::workspace_bytes()); }
int64_t CudaOps::peak_bytes() { return g_peak.load() + int64_t(cudnn::workspace_bytes()); }

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
    account(static_cast<int64_t>(bytes));
  }
  p_ = std::unique_ptr<T, Free>(p, Free{bytes});
  n_ = n;
}
template class CudaOps::Buffer<__nv_bfloat16>;
template class CudaOps::Buffer<float>;
template class CudaOps::Buffer<int32_t>;
template class CudaOps::Buffer<int64_t>;
template class CudaOps::Buffer<uint8_t>;
template class CudaOps::Buffer<double>;

CudaOps::Tokens::Tokens() = default;
CudaOps::Tokens::Tokens(Tokens&& o) noexcept { *this = std::move(o); }
CudaOps::Tokens& CudaOps::Tokens::operator=(Tokens&& o) noexcept {
  std::swap(ids_, o.ids_), std::swap(groups_, o.groups_);
  std::swap(n_, o.n_), std::swap(loaded_, o.loaded_), std::swap(v0_, o.v0_), std::swap(Vl_, o.Vl_);
  std::swap(summed_, o.summed_), std::swap(groups_count_, o.groups_count_);
  std::swap(h_ids_, o.h_ids_), std::swap(h_groups_, o.h_groups_), std::swap(staged_, o.staged_);
  return *this;
}
CudaOps::Tokens::~Tokens() {
  if (staged_) cudaEventSynchronize(staged_), cudaEventDestroy(staged_);
  cudaFreeHost(h_ids_), cudaFreeHost(h_groups_);
}
void CudaOps::Tokens::zeros(int64_t n) {
  *this = Tokens();
  ids_.zeros(n);
  groups_.zeros(3 * n + 1);
  n_ = n;
  CUDA_CHECK(cudaMallocHost(&h_ids_, std::max<int64_t>(n, 1) * 4));
  CUDA_CHECK(cudaMallocHost(&h_groups_, (3 * n + 1) * 4));
  CUDA_CHECK(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming));
}

CudaOps::CudaOps() : st_(std::make_shared<State>()) {
  CUDA_CHECK(cudaStreamCreateWithFlags(&st_->stream, cudaStreamNonBlocking));
  if (const char* path = std::getenv("MYRIAD_OP_PROFILE"); path && *path) {
    st_->profile.out = std::fopen(path, "a");
    if (!st_->profile.out) throw_input("MYRIAD_OP_PROFILE: cannot open ", path, " for appending: ", std::strerror(errno));
    log::warn("op profile on (MYRIAD_OP_PROFILE=", path, "): every op is timed between events, and each step "
              "waits for the last one's");
  }
  if (const char* g = std::getenv("MYRIAD_MOE_GEMM"); g && std::string(g) == "loop")
    std::fill(std::begin(st_->grouped_ok), std::end(st_->grouped_ok), false);
}

cudaStream_t CudaOps::stream() const { return st_->stream; }

float* CudaOps::scratch(size_t n) const {
  if (n > st_->scratch_floats) {
    CUDA_CHECK(cudaStreamSynchronize(st_->stream));
    cudaFree(st_->scratch);
    account(-static_cast<int64_t>(st_->scratch_floats * sizeof(float)));
    st_->scratch = nullptr;
    st_->scratch_floats = 0;
    CUDA_CHECK(cudaMalloc(&st_->scratch, n * sizeof(float)));
    st_->scratch_floats = n;
    account(static_cast<int64_t>(n * sizeof(float)));
  }
  return st_->scratch;
}

template <class T>
void CudaOps::zero(T* x, int64_t n) const {
  OpScope op(*st_, "zero");
  if (n > 0) CUDA_CHECK(cudaMemsetAsync(x, 0, static_cast<size_t>(n) * sizeof(T), st_->stream));
}
template <class T>
void CudaOps::copy(T* dst, const T* src, int64_t n) const {
  OpScope op(*st_, "copy");
  if (n > 0 && dst != src)
    CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(T), cudaMemcpyDeviceToDevice, st_->stream));
}
template void CudaOps::zero<__nv_bfloat16>(__nv_bfloat16*, int64_t) const;
template void CudaOps::zero<float>(float*, int64_t) const;
template void CudaOps::zero<int32_t>(int32_t*, int64_t) const;
template void CudaOps::zero<double>(double*, int64_t) const;
template void CudaOps::copy<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, int64_t) const;
template void CudaOps::copy<float>(float*, const float*, int64_t) const;
template void CudaOps::copy<int32_t>(int32_t*, const int32_t*, int64_t) const;

void CudaOps::load_tokens(Tokens& t, const int32_t* host, int B, int T, int64_t stride, int64_t v0,
                          int64_t Vl) const {
  OpScope op(*st_, "load_tokens");
  const int64_t N = int64_t(B) * T;
  MYRIAD_CHECK(N <= t.n_, "tokens ", B, "x", T, " exceed the buffer's ", t.n_);
  // The staging is reused: the previous load's copies must have left it (they have, unless the
  // host runs a whole micro-batch ahead of the device).
  CUDA_CHECK(cudaEventSynchronize(t.staged_));
  for (int b = 0; b < B; ++b) std::memcpy(t.h_ids_ + int64_t(b) * T, host + b * stride, size_t(T) * 4);
  CUDA_CHECK(cudaMemcpyAsync(t.ids_.data(), t.h_ids_, N * 4, cudaMemcpyHostToDevice, st_->stream));
  t.loaded_ = N, t.v0_ = v0, t.Vl_ = Vl;
  if (Vl > 0) {
    // Ids outside [v0, v0 + Vl) go to one extra id, Vl, whose group (the last) is left out.
    std::vector<int32_t> local(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) {
      const int64_t v = int64_t(t.h_ids_[i]) - v0;
      local[i] = static_cast<int32_t>(v >= 0 && v < Vl ? v : Vl);
    }
    const int groups = group_positions_by_token(local.data(), static_cast<int>(N), static_cast<int>(Vl) + 1,
                                                t.h_groups_);
    const int32_t last = t.h_groups_[N + groups + 1 + groups - 1];  // ids ascend
    t.groups_count_ = groups;
    t.summed_ = groups > 0 && last == Vl ? groups - 1 : groups;
    CUDA_CHECK(cudaMemcpyAsync(t.groups_.data(), t.h_groups_, (N + 2 * int64_t(groups) + 1) * 4,
                               cudaMemcpyHostToDevice, st_->stream));
  }
  CUDA_CHECK(cudaEventRecord(t.staged_, st_->stream));
}

void CudaOps::upload_params(Param* dst, const float* host, int64_t n) const {
  // In pieces of 64 MiB through the scratch: the whole model's fp32 at once would leave the
  // scratch that large for the rest of the run (13 GiB at 3.5B parameters).
  constexpr int64_t kPiece = int64_t(16) << 20;
  float* f = scratch(static_cast<size_t>(std::min(n, kPiece)));
  for (int64_t i = 0; i < n; i += kPiece) {
    const int64_t m = std::min(kPiece, n - i);
    CUDA_CHECK(cudaMemcpyAsync(f, host + i, static_cast<size_t>(m) * 4, cudaMemcpyHostToDevice, st_->stream));
    cast_to_bf16(dst + i, f, m, st_->stream);
    CUDA_CHECK(cudaStreamSynchronize(st_->stream));  // f is taken again by the next piece
  }
}

void CudaOps::download(float* host, const Act* src, int64_t n) const {
  std::vector<Act> h(static_cast<size_t>(n));
  CUDA_CHECK(cudaMemcpyAsync(h.data(), src, static_cast<size_t>(n) * 2, cudaMemcpyDeviceToHost, st_->stream));
  CUDA_CHECK(cudaStreamSynchronize(st_->stream));
  for (int64_t i = 0; i < n; ++i) host[i] = __bfloat162float(h[static_cast<size_t>(i)]);
}

void CudaOps::download(double* host, const double* src, int64_t n) const {
  if (n <= 0) return;
  CUDA_CHECK(cudaMemcpyAsync(host, src, static_cast<size_t>(n) * 8, cudaMemcpyDeviceToHost, st_->stream));
  CUDA_CHECK(cudaStreamSynchronize(st_->stream));
}

double peak_bf16_flops(const cudaDeviceProp& p) {
  if (p.major == 9) return 989.4e12;                // H100 / H200 SXM
  if (p.major == 8 && p.minor == 0) return 312e12;  // A100
  return 0;
}

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

std::shared_ptr<void> CudaOps::pin_host(void* host, size_t bytes) const {
  // Small buffers copy quickly anyway, and may share a page with another (which CUDA refuses to
  // register twice).
  if (!host || bytes < (size_t(16) << 20)) return nullptr;
  if (const cudaError_t e = cudaHostRegister(host, bytes, cudaHostRegisterDefault); e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    log::warn("cuda: cannot page-lock ", bytes >> 20, " MiB of host memory (", cudaGetErrorString(e),
              "): checkpoint copies run slower");
    return nullptr;
  }
  return std::shared_ptr<void>(host, [](void* p) { cudaHostUnregister(p); });
}

void CudaOps::cast_params(Param* dst, const float* src, int64_t n) const {
  OpScope op(*st_, "cast_params");
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

void CudaOps::clear_marks() const {
  st_->flush_profile();
  st_->marks = 0;
}

const int64_t* CudaOps::segments(const std::vector<int64_t>& bounds) const {
  if (bounds != st_->bounds) {
    CUDA_CHECK(cudaStreamSynchronize(st_->stream));
    cudaFree(st_->d_bounds);
    st_->d_bounds = nullptr;
    CUDA_CHECK(cudaMalloc(&st_->d_bounds, bounds.size() * 8));
    CUDA_CHECK(cudaMemcpy(st_->d_bounds, bounds.data(), bounds.size() * 8, cudaMemcpyHostToDevice));
    st_->bounds = bounds;
  }
  return st_->d_bounds;
}

std::vector<double> CudaOps::sums_of_squares(const float* x,
                                             const std::vector<std::pair<int64_t, int64_t>>& pieces) const {
  OpScope op(*st_, "sums_of_squares");
  std::vector<double> out(pieces.size(), 0.0);
  if (pieces.empty()) return out;
  // The pieces ascend; as segments of segment_sum_squares from the first piece's start, the
  // gaps between them segments too (their sums unread). Its fixed order: reproducible.
  const int64_t base = pieces.front().first;
  std::vector<int64_t> bounds = {0};
  std::vector<int> index;  // the segment of each piece
  for (auto [a, b] : pieces) {
    MYRIAD_CHECK(a - base >= bounds.back() && b >= a, "sums_of_squares: pieces must ascend");
    if (a - base > bounds.back()) bounds.push_back(a - base);
    index.push_back(static_cast<int>(bounds.size()) - 1);
    bounds.push_back(b - base);
  }
  const int count = static_cast<int>(bounds.size()) - 1;
  const int64_t total = bounds.back();
  const size_t need = count + sumsq_scratch_floats(total, count);
  float* f = scratch(need);
  segment_sum_squares(f, f + count, x + base, segments(bounds), count, total, st_->stream);
  if (static_cast<size_t>(count) > st_->h_sums_floats) {
    cudaFreeHost(st_->h_sums);
    st_->h_sums = nullptr;
    CUDA_CHECK(cudaMallocHost(&st_->h_sums, count * sizeof(float)));
    st_->h_sums_floats = count;
  }
  CUDA_CHECK(cudaMemcpyAsync(st_->h_sums, f, count * sizeof(float), cudaMemcpyDeviceToHost, st_->stream));
  CUDA_CHECK(cudaStreamSynchronize(st_->stream));
  for (size_t i = 0; i < pieces.size(); ++i) out[i] = st_->h_sums[index[i]];
  return out;
}

void CudaOps::mean_into(double* acc, const float* x, int64_t n, int64_t count) const {
  if (n <= 0) return;
  cuda::mean_into(acc, x, n, count, st_->stream);
}

void CudaOps::accumulate(float* dst, const float* src, int64_t n) const {
  OpScope op(*st_, "accumulate");
  if (n <= 0) return;
  cuda::accumulate(dst, src, n, st_->stream);
}

// A context-parallel rank's rows as the kernels take them (the identity for null).
static cuda::RowPositions positions_of(const ContextRows* rows) {
  if (!rows) return {};
  return {rows->begin[0], rows->end[0] - rows->begin[0], rows->n > 1 ? rows->begin[1] : 0};
}

void CudaOps::embedding_forward(Act* out, const int32_t* tokens, const Param* wte, const Param* wpe, int B, int T,
                                int C, const ContextRows* rows) const {
  OpScope op(*st_, "embedding_forward", B, T, C);
  cuda::embedding_forward(out, tokens, wte, wpe, B, T, C, st_->stream, positions_of(rows));
}

void CudaOps::rows_by_id_backward(float* dwte, float* dwpe, const Act* dout, const Tokens& t, int B, int T,
                                  int C, const ContextRows* rows) const {
  const int64_t N = int64_t(B) * T;
  MYRIAD_CHECK(t.Vl_ > 0 && t.loaded_ == N, "a lookup's backward needs its tokens loaded with their vocabulary rows");
  const int32_t* g = t.groups_.data();
  cuda::embedding_backward(dwte, dwpe, dout, g, g + N, g + N + t.groups_count_ + 1, t.summed_, B, T, C,
                           st_->stream, positions_of(rows));
}

void CudaOps::embedding_backward(float* dwte, float* dwpe, const Act* dout, const Tokens& tokens, int B, int T,
                                 int C, const ContextRows* rows) const {
  OpScope op(*st_, "embedding_backward", B, T, C);
  MYRIAD_CHECK(tokens.v0_ == 0, "the embedding's tokens are loaded with the whole vocabulary");
  rows_by_id_backward(dwte, dwpe, dout, tokens, B, T, C, rows);
}

namespace {
// Where a producer writes its output's amax for FP8's next cast: out_keep's scalars when it asks
// (per-tensor scaling only: block scaling's tiles take no tensor's amax), else nowhere.
float* producer_amax(const CudaOps::State& st, const fp8::Kept* out_keep) {
  return out_keep && out_keep->producer_amax && st.fp8.scaling == fp8::Scaling::tensor ? out_keep->scalars : nullptr;
}
}  // namespace

void CudaOps::norm_forward(Norm n, Act* out, float* mean, float* rstd, const Act* inp, const Param* w, const Param* b,
                           int N, int C, const fp8::Kept* out_keep) const {
  float* const amax = producer_amax(*st_, out_keep);
  if (n.kind == NormKind::kRMSNorm) {
    OpScope op(*st_, "rmsnorm_forward", N, C);
    cuda::rmsnorm_forward(out, rstd, inp, w, N, C, n.eps, st_->stream, amax);
  } else {
    OpScope op(*st_, "layernorm_forward", N, C);
    cuda::layernorm_forward(out, mean, rstd, inp, w, b, N, C, st_->stream, amax);
  }
}

void CudaOps::residual_norm_forward(Norm n, Act* resid, Act* out, float* mean, float* rstd, const Act* a, const Act* b,
                                    const Param* w, const Param* bias, int N, int C, const fp8::Kept* out_keep) const {
  float* const amax = producer_amax(*st_, out_keep);
  if (n.kind == NormKind::kRMSNorm) {
    OpScope op(*st_, "residual_rmsnorm_forward", N, C);
    cuda::residual_rmsnorm_forward(resid, out, rstd, a, b, w, N, C, n.eps, st_->stream, amax);
  } else {
    OpScope op(*st_, "residual_layernorm_forward", N, C);
    cuda::residual_layernorm_forward(resid, out, mean, rstd, a, b, w, bias, N, C, st_->stream, amax);
  }
}

void CudaOps::norm_backward(Norm n, Act* dinp, float* dw, float* db, const Act* dout, const Act* inp, const Param* w,
                            const float* mean, const float* rstd, int N, int C) const {
  if (n.kind == NormKind::kRMSNorm) {
    OpScope op(*st_, "rmsnorm_backward", N, C);
    cuda::rmsnorm_backward(dinp, dw, scratch(rmsnorm_scratch_floats(N, C)), dout, inp, w, rstd, N, C, st_->stream);
  } else {
    OpScope op(*st_, "layernorm_backward", N, C);
    cuda::layernorm_backward(dinp, dw, db, scratch(layernorm_scratch_floats(N, C)), dout, inp, w, mean, rstd, N, C,
                             st_->stream);
  }
}

namespace {

// A device buffer grown to the largest request it has had (model::fp8_cast_bytes plans the cast
// buffers and their tiles' scales), counted with the held memory.
template <class T>
T* grown(CudaOps::State& st, T*& p, size_t& capacity, size_t bytes) {
  if (bytes > capacity) {
    CUDA_CHECK(cudaStreamSynchronize(st.stream));  // nothing queued reads the old one
    cudaFree(p);
    account(-static_cast<int64_t>(capacity));
    p = nullptr;
    capacity = 0;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    capacity = bytes;
    account(static_cast<int64_t>(bytes));
  }
  return p;
}
// Cast buffer i, and its tiles' inverse scales (block scaling).
uint8_t* fp8_buffer(CudaOps::State& st, int i, size_t bytes) { return grown(st, st.fp8_bytes[i], st.fp8_capacity[i], bytes); }
float* fp8_tile_buffer(CudaOps::State& st, int i, int64_t floats) {
  return grown(st, st.fp8_tile_scales[i], st.fp8_tile_capacity[i], size_t(floats) * sizeof(float));
}

// What a cast's scalars (fp8::Kept's layout) hold already: nothing (the cast measures x's amax
// first), x's amax (its producer measured it as it wrote x: the group's gather and the scale
// remain), or x's scale (a kept cast's).
enum class Known { kNothing, kAmax, kScale };

// x (rows,cols) as FP8 GEMM operands with the scalars at `slot`: what `known` leaves to do of
// the amax (over the group) and the scale, then one pass that writes the bytes row-major into q
// and/or transposed, (cols,rows), into qt (either may be null).
struct Fp8Operand {
  Matmul::Fp8Tensor rows, cols;
};
Fp8Operand fp8_cast_into(CudaOps::State& st, uint8_t* q, uint8_t* qt, float* slot, const bf16* x, int rows, int cols,
                         fp8::Format f, Known known) {
  // A scope of its own, outside the GEMM's: the profile shows what the casts cost.
  OpScope op(st, q && qt ? "fp8_cast_both" : qt ? "fp8_cast_t" : "fp8_cast", rows, cols);
  float *amax = slot, *scale = slot + 16, *inv = slot + 32, *group = slot + 48;
  if (known == Known::kNothing) cuda::amax(amax, x, int64_t(rows) * cols, st.stream);
  if (known != Known::kScale) {
    const int ranks = st.amaxes.ranks;
    if (ranks > 1) st.amaxes.gather(amax, group);
    cuda::fp8_scales(scale, inv, ranks > 1 ? group : amax, ranks, f, st.stream);
  }
  cuda::cast_fp8(q, qt, x, rows, cols, scale, f, st.stream);
  return {{q, inv, f}, {qt, inv, f}};
}

// The same into cast buffer r (row-major) and/or t (transposed), -1: not wanted; each stays
// valid until its buffer's next cast; the scalars are those of the first buffer named.
Fp8Operand fp8_cast(CudaOps::State& st, int r, int t, const bf16* x, int rows, int cols, fp8::Format f) {
  const size_t bytes = size_t(rows) * cols;
  uint8_t* q = r >= 0 ? fp8_buffer(st, r, bytes) : nullptr;
  uint8_t* qt = t >= 0 ? fp8_buffer(st, t, bytes) : nullptr;
  if (!st.fp8_scalars)
    CUDA_CHECK(cudaMalloc(&st.fp8_scalars, CudaOps::State::kFp8Buffers * st.fp8_slot * sizeof(float)));
  return fp8_cast_into(st, q, qt, st.fp8_scalars + st.fp8_slot * (r >= 0 ? r : t), x, rows, cols, f, Known::kNothing);
}

// Block scaling (fp8::Scaling::block): x (rows,cols) into cast buffer r (row-major) and/or t
// (transposed), -1: not wanted, each with its inverse scales: in 1 x 128 tiles along each
// layout's rows (an activation or a gradient: the GEMMs' inner dimension), or in 128 x 128
// blocks (a weight). One pass over x, whatever it writes; nothing kept, nothing gathered (a tile's
// scale is its own).
Fp8Operand fp8_cast_tiles(CudaOps::State& st, int r, int t, const bf16* x, int rows, int cols, fp8::Format f,
                          bool blocks) {
  OpScope op(st, r >= 0 && t >= 0 ? "fp8_cast_tiles_both" : t >= 0 ? "fp8_cast_tiles_t" : "fp8_cast_tiles", rows, cols);
  const size_t bytes = size_t(rows) * cols;
  uint8_t* q = r >= 0 ? fp8_buffer(st, r, bytes) : nullptr;
  uint8_t* qt = t >= 0 ? fp8_buffer(st, t, bytes) : nullptr;
  float* inv = r >= 0 ? fp8_tile_buffer(st, r, fp8::tile_scales(rows, cols, blocks)) : nullptr;
  float* inv_t = t >= 0 ? fp8_tile_buffer(st, t, fp8::tile_scales(cols, rows, blocks)) : nullptr;
  cuda::cast_fp8_tiles(q, inv, qt, inv_t, x, rows, cols, blocks, f, st.stream);
  const Matmul::Scales sc = blocks ? Matmul::Scales::kBlocks : Matmul::Scales::kTiles;
  return {{q, inv, f, sc}, {qt, inv_t, f, sc}};
}

// A linear backward's output gradient dout (N,OC) cast once into both layouts, buffer 0
// row-major for the input gradient and 2 transposed for the weight's: in tiles (block scaling),
// or per tensor, its amax measured by its producer when dout_amax says so.
Fp8Operand fp8_output_gradient(CudaOps::State& st, const bf16* dout, int N, int OC, const fp8::Kept* dout_amax) {
  const fp8::Format f = st.fp8.gradient;
  if (st.fp8.scaling == fp8::Scaling::block) return fp8_cast_tiles(st, 0, 2, dout, N, OC, f, false);
  if (!dout_amax) return fp8_cast(st, 0, 2, dout, N, OC, f);
  return fp8_cast_into(st, fp8_buffer(st, 0, size_t(N) * OC), fp8_buffer(st, 2, size_t(N) * OC), dout_amax->scalars,
                       dout, N, OC, f, Known::kAmax);
}

// The weight gradient's x^T (IC,N), into buffer 1 (the input gradient's GEMM, queued before on
// the same stream, has read W^T there): block scaling's tiles along the tokens; else from what the
// forward kept: its bytes, or its scale, at which x is cast (or, without x, the activation is
// recomputed from pre straight into its cast, never written in bf16); else cast afresh.
Matmul::Fp8Tensor fp8_input_t(CudaOps::State& st, Mlp m, const bf16* inp, const bf16* pre, const fp8::Kept* kept,
                              int N, int IC) {
  const fp8::Format f = st.fp8.forward;
  if (st.fp8.scaling == fp8::Scaling::block) return fp8_cast_tiles(st, -1, 1, inp, N, IC, f, false).cols;
  if (!kept) return fp8_cast(st, -1, 1, inp, N, IC, f).cols;
  if (kept->bytes) return {kept->bytes, kept->scalars + 32, f};
  if (inp)
    return fp8_cast_into(st, nullptr, fp8_buffer(st, 1, size_t(N) * IC), kept->scalars, inp, N, IC, f, Known::kScale)
        .cols;
  uint8_t* q = fp8_buffer(st, 1, size_t(N) * IC);
  OpScope op(st, m == Mlp::kGelu ? "gelu_recompute_fp8_t" : "swiglu_recompute_fp8_t", N, IC);
  cuda::cast_fp8_activation_t(q, pre, m == Mlp::kSwiGlu, N, IC, kept->scalars + 16, f, st.stream);
  return {q, kept->scalars + 32, f};
}

// A linear's weight W (OC, IC) as the forward's operand, or transposed as the input gradient's
// W^T: from the step's cast when the model gives one (fp8::WeightCast), else cast now into
// buffer 1 (in 128 x 128 blocks under block scaling).
Matmul::Fp8Tensor fp8_weight(CudaOps::State& st, const fp8::WeightCast* wc, const bf16* w, int OC, int IC,
                             bool transposed) {
  const fp8::Format f = st.fp8.forward;
  const bool tiles = st.fp8.scaling == fp8::Scaling::block;
  if (wc && !tiles) return {transposed ? wc->bytes_t : wc->bytes, wc->scales + 32, f};
  if (wc)
    return {transposed ? wc->bytes_t : wc->bytes, transposed ? wc->scales_t : wc->scales, f, Matmul::Scales::kBlocks};
  const int r = transposed ? -1 : 1, t = transposed ? 1 : -1;
  const Fp8Operand q = tiles ? fp8_cast_tiles(st, r, t, w, OC, IC, f, true) : fp8_cast(st, r, t, w, OC, IC, f);
  return transposed ? q.cols : q.rows;
}

}  // namespace

void CudaOps::set_fp8(const fp8::Recipe& r, fp8::AmaxGroup group) const {
  MYRIAD_CHECK(group.ranks >= 1 && (group.ranks == 1 || group.gather), "set_fp8: ", group.ranks,
               " ranks without a gather");
  CUDA_CHECK(cudaStreamSynchronize(st_->stream));  // no cast in flight reads the old slots
  cudaFree(st_->fp8_scalars);
  st_->fp8_scalars = nullptr;
  st_->fp8_slot = static_cast<int>(fp8::kept_floats(group.ranks));
  st_->fp8 = r;
  st_->amaxes = std::move(group);
}

void CudaOps::fp8_cast_weight(const fp8::WeightCast& c, const Param* w, int OC, int IC) const {
  const fp8::Format f = st_->fp8.forward;
  if (st_->fp8.scaling == fp8::Scaling::block) {
    OpScope op(*st_, "fp8_cast_tiles_both", OC, IC);
    cuda::cast_fp8_tiles(c.bytes, c.scales, c.bytes_t, c.scales_t, w, OC, IC, /*blocks=*/true, f, st_->stream);
    return;
  }
  fp8_cast_into(*st_, c.bytes, c.bytes_t, c.scales, w, OC, IC, f, Known::kNothing);
}

std::string CudaOps::fp8_refusal(const fp8::Recipe& r) const {
  int d = 0;
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDevice(&d));
  CUDA_CHECK(cudaGetDeviceProperties(&p, d));
  return fp8::gpu_refusal(p.major, p.minor, r.scaling);
}

void CudaOps::linear_forward(Act* out, const Act* inp, const Param* w, const Param* b, int N, int IC, int OC,
                             Gemm g, const fp8::Kept* keep, const fp8::WeightCast* wcast) const {
  if (g == Gemm::kFp8) {
    // With `keep` the input's scalars go there (its amax there already when its producer wrote
    // it), and its transposed cast too when it has bytes. Block scaling keeps nothing: its
    // backward's x^T has tiles along the tokens, not the forward's.
    const fp8::Format f = st_->fp8.forward;
    const bool tiles = st_->fp8.scaling == fp8::Scaling::block;
    const Matmul::Fp8Tensor x =
        tiles  ? fp8_cast_tiles(*st_, 0, -1, inp, N, IC, f, false).rows
        : keep ? fp8_cast_into(*st_, fp8_buffer(*st_, 0, size_t(N) * IC), keep->bytes, keep->scalars, inp, N, IC, f,
                               keep->producer_amax ? Known::kAmax : Known::kNothing).rows
               : fp8_cast(*st_, 0, -1, inp, N, IC, f).rows;
    const Matmul::Fp8Tensor wq = fp8_weight(*st_, wcast, w, OC, IC, /*transposed=*/false);
    OpScope op(*st_, "linear_forward_fp8", N, IC, OC);
    st_->mm.forward_fp8(out, x, wq, b, N, IC, OC, st_->fp8.fast_accum, st_->stream);
    return;
  }
  OpScope op(*st_, "linear_forward", N, IC, OC);
  st_->mm.forward(out, inp, w, b, N, IC, OC, st_->stream);
}

void CudaOps::linear_act_forward(Mlp m, Act* out, Act* pre, const Act* inp, const Param* w, const Param* b, int N,
                                 int IC, int F, Gemm g, const fp8::Kept* keep, const fp8::Kept* out_keep,
                                 const fp8::WeightCast* wcast) const {
  if (m == Mlp::kGelu && g == Gemm::kBf16) {
    OpScope op(*st_, "linear_gelu_forward", N, IC, F);
    st_->mm.forward_gelu(out, pre, inp, w, b, N, IC, F, st_->stream);
    return;
  }
  linear_forward(pre, inp, w, b, N, IC, F * pre_width(m), g, keep, wcast);
  // In FP8 the activation measures its output's amax for the next linear's cast, if it asks.
  float* const amax = g == Gemm::kFp8 ? producer_amax(*st_, out_keep) : nullptr;
  if (m == Mlp::kGelu) {
    OpScope op(*st_, "gelu_forward", N, F);
    cuda::gelu_forward(out, pre, int64_t(N) * F, st_->stream, amax);
    return;
  }
  OpScope op(*st_, "swiglu_forward", N, F);
  cuda::swiglu_forward(out, pre, N, F, st_->stream, amax);
}

void CudaOps::linear_backward(Mlp m, Act* dinp, float* dw, float* db, const Act* dout, const Act* inp,
                              const Param* w, const Act* pre, int N, int IC, int OC, bool accumulate, Gemm g,
                              const fp8::Kept* kept, const fp8::Kept* dinp_amax, const fp8::Kept* dout_amax,
                              const fp8::WeightCast* wcast) const {
  MYRIAD_CHECK(!(pre && accumulate), "linear_backward: a gradient through the activation is written, not added");
  // FP8 with what the forward kept: x^T itself, or its scale, at which an activation recomputed
  // from pre goes straight into its transposed cast (never written in bf16).
  // Block scaling keeps nothing (linear_forward): its x^T is cast afresh, in tiles along the tokens.
  const bool tiles = g == Gemm::kFp8 && st_->fp8.scaling == fp8::Scaling::block;
  MYRIAD_CHECK(!(tiles && kept && kept->bytes), "linear_backward: block scaling keeps no cast of the input");
  const bool kept_bytes = g == Gemm::kFp8 && !tiles && kept && kept->bytes;
  const bool cast_from_pre = g == Gemm::kFp8 && !tiles && kept && !kept->bytes && !inp && pre;
  MYRIAD_CHECK(inp || pre || kept_bytes, "linear_backward: no input, and no pre-activation to recompute it from");
  // The input gradient: into dinp, or through the activation (its output gradient (N,IC) in
  // scratch, bf16). GELU's backward rides the bf16 GEMM's epilogue. Without `inp` (and in FP8
  // without a kept cast, which takes it from pre straight into its cast), the
  // activation's output is recomputed from `pre` into scratch beside it, by the forward's own
  // kernel (the same bits), for the weight gradient.
  const bool dgelu = pre && m == Mlp::kGelu && g == Gemm::kBf16;
  const size_t part = (size_t(N) * IC + 7) / 8 * 4;  // floats for (N,IC) bf16, 16-byte aligned
  float* const sc = pre && (!dgelu || !inp) ? scratch(2 * part) : nullptr;
  Act* dx = pre && !dgelu ? reinterpret_cast<Act*>(sc) : dinp;
  Matmul::Fp8Tensor dy_t{};
  if (g == Gemm::kFp8) {
    const Fp8Operand dy = fp8_output_gradient(*st_, dout, N, OC, dout_amax);
    dy_t = dy.cols;
    const Matmul::Fp8Tensor wt = fp8_weight(*st_, wcast, w, OC, IC, /*transposed=*/true);
    OpScope op(*st_, "linear_backward_input_fp8", N, IC, OC);
    st_->mm.backward_input_fp8(dx, dy.rows, wt, N, IC, OC, accumulate, st_->stream);
  } else if (dgelu) {
    OpScope op(*st_, "linear_backward_input_dgelu", N, IC, OC);
    st_->mm.backward_input_dgelu(dinp, dout, w, pre, N, IC, OC, st_->stream);
  } else {
    OpScope op(*st_, "linear_backward_input", N, IC, OC);
    st_->mm.backward_input(dx, dout, w, N, IC, OC, accumulate, st_->stream);
  }
  if (pre && !dgelu) {
    OpScope op(*st_, m == Mlp::kGelu ? "gelu_backward" : "swiglu_backward", N, IC);
    // In FP8 the activation's backward measures dinp's amax for the cast of the next backward.
    float* const amax = g == Gemm::kFp8 && !tiles && dinp_amax ? dinp_amax->scalars : nullptr;
    if (m == Mlp::kGelu)
      cuda::gelu_backward(dinp, pre, dx, int64_t(N) * IC, st_->stream, amax);
    else
      cuda::swiglu_backward(dinp, pre, dx, N, IC, st_->stream, amax);
  }
  if (!inp && !kept_bytes && !cast_from_pre) {
    Act* act = reinterpret_cast<Act*>(sc + part);
    OpScope op(*st_, m == Mlp::kGelu ? "gelu_recompute" : "swiglu_recompute", N, IC);
    if (m == Mlp::kGelu)
      cuda::gelu_forward(act, pre, int64_t(N) * IC, st_->stream);
    else
      cuda::swiglu_forward(act, pre, N, IC, st_->stream);
    inp = act;
  }
  if (g == Gemm::kFp8) {
    const Matmul::Fp8Tensor xt = fp8_input_t(*st_, m, inp, pre, kept, N, IC);
    OpScope op(*st_, "linear_backward_weight_fp8", N, IC, OC);
    st_->mm.backward_weight_fp8(dw, dy_t, xt, N, IC, OC, st_->stream);
  } else {
    OpScope op(*st_, "linear_backward_weight", N, IC, OC);
    st_->mm.backward_weight(dw, dout, inp, N, IC, OC, st_->stream);
  }
  if (db) bias_backward(db, dout, N, OC);
}

void CudaOps::bias_backward(float* db, const Act* dout, int rows, int OC) const {
  OpScope op(*st_, "bias_backward", rows, OC);
  cuda::bias_backward(db, scratch(bias_scratch_floats(rows, OC)), dout, rows, OC, st_->stream);
}

void CudaOps::add(Act* out, const Act* a, const Act* b, int64_t n) const {
  OpScope op(*st_, "add");
  cuda::add(out, a, b, n, st_->stream);
}

void CudaOps::select_attention(const std::string& kernel, bool deterministic) const {
  st_->attention = kernel;
  cudnn::set_deterministic(deterministic);
}

static cudnn::QueryRanges query_ranges(const ContextRows& r) {
  cudnn::QueryRanges q;
  q.n = r.n;
  for (int i = 0; i < 2; ++i) q.begin[i] = r.begin[i], q.end[i] = r.end[i];
  return q;
}

// Whether this shape runs on cuDNN: decided at its first call, the same for its forward and
// backward. A context-parallel rank's rows (two ranges, one cuDNN call each) take cuDNN under
// "auto" only when not deterministic: deterministic, cuDNN's backward holds about B H x (a
// range's queries x its keys) bf16 of workspace, which at the lengths cp is for outgrows the
// model (16 GiB for Llama 3.2 1B's 32K at cp 2); "cudnn" asks for it anyway.
static bool use_cudnn(CudaOps::State& st, int B, int T, int H, int Hkv, int D, int window, bool docs,
                      const ContextRows* rows) {
  if (st.attention == "myriad") return false;
  if (rows && st.attention == "auto" && cudnn::deterministic()) return false;
  const cudnn::QueryRanges q = rows ? query_ranges(*rows) : cudnn::QueryRanges{};
  const auto key = std::make_tuple(B, T, H, Hkv, D, window, docs, q.n, q.begin[0], q.end[0], q.begin[1], q.end[1]);
  if (auto it = st.cudnn_takes.find(key); it != st.cudnn_takes.end()) return it->second;
  std::string why;
  const bool ok = cudnn::supports(B, T, H, Hkv, D, window, &why, rows ? &q : nullptr, docs);
  if (!ok && st.attention == "cudnn")
    throw_input("train.attention = \"cudnn\" but cuDNN's fused attention cannot take B ", B, " T ", T, " H ", H,
                " Hkv ", Hkv, " D ", D, " window ", window, rows ? cat(" for a context-parallel rank's rows") : "",
                ": ", why, "; use train.attention = \"auto\" or \"myriad\"");
  // Once per head shape: sampling grows T by one a token, and each new T is a new shape.
  if (!ok && st.fallback_logged.insert({H, D, window, docs}).second)
    log::info("attention: Myriad's kernel for B ", B, " T ", T, " H ", H, " D ", D, " (cuDNN: ", why,
              "); further shapes of H ", H, " D ", D, " that cuDNN refuses are not logged");
  return st.cudnn_takes[key] = ok;
}

static cuda::QueryRows query_rows(const ContextRows* rows) {
  return rows ? cuda::QueryRows{positions_of(rows), int(rows->count())} : cuda::QueryRows{};
}

void CudaOps::attention_forward(Act* out, float* saved, const Act* qkv, int B, int T, int H, int Hkv, int D,
                                int window, const int32_t* docs, const ContextRows* rows) const {
  OpScope op(*st_, "attention_forward", B, T, H, D);
  if (use_cudnn(*st_, B, T, H, Hkv, D, window, docs, rows)) {
    const cudnn::QueryRanges q = rows ? query_ranges(*rows) : cudnn::QueryRanges{};
    cudnn::attention_forward(out, saved, qkv, B, T, H, Hkv, D, window, st_->stream, rows ? &q : nullptr, docs);
  } else {
    cuda::attention_forward(out, saved, qkv, B, T, H, Hkv, D, window, st_->stream, docs, query_rows(rows));
  }
}
void CudaOps::attention_backward(Act* dqkv, const Act* dout, const Act* out, const Act* qkv, const float* saved,
                                 int B, int T, int H, int Hkv, int D, int window, const int32_t* docs,
                                 const ContextRows* rows) const {
  OpScope op(*st_, "attention_backward", B, T, H, D);
  if (use_cudnn(*st_, B, T, H, Hkv, D, window, docs, rows)) {
    const cudnn::QueryRanges q = rows ? query_ranges(*rows) : cudnn::QueryRanges{};
    cudnn::attention_backward(dqkv, dout, out, qkv, saved, B, T, H, Hkv, D, window, st_->stream, rows ? &q : nullptr,
                              docs);
  } else {
    cuda::attention_backward(dqkv, scratch(attention_scratch_floats(B, rows ? int(rows->count()) : T, H, D)), dout,
                             out, qkv, saved, B, T, H, Hkv, D, window, st_->stream, docs, query_rows(rows));
  }
}

std::string CudaOps::context_parallel_refusal(int64_t chunk) const {
  if (chunk % 8 != 0)
    return cat("seq_len / (2 cp) = ", chunk, " tokens per chunk, but the GPU's attention kernel takes chunks of a "
               "multiple of 8 tokens; choose a seq_len divisible by 16 x cp");
  return "";
}

void CudaOps::cp_pack_kv(Act* pack, const Act* qkv, int64_t N, int Hkv, int G, int D) const {
  OpScope op(*st_, "cp_pack_kv");
  cuda::cp_pack_kv(pack, qkv, N, Hkv, G, D, st_->stream);
}
void CudaOps::cp_unpack_kv(Act* whole, const Act* packs, const Act* local, int B, int T, const ContextRows* ranks,
                           int cp, int rank, int Hkv, int G, int D) const {
  OpScope op(*st_, "cp_unpack_kv");
  const int64_t Tw = int64_t(T) * cp, block = int64_t(B) * T * Hkv * 2 * D;
  for (int q = 0; q < cp; ++q) {
    cuda::cp_place_rows(whole, q == rank ? local : nullptr, q == rank ? nullptr : packs + q * block, B, T, Tw,
                        positions_of(&ranks[q]), Hkv, G, D, st_->stream);
  }
}
void CudaOps::cp_pack_kv_grad(float* packs, const Act* dwhole, int B, int T, const ContextRows* ranks, int cp, int Hkv,
                              int G, int D) const {
  OpScope op(*st_, "cp_pack_kv_grad");
  const int64_t Tw = int64_t(T) * cp, block = int64_t(B) * T * Hkv * 2 * D;
  for (int q = 0; q < cp; ++q)
    cuda::cp_take_kv_grad(packs + q * block, dwhole, B, T, Tw, positions_of(&ranks[q]), Hkv, G, D, st_->stream);
}
void CudaOps::cp_unpack_kv_grad(Act* dlocal, const float* mine, const Act* dwhole, int B, int T,
                                const ContextRows* ranks, int cp, int rank, int Hkv, int G, int D) const {
  OpScope op(*st_, "cp_unpack_kv_grad");
  cuda::cp_unpack_kv_grad(dlocal, mine, dwhole, B, T, int64_t(T) * cp, positions_of(&ranks[rank]), Hkv, G, D,
                          st_->stream);
}

void CudaOps::set_rope(const std::vector<double>& freqs) const {
  std::vector<float> f(freqs.begin(), freqs.end());
  cudaFree(st_->rope_freqs);
  st_->rope_freqs = nullptr;
  CUDA_CHECK(cudaMalloc(&st_->rope_freqs, f.size() * sizeof(float)));
  CUDA_CHECK(cudaMemcpy(st_->rope_freqs, f.data(), f.size() * sizeof(float), cudaMemcpyHostToDevice));
}
void CudaOps::rope_forward(Act* qkv, int B, int T, int Hkv, int G, int D, const ContextRows* rows) const {
  OpScope op(*st_, "rope_forward", B, T, Hkv * G, D);
  cuda::rope_forward(qkv, st_->rope_freqs, B, T, Hkv, G, D, 0, st_->stream, positions_of(rows));
}
void CudaOps::rope_backward(Act* dqkv, int B, int T, int Hkv, int G, int D, const ContextRows* rows) const {
  OpScope op(*st_, "rope_backward", B, T, Hkv * G, D);
  cuda::rope_backward(dqkv, st_->rope_freqs, B, T, Hkv, G, D, 0, st_->stream, positions_of(rows));
}

void CudaOps::crossentropy_forward(float* losses, const Act* logits, const int32_t* targets, int N, int V,
                                   int Vp) const {
  OpScope op(*st_, "crossentropy_forward", N, V);
  // dloss 0: the losses only, the logits untouched.
  cuda::crossentropy(losses, const_cast<Act*>(logits), targets, 0.0f, N, V, Vp, st_->stream);
}
void CudaOps::crossentropy_forward_backward(float* losses, Act* logits, const int32_t* targets, float dloss, int N,
                                            int V, int Vp) const {
  OpScope op(*st_, "crossentropy_forward_backward", N, V);
  cuda::crossentropy(losses, logits, targets, dloss, N, V, Vp, st_->stream);
}

// ---- tensor parallelism ----

void CudaOps::add_bias(Act* out, const Param* bias, int rows, int C) const {
  OpScope op(*st_, "add_bias", rows, C);
  cuda::add_bias(out, bias, rows, C, st_->stream);
}

void CudaOps::vocab_rows_forward(Act* out, const int32_t* tokens, const Param* wte, int64_t v0, int64_t Vl, int N,
                                 int C) const {
  OpScope op(*st_, "vocab_rows_forward", N, C);
  cuda::vocab_rows_forward(out, tokens, wte, v0, Vl, N, C, st_->stream);
}

void CudaOps::vocab_rows_backward(float* dwte, const Act* dfull, const Tokens& tokens, int64_t v0, int64_t Vl,
                                  int N, int C) const {
  OpScope op(*st_, "vocab_rows_backward", N, C);
  MYRIAD_CHECK(tokens.v0_ == v0 && tokens.Vl_ == Vl, "tokens loaded for vocabulary rows [", tokens.v0_, ", ",
               tokens.v0_ + tokens.Vl_, ") but looked up in [", v0, ", ", v0 + Vl, ")");
  rows_by_id_backward(dwte, nullptr, dfull, tokens, 1, N, C);
}

void CudaOps::add_positions(Act* out, const Param* wpe, int r0, int rows, int T, int C, const ContextRows* cr) const {
  OpScope op(*st_, "add_positions", rows, C);
  cuda::add_positions(out, wpe, r0, rows, T, C, st_->stream, positions_of(cr));
}

void CudaOps::positions_backward(float* dwpe, const Act* dout, int r0, int rows, int T, int C,
                                 const ContextRows* cr) const {
  OpScope op(*st_, "positions_backward", rows, C);
  cuda::positions_backward(dwpe, dout, r0, rows, T, C, st_->stream, positions_of(cr));
}

void CudaOps::ce_row_max(float* mx, const Act* logits, int N, int64_t Vl, int live) const {
  OpScope op(*st_, "ce_row_max", N);
  cuda::ce_row_max(mx, logits, N, Vl, live, st_->stream);
}

void CudaOps::ce_partials(float* parts, const Act* logits, const float* mx, const int32_t* targets, int64_t v0,
                          int N, int64_t Vl, int live) const {
  OpScope op(*st_, "ce_partials", N);
  cuda::ce_partials(parts, logits, mx, targets, v0, N, Vl, live, st_->stream);
}

void CudaOps::ce_losses(float* losses, float* sums, const float* parts, const int32_t* targets, int N) const {
  OpScope op(*st_, "ce_losses", N);
  cuda::ce_losses(losses, sums, parts, targets, N, st_->stream);
}

void CudaOps::qk_norm_forward(QkNorm n, Act* qkv, float* rstd, const Act* raw, const Param* wq, const Param* wk, int N,
                              int Hkv, int G, int D) const {
  OpScope op(*st_, "qk_norm_forward", N, Hkv * G, D);
  MYRIAD_CHECK(n.kind != QkNormKind::kNone, "qk_norm_forward without a norm");
  cuda::qk_norm_forward(n.kind == QkNormKind::kHead, qkv, rstd, raw, wq, wk, N, Hkv, G, D, n.eps, st_->stream);
}

void CudaOps::qk_norm_backward(QkNorm n, Act* dqkv, float* dwq, float* dwk, const Act* raw, const Param* wq,
                               const Param* wk, const float* rstd, int N, int Hkv, int G, int D) const {
  OpScope op(*st_, "qk_norm_backward", N, Hkv * G, D);
  cuda::qk_norm_backward(n.kind == QkNormKind::kHead, dqkv, dwq, dwk, raw, wq, wk, rstd, N, Hkv, G, D, st_->stream);
}

void CudaOps::ce_tp_backward(Act* dlogits, const float* mx, const float* sums, float dloss, const int32_t* targets,
                             int64_t v0, int N, int64_t Vl, int live) const {
  OpScope op(*st_, "ce_tp_backward", N);
  cuda::ce_tp_backward(dlogits, mx, sums, dloss, targets, v0, N, Vl, live, st_->stream);
}

void CudaOps::widen(float* dst, const Act* src, int64_t n) const {
  OpScope op(*st_, "widen");
  cuda::widen(dst, src, n, st_->stream);
}

void CudaOps::narrow(Act* dst, const float* src, int64_t n) const {
  OpScope op(*st_, "narrow");
  if (n > 0) cast_to_bf16(dst, src, n, st_->stream);
}

// ---- a mixture of experts' layer ----

namespace {

// Pinned host memory of at least `bytes` for the routing's transfers. Every use writes it from
// the host only after a synchronization that follows the previous use's uploads, so one region
// serves route and route_backward alike.
char* stage(CudaOps::State& st, size_t bytes) {
  if (bytes > st.stage_bytes) {
    CUDA_CHECK(cudaStreamSynchronize(st.stream));
    cudaFreeHost(st.stage);
    st.stage = nullptr;
    CUDA_CHECK(cudaMallocHost(&st.stage, bytes));
    st.stage_bytes = bytes;
  }
  return st.stage;
}

// 16-byte aligned pieces of the staging, in order.
struct Carve {
  char* base;
  size_t at = 0;
  template <class T>
  T* take(int64_t n) {
    T* p = reinterpret_cast<T*>(base + at);
    at += (static_cast<size_t>(std::max<int64_t>(n, 0)) * sizeof(T) + 15) / 16 * 16;
    return p;
  }
};
size_t staged_bytes(std::initializer_list<int64_t> bytes) {
  size_t total = 0;
  for (int64_t b : bytes) total += (static_cast<size_t>(b) + 15) / 16 * 16;
  return total;
}

// The experts' three products, each expert e with rows (first row f_e, r_e rows) on its own
// slice of the stacked weights w (E, OC, IC):
//   kForward  out_e (r_e, OC) = x_e (r_e, IC) . w_e^T           bf16 out, =
//   kInput    out_e (r_e, IC) = y_e (r_e, OC) . w_e             bf16 out, =
//   kWeight   dw_e (OC, IC) += y_e (r_e, OC)^T . x_e (r_e, IC)  fp32 out, +=
enum Product { kForward = 0, kInput = 1, kWeight = 2 };
const char* const kProductName[] = {"forward", "input gradient", "weight gradient"};

// The pointer arrays of a grouped call live in device memory (cuBLAS reads them there).
const void** group_pointers(CudaOps::State& st, size_t count) {
  if (count > st.group_ptrs_count) {
    CUDA_CHECK(cudaStreamSynchronize(st.stream));
    cudaFree(st.group_ptrs);
    st.group_ptrs = nullptr;
    CUDA_CHECK(cudaMalloc(&st.group_ptrs, count * sizeof(void*)));
    st.group_ptrs_count = count;
  }
  return st.group_ptrs;
}

// One cublasGemmGroupedBatchedEx over every expert with rows, in cuBLAS's column-major terms (a
// row-major (r, c) matrix is a column-major (c, r) one). False where cuBLAS refuses the call, so
// that the caller loops instead.
bool grouped_gemm(CudaOps::State& st, Product p, void* out, const bf16* x, const bf16* y, const bf16* w,
                  const int64_t* counts, int E, int IC, int OC) {
  if (!st.grouped_ok[p]) return false;
  if (!st.blas) {
    try {
      CUBLAS_CHECK(cublasCreate(&st.blas));
      CUBLAS_CHECK(cublasSetStream(st.blas, st.stream));
      const size_t ws = size_t(32) << 20;
      CUDA_CHECK(cudaMalloc(&st.blas_workspace, ws));
      CUBLAS_CHECK(cublasSetWorkspace(st.blas, st.blas_workspace, ws));
    } catch (const std::exception& e) {
      log::warn("moe: cuBLAS is not usable (", e.what(), "): the experts' GEMMs loop over the experts");
      std::fill(std::begin(st.grouped_ok), std::end(st.grouped_ok), false);
      return false;
    }
  }
  std::vector<cublasOperation_t> ta, tb;
  std::vector<int> m, n, k, lda, ldb, ldc, size;
  std::vector<float> alpha, beta;
  std::vector<const void*> a_ptr, b_ptr, c_ptr;
  int64_t first = 0;
  for (int e = 0; e < E; ++e) {
    const int r = static_cast<int>(counts[e]);
    const int64_t f = first;
    first += r;
    if (r == 0) continue;
    const bf16* we = w ? w + int64_t(e) * OC * IC : nullptr;
    switch (p) {
      case kForward:  // out^T (OC, r) = w_e (as (IC, OC), transposed) . x_e^T (IC, r)
        ta.push_back(CUBLAS_OP_T), tb.push_back(CUBLAS_OP_N), m.push_back(OC), n.push_back(r), k.push_back(IC);
        lda.push_back(IC), ldb.push_back(IC), ldc.push_back(OC), beta.push_back(0.0f);
        a_ptr.push_back(we), b_ptr.push_back(x + f * IC), c_ptr.push_back(static_cast<bf16*>(out) + f * OC);
        break;
      case kInput:  // out^T (IC, r) = w_e (as (IC, OC)) . y_e^T (OC, r)
        ta.push_back(CUBLAS_OP_N), tb.push_back(CUBLAS_OP_N), m.push_back(IC), n.push_back(r), k.push_back(OC);
        lda.push_back(IC), ldb.push_back(OC), ldc.push_back(IC), beta.push_back(0.0f);
        a_ptr.push_back(we), b_ptr.push_back(y + f * OC), c_ptr.push_back(static_cast<bf16*>(out) + f * IC);
        break;
      case kWeight:  // dw_e^T (IC, OC) += x_e^T (IC, r) . y_e (r, OC)
        ta.push_back(CUBLAS_OP_N), tb.push_back(CUBLAS_OP_T), m.push_back(IC), n.push_back(OC), k.push_back(r);
        lda.push_back(IC), ldb.push_back(OC), ldc.push_back(IC), beta.push_back(1.0f);
        a_ptr.push_back(x + f * IC), b_ptr.push_back(y + f * OC),
            c_ptr.push_back(static_cast<float*>(out) + int64_t(e) * OC * IC);
        break;
    }
    alpha.push_back(1.0f), size.push_back(1);
  }
  const int G = static_cast<int>(size.size());
  if (G == 0) return true;
  // cuBLAS's grouped kernels read 16-byte vectors and cannot see the pointers (they sit in device
  // memory), so each operand must be 16-byte aligned here: a tensor after an odd-sized one in the
  // flat parameters (a router bias of 4 experts) is not. Such a call loops (cuBLASLt is told each
  // pointer's alignment); later calls try the grouped kernel again.
  auto aligned = [](const std::vector<const void*>& ptrs) {
    return std::all_of(ptrs.begin(), ptrs.end(), [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; });
  };
  if (!aligned(a_ptr) || !aligned(b_ptr) || !aligned(c_ptr) || IC % 8 != 0 || OC % 8 != 0) {
    if (!st.misaligned_logged) {
      log::info("moe: an operand of the experts' ", kProductName[p], " is not 16-byte aligned: this call loops over "
                "the experts' GEMMs");
      st.misaligned_logged = true;
    }
    return false;
  }
  std::vector<const void*> all(a_ptr);
  all.insert(all.end(), b_ptr.begin(), b_ptr.end());
  all.insert(all.end(), c_ptr.begin(), c_ptr.end());
  const void** d = group_pointers(st, all.size());
  // From pageable memory: the copy has taken the host's bytes when it returns.
  CUDA_CHECK(cudaMemcpyAsync(d, all.data(), all.size() * sizeof(void*), cudaMemcpyHostToDevice, st.stream));
  const cublasStatus_t s = cublasGemmGroupedBatchedEx(
      st.blas, ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(), d, CUDA_R_16BF, lda.data(), d + G,
      CUDA_R_16BF, ldb.data(), beta.data(), const_cast<void* const*>(reinterpret_cast<const void* const*>(d + 2 * G)),
      p == kWeight ? CUDA_R_32F : CUDA_R_16BF, ldc.data(), G, size.data(), CUBLAS_COMPUTE_32F);
  if (s != CUBLAS_STATUS_SUCCESS) {
    // cuBLAS 13.1 refuses the weight gradient (bf16 operands into fp32 C: status 15, not
    // supported; seen on an H100, 2026-12-05) and takes the other two: an expected refusal, once
    // per op set.
    log::info("moe: cublasGemmGroupedBatchedEx refused the experts' ", kProductName[p], " (status ", int(s),
              "): it loops over the experts' GEMMs from now on");
    st.grouped_ok[p] = false;
    return false;
  }
  return true;
}

// The same products as a loop of the dense GEMMs (cuBLASLt), one per expert with rows: the
// fallback where the grouped call is refused. Its own Matmul takes the heuristic's first
// algorithm untimed: each step brings new row counts, which the tuned Matmul would time anew.
void looped_gemm(CudaOps::State& st, Product p, void* out, const bf16* x, const bf16* y, const bf16* w,
                 const int64_t* counts, int E, int IC, int OC) {
  if (!st.experts_mm) {
    st.experts_mm = std::make_unique<Matmul>();
    st.experts_mm->forget_shapes();
  }
  int64_t f = 0;
  for (int e = 0; e < E; ++e) {
    const int r = static_cast<int>(counts[e]);
    if (r > 0) {
      const bf16* we = w ? w + int64_t(e) * OC * IC : nullptr;
      if (p == kForward)
        st.experts_mm->forward(static_cast<bf16*>(out) + f * OC, x + f * IC, we, nullptr, r, IC, OC, st.stream);
      else if (p == kInput)
        st.experts_mm->backward_input(static_cast<bf16*>(out) + f * IC, y + f * OC, we, r, IC, OC, false, st.stream);
      else
        st.experts_mm->backward_weight(static_cast<float*>(out) + int64_t(e) * OC * IC, y + f * OC, x + f * IC, r, IC, OC,
                              st.stream);
    }
    f += r;
  }
}

void experts_gemm(CudaOps::State& st, Product p, void* out, const bf16* x, const bf16* y, const bf16* w,
                  const int64_t* counts, int E, int IC, int OC) {
  if (!grouped_gemm(st, p, out, x, y, w, counts, E, IC, OC)) looped_gemm(st, p, out, x, y, w, counts, E, IC, OC);
}

int64_t rows_of(const int64_t* counts, int E) {
  int64_t M = 0;
  for (int e = 0; e < E; ++e) M += counts[e];
  return M;
}

}  // namespace

void CudaOps::router_forward(float* logits, const Act* x, const Param* w, int N, int C, int E) const {
  OpScope op(*st_, "router_forward", N, C, E);
  st_->mm.forward_f32(logits, x, w, N, C, E, st_->stream);
}

void CudaOps::router_backward(Act* dx, float* dw, const float* dlogits, const Act* x, const Param* w, int N, int C,
                              int E) const {
  OpScope op(*st_, "router_backward", N, C, E);
  MYRIAD_CHECK(E <= cuda::router_backward_max_experts(), "router_backward: ", E, " experts, at most ",
               cuda::router_backward_max_experts(), " on CUDA");
  cuda::router_backward(dx, dw, dlogits, x, w, N, C, E, st_->stream);
}

namespace {
cuda::RouteArgs route_args(const Router& r) {
  return {r.experts, r.top_k, std::max(r.groups, 1), r.top_groups, r.score == RouterScore::kSoftmax, r.norm_topk,
          r.scale, r.aux_loss, r.z_loss};
}
// 16-byte aligned pieces of a device scratch of floats, in order.
struct DeviceCarve {
  float* base;
  size_t at = 0;  // floats
  template <class T>
  T* take(int64_t n) {
    T* p = reinterpret_cast<T*>(base + at);
    at += (static_cast<size_t>(std::max<int64_t>(n, 0)) * sizeof(T) + 15) / 16 * 4;
    return p;
  }
};
}  // namespace

Routing CudaOps::route(const Router& r, int32_t* choice, float* weights, int32_t* order, int32_t* pos,
                       const float* logits, const Param* bias, int N) const {
  OpScope op(*st_, "route", N, r.experts, r.top_k);
  const int E = r.experts;
  const int64_t NE = int64_t(N) * E, M = int64_t(N) * r.top_k;
  const cuda::RouteArgs args = route_args(r);
  if (r.capacity_factor <= 0 && cuda::route_on_device(args)) {
    // On the device; only the counts and the sums come up (the grouped GEMMs' shapes, the losses).
    const size_t floats = (NE * 4 + 15) / 16 * 4 + (N * 8 + 15) / 16 * 4 + (E * 4 + 15) / 16 * 4 + ((E + 1) * 8 + 15) / 16 * 4;
    DeviceCarve d{scratch(floats)};
    float* scores = d.take<float>(NE);
    double* lse2 = d.take<double>(N);
    int* counts = d.take<int>(E);
    double* sums = d.take<double>(E + 1);
    cuda::route_tokens(choice, weights, order, pos, counts, sums, scores, lse2, logits, bias, args, N, st_->stream);
    Carve c{stage(*st_, staged_bytes({E * 4, (E + 1) * 8}))};
    int* h_counts = c.take<int>(E);
    double* h_sums = c.take<double>(E + 1);
    CUDA_CHECK(cudaMemcpyAsync(h_counts, counts, E * 4, cudaMemcpyDeviceToHost, st_->stream));
    CUDA_CHECK(cudaMemcpyAsync(h_sums, sums, (E + 1) * 8, cudaMemcpyDeviceToHost, st_->stream));
    CUDA_CHECK(cudaStreamSynchronize(st_->stream));
    Routing out;
    out.counts.assign(h_counts, h_counts + E);
    out.score_sums.assign(h_sums, h_sums + E);
    // The oracle's formulas on these sums (ops/cpu/moe.cc).
    for (int e = 0; e < E; ++e)
      out.aux += double(E) * (double(out.counts[e]) / (double(N) * r.top_k)) * (out.score_sums[e] / N);
    out.z = h_sums[E] / N;
    return out;
  }
  // With a capacity (its drops rank each expert's slots by weight), on the host: the oracle's code.
  Carve c{stage(*st_, staged_bytes({NE * 4, E * 4, E * 2, M * 4, M * 4, M * 4, M * 4}))};
  float* h_logits = c.take<float>(NE);
  float* h_bias = c.take<float>(E);
  bf16* h_bias16 = c.take<bf16>(E);
  int32_t* h_choice = c.take<int32_t>(M);
  float* h_weights = c.take<float>(M);
  int32_t* h_order = c.take<int32_t>(M);
  int32_t* h_pos = c.take<int32_t>(M);
  CUDA_CHECK(cudaMemcpyAsync(h_logits, logits, NE * 4, cudaMemcpyDeviceToHost, st_->stream));
  if (bias) CUDA_CHECK(cudaMemcpyAsync(h_bias16, bias, E * 2, cudaMemcpyDeviceToHost, st_->stream));
  CUDA_CHECK(cudaStreamSynchronize(st_->stream));
  if (bias)
    for (int e = 0; e < E; ++e) h_bias[e] = __bfloat162float(h_bias16[e]);
  Routing out = st_->host.route(r, h_choice, h_weights, h_order, h_pos, h_logits, bias ? h_bias : nullptr, N);
  const int64_t kept = rows_of(out.counts.data(), E);
  CUDA_CHECK(cudaMemcpyAsync(choice, h_choice, M * 4, cudaMemcpyHostToDevice, st_->stream));
  CUDA_CHECK(cudaMemcpyAsync(weights, h_weights, M * 4, cudaMemcpyHostToDevice, st_->stream));
  if (kept > 0) CUDA_CHECK(cudaMemcpyAsync(order, h_order, kept * 4, cudaMemcpyHostToDevice, st_->stream));
  CUDA_CHECK(cudaMemcpyAsync(pos, h_pos, M * 4, cudaMemcpyHostToDevice, st_->stream));
  return out;
}

void CudaOps::route_backward(const Router& r, float* dlogits, const float* dweights, const float* logits,
                             const int32_t* choice, float grad_scale, int N, RouteTotals totals) const {
  OpScope op(*st_, "route_backward", N, r.experts, r.top_k);
  const int64_t NE = int64_t(N) * r.experts;
  DeviceCarve d{scratch((NE * 4 + 15) / 16 * 4 + (r.experts * 4 + 15) / 16 * 4)};
  float* scores = d.take<float>(NE);
  int* counts = d.take<int>(r.experts);
  cuda::route_backward(dlogits, scores, counts, dweights, logits, choice, totals.chosen,
                       totals.chosen ? double(totals.tokens) : double(N), grad_scale, route_args(r), N, st_->stream);
}

void CudaOps::gather_rows(Act* xs, const Act* x, const int32_t* order, int M, int k, int C) const {
  OpScope op(*st_, "gather_rows", M, C);
  cuda::gather_rows(xs, x, order, M, k, C, st_->stream);
}

void CudaOps::gather_rows_backward(Act* dx, const Act* dxs, const int32_t* pos, int N, int k, int C) const {
  OpScope op(*st_, "gather_rows_backward", N, k, C);
  cuda::gather_rows_backward(dx, dxs, pos, N, k, C, st_->stream);
}

void CudaOps::grouped_linear_act_forward(Mlp m, Act* out, Act* pre, const Act* inp, const Param* w,
                                         const int64_t* counts, int E, int IC, int F) const {
  OpScope op(*st_, "grouped_linear_act_forward", E, IC, F);
  const int64_t M = rows_of(counts, E);
  experts_gemm(*st_, kForward, pre, inp, nullptr, w, counts, E, IC, F * pre_width(m));
  if (m == Mlp::kSwiGlu)
    cuda::swiglu_forward(out, pre, M, F, st_->stream);
  else
    cuda::gelu_forward(out, pre, M * F, st_->stream);
}

void CudaOps::grouped_linear_forward(Act* out, const Act* inp, const Param* w, const int64_t* counts, int E, int IC,
                                     int OC) const {
  OpScope op(*st_, "grouped_linear_forward", E, IC, OC);
  experts_gemm(*st_, kForward, out, inp, nullptr, w, counts, E, IC, OC);
}

void CudaOps::grouped_linear_backward(Mlp m, Act* dinp, float* dw, const Act* dout, const Act* inp, const Param* w,
                                      const Act* pre, const int64_t* counts, int E, int IC, int OC) const {
  OpScope op(*st_, "grouped_linear_backward", E, IC, OC);
  const int64_t M = rows_of(counts, E);
  if (pre) {  // the activation's output gradient (M, IC) in scratch, then through the activation into dinp
    Act* dact = reinterpret_cast<Act*>(scratch(static_cast<size_t>((M * IC + 1) / 2 + 1)));
    experts_gemm(*st_, kInput, dact, nullptr, dout, w, counts, E, IC, OC);
    if (m == Mlp::kSwiGlu)
      cuda::swiglu_backward(dinp, pre, dact, M, IC, st_->stream);
    else
      cuda::gelu_backward(dinp, pre, dact, M * IC, st_->stream);
  } else {
    experts_gemm(*st_, kInput, dinp, nullptr, dout, w, counts, E, IC, OC);
  }
  experts_gemm(*st_, kWeight, dw, inp, dout, nullptr, counts, E, IC, OC);
}

void CudaOps::combine_forward(Act* out, const Act* ys, const float* weights, const int32_t* pos, int N, int k, int C,
                              bool accumulate) const {
  OpScope op(*st_, "combine_forward", N, k, C);
  cuda::combine_forward(out, ys, weights, pos, N, k, C, accumulate, st_->stream);
}

void CudaOps::combine_backward(Act* dys, float* dweights, const Act* dout, const Act* ys, const float* weights,
                               const int32_t* pos, int N, int k, int C) const {
  OpScope op(*st_, "combine_backward", N, k, C);
  cuda::combine_backward(dys, dweights, dout, ys, weights, pos, N, k, C, st_->stream);
}

}  // namespace myriad::cuda
