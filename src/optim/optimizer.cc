#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/cpu/reduce.h"

namespace myriad {

double lr_at(const OptimConfig& o, int64_t step, int64_t total_steps) {
  if (step < o.warmup_steps) return o.lr * double(step + 1) / double(o.warmup_steps);
  if (o.decay == "constant") return o.lr;
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

namespace {

class AdamW final : public Optimizer {
 public:
  AdamW(const OptimConfig& cfg, const ParamLayout& layout) : Optimizer(cfg, layout) {}
  void step(float* params, const float* grads, double lr) override {
    ++t_;
    const float b1 = cfg_.beta1, b2 = cfg_.beta2, eps = cfg_.eps;
    const float c1 = 1.0 - std::pow(cfg_.beta1, t_), c2 = 1.0 - std::pow(cfg_.beta2, t_);
    for (const ParamSpec& p : layout_.tensors()) {
      const float decay = p.decay ? 1.0 - lr * cfg_.weight_decay : 1.0;
      float *w = params + p.offset, *m = m_.data() + p.offset, *v = v_.data() + p.offset;
      const float* g = grads + p.offset;
      const float a = lr;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < p.numel; ++i) {
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        w[i] = w[i] * decay - a * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
      }
    }
  }
};

class Lamb final : public Optimizer {
 public:
  Lamb(const OptimConfig& cfg, const ParamLayout& layout)
      : Optimizer(cfg, layout), update_(layout.total()) {}

  void step(float* params, const float* grads, double lr) override {
    ++t_;
    const float b1 = cfg_.beta1, b2 = cfg_.beta2, eps = cfg_.eps;
    const float c1 = 1.0 - std::pow(cfg_.beta1, t_), c2 = 1.0 - std::pow(cfg_.beta2, t_);
    for (const ParamSpec& p : layout_.tensors()) {
      const float wd = p.decay ? cfg_.weight_decay : 0.0;
      float *w = params + p.offset, *m = m_.data() + p.offset, *v = v_.data() + p.offset;
      float* u = update_.data() + p.offset;
      const float* g = grads + p.offset;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < p.numel; ++i) {
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        u[i] = (m[i] / c1) / (std::sqrt(v[i] / c2) + eps) + wd * w[i];
      }
      // Trust ratio per tensor; 1 when either norm is 0 (fresh zero biases, zero updates).
      const double wn = std::sqrt(cpu::sum_squares(w, p.numel)), un = std::sqrt(cpu::sum_squares(u, p.numel));
      const float step = lr * (wn > 0 && un > 0 ? wn / un : 1.0);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < p.numel; ++i) w[i] -= step * u[i];
    }
  }

 private:
  std::vector<float> update_;  // (total) scratch: the Adam direction plus weight decay
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& cfg, const ParamLayout& layout) {
  if (cfg.name == "adamw") return std::make_unique<AdamW>(cfg, layout);
  if (cfg.name == "lamb") return std::make_unique<Lamb>(cfg, layout);
  throw_input("config: optim.name = \"", cfg.name, "\" is not one of: adamw, lamb");
}

}  // namespace myriad
