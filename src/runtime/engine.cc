#include "runtime/engine.h"

#include <omp.h>

#include <cmath>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "model/gpt.h"
#include "optim/optimizer.h"
#include "ops/cpu/reduce.h"
#include "parallel/mappings.h"
#include "parallel/schedule.h"
#include "runtime/data_parallel.h"
#include "runtime/pipeline.h"
#ifdef MYRIAD_HAVE_CUDA
#include "model/cuda/gpt_cuda.h"
#endif

namespace myriad {
namespace {

// The CPU backend: the Gpt of model/ and the optimizers of optim/, fp32 throughout, in any 3D
// layout. Tensor parallelism lives inside Gpt; this engine runs the pipeline schedule over the
// rank's chunks (runtime/pipeline.h) and the sharded data-parallel update (runtime/
// data_parallel.h). With one process every group is null and the same code is the plain
// training step.
class CpuEngine final : public Engine {
 public:
  CpuEngine(const Config& cfg, const parallel::ParallelContext* par)
      : cfg_(cfg),
        ctx_(par ? *par : parallel::ParallelContext{}),
        part_(model_part(cfg, ctx_)),
        model_(cfg, &ctx_, &part_,
               plan_buckets(ParamLayout(cfg, ctx_.tp_rank(), ctx_.tp_size(), &part_).total(),
                            ctx_.dp_size(), bucket_elems(cfg))
                   .padded_total),
        dp_(ctx_.dp, model_.layout().total(), bucket_elems(cfg), chunk_ranges(), chunk_reads(),
            tied_embedding(), cfg.parallel.overlap_dp) {
    optimizer_ = make_optimizer(cfg.optim, model_.layout(), dp_.owned(),
                                [this](std::vector<double>& sums) { reduce_norms(sums); });
    const int dp = ctx_.dp_size();
    const int m = static_cast<int>(cfg.accum_steps(dp));
    const int v = static_cast<int>(cfg.parallel.virtual_stages);
    std::string kind = cfg.parallel.schedule;
    if (kind == "auto") kind = v > 1 ? "interleaved" : "1f1b";
    pipeline_ = std::make_unique<Pipeline>(
        model_, parallel::make_schedule(parallel::schedule_kind(kind), ctx_.pp_size(), v, m),
        ctx_.pp_rank(),
        PipelineLinks{ctx_.act_to_next, ctx_.act_from_prev, ctx_.grad_to_prev, ctx_.grad_from_next},
        static_cast<int>(cfg.train.micro_batch), static_cast<int>(cfg.model.seq_len));
    if (ctx_.pp_size() > 1) {
      std::string layers;
      for (auto [a, b] : part_.chunks) layers += cat(layers.empty() ? "" : ", ", "[", a, ", ", b, ")");
      const parallel::Schedule& sch = pipeline_->schedule();
      log::info("pipeline: stage ", ctx_.pp_rank(), " of ", sch.p, ", layers ", layers, "; ", sch.m,
                " micro-batches per step, ideal bubble ",
                cat(static_cast<int>(parallel::simulate(sch).bubble * 1000 + 0.5) / 10.0), "% of compute");
    }
    if (ctx_.dp_size() > 1)
      log::info("data parallel: ", ctx_.dp_size(), " ranks, ", dp_.plan().buckets.size(),
                " gradient buckets; this rank updates ", optimizer_->m().size(), " of ",
                model_.layout().total(), " parameters");
  }

  const ParamLayout& layout() const override { return model_.layout(); }
  std::string device() const override { return cat("cpu (", omp_get_max_threads(), " threads)"); }

  // One optimizer step; every group's collectives are issued in the same order on each rank.
  StepResult train_step(const int32_t* tokens, int64_t step, double lr) override {
    const int dp = ctx_.dp_size(), accum = pipeline_->schedule().m;
    const int32_t* mine = tokens;  // (accum x micro_batch, T+1): this data-parallel rank's rows
    const double dp_waited = dp_.waited_s();
    model_.zero_grads();
    Pipeline::Hooks hooks{[this](int c) { dp_.wait_params(c); },
                          [this](int c) { dp_.chunk_done(c, model_.grads()); }};
    StepResult r;
    r.loss = step_loss(pipeline_->train(mine, 1.0f / float(accum * dp), hooks));
    if (!std::isfinite(r.loss))
      throw Error(ErrorClass::kNumerics, cat("step ", step, ": loss is ", r.loss,
                                             "; lower optim.lr or resume from an earlier checkpoint"));
    sync_tied_embedding();
    dp_.finish_reduce(model_.grads());  // the owned ranges now hold the sums over dp
    const double t_update = now_s();
    const std::vector<FlatRange> owned = dp_.owned();
    for (const FlatRange& o : owned) model_.finish_grads(o.begin, o.end);
    r.grad_norm = grad_norm(owned);
    clip(owned, r.grad_norm);
    r.lr = lr;
    optimizer_->step(model_.params(), model_.grads(), lr);
    const double t_updated = now_s();
    dp_.gather_params(model_.params());  // awaited chunk by chunk by the next forward
    const Pipeline::Times& pt = pipeline_->times();
    r.times = {pt.forward_s, pt.backward_s, pt.wait_s, dp_.waited_s() - dp_waited,
               t_updated - t_update};
    return r;
  }

