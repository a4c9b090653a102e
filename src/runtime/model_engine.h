// The one training step, for every device and every 3D layout: ModelEngine<Ops> runs the layer
// schedule GptModel<Ops> (model/gpt.h) under the pipeline executor (runtime/pipeline.h) and
// the sharded data-parallel update (runtime/data_parallel.h), with the optimizers of optim/.
// runtime/engine.cc instantiates it on the CPU op set (fp32: the oracle); runtime/cuda/ on the
// CUDA one (bf16 compute, fp32 master weights, gradients and moments in device memory).
//
// The step's phases, in order (docs/ARCHITECTURE.md):
//   1 zero the gradients          2 forward and backward over the micro-batches (the pipeline;
//   3 reduce-scatter per bucket     overlapped with backward)
//   4 the tied embedding's exchange between the first and last stage
//   5 finish the reduce-scatters  6 the global gradient norm  7 the clipping coefficient
//   8 the update of the owned ranges (each gradient times that coefficient as it is read)   9 all-gather the parameters (awaited by the next forward)
//
// The weights live twice, ZeRO's way: the fp32 master weights of this rank's owned ranges
// only (packed like the optimizer's moments), which the update reads and writes, and the
// whole model's compute copy the kernels read (bf16 on a GPU; on the CPU fp32, the same bits).
// The update writes the new weights of its owned ranges into the compute copy, and the
// all-gather brings the other ranks' ranges of it; so each rank holds 4 bytes a parameter of
// master weights only for the 1/dp it updates. Checkpoints take the weights from their owners,
// as they take the moments.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "core/clock.h"
#include "core/parallel_layout.h"
#include "core/error.h"
#include "core/worker_report.h"
#include "core/fault.h"
#include "core/log.h"
#include "model/engine.h"
#include "model/flops.h"
#include "model/gpt.h"
#include "optim/optimizer.h"
#include "parallel/mappings.h"
#include "parallel/schedule.h"
#include "runtime/data_parallel.h"
#include "observe/trace.h"
#include "runtime/heartbeat.h"
#include "runtime/pipeline.h"

namespace myriad {

template <OpSet Ops>
class ModelEngine final : public Engine {
 public:
  using Model = GptModel<Ops>;
  using Param = typename Ops::Param;
  // Whether the compute copy is host fp32 (the CPU's): then it is the host state a checkpoint
  // writes and reads (its owned ranges equal the master bit for bit), with no copy beside it.
  static constexpr bool kHostCompute = std::is_same_v<Param, float>;

