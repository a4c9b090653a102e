#include "model/cuda/gpt_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include <cublas_api.h>

#include "model/cuda/cuda_check.h"
#include "model/cuda/cuda_ops.h"
#include "model/cuda/matmul.h"
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

namespace {

using cuda::bf16;

// The driver must be at least as new as the runtime we were built with, and cuBLASLt at least
// the major version we compiled against; say which and what to do rather than fail obscurely.
void check_versions() {
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
}

// Clipping coefficient from the squared global norm, on the device (no host round trip).
__global__ void clip_scale_kernel(float* scale, const float* sumsq, float max_norm) {
  const float norm = sqrtf(*sumsq);
  *scale = (max_norm > 0 && max_norm / (norm + 1e-6f) < 1.0f) ? max_norm / (norm + 1e-6f) : 1.0f;
}

// train.recompute: which activations backward recomputes instead of keeping (see carve_layers).
enum class Recompute { kNone, kSelective, kFull };

Recompute parse_recompute(const std::string& mode) {
  if (mode == "none") return Recompute::kNone;
  if (mode == "selective") return Recompute::kSelective;
  if (mode == "full") return Recompute::kFull;
  throw_input("config: train.recompute = \"", mode, "\" is not one of: none, selective, full");
}

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
  return buf;
}

// One cudaMalloc for everything, carved in order: the memory plan is fixed at start. The same
// carving code runs twice: first to measure (take() returns null and counts), then for real.
class Arena {
 public:
  // The plan is fixed at start, so a plan that does not fit is an input error, never a retry.
  void allocate() {
    if (cudaMalloc(&base_, used_) != cudaSuccess) {
      (void)cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw_input("GPU memory: the plan needs ", used_ >> 20, " MiB (weights, gradients, moments "
                  "and activations) but ", free_b >> 20, " MiB of ", total_b >> 20,
                  " MiB are free: lower train.micro_batch, set train.recompute = \"full\", or "
                  "split the model (parallel.tp, parallel.pp)");
    }
    size_ = used_, used_ = 0;
    // Debug knob: fill with NaNs, so that any read of memory nothing wrote shows up.
    if (std::getenv("MYRIAD_CUDA_POISON")) CUDA_CHECK(cudaMemset(base_, 0xFF, size_));
  }
  template <class T>
  T* take(size_t count) {
    T* p = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += (count * sizeof(T) + 255) & ~size_t(255);
    MYRIAD_CHECK(!base_ || used_ <= size_, "arena overflow");
    return p;
  }
  size_t size() const { return base_ ? size_ : used_; }
  size_t used() const { return used_; }  // bytes carved so far in this pass
  ~Arena() { cudaFree(base_); }

 private:
  char* base_ = nullptr;
  size_t size_ = 0, used_ = 0;
};

class GptCuda final : public Engine {
 public:
  explicit GptCuda(const Config& cfg);
  ~GptCuda() override;

  const ParamLayout& layout() const override { return layout_; }
  std::string device() const override { return cat("cuda:", device_, " ", prop_.name); }
  double peak_flops() const override { return cuda::peak_bf16_flops(prop_); }
  StepResult train_step(const int32_t* tokens, int64_t step, double lr) override;
  float loss(const int32_t* tokens, int B) override;
  void last_logits(const int32_t* tokens, int B, int T, float* out) override;
  double flops_per_token() const override;
  int64_t peak_memory() const override { return static_cast<int64_t>(arena_.size()) + (32 << 20); }
  HostState host_state() override {
    return {h_params_.data(), h_m_.data(), h_v_.data(), &steps_taken_, {{0, layout_.total()}}};
  }
  void state_to_host() override;
  void state_from_host() override;

