#include "runtime/engine.h"

#include <omp.h>

#include <cmath>

#include "core/error.h"
#include "model/gpt.h"
#include "optim/optimizer.h"
#include "parallel/mappings.h"
#ifdef MYRIAD_HAVE_CUDA
#include "model/cuda/gpt_cuda.h"
#endif

namespace myriad {
namespace {

// The CPU backend: the Gpt of model/ and the optimizers of optim/, fp32 throughout. With tensor
// parallelism the model and the optimizer hold this rank's shards (AdamW is elementwise).
class CpuEngine final : public Engine {
 public:
  CpuEngine(const Config& cfg, const parallel::ParallelContext* par)
      : cfg_(cfg), model_(cfg, par), optimizer_(make_optimizer(cfg.optim, model_.layout())) {}

  const ParamLayout& layout() const override { return model_.layout(); }
  std::string device() const override { return cat("cpu (", omp_get_max_threads(), " threads)"); }

  StepResult train_step(const int32_t* tokens, int64_t step, double lr) override {
    const int64_t mb = cfg_.train.micro_batch, T = cfg_.model.seq_len;
    const int64_t accum = cfg_.accum_steps(1);
    StepResult r;
    model_.zero_grads();
    double loss_sum = 0;
    for (int64_t i = 0; i < accum; ++i)
      loss_sum += model_.forward_backward(tokens + i * mb * (T + 1), mb, 1.0f / accum);
    r.loss = static_cast<float>(loss_sum / accum);
    if (!std::isfinite(r.loss))
      throw Error(ErrorClass::kNumerics, cat("step ", step, ": loss is ", r.loss,
                                             "; lower optim.lr or resume from an earlier checkpoint"));
    if (model_.tp_size() > 1) {
      // The norm over every shard (replicated tensors once), then PyTorch's clipping rule.
      model_.finish_grads();
      r.grad_norm = model_.grad_norm();
      const double coef = cfg_.optim.grad_clip / (r.grad_norm + 1e-6);
      if (cfg_.optim.grad_clip > 0 && coef < 1.0) {
        const float c = static_cast<float>(coef);
        float* g = model_.grads();
        const int64_t n = model_.num_params();
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) g[i] *= c;
      }
    } else {
      r.grad_norm = clip_grad_norm(model_.grads(), model_.num_params(), cfg_.optim.grad_clip);
    }
    r.lr = lr;
    optimizer_->step(model_.params(), model_.grads(), lr);
    return r;
  }
  float loss(const int32_t* tokens, int B) override { return model_.loss(tokens, B); }
  void last_logits(const int32_t* tokens, int B, int T, float* out) override {
    model_.last_logits(tokens, B, T, out);
  }
  double flops_per_token() const override { return model_.flops_per_token(); }

  HostState host_state() override {
    return {model_.params(), optimizer_->m().data(), optimizer_->v().data(), &optimizer_->steps_taken()};
  }
  void state_to_host() override {}
  void state_from_host() override {}

 private:
  Config cfg_;
  Gpt model_;
  std::unique_ptr<Optimizer> optimizer_;
};

}  // namespace

bool cuda_available() {
#ifdef MYRIAD_HAVE_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

std::unique_ptr<Engine> make_engine(const Config& cfg, const parallel::ParallelContext* parallel) {
  const std::string& d = cfg.train.device;
  const int tp = parallel ? parallel->tp_size() : 1;
  if (tp > 1 && cfg.optim.name == "lamb")
    throw_input("config: optim.name = \"lamb\" is not supported with parallel.tp = ", tp,
                " yet (its per-tensor trust ratios would need norms over the tensor-parallel "
                "shards); use adamw");
  if (d == "cuda" || (d == "auto" && cuda_available())) {
    if (tp > 1)
      throw_input("config: parallel.tp = ", tp, " runs on the CPU engine only so far; set "
                  "train.device = \"cpu\"");
#ifdef MYRIAD_HAVE_CUDA
    if (!cuda_available())
      throw_input("config: train.device = \"cuda\" but no GPU is visible; use cpu or auto");
    return make_cuda_engine(cfg);
#else
    throw_input("config: train.device = \"cuda\" but this build has no CUDA (nvcc was not found "
                "at build time); use cpu or auto");
#endif
  }
  return std::make_unique<CpuEngine>(cfg, parallel);
}

}  // namespace myriad
