// Optimizers over the flat parameter buffer: AdamW and LAMB, fp32 state, plus the learning-rate
// schedule and global-norm clipping.
//
// Every reduction (norms) runs over fixed-size chunks whose partial sums are added in chunk
// order, so results are bitwise the same whatever the number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "model/params.h"

namespace myriad {

// Learning rate at 0-based `step`: linear warmup to optim.lr over warmup_steps, then cosine or
// linear decay to min_lr at train.steps (or constant).
double lr_at(const OptimConfig& o, int64_t step, int64_t total_steps);

// Scales grads so that their global L2 norm is at most max_norm (PyTorch's clip_grad_norm_:
// coefficient max_norm / (norm + 1e-6) when below 1). Returns the norm before clipping.
double clip_grad_norm(float* grads, int64_t n, double max_norm);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of params from grads at learning rate lr; advances the step count.
  virtual void step(float* params, const float* grads, double lr) = 0;

  // State, for checkpoints: first and second moments in the parameter layout, and the count
  // of steps taken (bias correction).
  std::vector<float>& m() { return m_; }
  std::vector<float>& v() { return v_; }
  int64_t& steps_taken() { return t_; }

 protected:
  Optimizer(const OptimConfig& cfg, const ParamLayout& layout)
      : cfg_(cfg), layout_(layout), m_(layout.total(), 0.0f), v_(layout.total(), 0.0f) {}
  OptimConfig cfg_;
  const ParamLayout& layout_;
  std::vector<float> m_, v_;
  int64_t t_ = 0;
};

// optim.name selects AdamW (decoupled weight decay, Loshchilov & Hutter) or LAMB (You et al.
// 2019: Adam direction scaled per tensor by the trust ratio ||w|| / ||update||). Weight decay
// applies to the tensors whose ParamSpec says so (matrices and embeddings, not biases or norms).
std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& cfg, const ParamLayout& layout);

}  // namespace myriad
