#include <cstring>
#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/cpu/reduce.h"

namespace myriad {

int64_t wsd_decay_steps(const OptimConfig& o, int64_t total_steps) {
  const int64_t d = o.decay_steps > 0 ? o.decay_steps : std::llround(o.decay_fraction * double(total_steps));
  return std::clamp<int64_t>(d, 1, std::max<int64_t>(1, total_steps - o.warmup_steps));
}

std::string schedule_warning(const OptimConfig& o, int64_t total_steps) {
  const int64_t w = o.warmup_steps;
  if (w > 0 && (w > total_steps || (w == total_steps && o.decay != "constant")))
    return cat("optim.warmup_steps = ", w, " is not shorter than train.steps = ", total_steps, ": the run ends in its "
               "warmup, at lr ", lr_at(o, total_steps - 1, total_steps), " of optim.lr ", o.lr,
               o.decay == "constant" ? std::string() : cat(", and never decays to optim.min_lr ", o.min_lr));
  if (o.decay == "wsd" && o.decay_steps == 0) {
    const int64_t asked = std::llround(o.decay_fraction * double(total_steps)), used = wsd_decay_steps(o, total_steps);
    if (asked != used)
      return cat("optim.decay_fraction = ", o.decay_fraction, " of train.steps = ", total_steps, " is ", asked,
                 " decay steps, but ", total_steps - w, " follow the warmup: the decay takes ", used);
  }
  return "";
}

double lr_at(const OptimConfig& o, int64_t step, int64_t total_steps) {
  if (step < o.warmup_steps) return o.lr * double(step + 1) / double(o.warmup_steps);
  if (o.decay == "constant") return o.lr;
  if (o.decay == "wsd") {
    const int64_t d = wsd_decay_steps(o, total_steps), start = total_steps - d;
    if (step < start) return o.lr;
    // The decay's d steps end on min_lr: step start + i trains at progress (i + 1) / d.
    const double p = std::min(1.0, double(step - start + 1) / double(d));
    const double frac = o.decay_shape == "linear"   ? 1.0 - p
                        : o.decay_shape == "cosine" ? 0.5 * (1.0 + std::cos(M_PI * p))
                                                    : 1.0 - std::sqrt(p);
    return o.min_lr + frac * (o.lr - o.min_lr);
  }
  const double span = std::max<int64_t>(1, total_steps - o.warmup_steps);
  const double progress = std::min(1.0, double(step - o.warmup_steps) / span);
  const double frac = o.decay == "cosine" ? 0.5 * (1.0 + std::cos(M_PI * progress)) : 1.0 - progress;
  return o.min_lr + frac * (o.lr - o.min_lr);
}

double clip_grad_norm(float* grads, int64_t n, double max_norm) {
  const double norm = std::sqrt(cpu::sum_squares(grads, n));
  if (max_norm > 0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) {
      const float c = static_cast<float>(coef);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) grads[i] *= c;
    }
  }
  return norm;
}

std::vector<OwnedPiece> owned_pieces(const ParamLayout& layout, const std::vector<FlatRange>& owned) {
  std::vector<OwnedPiece> out;
  const std::vector<ParamSpec>& ts = layout.tensors();
  int64_t packed = 0, last = 0;
  size_t k = 0;  // the first tensor that may intersect the range (tensors are in offset order)
  for (const FlatRange& r : owned) {
    if (r.size() == 0) continue;
    MYRIAD_CHECK(r.begin >= last && r.end > r.begin && r.end <= layout.total(),
                 "owned ranges must be ascending, disjoint and inside [0, ", layout.total(),
                 "): [", r.begin, ", ", r.end, ") after ", last);
    last = r.end;
    while (ts[k].offset + ts[k].numel <= r.begin) ++k;
    for (size_t j = k; j < ts.size() && ts[j].offset < r.end; ++j) {
      const int64_t b = std::max(r.begin, ts[j].offset), e = std::min(r.end, ts[j].offset + ts[j].numel);
      out.push_back({&ts[j], b - ts[j].offset, e - ts[j].offset, packed});
      packed += e - b;
    }
  }
  return out;
}

Optimizer::Optimizer(const OptimConfig& cfg, const ParamLayout& layout, std::vector<FlatRange> owned)
    : cfg_(cfg), layout_(layout) {
  if (owned.empty()) owned = {{0, layout.total()}};
  for (const FlatRange& r : owned)
    if (r.size() != 0) owned_.push_back(r);
  pieces_ = owned_pieces(layout, owned_);
  int64_t n = 0;
  for (const FlatRange& r : owned_) n += r.size();
  m_.assign(n, 0.0f);
  v_.assign(n, 0.0f);
}

