#include "optim/cuda/cuda_optimizer.h"

#include <cmath>
#include <memory>

#include "core/error.h"
#include "model/cuda/cuda_check.h"
#include "model/cuda/cuda_ops.h"
#include "ops/cuda/ops.cuh"

namespace myriad::cuda {
namespace {

class CudaOptimizer final : public Optimizer {
 public:
  CudaOptimizer(const CudaOps& ops, const OptimConfig& cfg, const ParamLayout& layout,
                std::vector<FlatRange> owned, NormReducer reduce, __nv_bfloat16* compute)
      : Optimizer(cfg, layout, std::move(owned)),
        ops_(ops),
        reduce_(std::move(reduce)),
        lamb_(cfg.name == "lamb"),
        compute_(compute) {
    if (cfg.name != "adamw" && !lamb_)
      throw_input("config: optim.name = \"", cfg.name, "\" is not one of: adamw, lamb");
    // Each owned range is contiguous in the flat buffer and in the packed state; its pieces
    // (tensors) are its segments, relative to the range's start.
    std::vector<int64_t> segments;
    std::vector<uint8_t> decay;
    size_t k = 0;
    for (const FlatRange& r : owned_) {
      Range out{r.begin, pieces_[k].packed, r.size(), static_cast<int>(segments.size()),
                static_cast<int>(k), 0};
      for (; k < pieces_.size(); ++k) {
        const OwnedPiece& p = pieces_[k];
        const int64_t at = p.tensor->offset + p.local_begin;
        if (at >= r.end) break;
        // Its kernels update every element of a range, untrained state (an MoE router's bias,
        // params.h) too. Such a tensor gets no gradient (nothing in the model writes one), so its
        // moments stay 0 and AdamW's and LAMB's step on it is exactly 0, as the CPU optimizer's
        // skip leaves it; that holds without weight decay, which an untrained tensor must not have.
        MYRIAD_CHECK(p.tensor->trained || !p.tensor->decay, "the CUDA optimizer would decay ", p.tensor->name,
                     ", which is not trained");
        segments.push_back(at - r.begin);
        decay.push_back(p.tensor->decay);
        ++out.count;
      }
      segments.push_back(r.size());
      ranges_.push_back(out);
      scratch_floats_ = std::max(scratch_floats_, sumsq_scratch_floats(r.size(), out.count));
    }
    segments_.zeros(static_cast<int64_t>(segments.size()));
    decay_.zeros(static_cast<int64_t>(decay.size()));
    CUDA_CHECK(cudaMemcpy(segments_.data(), segments.data(), segments.size() * 8, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(decay_.data(), decay.data(), decay.size(), cudaMemcpyHostToDevice));
    d_m_.zeros(static_cast<int64_t>(m_.size()));
    d_v_.zeros(static_cast<int64_t>(v_.size()));
    // The host copies a checkpoint reads (state_to_host), page-locked for the copy's speed.
    pinned_ = {ops_.pin_host(m_.data(), m_.size() * sizeof(float)), ops_.pin_host(v_.data(), v_.size() * sizeof(float))};
    if (lamb_) {
      update_.zeros(static_cast<int64_t>(m_.size()));
      norms_.zeros(4 * static_cast<int64_t>(pieces_.size()));  // ||w||^2, ||u||^2 per piece; twice
      scratch_.zeros(static_cast<int64_t>(scratch_floats_));
    }
  }

  void step(float* master, const float* grads, double lr, float grad_scale) override {
    ++t_;
    const AdamParams p{static_cast<float>(lr), float(cfg_.beta1), float(cfg_.beta2), float(cfg_.eps),
                       float(cfg_.weight_decay), float(1.0 - std::pow(cfg_.beta1, t_)),
                       float(1.0 - std::pow(cfg_.beta2, t_)), grad_scale};
    const cudaStream_t s = ops_.stream();
    if (!lamb_) {
      for (const Range& r : ranges_)
        adamw_step(master + r.packed, compute(r), d_m_.data() + r.packed, d_v_.data() + r.packed, grads + r.flat,
                   segments_.data() + r.segments, decay_.data() + r.first_piece, r.count, r.n, p, s);
      return;
    }
    const int64_t n = static_cast<int64_t>(pieces_.size());
    float *wn2 = norms_.data(), *un2 = wn2 + n;
    for (const Range& r : ranges_) {
      const int64_t* seg = segments_.data() + r.segments;
      float* u = update_.data() + r.packed;
      lamb_direction(master + r.packed, d_m_.data() + r.packed, d_v_.data() + r.packed, grads + r.flat, u, seg,
                     decay_.data() + r.first_piece, r.count, r.n, p, s);
      segment_sum_squares(wn2 + r.first_piece, scratch_.data(), master + r.packed, seg, r.count, r.n, s);
      segment_sum_squares(un2 + r.first_piece, scratch_.data(), u, seg, r.count, r.n, s);
    }
    // Per tensor over this rank's pieces, then over the ranks that share the tensors.
    std::vector<float> h(2 * n);
    CUDA_CHECK(cudaMemcpyAsync(h.data(), wn2, 2 * n * 4, cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    const ParamSpec* first = layout_.tensors().data();
    std::vector<double> sums(2 * layout_.tensors().size(), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      const size_t k = pieces_[i].tensor - first;
      sums[2 * k] += h[i], sums[2 * k + 1] += h[n + i];
    }
    if (reduce_) reduce_(sums);
    for (int64_t i = 0; i < n; ++i) {
      const size_t k = pieces_[i].tensor - first;
      h[i] = static_cast<float>(sums[2 * k]), h[n + i] = static_cast<float>(sums[2 * k + 1]);
    }
    float *wt = norms_.data() + 2 * n, *ut = wt + n;
    CUDA_CHECK(cudaMemcpyAsync(wt, h.data(), 2 * n * 4, cudaMemcpyHostToDevice, s));
    for (const Range& r : ranges_)
      lamb_apply(master + r.packed, compute(r), update_.data() + r.packed, wt + r.first_piece, ut + r.first_piece,
                 segments_.data() + r.segments, r.count, r.n, p.lr, s);
    CUDA_CHECK(cudaStreamSynchronize(s));  // `h` is pageable and leaves with this call
  }

  void state_to_host() override {
    ops_.download(m_.data(), d_m_.data(), static_cast<int64_t>(m_.size()));
    ops_.download(v_.data(), d_v_.data(), static_cast<int64_t>(v_.size()));
  }
  void state_from_host() override {
    ops_.upload(d_m_.data(), m_.data(), static_cast<int64_t>(m_.size()));
    ops_.upload(d_v_.data(), v_.data(), static_cast<int64_t>(v_.size()));
  }

 private:
  // One owned range: where it starts in the flat buffer and in the packed state, its length,
  // and its pieces: segments at segments_[segments ..], pieces_[first_piece ..], count of them.
  struct Range {
    int64_t flat, packed, n;
    int segments, first_piece, count;
  };
  __nv_bfloat16* compute(const Range& r) const { return compute_ ? compute_ + r.flat : nullptr; }

  CudaOps ops_;
  std::vector<std::shared_ptr<void>> pinned_;  // m_ and v_ page-locked (unpinned before the base frees them)
  NormReducer reduce_;
  bool lamb_;
  __nv_bfloat16* compute_;  // the compute copy, or null
  std::vector<Range> ranges_;
  size_t scratch_floats_ = 0;
  CudaOps::Buffer<int64_t> segments_;
  CudaOps::Buffer<uint8_t> decay_;
  CudaOps::Buffer<float> d_m_, d_v_, update_, norms_, scratch_;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const CudaOps& ops, const OptimConfig& cfg, const ParamLayout& layout,
                                          std::vector<FlatRange> owned, NormReducer reduce,
                                          __nv_bfloat16* compute) {
  return std::make_unique<CudaOptimizer>(ops, cfg, layout, std::move(owned), std::move(reduce), compute);
}

}  // namespace myriad::cuda