  ModelEngine(const Config& cfg, const parallel::ParallelContext* par, Ops ops = {})
      : cfg_(cfg),
        ctx_(par ? *par : parallel::ParallelContext{}),
        part_(model_part(cfg, ctx_)),
        model_(cfg, &ctx_, &part_,
               DataParallel::flat_size(DataParallel::regions_of(
                   ParamLayout(cfg, ctx_.tp_rank(), ctx_.tp_size(), &part_, Model::expert_shard(&ctx_)),
                   ctx_.weights_dp(), ctx_.expert_dp())),
               std::move(ops)),
        dp_(DataParallel::regions_of(model_.layout(), ctx_.weights_dp(), ctx_.expert_dp()), bucket_elems(cfg), chunk_ranges(),
            chunk_reads(), tied_embedding(), cfg.parallel.overlap_dp, model_.ops().comm_stream()) {
    if constexpr (!kHostCompute) {
      // The same draw as the model's compute copy, kept in fp32.
      h_params_.assign(static_cast<size_t>(model_.layout().total()), 0.0f);
      init_params(h_params_.data(), model_.layout(), cfg.model.seed);
      h_params_pinned_ = model_.ops().pin_host(h_params_.data(), h_params_.size() * sizeof(float));
    }
    const FlatRange tied = tied_embedding();
    if (tied.size() > 0) tied_other_.zeros(tied.size());
    // The op set's optimizer: found by overload (the CPU's, optim/optimizer.h) or by argument-
    // dependent lookup (the CUDA one, optim/cuda/cuda_optimizer.h).
    // The update writes the compute copy of what it owns; the all-gather brings the rest.
    optimizer_ = make_optimizer(model_.ops(), cfg.optim, model_.layout(), dp_.owned(),
                                [this](std::vector<double>& sums) { reduce_norms(sums); }, model_.params());
    int64_t packed = 0;
    for (const FlatRange& o : optimizer_->owned()) packed_at_.push_back(packed), packed += o.size();
    master_.zeros(std::max<int64_t>(packed, 1));
    master_from_host();
    const ParallelLayout layout = ParallelLayout::of(cfg, ctx_.dp_size());
    pipeline_ = std::make_unique<Pipeline<Model>>(
        model_,
        parallel::make_schedule(parallel::schedule_kind(layout.schedule), ctx_.pp_size(),
                                static_cast<int>(layout.virtual_stages), static_cast<int>(layout.micro_batches)),
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
    if (ctx_.cp_size() > 1)
      log::info("context parallel: ", ctx_.cp_size(), " ranks per sequence, this one holding ",
                cfg.model.seq_len / ctx_.cp_size(), " of its ", cfg.model.seq_len, " tokens (",
                cfg.data.document_mask ? cat("two of its ", 2 * ctx_.cp_size(), " chunks, paired per micro-batch by "
                                             "their documents' attention work")
                                       : cat("chunks ", ctx_.cp_rank(), " and ", 2 * ctx_.cp_size() - 1 - ctx_.cp_rank(),
                                             " of ", 2 * ctx_.cp_size()),
                ")");
    if (parallel::group_size(ctx_.weights_dp()) > 1 || ctx_.ep)
      log::info("data parallel: ", ctx_.dp_size(), " ranks", ctx_.cp ? cat(" x cp ", ctx_.cp_size()) : std::string(), ctx_.ep ? cat(" (experts: ep ", ctx_.ep_size(), " x edp ",
                parallel::group_size(ctx_.edp), ")") : std::string(), ", ", dp_.buckets(),
                " gradient buckets; this rank updates ", optimizer_->m().size(), " of ",
                model_.layout().total(), " parameters");
  }

  const ParamLayout& layout() const override { return model_.layout(); }
  std::string device() const override { return model_.ops().device_name(); }
  double peak_flops() const override { return model_.ops().peak_flops(); }
  int64_t peak_memory() const override { return model_.ops().peak_bytes(); }

  // One optimizer step; every group's collectives are issued in the same order on each rank.
  StepResult train_step(Rows rows, int64_t step, double lr, bool stop = false) override {
    const int dp = ctx_.dp_size(), accum = pipeline_->schedule().m;
    const Rows mine = rows;  // (accum x micro_batch, T+1): this data-parallel rank's rows
    const double dp_waited = dp_.waited_s();
    model_.ops().clear_marks();
    model_.zero_grads();
    PipelineHooks hooks{[this, step](int c) {
                          fault::trigger(cat("fwd:", step));
                          ready_to_read(c);
                        },
                        [this, step](int c) {
                          fault::trigger(cat("bwd:", step));
                          dp_.chunk_done(c, model_.grads());
                        },
                        [step] { fault::trigger(cat("pp_recv:", step)); }};
    StepResult r;
    // The micro-batches the step's mean is over: those that count a target, on every rank.
    const int counted = counted_microbatches(mine, accum);
    if (counted == 0) {
      r.counted_nothing = true, r.lr = lr;
      return r;
    }
    {
      // The weights stay as they are until the update: FP8 may cast each once for the whole step.
      const auto fixed = model_.fix_weights();
      r.loss = step_loss(pipeline_->train(mine, 1.0f / float(counted), hooks));
    }
    if (cfg_.model.moe()) r.experts = expert_loads();
    if (counted < accum * dp) r.loss = float(double(r.loss) * (accum * dp) / counted);  // the empty ones added 0
    if (ctx_.cp_size() > 1 && mine.doc_starts) r.cp_imbalance = cp_imbalance(mine, int64_t(accum) * cfg_.train.micro_batch);
    if (!std::isfinite(r.loss)) throw nonfinite_loss(step, r.loss);
    set_phase("optimizer");  // the gradients' reductions, the norm, the update
    sync_tied_embedding();
    dp_.finish_reduce(model_.grads());  // the owned ranges now hold the sums over dp
    const int update_begins = model_.ops().mark();
    const std::vector<FlatRange> owned = dp_.owned();
    for (const FlatRange& o : owned) model_.finish_grads(o.begin, o.end);
    std::tie(r.grad_norm, r.stop) = grad_norm(owned, stop);
    r.lr = lr;
    optimizer_->step(master_.data(), model_.grads(), lr, clip_coefficient(r.grad_norm));
    update_router_bias(r.experts, owned);
    if (cfg_.fault.sdc_check_every > 0 && step % cfg_.fault.sdc_check_every == 0)
      for (int g = 0; g < dp_.regions(); ++g) owned_hash_[g] = hash_of(dp_.owned_by(g, parallel::group_rank(dp_.group(g))));
    const int update_ends = model_.ops().mark();
    fault::trigger(cat("dp_gather:", step));
    dp_.gather_params(model_.params(), sizeof(Param));  // awaited chunk by chunk by the next forward
    // The device's phase times, once the update is done (on a GPU: its event, not the device).
    const PipelineTimes& pt = pipeline_->times();
    r.times = {pt.forward_s, pt.backward_s, pt.wait_s + loss_wait_[0], dp_.waited_s() - dp_waited + loss_wait_[1],
               model_.ops().seconds(update_begins, update_ends)};
    if (trace::active()) {
      // The op set's timeline (CUDA events on a GPU) on the host clock: the update's last mark
      // completed just before now (seconds() waited for it), each mark that long before it.
      const int64_t end_us = trace::now_us();
      auto at = [&](int mark) { return end_us - int64_t(model_.ops().seconds(mark, update_ends) * 1e6); };
      for (const ComputeSpan& s : pipeline_->spans())
        trace::complete(s.name, "step", at(s.from), at(s.to), 0, {{"microbatch", s.microbatch}, {"chunk", s.chunk}});
      trace::complete("optimizer", "step", at(update_begins), end_us, 0);
    }
    // Activations are held from the first step on (a slot per micro-batch in flight).
    if (step == 1 && model_.ops().peak_bytes() > 0)
      log::info("device memory: ", model_.ops().peak_bytes() >> 20, " MiB held by this rank after its first "
                "step (weights and their compute copy, gradients, moments, activations of ",
                cfg_.train.micro_batch, "-row micro-batches)");
    return r;
  }

  float loss(Rows rows, int B) override {
    ready_to_read_all();
    return step_loss(ctx_.pp_size() > 1 ? pipeline_->evaluate(rows, B) : model_.loss(rows, B),
                     /*over_dp=*/false);
  }
  void last_logits(const int32_t* tokens, int B, int T, float* out) override {
    if (ctx_.pp_size() > 1)
      throw_input("sampling runs on the whole model: use myriad sample on the checkpoint");
    // The embedding's rows are read by id: an id past the table would read other memory.
    for (int64_t i = 0; i < int64_t(B) * T; ++i)
      if (tokens[i] < 0 || tokens[i] >= cfg_.model.vocab_size)
        throw_input("token id ", tokens[i], " (position ", i, ") is outside the model's vocabulary of ",
                    cfg_.model.vocab_size, " ids");
    ready_to_read_all();
    model_.last_logits(tokens, B, T, out);
  }
  double flops_per_token() const override { return model_.flops_per_token(); }

  // Weights and moments by the data-parallel owners of each piece (host_state().owned);
  // replicated tensors by tensor-parallel rank 0; the tied embedding by the first stage (the
  // last one holds a copy).
  bool writes_to_checkpoint(const ParamSpec& p) const override {
    if (p.replicated() && ctx_.tp_rank() != 0) return false;
    return p.name != "wte" || part_.embedding;
  }

  HostState host_state() override {
    float* params = nullptr;
    if constexpr (kHostCompute) params = model_.params();
    else params = h_params_.data();
    return {params, optimizer_->m().data(), optimizer_->v().data(), &optimizer_->steps_taken(),
            optimizer_->owned()};
  }
  bool host_state_is_live() const override { return kHostCompute; }
  std::vector<std::vector<uint64_t>> replica_hashes() override {
    dp_.wait_all_params();
    std::vector<std::vector<uint64_t>> out;
    for (int g = 0; g < dp_.regions(); ++g) {
      out.push_back({owned_hash_[g]});
      for (int o = 0; o < parallel::group_size(dp_.group(g)); ++o) out.back().push_back(hash_of(dp_.owned_by(g, o)));
    }
    return out;
  }
  // One bit of the compute copy the forward reads (bit 20 of its fp32 value: a bf16 mantissa bit
  // too, so the rounding back keeps the flip exactly).
  void flip_parameter_bit() override {
    dp_.wait_all_params();  // the flip must not travel with a gather still reading the buffer
    float x = 0;
    const int64_t at = model_.layout().dense_total() / 2;  // a parameter (not the experts' alignment gap)
    model_.ops().download(&x, model_.params() + at, 1);
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    bits ^= 1u << 20;
    std::memcpy(&x, &bits, 4);
    model_.ops().upload_params(model_.params() + at, &x, 1);
  }

  // The host state's weights are current on the owned ranges (the master's), which are what a
  // checkpoint writes; on a GPU the rest of h_params_ is whatever was last loaded.
  void state_to_host() override {
    dp_.wait_all_params();
    if constexpr (!kHostCompute)
      for (size_t k = 0; k < packed_at_.size(); ++k) {
        const FlatRange& o = optimizer_->owned()[k];
        model_.ops().download(h_params_.data() + o.begin, master_.data() + packed_at_[k], o.size());
      }
    optimizer_->state_to_host();
  }
  // After a load into the host state (every weight of the layout): the compute copy and the
  // owned master weights from it.
  void state_from_host() override {
    dp_.wait_all_params();
    if constexpr (!kHostCompute) model_.ops().upload_params(model_.params(), h_params_.data(), model_.layout().total());
    master_from_host();
    optimizer_->state_from_host();
  }

 private:
  // The owned ranges of the host state's weights into the packed master (at construction: the
  // same draw as the compute copy's).
  void master_from_host() {
    const float* host = host_state().params;
    for (size_t k = 0; k < packed_at_.size(); ++k) {
      const FlatRange& o = optimizer_->owned()[k];
      model_.ops().upload(master_.data() + packed_at_[k], host + o.begin, o.size());
    }
  }
  // Where flat offset `at`, inside an owned range, lives in the packed master.
  int64_t packed_of(int64_t at) const {
    const std::vector<FlatRange>& owned = optimizer_->owned();
    for (size_t k = 0; k < owned.size(); ++k)
      if (owned[k].begin <= at && at < owned[k].end) return packed_at_[k] + (at - owned[k].begin);
    MYRIAD_CHECK(false, "offset ", at, " is not in this rank's owned ranges");
    return -1;
  }

  // FNV-1a over the compute copy's weights in `ranges`, in order, as fp32 (read to the host; a
  // bf16's widening is exact, so equal hashes are equal bits).
  uint64_t hash_of(const std::vector<FlatRange>& ranges) {
    uint64_t h = 1469598103934665603ull;
    std::vector<float> host;
    for (const FlatRange& r : ranges) {
      host.resize(static_cast<size_t>(r.size()));
      model_.ops().download(host.data(), model_.params() + r.begin, r.size());
      const auto* b = reinterpret_cast<const unsigned char*>(host.data());
      for (size_t i = 0; i < host.size() * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
    }
    return h;
  }

  // Before chunk c's forward: the all-gathers of its weights have landed.
  void ready_to_read(int c) { dp_.wait_params(c); }
  void ready_to_read_all() {
    for (int c = 0; c < model_.num_chunks(); ++c) ready_to_read(c);
  }

  // This pipeline rank's chunks: virtual stage g = c * pp + stage.
  static ModelPart model_part(const Config& cfg, const parallel::ParallelContext& ctx) {
    const int p = ctx.pp_size(), s = ctx.pp_rank(), v = static_cast<int>(cfg.parallel.virtual_stages);
    // Balanced on forward FLOPs per token (model/flops.h): a layer's, the head's logits on the
    // last stage; the embedding is a lookup.
    const auto ranges = parallel::stage_layer_ranges(
        cfg.parallel.stage_layers, static_cast<int>(cfg.model.layers), p, v, model::layer_forward_flops(cfg.model),
        0, model::head_forward_flops(cfg.model, cfg.padded_vocab()));
    ModelPart part{{}, s == 0, s == p - 1};
    for (int c = 0; c < v; ++c) part.chunks.push_back(ranges[c * p + s]);
    return part;
  }

  // The flat ranges whose gradients chunk c completes: from its first layer to the next chunk's
  // (the first chunk from 0, the last to the end of the region: embeddings and final norm
  // included), in the layout's region of every other tensor and, for an MoE model, in its
  // expert region (the chunk's layers' experts).
  std::vector<std::vector<FlatRange>> chunk_ranges() const {
    const ParamLayout& l = model_.layout();
    const FlatRange experts = l.expert_region();
    auto first_of = [&](int layer, bool expert) {  // -1: none (a dense layer's experts)
      for (const ParamSpec& p : l.tensors())
        if (p.layer == layer && p.expert == expert) return p.offset;
      MYRIAD_CHECK(expert, "layer ", layer, " not in this rank's layout");
      return int64_t(-1);
    };
    const auto& chunks = part_.chunks;
    std::vector<std::vector<FlatRange>> out;
    for (size_t c = 0; c < chunks.size(); ++c) {
      out.push_back({{c == 0 ? 0 : first_of(chunks[c].first, false),
                      c + 1 < chunks.size() ? first_of(chunks[c + 1].first, false) : l.dense_total()}});
      if (experts.size() == 0) continue;
      // Chunks whose layers are all dense hold no experts: their range is empty.
      auto expert_start = [&](size_t from) {
        for (size_t d = from; d < chunks.size(); ++d)
          for (int layer = chunks[d].first; layer < chunks[d].second; ++layer)
            if (const int64_t o = first_of(layer, true); o >= 0) return o;
        return experts.end;
      };
      out.back().push_back({expert_start(c), expert_start(c + 1)});
    }
    return out;
  }
  // The ranges chunk c's forward reads: its own, and the tied embedding for the LM head.
  std::vector<std::vector<FlatRange>> chunk_reads() const {
    std::vector<std::vector<FlatRange>> out = chunk_ranges();
    // An untied lm_head is the layout's last tensor, inside the last chunk's range already.
    if (part_.head && cfg_.model.tied_embeddings) {
      const ParamSpec& wte = model_.layout().find("wte");
      out.back().push_back({wte.offset, wte.offset + wte.numel});
    }
    return out;
  }
  // The wte copy that pipeline stages share (embedding on the first, LM head on the last).
  FlatRange tied_embedding() const {
    if (ctx_.pp_size() == 1 || !cfg_.model.tied_embeddings || !(part_.embedding || part_.head)) return {};
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
    comm::Stream stream = model_.ops().comm_stream();
    comm::WorkPtr sent = ctx_.pp->send(g, t.size(), peer, stream);
    ctx_.pp->recv(tied_other_.data(), t.size(), peer, stream)->wait();
    sent->wait();
    model_.ops().accumulate(g, tied_other_.data(), t.size());
  }

  // The micro-batches of the global batch that count at least one target: all accum x dp of
  // them, but with data.document_end_loss = false those whose every target begins a document
  // count none (summed over dp: every rank of a data-parallel replica holds the same rows).
  int counted_microbatches(Rows mine, int accum) {
    const int dp = ctx_.dp_size();
    if (cfg_.data.document_end_loss || !mine.doc_starts) return accum * dp;
    const int64_t mb = cfg_.train.micro_batch, T = cfg_.model.seq_len;
    int counted = 0;
    for (int i = 0; i < accum; ++i) counted += mine.from(i * mb, T).counted_targets(mb, T, false) > 0;
    return dp > 1 ? static_cast<int>(std::lround(parallel::sum_over_group(ctx_.dp, double(counted)))) : counted;
  }

  // Under cp with documents, how even the ranks' attention work was over this rank's rows of the
  // step: the busiest rank's (query, key) pairs against the mean (context_pairs), each
  // micro-batch's rows under the chunks its documents chose (context_assignment, as the model
  // does). Every rank holds the whole rows' document starts, so each counts every rank's share
  // alike. Two chunks a rank pair the heaviest with the lightest; what remains uneven is within
  // a chunk's documents (docs/notes/cp.md).
  double cp_imbalance(Rows mine, int64_t rows) const {
    const int64_t cp = ctx_.cp_size(), T = cfg_.model.seq_len, mb = cfg_.train.micro_batch, stride = T + 1;
    std::vector<int64_t> pairs(static_cast<size_t>(cp), 0);
    for (int64_t b0 = 0; b0 < rows; b0 += mb) {
      const int32_t* starts = mine.doc_starts + b0 * stride;
      const std::vector<ContextRows> ranks = context_assignment(T, cp, starts, mb, stride, cfg_.model.window);
      for (int64_t b = 0; b < mb; ++b)
        for (int64_t q = 0; q < cp; ++q)
          pairs[q] += context_pairs(ranks[q], starts + b * stride, cfg_.model.window);
    }
    const int64_t sum = std::accumulate(pairs.begin(), pairs.end(), int64_t(0));
    return sum > 0 ? double(*std::max_element(pairs.begin(), pairs.end())) * double(cp) / double(sum) : 0.0;
  }

  // The step's routing, job-wide: each MoE layer's rows per expert summed over the tensor-,
  // context- and data-parallel ranks' micro-batches, its losses averaged over them; the stages' layers gathered over the
  // pipeline (each stage fills its own, zeros elsewhere). Every rank gets all of it.
  std::vector<ExpertLoad> expert_loads() {
    const ModelConfig& m = cfg_.model;
    const int64_t E = m.experts, width = E + 4;  // counts, aux, z, micro-batches, dropped
    std::vector<int64_t> layers;
    for (int64_t l = 0; l < m.layers; ++l)
      if (m.layer_is_moe(l)) layers.push_back(l);
    std::vector<double> packed(layers.size() * width, 0.0);
    for (const auto& st : model_.take_route_stats()) {
      double* at = packed.data() + (std::find(layers.begin(), layers.end(), st.layer) - layers.begin()) * width;
      for (int64_t e = 0; e < E; ++e) at[e] = double(st.counts[e]);
      at[E] = st.aux, at[E + 1] = st.z, at[E + 2] = double(st.micro_batches), at[E + 3] = double(st.dropped);
    }
    // Under tp each rank routed its share of the tokens (its losses are the micro-batch's, so the
    // means below count each tp rank's copy alike).
    if (ctx_.tp_size() > 1) parallel::sum_over_group(ctx_.tp, packed.data(), int64_t(packed.size()));
    if (ctx_.cp_size() > 1) parallel::sum_over_group(ctx_.cp, packed.data(), int64_t(packed.size()));
    if (ctx_.dp_size() > 1) parallel::sum_over_group(ctx_.dp, packed.data(), int64_t(packed.size()));
    if (ctx_.pp_size() > 1) parallel::sum_over_group(ctx_.pp, packed.data(), int64_t(packed.size()));
    std::vector<ExpertLoad> out;
    for (size_t j = 0; j < layers.size(); ++j) {
      const double* at = packed.data() + j * width;
      const double n = std::max(at[E + 2], 1.0);
      out.push_back({layers[j], std::vector<double>(at, at + E), at[E + 3], at[E] / n, at[E + 1] / n});
    }
    return out;
  }

  // DeepSeek-V3's auxiliary-loss-free balancing (model.router_bias): each MoE layer's bias on
  // its owned elements moves by moe.bias_rate toward the step's mean load, bias_e += rate x
  // sign(mean - load_e), from the job-wide loads every rank holds alike; the all-gather that
  // follows brings it to the replicas.
  void update_router_bias(const std::vector<ExpertLoad>& loads, const std::vector<FlatRange>& owned) {
    if (!cfg_.model.router_bias || cfg_.moe.bias_rate <= 0) return;
    for (const ExpertLoad& x : loads) {
      const ParamSpec* p = model_.layout().get(cat("h.", x.layer, ".mlp.router.bias"));
      if (!p) continue;  // another stage's layer
      double mean = 0;
      for (double t : x.tokens) mean += t / double(x.tokens.size());
      for (const FlatRange& o : owned) {
        const int64_t b = std::max(o.begin, p->offset), e = std::min(o.end, p->offset + p->numel);
        if (b >= e) continue;
        std::vector<float> bias(static_cast<size_t>(e - b));
        float* master = master_.data() + packed_of(b);  // an owned range holds [b, e) whole
        model_.ops().download(bias.data(), master, e - b);
        for (int64_t i = b; i < e; ++i) {
          const double load = x.tokens[static_cast<size_t>(i - p->offset)];
          bias[i - b] += static_cast<float>(cfg_.moe.bias_rate * double((mean > load) - (mean < load)));
        }
        model_.ops().upload(master, bias.data(), e - b);
        // The compute copy too: the update wrote it from the bias before this move, and the next
        // forward routes with it.
        model_.ops().cast_params(model_.params() + b, master, e - b);
      }
    }
  }

  // The step's loss lives on the last stage: summed over cp (each rank's part of every sequence's
  // mean), broadcast over the pipeline, averaged over dp.
  // The first exchanges of a step after its compute: the time they block is waiting for the
  // slowest peer (loss_wait_: pipeline, data parallel), counted with the phases' waits.
  float step_loss(float local, bool over_dp = true) {
    loss_wait_[0] = loss_wait_[1] = 0;
    if (ctx_.cp_size() > 1) {  // waits on the peers holding the same weights: counted with dp's
      const double t = now_s();
      local = static_cast<float>(parallel::sum_over_group(ctx_.cp, double(local)));
      loss_wait_[1] = now_s() - t;
    }
    if (ctx_.pp_size() > 1) {
      const double t = now_s();
      ctx_.pp->broadcast(&local, 1, ctx_.pp_size() - 1)->wait();
      loss_wait_[0] = now_s() - t;
    }
    if (over_dp && ctx_.dp_size() > 1) {
      const double t = now_s();
      local = static_cast<float>(parallel::sum_over_group(ctx_.dp, double(local)) / ctx_.dp_size());
      loss_wait_[1] += now_s() - t;
    }
    return local;
  }

  // The global L2 norm over every shard: split tensors summed over tp, replicated ones once,
  // the stages' disjoint layers over pp (the tied wte counted on the first stage only), the
  // owned pieces over dp (x cp). Identical bits on every rank.
  // With it, whether any rank passed `stop` (the flag summed beside the squares).
  std::pair<double, bool> grad_norm(const std::vector<FlatRange>& owned, bool stop) {
    std::vector<std::pair<int64_t, int64_t>> pieces;  // ascending: tensors in layout order
    std::vector<bool> replicated;
    for (const ParamSpec& p : model_.layout().tensors()) {
      if (p.name == "wte" && !part_.embedding) continue;  // the first stage's copy counts
      for (const FlatRange& o : owned) {
        const int64_t a = std::max(o.begin, p.offset), b = std::min(o.end, p.offset + p.numel);
        if (a < b) pieces.emplace_back(a, b), replicated.push_back(p.replicated());
      }
    }
    const std::vector<double> sums = model_.ops().sums_of_squares(model_.grads(), pieces);
    double split = 0, repl = 0;
    for (size_t i = 0; i < sums.size(); ++i) (replicated[i] ? repl : split) += sums[i];
    // {squares, stop flags}: summed over tp, then pp, then dp, which reaches every rank of the job.
    double v[2] = {split, stop ? 1.0 : 0.0};
    parallel::sum_over_group(ctx_.tp, v, 2);
    v[0] += repl;
    parallel::sum_over_group(ctx_.pp, v, 2);
    parallel::sum_over_group(ctx_.weights_dp(), v, 2);
    return {std::sqrt(v[0]), v[1] > 0};
  }

  // PyTorch's clipping rule: the factor the update multiplies each gradient by as it reads it.
  float clip_coefficient(double norm) const {
    const double coef = cfg_.optim.grad_clip / (norm + 1e-6);
    return cfg_.optim.grad_clip <= 0 || coef >= 1.0 ? 1.0f : static_cast<float>(coef);
  }

  // LAMB's per-tensor sums of squares: over dp (x cp) for every tensor, over tp for the split ones.
  void reduce_norms(std::vector<double>& sums) {
    parallel::sum_over_group(ctx_.weights_dp(), sums.data(), static_cast<int64_t>(sums.size()));
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
  Model model_;
  DataParallel dp_;
  typename Ops::template Buffer<float> master_;  // (owned elements, packed like the moments) fp32 master weights
  std::vector<int64_t> packed_at_;               // per owned range (optimizer_->owned()): its start in master_
  std::vector<float> h_params_;                  // (layout total) the weights' host copy for checkpoints (GPU)
  std::shared_ptr<void> h_params_pinned_;        // h_params_ page-locked (declared after it: unpinned first)
  typename Ops::template Buffer<float> tied_other_;  // (wte) the other stage's wte gradient
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Pipeline<Model>> pipeline_;
  double loss_wait_[2] = {0, 0};  // seconds the step's loss exchanges blocked: over pp, over dp
  uint64_t owned_hash_[2] = {0, 0};  // per region, replica_hashes()[g][0]: this rank's owned ranges after a checked update
};

}  // namespace myriad