namespace {

// Each element's update is the same arithmetic whichever piece it falls in, so sharded AdamW
// equals unsharded AdamW bit for bit.
class AdamW final : public Optimizer {
 public:
  AdamW(const OptimConfig& cfg, const ParamLayout& layout, std::vector<FlatRange> owned, float* compute)
      : Optimizer(cfg, layout, std::move(owned)), compute_(compute) {}
  void step(float* master, const float* grads, double lr, float grad_scale) override {
    ++t_;
    const float b1 = cfg_.beta1, b2 = cfg_.beta2, eps = cfg_.eps;
    const float c1 = 1.0 - std::pow(cfg_.beta1, t_), c2 = 1.0 - std::pow(cfg_.beta2, t_);
    for (const OwnedPiece& s : pieces_) {
      const ParamSpec& p = *s.tensor;
      if (!p.trained) continue;  // state with a rule of its own (params.h)
      const float decay = p.decay ? 1.0 - lr * cfg_.weight_decay : 1.0;
      const int64_t at = p.offset + s.local_begin, n = s.local_end - s.local_begin;
      float *w = master + s.packed, *m = m_.data() + s.packed, *v = v_.data() + s.packed;
      const float* g = grads + at;
      const float a = lr;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        const float gi = g[i] * grad_scale;
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        w[i] = w[i] * decay - a * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
      }
      if (compute_) std::memcpy(compute_ + at, w, size_t(n) * sizeof(float));
    }
  }

 private:
  float* compute_;
};

// Three phases, because the trust ratio of a tensor needs norms over elements other ranks own:
// the Adam direction and the partial sums of squares over the owned pieces; one reduction of
// all tensors' sums; the update. Unsharded, each tensor is one piece and its sums are those of
// the single-pass algorithm, bit for bit.
class Lamb final : public Optimizer {
 public:
  Lamb(const OptimConfig& cfg, const ParamLayout& layout, std::vector<FlatRange> owned,
       NormReducer reduce, float* compute)
      : Optimizer(cfg, layout, std::move(owned)), reduce_(std::move(reduce)), compute_(compute), update_(m_.size()) {}

  void step(float* master, const float* grads, double lr, float grad_scale) override {
    ++t_;
    const float b1 = cfg_.beta1, b2 = cfg_.beta2, eps = cfg_.eps;
    const float c1 = 1.0 - std::pow(cfg_.beta1, t_), c2 = 1.0 - std::pow(cfg_.beta2, t_);
    const ParamSpec* first = layout_.tensors().data();
    std::vector<double> sums(2 * layout_.tensors().size(), 0.0);
    for (const OwnedPiece& s : pieces_) {
      const ParamSpec& p = *s.tensor;
      if (!p.trained) continue;  // state with a rule of its own (params.h)
      const float wd = p.decay ? cfg_.weight_decay : 0.0;
      const int64_t at = p.offset + s.local_begin, n = s.local_end - s.local_begin;
      float *w = master + s.packed, *m = m_.data() + s.packed, *v = v_.data() + s.packed;
      float* u = update_.data() + s.packed;
      const float* g = grads + at;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        const float gi = g[i] * grad_scale;
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        u[i] = (m[i] / c1) / (std::sqrt(v[i] / c2) + eps) + wd * w[i];
      }
      const size_t k = &p - first;
      sums[2 * k] += cpu::sum_squares(w, n);
      sums[2 * k + 1] += cpu::sum_squares(u, n);
    }
    if (reduce_) reduce_(sums);
    for (const OwnedPiece& s : pieces_) {
      const ParamSpec& p = *s.tensor;
      if (!p.trained) continue;
      const size_t k = &p - first;
      // Trust ratio per tensor; 1 when either norm is 0 (fresh zero biases, zero updates).
      const double wn = std::sqrt(sums[2 * k]), un = std::sqrt(sums[2 * k + 1]);
      const float step = lr * (wn > 0 && un > 0 ? wn / un : 1.0);
      const int64_t n = s.local_end - s.local_begin;
      float* w = master + s.packed;
      const float* u = update_.data() + s.packed;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) w[i] -= step * u[i];
      if (compute_) std::memcpy(compute_ + p.offset + s.local_begin, w, size_t(n) * sizeof(float));
    }
  }

 private:
  NormReducer reduce_;
  float* compute_;
  OptimState update_;  // (owned elements) scratch: the Adam direction plus weight decay
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& cfg, const ParamLayout& layout,
                                          std::vector<FlatRange> owned, NormReducer reduce, float* compute) {
  if (cfg.name == "adamw") return std::make_unique<AdamW>(cfg, layout, std::move(owned), compute);
  if (cfg.name == "lamb")
    return std::make_unique<Lamb>(cfg, layout, std::move(owned), std::move(reduce), compute);
  throw_input("config: optim.name = \"", cfg.name, "\" is not one of: adamw, lamb");
}

std::unique_ptr<Optimizer> make_optimizer(const cpu::CpuOps&, const OptimConfig& cfg,
                                          const ParamLayout& layout, std::vector<FlatRange> owned,
                                          NormReducer reduce, float* compute) {
  return make_optimizer(cfg, layout, std::move(owned), std::move(reduce), compute);
}

}  // namespace myriad