  float loss(const int32_t* tokens, int B) override {
    dp_.wait_all_params();
    return step_loss(ctx_.pp_size() > 1 ? pipeline_->evaluate(tokens, B) : model_.loss(tokens, B),
                     /*over_dp=*/false);
  }
  void last_logits(const int32_t* tokens, int B, int T, float* out) override {
    if (ctx_.pp_size() > 1)
      throw_input("sampling runs on the whole model: use myriad sample on the checkpoint");
    dp_.wait_all_params();
    model_.last_logits(tokens, B, T, out);
  }
  double flops_per_token() const override { return model_.flops_per_token(); }

  // Parameters by data-parallel rank 0 (the owners of the optimizer state write theirs);
  // replicated tensors by tensor-parallel rank 0; the tied embedding by the first stage (the
  // last one holds a copy).
  bool writes_to_checkpoint(const ParamSpec& p, bool params) const override {
    if (params && ctx_.dp_rank() != 0) return false;
    if (p.replicated() && ctx_.tp_rank() != 0) return false;
    return p.name != "wte" || part_.embedding;
  }

  HostState host_state() override {
    return {model_.params(), optimizer_->m().data(), optimizer_->v().data(),
            &optimizer_->steps_taken(), optimizer_->owned()};
  }
  void state_to_host() override { dp_.wait_all_params(); }
  void state_from_host() override {}

 private:
  // This pipeline rank's chunks: virtual stage g = c * pp + stage.
  static ModelPart model_part(const Config& cfg, const parallel::ParallelContext& ctx) {
    const int p = ctx.pp_size(), s = ctx.pp_rank(), v = static_cast<int>(cfg.parallel.virtual_stages);
    const double C = cfg.model.d_model, T = cfg.model.window > 0 ? std::min(cfg.model.window, cfg.model.seq_len) : cfg.model.seq_len;
    // Forward FLOPs per token: a layer's GEMMs and attention; the head's logits; the embedding
    // is a lookup.
    const auto ranges = parallel::stage_layer_ranges(
        cfg.parallel.stage_layers, static_cast<int>(cfg.model.layers), p, v, 24 * C * C + 4 * C * T,
        0, 2 * C * double(cfg.padded_vocab()));
    ModelPart part{{}, s == 0, s == p - 1};
    for (int c = 0; c < v; ++c) part.chunks.push_back(ranges[c * p + s]);
    return part;
  }

  // The flat range whose gradients chunk c completes: from its first layer to the next chunk's
  // (the first chunk from 0, the last to the end: embeddings and final norm included).
  std::vector<FlatRange> chunk_ranges() const {
    const ParamLayout& l = model_.layout();
    auto first_of = [&](int layer) {
      for (const ParamSpec& p : l.tensors())
        if (p.layer == layer) return p.offset;
      MYRIAD_CHECK(false, "layer ", layer, " not in this rank's layout");
      return int64_t(0);
    };
    const auto& chunks = part_.chunks;
    std::vector<FlatRange> out;
    for (size_t c = 0; c < chunks.size(); ++c)
      out.push_back({c == 0 ? 0 : first_of(chunks[c].first),
                     c + 1 < chunks.size() ? first_of(chunks[c + 1].first) : l.total()});
    return out;
  }
  // The ranges chunk c's forward reads: its own, and the tied embedding for the LM head.
  std::vector<std::vector<FlatRange>> chunk_reads() const {
    std::vector<std::vector<FlatRange>> out;
    for (const FlatRange& r : chunk_ranges()) out.push_back({r});
    if (part_.head) {
      const ParamSpec& wte = model_.layout().find("wte");
      out.back().push_back({wte.offset, wte.offset + wte.numel});
    }
    return out;
  }
  // The wte copy that pipeline stages share (embedding on the first, LM head on the last).
  FlatRange tied_embedding() const {
    if (ctx_.pp_size() == 1 || !(part_.embedding || part_.head)) return {};
    const ParamSpec& wte = model_.layout().find("wte");
    return {wte.offset, wte.offset + wte.numel};
  }