 private:
  struct Layer {  // pointers into a flat buffer; null where the tensor is absent
    int64_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
  };
  struct Acts {  // what layer l's backward reads, for a micro-batch (where each lives: carve_layers)
    bf16 *in, *ln1, *qkv, *atty, *mid, *ln2, *fc, *gelu;  // (B,T,C) (B,T,C) (B,T,3C) (B,T,C) x3 (B,T,4C) x2
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse;  // (B,T) x4, (B,H,T)
  };
  template <class T>
  T* at(T* base, int64_t offset) const { return offset < 0 ? nullptr : base + offset; }
  // Uploads the inputs and targets of `micro` micro-batches of tokens (B, T+1 or T) (rows
  // `stride` apart), and, for training, the embedding backward's groups of each.
  void stage(const int32_t* tokens, int micro, int B, int T, int64_t stride, bool groups);
  // Ints per micro-batch of the embedding backward's groups: positions (N), starts (G+1) and
  // ids (G) for G <= N distinct tokens, N = maxB x maxT. (Sized 2N + 1 before, the ids of a
  // batch with more than N/2 distinct tokens ran past it: rows of garbage ids, often 0, got
  // gradient, differently each run.)
  int64_t group_slot() const { return 3 * int64_t(maxB_) * maxT_ + 1; }
  void carve();
  size_t carve_layers(Arena& arena, Recompute mode);  // returns the bytes it took
  void forward(int micro, int B, int T);
  void layer_forward(int l, int B, int T);
  void recompute(int l, int B, int T);
  void backward(int micro, int B, int T);
  const bf16* mlp_in(const Acts& a) const { return parallel_block_ ? a.ln1 : a.ln2; }

  Config cfg_;
  ParamLayout layout_;
  int device_ = 0;
  cudaDeviceProp prop_{};
  int L_, C_, H_, maxT_, maxB_, V_, Vp_, window_;
  bool parallel_block_;
  Recompute recompute_;
  size_t layer_bytes_ = 0;  // the layers' activations in the arena (carve_layers)
  cudaStream_t stream_ = nullptr;
  // The phase timers: events around each micro-batch's forward (loss included) and backward,
  // and the update, read after the step's one synchronization (the loss copy), never with a
  // sync of their own. marks_[2i], [2i+1], [2i+2]: forward i starts, ends (backward i
  // starts), backward i ends; marks_.back(): the update ends.
  std::vector<cudaEvent_t> marks_;
  cuda::Matmul mm_;
  Arena arena_;

  int64_t wte_, wpe_, lnf_w_, lnf_b_;
  std::vector<Layer> layers_;

  // Device state, flat in the canonical layout.
  float *master_, *grads_, *m_, *v_;  // (P) fp32
  bf16* params_;                      // (P) bf16 copy used by the kernels
  int64_t* segments_;                 // (tensors + 1) tensor offsets
  uint8_t* decay_;                    // (tensors)
  float *update_, *opt_scratch_;      // LAMB's update (P) and scratch
  float *sumsq_, *clip_scale_;        // (1), (1)
  int64_t* whole_;                    // (2) {0, P}: all gradients as one segment
  float* red_scratch_;                // norm / bias / layernorm reductions

  // Activations and their gradients for one micro-batch (maxB, maxT).
  std::vector<Acts> acts_;  // (L); with recompute, some pointers are shared by every layer
  bf16 *out_, *lnf_, *logits_;         // (B,T,C) (B,T,C) (B,T,Vp)
  float *lnf_mean_, *lnf_rstd_, *losses_;  // (B,T) x2, (accum, B*T) losses of the step's micro-batches
  bf16 *tmp_, *tmp2_, *dresid_, *dln_, *datty_, *dqkv_, *dfc_;  // (B,T,C) x5 (B,T,3C) (B,T,4C)
  float* attn_scratch_;
  // Per micro-batch of the step: inputs (B*T), targets (B*T), groups (2*B*T+1: positions,
  // starts, ids of the token groups).
  int32_t *inputs_, *targets_, *groups_;

  // Pinned host staging.
  int32_t *h_inputs_ = nullptr, *h_targets_ = nullptr, *h_groups_ = nullptr;
  std::vector<int> num_groups_;  // per micro-batch
  float* h_losses_ = nullptr;
  std::vector<float> h_params_, h_m_, h_v_;
  int64_t steps_taken_ = 0;
};