  // The first and the last stage add their wte gradients (embedding + LM head); both get the
  // same bits (a + b == b + a), so both copies take the same update.
  void sync_tied_embedding() {
    const FlatRange t = tied_embedding();
    if (t.size() == 0) return;
    const int p = ctx_.pp_size(), s = ctx_.pp_rank(), peer = s == 0 ? p - 1 : 0;
    float* g = model_.grads() + t.begin;
    std::vector<float> other(t.size());
    comm::WorkPtr sent = ctx_.pp->send(g, t.size(), peer);
    ctx_.pp->recv(other.data(), t.size(), peer)->wait();
    sent->wait();
    for (int64_t i = 0; i < t.size(); ++i) g[i] += other[i];
  }

  // The step's loss lives on the last stage: broadcast over the pipeline, averaged over dp.
  float step_loss(float local, bool over_dp = true) {
    if (ctx_.pp_size() > 1) ctx_.pp->broadcast(&local, 1, ctx_.pp_size() - 1)->wait();
    if (over_dp && ctx_.dp_size() > 1)
      local = static_cast<float>(parallel::sum_over_group(ctx_.dp, double(local)) / ctx_.dp_size());
    return local;
  }

  // The global L2 norm over every shard: split tensors summed over tp, replicated ones once,
  // the stages' disjoint layers over pp (the tied wte counted on the first stage only), the
  // owned pieces over dp. Identical bits on every rank.
  double grad_norm(const std::vector<FlatRange>& owned) const {
    double split = 0, replicated = 0;
    const float* g = const_cast<Gpt&>(model_).grads();
    for (const ParamSpec& p : model_.layout().tensors()) {
      if (p.name == "wte" && !part_.embedding) continue;  // the first stage's copy counts
      for (const FlatRange& o : owned) {
        const int64_t a = std::max(o.begin, p.offset), b = std::min(o.end, p.offset + p.numel);
        if (a < b) (p.replicated() ? replicated : split) += cpu::sum_squares(g + a, b - a);
      }
    }
    double sq = parallel::sum_over_group(ctx_.tp, split) + replicated;
    sq = parallel::sum_over_group(ctx_.pp, sq);
    sq = parallel::sum_over_group(ctx_.dp, sq);
    return std::sqrt(sq);
  }

  // PyTorch's clipping rule on the owned gradients.
  void clip(const std::vector<FlatRange>& owned, double norm) {
    const double coef = cfg_.optim.grad_clip / (norm + 1e-6);
    if (cfg_.optim.grad_clip <= 0 || coef >= 1.0) return;
    const float c = static_cast<float>(coef);
    float* g = model_.grads();
    for (const FlatRange& o : owned) {
#pragma omp parallel for schedule(static)
      for (int64_t i = o.begin; i < o.end; ++i) g[i] *= c;
    }
  }

  // LAMB's per-tensor sums of squares: over dp for every tensor, over tp for the split ones.
  void reduce_norms(std::vector<double>& sums) {
    parallel::sum_over_group(ctx_.dp, sums.data(), static_cast<int64_t>(sums.size()));
    if (ctx_.tp_size() == 1) return;
    const auto& tensors = model_.layout().tensors();
    std::vector<double> split;
    for (size_t k = 0; k < tensors.size(); ++k)
      if (!tensors[k].replicated()) split.push_back(sums[2 * k]), split.push_back(sums[2 * k + 1]);
    parallel::sum_over_group(ctx_.tp, split.data(), static_cast<int64_t>(split.size()));
    for (size_t k = 0, i = 0; k < tensors.size(); ++k)
      if (!tensors[k].replicated()) sums[2 * k] = split[i++], sums[2 * k + 1] = split[i++];
  }

  static int64_t bucket_elems(const Config& cfg) {
    return static_cast<int64_t>(cfg.parallel.bucket_mb * (1 << 20) / sizeof(float));
  }

  Config cfg_;
  parallel::ParallelContext ctx_;
  ModelPart part_;
  Gpt model_;
  DataParallel dp_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Pipeline> pipeline_;
};

}  // namespace

int cuda_device_count_or_zero() {
#ifdef MYRIAD_HAVE_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}

bool cuda_available() {
#ifdef MYRIAD_HAVE_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

std::unique_ptr<Engine> make_engine(const Config& cfg, const parallel::ParallelContext* parallel) {
  const std::string& d = cfg.train.device;
  const int world = parallel ? parallel->tp_size() * parallel->pp_size() * parallel->dp_size() : 1;
  if (d == "cuda" || (d == "auto" && cuda_available())) {
    if (world > 1)
      throw_input("config: parallel.tp x pp x dp = ", world, " processes run on the CPU engine "
                  "only so far; set train.device = \"cpu\"");
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