GptCuda::GptCuda(const Config& cfg)
    : cfg_(cfg),
      layout_(cfg),
      L_(cfg.model.layers),
      C_(cfg.model.d_model),
      H_(cfg.model.heads),
      maxT_(cfg.model.seq_len),
      maxB_(cfg.train.micro_batch),
      V_(cfg.model.vocab_size),
      Vp_(cfg.padded_vocab()),
      window_(cfg.model.window),
      parallel_block_(cfg.model.parallel_block),
      recompute_(parse_recompute(cfg.train.recompute)) {
  check_versions();
  CUDA_CHECK(cudaGetDevice(&device_));
  CUDA_CHECK(cudaGetDeviceProperties(&prop_, device_));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  const int D = C_ / H_;
  if (D != 64 && D != 80 && D != 128)
    throw_input("config: head size model.d_model / model.heads = ", D,
                " is not supported by the CUDA attention (64, 80 or 128); use train.device = cpu");
  if (C_ % 8 != 0) throw_input("config: model.d_model must be a multiple of 8 on CUDA, got ", C_);

  auto off = [&](const std::string& name) -> int64_t {
    const ParamSpec* p = layout_.get(name);
    return p ? p->offset : -1;
  };
  wte_ = off("wte"), wpe_ = off("wpe"), lnf_w_ = off("lnf.w"), lnf_b_ = off("lnf.b");
  for (int l = 0; l < L_; ++l) {
    std::string h = "h." + std::to_string(l) + ".";
    layers_.push_back({off(h + "ln1.w"), off(h + "ln1.b"), off(h + "attn.qkv.w"), off(h + "attn.qkv.b"),
                       off(h + "attn.proj.w"), off(h + "attn.proj.b"), off(h + "ln2.w"), off(h + "ln2.b"),
                       off(h + "mlp.fc.w"), off(h + "mlp.fc.b"), off(h + "mlp.proj.w"), off(h + "mlp.proj.b")});
  }

  Arena probe;  // what the layers would take without recomputation, for the log line
  const size_t stored_bytes = carve_layers(probe, Recompute::kNone);
  carve();  // measure
  arena_.allocate();
  carve();
  log::info("CUDA engine: train.recompute = ", cfg.train.recompute, ": layer activations ",
            mib(layer_bytes_), " (", mib(stored_bytes), " when all are kept), device arena ",
            mib(arena_.size()));
  num_groups_.assign(cfg.accum_steps(1), 0);
  marks_.resize(2 * cfg.accum_steps(1) + 2);
  for (cudaEvent_t& e : marks_) CUDA_CHECK(cudaEventCreate(&e));

  const int64_t P = layout_.total(), BT = int64_t(maxB_) * maxT_;
  const int64_t accum = cfg.accum_steps(1);
  CUDA_CHECK(cudaMallocHost(&h_inputs_, accum * BT * 4));
  CUDA_CHECK(cudaMallocHost(&h_targets_, accum * BT * 4));
  CUDA_CHECK(cudaMallocHost(&h_groups_, accum * group_slot() * 4));
  CUDA_CHECK(cudaMallocHost(&h_losses_, accum * BT * 4));

  // Parameters: initialized on the host (layout-independent counter-based init), then uploaded.
  h_params_.assign(P, 0.0f), h_m_.assign(P, 0.0f), h_v_.assign(P, 0.0f);
  init_params(h_params_.data(), layout_, cfg.model.seed);
  std::vector<int64_t> seg;
  std::vector<uint8_t> dec;
  for (const ParamSpec& p : layout_.tensors()) seg.push_back(p.offset), dec.push_back(p.decay);
  seg.push_back(P);
  CUDA_CHECK(cudaMemcpy(segments_, seg.data(), seg.size() * 8, cudaMemcpyHostToDevice));
  const int64_t whole[2] = {0, P};
  CUDA_CHECK(cudaMemcpy(whole_, whole, sizeof whole, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(decay_, dec.data(), dec.size(), cudaMemcpyHostToDevice));
  state_from_host();
}

// The memory plan: every device buffer, in one arena.
void GptCuda::carve() {
  const int64_t P = layout_.total(), BT = int64_t(maxB_) * maxT_, C = C_;
  const int count = static_cast<int>(layout_.tensors().size());
  const int64_t accum = cfg_.accum_steps(1);
  const int D = C_ / H_;
  const size_t red = std::max({cuda::sumsq_scratch_floats(P, count), cuda::bias_scratch_floats(BT, 4 * C),
                               cuda::layernorm_scratch_floats(BT, C), cuda::bias_scratch_floats(BT, Vp_)});
  master_ = arena_.take<float>(P), grads_ = arena_.take<float>(P);
  m_ = arena_.take<float>(P), v_ = arena_.take<float>(P);
  params_ = arena_.take<bf16>(P);
  segments_ = arena_.take<int64_t>(count + 1);
  decay_ = arena_.take<uint8_t>(count);
  if (cfg_.optim.name == "lamb") {
    update_ = arena_.take<float>(P);
    opt_scratch_ = arena_.take<float>(cuda::lamb_scratch_floats(P, count));
  }
  sumsq_ = arena_.take<float>(1), clip_scale_ = arena_.take<float>(1);
  whole_ = arena_.take<int64_t>(2);
  red_scratch_ = arena_.take<float>(red);
  layer_bytes_ = carve_layers(arena_, recompute_);
  out_ = arena_.take<bf16>(BT * C), lnf_ = arena_.take<bf16>(BT * C);
  logits_ = arena_.take<bf16>(BT * Vp_);
  lnf_mean_ = arena_.take<float>(BT), lnf_rstd_ = arena_.take<float>(BT);
  losses_ = arena_.take<float>(accum * BT);
  tmp_ = arena_.take<bf16>(BT * C), tmp2_ = arena_.take<bf16>(BT * C), dresid_ = arena_.take<bf16>(BT * C);
  dln_ = arena_.take<bf16>(BT * C), datty_ = arena_.take<bf16>(BT * C);
  dqkv_ = arena_.take<bf16>(BT * 3 * C), dfc_ = arena_.take<bf16>(BT * 4 * C);
  attn_scratch_ = arena_.take<float>(cuda::attention_scratch_floats(maxB_, maxT_, H_, D));
  inputs_ = arena_.take<int32_t>(accum * BT), targets_ = arena_.take<int32_t>(accum * BT);
  groups_ = arena_.take<int32_t>(accum * group_slot());
}

// The layers' activations of one micro-batch, N = maxB x maxT tokens: what layer l's backward
// reads, and where acts_[l] finds it in each train.recompute mode ("layer": a buffer of its own;
// "shared": one buffer for all layers, refilled by recompute(l) just before layer l's backward):
//
//   tensor                                   shape            none    selective  full
//   in (the residual stream entering l)      (N,C)   bf16     layer   layer      layer
//   ln1; its mean, rstd                      (N,C); (N) x2    layer   layer      shared
//   qkv                                      (N,3C)  bf16     layer   layer      shared
//   atty (attention output); lse             (N,C); (B,H,T)   layer   layer      shared
//   mid = in + attn; ln2; its mean, rstd *   (N,C) x2; (N) x2 layer   layer      shared
//   fc (pre-GELU), gelu                      (N,4C) x2 bf16   layer   shared     shared
//   (* sequential block only; the parallel block's MLP reads ln1)
//
// Bytes per token and layer (C = d_model, H = heads): none 32C + 16 + 4H (28C + 8 + 4H in the
// parallel block); selective 16C + 16 + 4H (12C + 8 + 4H) plus one shared 16C; full 2C plus
// one shared set of 30C + 16 + 4H (26C + 8 + 4H). Selective recomputes the fc GEMM (with its
// GELU) from the kept MLP input; full recomputes LN1 from `in` and the layer up to the GELU.
size_t GptCuda::carve_layers(Arena& arena, Recompute mode) {
  const int64_t BT = int64_t(maxB_) * maxT_, C = C_;
  const bool seq = !parallel_block_;
  const size_t start = arena.used();
  // Everything but `in`; fc and gelu only when `mlp`.
  auto take_set = [&](Acts& a, bool mlp) {
    a.ln1 = arena.take<bf16>(BT * C);
    a.atty = arena.take<bf16>(BT * C);
    a.mid = seq ? arena.take<bf16>(BT * C) : nullptr;
    a.ln2 = seq ? arena.take<bf16>(BT * C) : nullptr;
    a.qkv = arena.take<bf16>(BT * 3 * C);
    if (mlp) a.fc = arena.take<bf16>(BT * 4 * C), a.gelu = arena.take<bf16>(BT * 4 * C);
    a.ln1_mean = arena.take<float>(BT), a.ln1_rstd = arena.take<float>(BT);
    a.ln2_mean = seq ? arena.take<float>(BT) : nullptr;
    a.ln2_rstd = seq ? arena.take<float>(BT) : nullptr;
    a.lse = arena.take<float>(int64_t(maxB_) * H_ * maxT_);
  };
  Acts shared{};  // the buffers every layer uses in turn
  if (mode == Recompute::kFull) take_set(shared, true);
  if (mode == Recompute::kSelective)
    shared.fc = arena.take<bf16>(BT * 4 * C), shared.gelu = arena.take<bf16>(BT * 4 * C);
  acts_.assign(L_, shared);
  for (Acts& a : acts_) {
    a.in = arena.take<bf16>(BT * C);
    if (mode != Recompute::kFull) take_set(a, /*mlp=*/mode == Recompute::kNone);
  }
  return arena.used() - start;
}

GptCuda::~GptCuda() {
  cudaStreamSynchronize(stream_);
  for (cudaEvent_t e : marks_) cudaEventDestroy(e);
  cudaFreeHost(h_inputs_), cudaFreeHost(h_targets_), cudaFreeHost(h_groups_), cudaFreeHost(h_losses_);
  cudaStreamDestroy(stream_);
}

void GptCuda::state_from_host() {
  const int64_t P = layout_.total();
  CUDA_CHECK(cudaMemcpyAsync(master_, h_params_.data(), P * 4, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaMemcpyAsync(m_, h_m_.data(), P * 4, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaMemcpyAsync(v_, h_v_.data(), P * 4, cudaMemcpyHostToDevice, stream_));
  cuda::cast_to_bf16(params_, master_, P, stream_);
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void GptCuda::state_to_host() {
  const int64_t P = layout_.total();
  CUDA_CHECK(cudaMemcpyAsync(h_params_.data(), master_, P * 4, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaMemcpyAsync(h_m_.data(), m_, P * 4, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaMemcpyAsync(h_v_.data(), v_, P * 4, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

double GptCuda::flops_per_token() const {
  const double t_att = window_ > 0 ? std::min(window_, maxT_) : maxT_;
  return 6.0 * layout_.matmul_params() + 12.0 * L_ * C_ * t_att;
}

void GptCuda::stage(const int32_t* tokens, int micro, int B, int T, int64_t stride, bool groups) {
  const int N = B * T, BT = maxB_ * maxT_;
  for (int i = 0; i < micro; ++i)
    for (int b = 0; b < B; ++b) {
      const int32_t* row = tokens + (int64_t(i) * B + b) * stride;
      std::memcpy(h_inputs_ + int64_t(i) * BT + b * T, row, T * 4);
      if (stride > T) std::memcpy(h_targets_ + int64_t(i) * BT + b * T, row + 1, T * 4);
    }
  CUDA_CHECK(cudaMemcpyAsync(inputs_, h_inputs_, int64_t(micro) * BT * 4, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaMemcpyAsync(targets_, h_targets_, int64_t(micro) * BT * 4, cudaMemcpyHostToDevice, stream_));
  if (!groups) return;
  // Positions grouped by token id (a counting sort) for a deterministic embedding backward:
  // [positions (N)] [starts (G+1)] [ids (G)] in each micro-batch's slot.
  for (int i = 0; i < micro; ++i)
    num_groups_[i] = cuda::group_positions_by_token(h_inputs_ + int64_t(i) * BT, N, Vp_,
                                                    h_groups_ + int64_t(i) * group_slot());
  CUDA_CHECK(cudaMemcpyAsync(groups_, h_groups_, int64_t(micro) * group_slot() * 4,
                             cudaMemcpyHostToDevice, stream_));
}

void GptCuda::forward(int micro, int B, int T) {
  const int C = C_, N = B * T;
  cudaStream_t s = stream_;
  const bf16* p = params_;
  const int32_t* inputs = inputs_ + int64_t(micro) * maxB_ * maxT_;
  cuda::embedding_forward(acts_[0].in, inputs, at(p, wte_), at(p, wpe_), B, T, C, s);
  cuda::layernorm_forward(acts_[0].ln1, acts_[0].ln1_mean, acts_[0].ln1_rstd, acts_[0].in,
                          at(p, layers_[0].ln1_w), at(p, layers_[0].ln1_b), N, C, s);
  for (int l = 0; l < L_; ++l) {
    Acts& a = acts_[l];
    const Layer& w = layers_[l];
    layer_forward(l, B, T);
    mm_.forward(tmp2_, a.gelu, at(p, w.fcproj_w), at(p, w.fcproj_b), N, 4 * C, C, s);
    // next = (mid, or in + attn) + mlp, with the next norm (LN1 of layer l+1, or LNf) fused.
    const bf16* base = a.mid;
    if (parallel_block_) {
      mm_.forward(tmp_, a.atty, at(p, w.proj_w), at(p, w.proj_b), N, C, C, s);
      cuda::add(tmp2_, tmp2_, tmp_, int64_t(N) * C, s);
      base = a.in;
    }
    const bool last = l + 1 == L_;
    bf16* next = last ? out_ : acts_[l + 1].in;
    bf16* next_ln = last ? lnf_ : acts_[l + 1].ln1;
    float* next_mean = last ? lnf_mean_ : acts_[l + 1].ln1_mean;
    float* next_rstd = last ? lnf_rstd_ : acts_[l + 1].ln1_rstd;
    const bf16* nw = last ? at(p, lnf_w_) : at(p, layers_[l + 1].ln1_w);
    const bf16* nb = last ? at(p, lnf_b_) : at(p, layers_[l + 1].ln1_b);
    cuda::residual_layernorm_forward(next, next_ln, next_mean, next_rstd, base, tmp2_, nw, nb, N, C, s);
  }
  mm_.forward(logits_, lnf_, at(p, wte_), nullptr, N, C, Vp_, s);
}

// Layer l from its LN1 output up to the MLP's GELU: every activation its backward reads (the
// MLP's projection and the residual add that follow only make layer l+1's input). The parallel
// block's attention projection is left to forward(): only that add reads it.
void GptCuda::layer_forward(int l, int B, int T) {
  const int C = C_, N = B * T, D = C_ / H_;
  cudaStream_t s = stream_;
  const bf16* p = params_;
  Acts& a = acts_[l];
  const Layer& w = layers_[l];
  mm_.forward(a.qkv, a.ln1, at(p, w.qkv_w), at(p, w.qkv_b), N, C, 3 * C, s);
  cuda::attention_forward(a.atty, a.lse, a.qkv, B, T, H_, D, window_, s);
  if (!parallel_block_) {  // mid = in + attn; ln2 = LN2(mid)
    mm_.forward(tmp_, a.atty, at(p, w.proj_w), at(p, w.proj_b), N, C, C, s);
    cuda::residual_layernorm_forward(a.mid, a.ln2, a.ln2_mean, a.ln2_rstd, a.in, tmp_,
                                     at(p, w.ln2_w), at(p, w.ln2_b), N, C, s);
  }
  mm_.forward_gelu(a.gelu, a.fc, mlp_in(a), at(p, w.fc_w), at(p, w.fc_b), N, C, 4 * C, s);
}

// Refills the shared buffers (carve_layers) with layer l's activations before its backward,
// with the forward's kernels on the forward's inputs, so they are bitwise what the forward
// computed (LN1's output too: the fused residual + norm that made it in the forward rounds the
// residual to bf16 before its statistics, exactly what layernorm_forward reads back from `in`).
// The last layer's are still there: backward runs right after its micro-batch's forward.
void GptCuda::recompute(int l, int B, int T) {
  if (recompute_ == Recompute::kNone || l == L_ - 1) return;
  const int C = C_, N = B * T;
  const bf16* p = params_;
  Acts& a = acts_[l];
  const Layer& w = layers_[l];
  if (recompute_ == Recompute::kSelective) {
    mm_.forward_gelu(a.gelu, a.fc, mlp_in(a), at(p, w.fc_w), at(p, w.fc_b), N, C, 4 * C, stream_);
    return;
  }
  cuda::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.in, at(p, w.ln1_w), at(p, w.ln1_b), N,
                          C, stream_);
  layer_forward(l, B, T);
}

void GptCuda::backward(int micro, int B, int T) {
  const int C = C_, N = B * T, D = C_ / H_;
  const int64_t NC = int64_t(N) * C;
  cudaStream_t s = stream_;
  const bf16* p = params_;
  float* g = grads_;
  // logits now hold dlogits (crossentropy ran in place).
  mm_.backward_input(dln_, logits_, at(p, wte_), N, C, Vp_, false, s);
  mm_.backward_weight(at(g, wte_), logits_, lnf_, N, C, Vp_, s);
  CUDA_CHECK(cudaMemsetAsync(dresid_, 0, NC * 2, s));
  cuda::layernorm_backward(dresid_, at(g, lnf_w_), at(g, lnf_b_), red_scratch_, dln_, out_,
                           at(p, lnf_w_), lnf_mean_, lnf_rstd_, N, C, s);
  for (int l = L_ - 1; l >= 0; --l) {
    recompute(l, B, T);  // train.recompute: refill what this layer dropped
    Acts& a = acts_[l];
    const Layer& w = layers_[l];
    // MLP branch: its output gradient is dresid.
    mm_.backward_input_dgelu(dfc_, dresid_, at(p, w.fcproj_w), a.fc, N, 4 * C, C, s);
    mm_.backward_weight(at(g, w.fcproj_w), dresid_, a.gelu, N, 4 * C, C, s);
    if (w.fcproj_b >= 0) cuda::bias_backward(at(g, w.fcproj_b), red_scratch_, dresid_, N, C, s);
    mm_.backward_input(dln_, dfc_, at(p, w.fc_w), N, C, 4 * C, false, s);
    mm_.backward_weight(at(g, w.fc_w), dfc_, mlp_in(a), N, C, 4 * C, s);
    if (w.fc_b >= 0) cuda::bias_backward(at(g, w.fc_b), red_scratch_, dfc_, N, 4 * C, s);
    if (!parallel_block_)  // dresid becomes the gradient at mid
      cuda::layernorm_backward(dresid_, at(g, w.ln2_w), at(g, w.ln2_b), red_scratch_, dln_, a.mid,
                               at(p, w.ln2_w), a.ln2_mean, a.ln2_rstd, N, C, s);
    // Attention branch; in the parallel block dln_ keeps the MLP's share of LN1's gradient.
    mm_.backward_input(datty_, dresid_, at(p, w.proj_w), N, C, C, false, s);
    mm_.backward_weight(at(g, w.proj_w), dresid_, a.atty, N, C, C, s);
    if (w.proj_b >= 0) cuda::bias_backward(at(g, w.proj_b), red_scratch_, dresid_, N, C, s);
    cuda::attention_backward(dqkv_, attn_scratch_, datty_, a.atty, a.qkv, a.lse, B, T, H_, D, window_, s);
    mm_.backward_input(dln_, dqkv_, at(p, w.qkv_w), N, C, 3 * C, parallel_block_, s);
    mm_.backward_weight(at(g, w.qkv_w), dqkv_, a.ln1, N, C, 3 * C, s);
    if (w.qkv_b >= 0) cuda::bias_backward(at(g, w.qkv_b), red_scratch_, dqkv_, N, 3 * C, s);
    cuda::layernorm_backward(dresid_, at(g, w.ln1_w), at(g, w.ln1_b), red_scratch_, dln_, a.in,
                             at(p, w.ln1_w), a.ln1_mean, a.ln1_rstd, N, C, s);
  }
  const int32_t* positions = groups_ + int64_t(micro) * group_slot();
  const int32_t* starts = positions + N;
  const int32_t* ids = starts + num_groups_[micro] + 1;
  cuda::embedding_backward(at(g, wte_), at(g, wpe_), dresid_, positions, starts, ids,
                           num_groups_[micro], B, T, C, s);
}

StepResult GptCuda::train_step(const int32_t* tokens, int64_t step, double lr) {
  const int B = maxB_, T = maxT_, N = B * T;
  const int64_t accum = cfg_.accum_steps(1), P = layout_.total();
  const int count = static_cast<int>(layout_.tensors().size());
  cudaStream_t s = stream_;
  stage(tokens, static_cast<int>(accum), B, T, T + 1, /*groups=*/true);
  CUDA_CHECK(cudaMemsetAsync(grads_, 0, P * 4, s));
  for (int i = 0; i < accum; ++i) {
    CUDA_CHECK(cudaEventRecord(marks_[2 * i], s));
    forward(i, B, T);
    cuda::crossentropy(losses_ + int64_t(i) * N, logits_, targets_ + int64_t(i) * N,
                       1.0f / (accum * N), N, V_, Vp_, s);
    CUDA_CHECK(cudaEventRecord(marks_[2 * i + 1], s));
    backward(i, B, T);
  }
  CUDA_CHECK(cudaEventRecord(marks_[2 * accum], s));
  // Global-norm clipping, then the update, without leaving the device.
  cuda::segment_sum_squares(sumsq_, red_scratch_, grads_, whole_, 1, P, s);
  StepResult r;
  r.lr = lr;
  clip_scale_kernel<<<1, 1, 0, s>>>(clip_scale_, sumsq_, static_cast<float>(cfg_.optim.grad_clip));
  cuda::check_launch("clip_scale");
  cuda::scale_inplace(grads_, clip_scale_, P, s);
  ++steps_taken_;
  const OptimConfig& o = cfg_.optim;
  cuda::AdamParams ap{static_cast<float>(r.lr), float(o.beta1), float(o.beta2), float(o.eps),
                      float(o.weight_decay), float(1 - std::pow(o.beta1, steps_taken_)),
                      float(1 - std::pow(o.beta2, steps_taken_))};
  if (o.name == "lamb")
    cuda::lamb_step(master_, params_, m_, v_, grads_, update_, opt_scratch_, segments_, decay_, count, P, ap, s);
  else
    cuda::adamw_step(master_, params_, m_, v_, grads_, segments_, decay_, count, P, ap, s);
  CUDA_CHECK(cudaEventRecord(marks_.back(), s));
  float sumsq = 0;
  CUDA_CHECK(cudaMemcpyAsync(&sumsq, sumsq_, 4, cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaMemcpyAsync(h_losses_, losses_, accum * N * 4, cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  double sum = 0;  // fixed order
  for (int64_t i = 0; i < accum * N; ++i) sum += h_losses_[i];
  r.loss = static_cast<float>(sum / (accum * N));
  r.grad_norm = std::sqrt(double(sumsq));
  auto seconds = [&](int64_t a, int64_t b) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[a], marks_[b]));
    return ms / 1e3;
  };
  for (int64_t i = 0; i < accum; ++i)
    r.times.forward_s += seconds(2 * i, 2 * i + 1), r.times.backward_s += seconds(2 * i + 1, 2 * i + 2);
  r.times.optimizer_s = seconds(2 * accum, int64_t(marks_.size()) - 1);
  if (!std::isfinite(r.loss))
    throw Error(ErrorClass::kNumerics, cat("step ", step, ": loss is ", r.loss,
                                           "; lower optim.lr or resume from an earlier checkpoint"));
  return r;
}

float GptCuda::loss(const int32_t* tokens, int B) {
  const int T = maxT_, N = B * T;
  stage(tokens, 1, B, T, T + 1, false);
  forward(0, B, T);
  cuda::crossentropy(losses_, logits_, targets_, 0.0f, N, V_, Vp_, stream_);
  CUDA_CHECK(cudaMemcpyAsync(h_losses_, losses_, N * 4, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  double sum = 0;
  for (int i = 0; i < N; ++i) sum += h_losses_[i];
  return static_cast<float>(sum / N);
}

void GptCuda::last_logits(const int32_t* tokens, int B, int T, float* out) {
  stage(tokens, 1, B, T, T, false);
  forward(0, B, T);
  std::vector<bf16> row(Vp_);
  for (int b = 0; b < B; ++b) {
    CUDA_CHECK(cudaMemcpyAsync(row.data(), logits_ + (int64_t(b) * T + T - 1) * Vp_, Vp_ * 2,
                               cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int v = 0; v < Vp_; ++v) out[int64_t(b) * Vp_ + v] = __bfloat162float(row[v]);
  }
}

}  // namespace

std::unique_ptr<Engine> make_cuda_engine(const Config& cfg) { return std::make_unique<GptCuda>(cfg); }

}  // namespace myriad
