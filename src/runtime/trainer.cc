#include "runtime/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <filesystem>
#include <fstream>

#include "comm/communicator.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/files.h"
#include "core/log.h"
#include "core/parallel_layout.h"
#include "core/memory.h"
#include "core/preemption.h"
#include "core/worker_report.h"
#include "data/tokenizer.h"
#include "model/params.h"
#include "observe/trace.h"
#include "ops/fp8.h"
#include "optim/optimizer.h"
#include "runtime/engine.h"
#include "runtime/state.h"

namespace fs = std::filesystem;

namespace myriad {
namespace {

std::string human_duration(double s) {
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return cat(t / 3600, "h", (t % 3600) / 60, "m");
  if (t >= 60) return cat(t / 60, "m", t % 60, "s");
  return cat(t, "s");
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// The first [model] key whose value differs between two configs, as "key: a vs b", or "".
// A dense model and a mixture of experts, either way round: said first, whatever else differs.
std::string dense_or_moe(const ModelConfig& saved, const ModelConfig& now) {
  if (saved.moe() == now.moe()) return "";
  auto kind = [](const ModelConfig& m) { return m.moe() ? "a mixture of experts" : "a dense model"; };
  return cat("model.experts = ", saved.experts, " in the checkpoint (", kind(saved), ") but ", now.experts,
             " in the config (", kind(now), ")");
}

std::string model_difference(const Config& saved, const Config& now) {
  if (std::string d = dense_or_moe(saved.model, now.model); !d.empty()) return d;
  std::string diff;
  Config a = saved, b = now;
  a.model.positions = a.positions(), b.model.positions = b.positions();  // 0 stands for seq_len
  std::vector<std::pair<std::string, std::string>> va, vb;
  auto collect = [](std::vector<std::pair<std::string, std::string>>& out) {
    return [&out](const char* s, const char* k, const auto& field) {
      if (std::string(s) != "model" || std::string(k) == "seed") return;
      using T = std::decay_t<decltype(field)>;
      if constexpr (std::is_same_v<T, bool>) out.emplace_back(cat(s, ".", k), field ? "true" : "false");
      else if constexpr (std::is_arithmetic_v<T>) out.emplace_back(cat(s, ".", k), cat(field));
      else if constexpr (std::is_same_v<T, std::string>) out.emplace_back(cat(s, ".", k), "\"" + field + "\"");
    };
  };
  a.visit(collect(va));
  b.visit(collect(vb));
  for (size_t i = 0; i < va.size(); ++i)
    if (va[i].second != vb[i].second)
      return cat(va[i].first, " = ", va[i].second, " in the checkpoint but ", vb[i].second,
                 " in the config");
  return "";
}

// Why a checkpoint written under `saved` cannot give its weights to a model of `now` (""
// when it can): the keys that change how a tensor's elements are laid out, which equal shapes do
// not reveal (heads reorders the fused QKV rows), and the tokenizer, whose ids the embedding rows
// mean.
std::string weights_mismatch(const Config& saved, const std::string& saved_tokenizer, const Config& now) {
  const ModelConfig &a = saved.model, &b = now.model;
  if (std::string d = dense_or_moe(a, b); !d.empty()) return d;
  // Which layers are MoE and the experts' shapes (the number per token does not change a tensor).
  std::vector<int64_t> moe_a, moe_b;
  for (int64_t l = 0; l < std::min(a.layers, b.layers); ++l) moe_a.push_back(a.layer_is_moe(l)), moe_b.push_back(b.layer_is_moe(l));
  if (moe_a != moe_b)
    return cat("model.dense_layers = ", a.dense_layers, " and model.moe_every = ", a.moe_every,
               " in the checkpoint but ", b.dense_layers, " and ", b.moe_every, " in the config (other layers are MoE)");
  for (const auto& [key, x, y] : {std::tuple<const char*, int64_t, int64_t>{"model.layers", a.layers, b.layers},
                                  {"model.d_model", a.d_model, b.d_model},
                                  {"model.heads", a.heads, b.heads},
                                  {"model.kv_heads", a.kv(), b.kv()},
                                  {"model.mlp_hidden", a.moe_layers() < a.layers ? a.ffn() : 0,
                                   b.moe_layers() < b.layers ? b.ffn() : 0},  // the dense layers' MLP
                                  {"model.experts", a.experts, b.experts},
                                  {"model.expert_hidden", a.moe() ? a.expert_ffn() : 0, b.moe() ? b.expert_ffn() : 0},
                                  {"model.shared_experts x shared_expert_hidden", a.shared_ffn(), b.shared_ffn()},
                                  {"model.vocab_size", a.vocab_size, b.vocab_size}})
    if (x != y) return cat(key, " = ", x, " in the checkpoint but ", y, " in the config");
  for (const auto& [key, x, y] : {std::tuple<const char*, std::string, std::string>{"model.norm", a.norm, b.norm},
                                  {"model.position_encoding", a.position_encoding, b.position_encoding},
                                  {"model.mlp", a.mlp, b.mlp}})
    if (x != y) return cat(key, " = \"", x, "\" in the checkpoint but \"", y, "\" in the config");
  // RoPE's theta and scaling may change (a context extension starts from a shorter model's weights).
  for (const auto& [key, x, y] : {std::tuple<const char*, bool, bool>{"model.bias", a.bias, b.bias},
                                  {"model.tied_embeddings", a.tied_embeddings, b.tied_embeddings}})
    if (x != y)
      return cat(key, " = ", x ? "true" : "false", " in the checkpoint but ", y ? "true" : "false", " in the config");
  if (saved_tokenizer != now.data.tokenizer)
    return cat("its token ids are the ", saved_tokenizer, " tokenizer's but data.tokenizer = \"", now.data.tokenizer,
               "\"");
  return "";
}

// The tokenizer a checkpoint's token ids belong to (meta.json's, else its config's).
std::string tokenizer_of(const checkpoint::Meta& meta, const Config& saved) {
  return meta.tokenizer.empty() ? saved.data.tokenizer : meta.tokenizer;
}

// Building the engine allocates every buffer the model plan holds: running out of memory there
// is a plan that cannot fit, which a retry does not fix (an input error, not a runtime fault).
std::unique_ptr<Engine> make_planned_engine(const Config& cfg, const parallel::ParallelContext* ctx,
                                            const std::string& gemm_choices) {
  try {
    return make_engine(cfg, ctx, gemm_choices);
  } catch (const std::bad_alloc&) {
    const double P = double(ParamLayout(cfg).total());
    const int ranks = ctx ? ctx->tp_size() * ctx->pp_size() : 1;
    throw_input("out of host memory while allocating the model: ", cat(int64_t(P)),
                " parameters, about ", fmt("%.1f", P * 16 / ranks / double(1 << 30)),
                " GiB per rank for weights, gradients and two optimizer moments before activations"
                " (over tp x pp = ", ranks, "); use a smaller model or more ranks (parallel.tp, parallel.pp)");
  }
}

}  // namespace

std::unique_ptr<data::IndexedDataset> Trainer::open_data(const std::string& prefix, const char* key) {
  // A model smaller than the tokenizer's vocabulary trains on these ids but cannot be sampled
  // (nor trained on other text of the same tokenizer). Larger is fine: 64000 on gpt2 data.
  const int64_t tokenizer_vocab = data::tokenizer_vocab_size(cfg_.data.tokenizer);
  if (cfg_.model.vocab_size < tokenizer_vocab)
    throw_input("config: model.vocab_size (", cfg_.model.vocab_size, ") is below the ",
                cfg_.data.tokenizer, " tokenizer's vocabulary (", tokenizer_vocab,
                "): set model.vocab_size to at least ", tokenizer_vocab);
  // The sidecar's tokenizer and vocabulary before the token ids: they say what is wrong better
  // than an id out of range does.
  auto d = std::make_unique<data::IndexedDataset>(prefix);
  const data::DatasetInfo& info = d->info();
  if (!info.tokenizer.empty() && info.tokenizer != cfg_.data.tokenizer)
    throw_input(prefix, ".json: ", key, " was prepared with the ", info.tokenizer,
                " tokenizer but data.tokenizer = \"", cfg_.data.tokenizer, "\"");
  if (cfg_.model.vocab_size < info.vocab_size)
    throw_input(prefix, ".json: ", key, " has a vocabulary of ", info.vocab_size,
                " but model.vocab_size = ", cfg_.model.vocab_size,
                ": set model.vocab_size to at least ", info.vocab_size);
  d->check_tokens(cfg_.model.vocab_size);
  // Fewer than one sample is an input error naming the file.
  data::num_samples(*d, cfg_.model.seq_len);
  // Without the targets that begin documents, a file of one-token documents counts none: its
  // loss would be no number at all (trained as 0, evaluated as NaN).
  if (cfg_.data.document_mask && !cfg_.data.document_end_loss && !data::has_counted_target(*d, cfg_.model.seq_len))
    throw_input(prefix, ": ", key, " has only one-token documents, so with data.document_end_loss = false no target "
                "of it counts (each begins a document): set data.document_end_loss = true, or leave this source out");
  return d;
}

namespace {
// A number from the launcher's environment (MYRIAD_NODE_RANK, ...), 0 when unset.
int env_or_zero(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : 0;
}
}  // namespace

Trainer::Trainer(const Config& cfg, const std::string& run_dir)
    : cfg_(cfg), run_dir_(run_dir), heartbeat_(cfg.fault.startup_timeout_s) {
  dist_ = Distributed::from_env(cfg_);
  if (dist_) heartbeat_.watch(dist_->groups());
  if (const int64_t ranks = ParallelLayout::of(cfg_).ranks(); !dist_ && ranks != 1)
    throw_input("config: parallel.tp x pp x ", cfg_.parallel.cp > 1 ? "cp x " : "", "dp = ", ranks,
                " processes, but this is one process: start it with myriad launch --nproc-per-node N");
  if (cfg_.data.train.empty())
    throw_input("config: data.train is empty: set it to a prefix made by `myriad prepare` "
                "(--set data.train=PREFIX)");

  std::vector<int64_t> samples;
  for (const DataSource& d : cfg_.data.train) {
    train_files_.push_back(open_data(d.path, cat("data.train's source '", d.name, "'").c_str()));
    samples.push_back(data::num_samples(*train_files_.back(), cfg_.model.seq_len));
  }
  for (const DataSource& d : cfg_.data.valid) valid_files_.push_back(open_data(d.path, cat("data.valid's source '", d.name, "'").c_str()));
  blend_ = std::make_unique<data::Blend>(cfg_.data.train, samples);
  // With every source capped the run must fit in the samples they hold.
  if (const int64_t capacity = blend_->capacity(); capacity >= 0 && capacity < cfg_.train.steps * cfg_.train.global_batch)
    throw_input("config: data.train's sources are all capped (epochs) at ", capacity, " samples in all, but train.steps x "
                "train.global_batch = ", cfg_.train.steps * cfg_.train.global_batch,
                ": raise a source's epochs (or set 0: no cap), or lower train.steps");

  // Where the run writes must be writable before anything trains: a save that fails at the
  // first checkpoint would lose the steps before it.
  require_writable_dir((fs::path(run_dir_) / "logs").string(), "run directory", "choose a writable --run-dir");
  checkpoint::check_writable(checkpoint_root());
  refuse_foreign_checkpoints();
  if (!dist_ || dist_->rank() == 0) checkpoint::remove_leftovers(checkpoint_root());
  start_id_ = std::to_string(dist_ ? dist_->start_id()
                                   : static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) % 1000000007);

  // The GEMM algorithms a GPU run chooses (model/cuda/matmul.h), kept with the run: its restart
  // does not retune and computes bit for bit as before.
  const std::string algos = (fs::path(run_dir_) / cat("gemm_algos.rank", dist_ ? dist_->rank() : 0, ".txt")).string();
  engine_ = make_planned_engine(cfg_, dist_ ? dist_->context() : nullptr, algos);
  // What a checkpoint holds (runtime/state.h): every save and resume asks these.
  state_ = run_state(*engine_, cfg_, step_, *blend_, recent_loss_.values(), cfg_.train.skip_steps);
  if (cfg_.observe.trace) {
    const int64_t offset = dist_ ? dist_->clock_offset_us() : 0;
    const int rank = dist_ ? dist_->rank() : 0;
    trace::open((fs::path(run_dir_) / "traces").string(), rank,
                dist_ ? cat("rank ", rank, " (node ", env_or_zero("MYRIAD_NODE_RANK"), ", ", dist_->coordinates(), ")")
                      : std::string("rank 0"),
                cfg_.observe.trace_every, offset);
    if (offset != 0) log::info("trace: this rank's clock runs ", offset, " us ahead of rank 0's");
    if (dist_)  // the start-up's operations are not the steps'
      for (comm::Communicator* g : dist_->groups())
        if (const std::vector<comm::OpRecord> recs = g->records(); !recs.empty()) traced_seq_[g->name()] = recs.back().seq;
  }

  std::string resume = cfg_.checkpoint.resume;
  if (resume == "auto") resume_latest_good();
  else if (resume != "none") resume_from(resume);
  if (step_ > cfg_.train.steps)
    throw_input("config: train.steps = ", cfg_.train.steps, " but the checkpoint resumed is at step ",
                step_, ": raise train.steps above ", step_, " to train on, or use a new run directory");
  if (step_ == cfg_.train.steps && step_ > 0)
    log::info("resume: the run is complete (train.steps = ", step_, "); nothing to train");
  if (step_ == 0 && !cfg_.checkpoint.init_from.empty()) init_from(cfg_.checkpoint.init_from);
  // One process writes what is written once per run: the rank holding the final loss.
  if (!dist_ || dist_->writes_metrics()) {
    std::ofstream out(fs::path(run_dir_) / "config.toml");
    out << to_toml(cfg_);
    metrics_ = std::make_unique<MetricsWriter>(
        (fs::path(run_dir_) / "metrics.jsonl").string(), step_,
        cfg_.observe.tensorboard ? (fs::path(run_dir_) / "tensorboard").string() : "");
  }
  // Each data-parallel rank reads only its rows of the global batch: [dp_rank x rows, + rows).
  const int64_t dp = dist_ ? dist_->context()->dp_size() : 1;
  rows_ = cfg_.train.global_batch / dp;
  const int64_t first_row = dist_ ? dist_->dp_rank() * rows_ : 0;
  if (dist_) shared_ = dist_->shared_batch(batch_ints(), cfg_.comm.timeout_s);
  if (dp > 1)
    log::info("data: this rank reads rows [", first_row, ", ", first_row + rows_, ") of each global batch of ",
              cfg_.train.global_batch);
  if (shared_) log::info("data: one reader per tensor-parallel group, batches shared through memory");
  if (!shared_ || dist_->tp_rank() == 0) {
    std::vector<data::SourceFile> files;
    for (size_t s = 0; s < train_files_.size(); ++s)
      files.push_back({train_files_[s].get(), data::source_seed(cfg_.train.seed, blend_->name(int(s)), blend_->order(int(s)))});
    loader_ = std::make_unique<data::BatchLoader>(std::move(files), *blend_, cfg_.model.seq_len, /*shuffle=*/true,
                                                  cfg_.train.global_batch, first_row, rows_,
                                                  cfg_.data.document_mask);
  }
  // The copy an asynchronous save takes of the CPU's live state: allocated, and its pages
  // touched, here rather than in the step of the first save.
  if (cfg_.checkpoint.async && engine_->host_state_is_live()) {
    int64_t total = 0;
    for (const checkpoint::Shard& s : checkpoint::shards_of(state_, true)) total += s.numel();
    snapshot_.assign(static_cast<size_t>(total), 0.0f);
  }
}

Trainer::~Trainer() { trace::close(); }

// The run directory's rule: a fresh run (checkpoint.resume = none) never writes where committed
// checkpoints are. Its saves would take their step numbers and its pruning their places, so the
// run that wrote them would lose them; it is refused before it changes anything. --resume auto
// continues them, and --resume DIR says which checkpoint the run goes on from.
void Trainer::refuse_foreign_checkpoints() const {
  if (cfg_.checkpoint.resume != "none") return;
  const std::vector<std::string> found = checkpoint::committed_newest_first(checkpoint_root());
  if (found.empty()) return;
  std::string names;
  for (size_t i = 0; i < found.size() && i < 3; ++i)
    names += cat(i ? ", " : "", fs::path(found[i]).filename().string());
  if (found.size() > 3) names += cat(" and ", found.size() - 3, " more");
  throw_input("checkpoint directory ", checkpoint_root(), " holds committed checkpoints of an earlier run (", names,
              "), which a fresh run would overwrite and prune: continue that run with --resume auto, train in a new "
              "--run-dir, or move its checkpoints away first");
}

// The communication of the steps traced: each group's operations completed since the last call,
// on lane 1, with the flows that tie them across ranks (observe/trace.h). Called after every
// step: the operations of steps not traced (and of the start-up) are passed over.
void Trainer::trace_collectives() {
  if (!dist_ || !cfg_.observe.trace) return;  // untraced runs copy no records
  const bool keep = trace::active();
  for (comm::Communicator* g : dist_->groups()) {
    uint64_t& seen = traced_seq_[g->name()];
    const std::vector<int>& members = g->members();
    auto global = [&](int group_rank) {
      return group_rank >= 0 && group_rank < int(members.size()) ? members[group_rank] : group_rank;
    };
    for (const comm::OpRecord& r : g->records()) {
      if (r.seq <= seen || r.state == comm::OpState::kQueued || r.state == comm::OpState::kRunning) continue;
      seen = r.seq;
      if (!keep || r.state != comm::OpState::kDone) continue;
      const int64_t t0 = trace::from_system_us(r.started_us ? r.started_us : r.queued_us);
      const int64_t t1 = trace::from_system_us(r.ended_us);
      nlohmann::json args = {{"group", g->name()}, {"match", r.match}, {"bytes", r.bytes}};
      if (r.peer >= 0) args["peer"] = global(r.peer);
      trace::complete(cat(comm::op_name(r.op), " ", g->name()), "comm", t0, t1, 1, std::move(args));
      // A message is the n-th between its sender and receiver; a collective the n-th of the group.
      const std::hash<std::string> h;
      const int me = dist_->rank();
      if (r.op == comm::OpKind::kSend) trace::flow(true, h(cat(g->name(), "#", r.match, "#", me, ">", global(r.peer))), t0, 1);
      else if (r.op == comm::OpKind::kRecv) trace::flow(false, h(cat(g->name(), "#", r.match, "#", global(r.peer), ">", me)), t1, 1);
      else if (g->size() > 1 && g->rank() == 0)
        for (int m = 1; m < g->size(); ++m) trace::flow(true, h(cat(g->name(), "#", r.match, "#", m)), t0, 1);
      else if (g->size() > 1)
        trace::flow(false, h(cat(g->name(), "#", r.match, "#", g->rank())), t0, 1);
    }
  }
}

// The step loop: a batch, the step, its checks, its record, evaluation and a save when due, the
// log line. What each step leaves for the launcher's watch (the heartbeat's allowance, its own
// time), the trace and the chaos run's injected faults are begin_step's, after_step's and
// end_step's.
Trainer::End Trainer::run() {
  const TrainConfig& t = cfg_.train;
  describe_start();
  while (step_ < t.steps) {
    const double t0 = now_s();
    begin_step();
    data::Batch batch = next_batch();  // (global_batch / dp, T+1): this rank's rows
    if (std::count(t.skip_steps.begin(), t.skip_steps.end(), step_ + 1)) {
      skip_step(batch, "train.skip_steps");
      continue;
    }
    StepResult r = engine_->train_step(rows_of(batch), step_ + 1, lr_at(cfg_.optim, step_, t.steps),
                                       preemption::requested());
    if (r.counted_nothing) {
      skip_step(batch, "no target of its batch counts: each begins a document, and data.document_end_loss = false");
      continue;
    }
    ++step_;
    take_position(batch);
    const std::string injected = after_step(r);  // a chaos run's faults on the results, then the checks
    nlohmann::json rec = step_record(r, now_s() - t0);
    if (eval_due()) {
      set_phase("eval");
      trace::Span span("eval");
      evaluate(rec);
    }
    if (blend_->size() > 1)
      for (int s = 0; s < blend_->size(); ++s) rec["epochs/" + blend_->name(s)] = blend_->epochs_taken(s);
    if (save_due()) {
      set_phase("checkpoint");
      trace::Span span("checkpoint");
      save_checkpoint();
      // What the save cost the step: its time so far (the check and the evaluation included, as
      // in any step) less the median step's (at least 0: a save that cost nothing leaves only
      // the step times' noise).
      rec["checkpoint_stall_ms"] = std::max(0.0, now_s() - t0 - step_s_.median()) * 1e3;
    }
    log_step(rec, r);
    end_step(r, injected, rec["step_ms"].get<double>() / 1e3);
    if (r.stop && step_ < t.steps) return stop_preempted();
  }
  // The last save is written before the run ends, and its failure is the run's; meanwhile the
  // launcher allows what it allows any save.
  set_phase("checkpoint");
  heartbeat_.set(step_, cfg_.fault.startup_timeout_s);
  writer_.wait();
  trace_written_save();
  return End::kDone;
}

void Trainer::describe_start() {
  const TrainConfig& t = cfg_.train;
  log::info("model: ", engine_->layout().total(), dist_ ? " parameters on this rank (" : " parameters (", cfg_.model.layers,
            " layers, d_model ", cfg_.model.d_model, ", ", cfg_.model.heads, " heads, seq_len ", cfg_.model.seq_len,
            ", vocab ", cfg_.model.vocab_size, " padded to ", cfg_.padded_vocab(), ")");
  log::info("train: steps ", step_ + 1, "..", t.steps, ", ", t.global_batch, " sequences x ", cfg_.model.seq_len,
            " tokens per step, micro-batch ", t.micro_batch, ", ", engine_->device(), ", ", cfg_.optim.name);
  if (t.precision == "fp8") log::info("precision: ", fp8::describe(fp8::recipe_of(t)));
  if (const std::string w = schedule_warning(cfg_.optim, t.steps); !w.empty()) log::warn("schedule: ", w);
  describe_blend();
  if (cfg_.data.document_mask)
    log::info("data: attention stays inside each document packed in a row (its start from the .idx document index; "
              "positions run on across documents)");
  log::info("memory: optimizer state ", memory_bytes(MemoryKind::kOptimizerState), " bytes on this rank (",
            engine_->layout().total(), " parameters here)");
}

// The step under way, for the heartbeat, the trace and a chaos run's faults armed for it.
void Trainer::begin_step() {
  set_phase("data");
  trace::set_step(step_ + 1);
  fault::poll_live(step_ + 1);  // core/fault.h
}

// Injected faults that act on the step's results (a chaos run's: nan, spike, flip), then the
// checks that catch such faults: the loss, and every fault.sdc_check_every steps the replicas.
// The injection left for end_step to carry out.
std::string Trainer::after_step(StepResult& r) {
  const std::string injected = fault::action(cat("step:", step_));
  if (injected == "nan") r.loss = std::numeric_limits<float>::quiet_NaN();
  if (injected == "spike") r.loss *= 1000.0f;
  if (injected == "flip") engine_->flip_parameter_bit();
  check_loss(r.loss);
  if (cfg_.fault.sdc_check_every > 0 && step_ % cfg_.fault.sdc_check_every == 0) check_replicas();
  return injected;
}

// The step's record for metrics.jsonl (and TensorBoard), and the heartbeat's word on it: how
// long the launcher may see no new step before it calls the job stalled, the observed step time
// (fault.stall_factor x the median of the last 21 steps, at least fault.stall_floor_s), as
// NVIDIA's resiliency extension times its sections, or fault.step_timeout_s when set;
// evaluations and saves get the start-up allowance.
nlohmann::json Trainer::step_record(const StepResult& r, double dt) {
  const double tokens_per_step = double(cfg_.train.global_batch) * cfg_.model.seq_len;
  if (step_ > 1 || cfg_.train.steps == 1) elapsed_s_ += dt, ++timed_;  // the first step warms caches
  nlohmann::json rec = {{"step", step_}, {"loss", r.loss}, {"lr", r.lr},
                        {"grad_norm", r.grad_norm}, {"tokens_per_s", tokens_per_step / dt},
                        {"step_ms", dt * 1e3}, {"time", comm::wall_us() * 1e-6}};
  if (r.times.forward_s > 0) {  // the engine times its phases
    rec["forward_ms"] = r.times.forward_s * 1e3, rec["backward_ms"] = r.times.backward_s * 1e3;
    if (cfg_.parallel.pp > 1) rec["bubble_ms"] = r.times.bubble_s * 1e3;
    if (dist_ && parallel::group_size(dist_->context()->weights_dp()) > 1) rec["dp_wait_ms"] = r.times.dp_wait_s * 1e3;
    rec["optimizer_ms"] = r.times.optimizer_s * 1e3;
  }
  if (engine_->peak_memory() > 0) rec["peak_memory_gib"] = double(engine_->peak_memory()) / (1 << 30);
  if (!r.experts.empty()) {
    // Each MoE layer's load over the global batch: rows per expert and max / mean (1 when
    // balanced); the routers' losses summed over the layers, as the gradients take them.
    double aux = 0, z = 0, dropped = 0;
    nlohmann::json load = nlohmann::json::object();
    for (const ExpertLoad& x : r.experts) {
      double sum = 0, mx = 0;
      for (double t : x.tokens) sum += t, mx = std::max(mx, t);
      load[std::to_string(x.layer)] = x.tokens;
      rec[cat("expert_imbalance/", x.layer)] = sum > 0 ? mx / (sum / double(x.tokens.size())) : 0.0;
      aux += x.aux_loss, z += x.z_loss, dropped += x.dropped;
    }
    rec["expert_load"] = load;
    rec["moe_aux_loss"] = aux, rec["moe_z_loss"] = z;
    if (cfg_.moe.capacity_factor > 0) rec["moe_dropped"] = dropped;  // rows, over the layers
  }
  if (r.cp_imbalance > 0) rec["cp_imbalance"] = r.cp_imbalance;  // attention's pairs, busiest cp rank / mean
  if (engine_->peak_flops() > 0)
    rec["mfu"] = tokens_per_step / dt * engine_->flops_per_token() / engine_->peak_flops();
  step_s_.push(dt);
  allowance_s_ = cfg_.fault.step_timeout_s > 0 ? cfg_.fault.step_timeout_s
                                               : std::max(cfg_.fault.stall_floor_s, cfg_.fault.stall_factor * step_s_.median());
  heartbeat_.set_rate(dt * 1e3, tokens_per_step / dt);
  heartbeat_.set(step_, cfg_.fault.startup_timeout_s);
  heartbeat_.step_done(step_);
  return rec;
}

void Trainer::log_step(const nlohmann::json& rec, const StepResult& r) {
  const TrainConfig& t = cfg_.train;
  if (!(step_ % t.log_every == 0 || step_ == t.steps || rec.contains("val_loss") || rec.contains("checkpoint_stall_ms")))
    return;
  if (metrics_) metrics_->write(rec);
  const double dt = rec["step_ms"].get<double>() / 1e3;
  const double eta = timed_ ? elapsed_s_ / timed_ * (t.steps - step_) : 0;
  log::info("step ", step_, "/", t.steps, " | loss ", fmt("%.4f", r.loss),
            rec.contains("val_loss") ? " | val " + fmt("%.4f", rec["val_loss"].get<double>()) : "", " | lr ",
            fmt("%.2e", r.lr), " | grad norm ", fmt("%.3f", r.grad_norm), " | ",
            fmt("%.0f", double(t.global_batch) * cfg_.model.seq_len / dt), " tok/s | ETA ", human_duration(eta));
}

// After the step's record: a background save's failure fails the run now; the trace's last save
// and collectives; the heartbeat's allowance and the step's own time (from the end of the last
// one, less the waits on its peers: what the launcher's straggler check compares); then what a
// chaos run injected for the end of the step (a kill, a hang, a slower device).
void Trainer::end_step(const StepResult& r, const std::string& injected, double step_s) {
  writer_.poll();
  trace_written_save();
  trace_collectives();
  heartbeat_.set(step_, allowance_s_);
  set_phase("data");
  const double end = now_s();
  if (last_end_ > 0) {
    const double own_s = end - last_end_ - r.times.bubble_s - r.times.dp_wait_s;
    const int64_t trace_end = trace::now_us();
    trace::complete("step", "step", trace_end - int64_t((end - last_end_) * 1e6), trace_end, 2, {{"own_ms", own_s * 1e3}});
    own_s_.push(own_s);
    heartbeat_.set_own_ms(own_s_.median() * 1e3);
  }
  last_end_ = end;
  fault::carry_out(injected, cat("step:", step_));
  // slow:xK: K times the step's own compute (its time to the record, less the waits on peers).
  const double own_ms = (step_s - r.times.bubble_s - r.times.dp_wait_s) * 1e3;
  if (const int ms = fault::delay_ms(own_ms); ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// Every rank was told at this step that one was preempted: this step is saved (unless it just
// was), and the save committed, before the process exits (core/preemption.h bounds the time).
Trainer::End Trainer::stop_preempted() {
  preemption::begin_save();
  log::warn("preempted: saving step ", step_, " (a further signal now ends the process at once)");
  set_phase("checkpoint");
  heartbeat_.set(step_, cfg_.fault.startup_timeout_s);
  if (saved_step_ != step_) save_checkpoint(/*always=*/true);
  writer_.wait();
  trace_written_save();
  log::warn("preempted: step ", step_, " of ", cfg_.train.steps, " is saved under ", checkpoint_root(),
            "; --resume auto continues from it");
  return End::kPreempted;
}

// The step's batch, read (so that every later step trains on the batch it would have had), is
// dropped: no update. The step still evaluates and saves when due. `why` is said once for a
// skip_steps entry each, and once per run for a batch that counts no target.
void Trainer::skip_step(const data::Batch& batch, const std::string& why) {
  ++step_;
  take_position(batch);
  const bool listed = why == "train.skip_steps";
  if (listed || !said_no_target_)
    log::warn("step ", step_, "/", cfg_.train.steps, " skipped: its batch is dropped (", why, ")",
              listed ? "" : "; later such steps are marked \"skipped\" in metrics.jsonl without a word here");
  said_no_target_ = said_no_target_ || !listed;
  nlohmann::json rec = {{"step", step_}, {"skipped", true}};
  if (!listed) rec["counted_targets"] = 0;
  heartbeat_.set(step_, cfg_.fault.startup_timeout_s);  // an evaluation or a save may follow
  if (eval_due()) {
    set_phase("eval");
    evaluate(rec);
  }
  if (save_due()) {
    set_phase("checkpoint");
    save_checkpoint();
  }
  if (metrics_) metrics_->write(rec);
  writer_.poll();
  trace_written_save();
  heartbeat_.set(step_, allowance_s_ > 0 ? allowance_s_ : cfg_.fault.startup_timeout_s);
  set_phase("data");
  last_end_ = now_s();  // the next step's own time starts here
}

bool Trainer::eval_due() const {
  const int64_t every = cfg_.train.eval_every;
  return !valid_files_.empty() && every > 0 && (step_ % every == 0 || step_ == cfg_.train.steps);
}

bool Trainer::save_due() const {
  const int64_t every = cfg_.checkpoint.every;
  return (every > 0 && step_ % every == 0) || step_ == cfg_.train.steps;
}

// A non-finite loss, or (fault.spike_factor) one far above the recent median: a numerics fault,
// raised before the step is saved, so that the restart resumes from the checkpoint before it.
void Trainer::check_loss(float loss) {
  if (!std::isfinite(loss)) throw nonfinite_loss(step_, loss);
  const double f = cfg_.fault.spike_factor;
  if (f > 0 && recent_loss_.size() >= 5) {
    const double median = recent_loss_.median();
    if (loss > f * median)
      throw FaultError(FaultKind::kLoss, ErrorClass::kNumerics, step_,
                  cat("step ", step_, ": loss ", fmt("%.4f", loss), " is above fault.spike_factor (", f,
                      ") x the median of the last ", recent_loss_.size(), " steps (", fmt("%.4f", median),
                      "): a loss spike; resume from the checkpoint before it"));
  }
  recent_loss_.push(loss);
}

// fault.sdc_check_every: the data-parallel replicas exchange the hashes of what they hold after
// the all-gather (Engine::replica_hashes) and compare each copy with what its owner's update
// left, region by region: every tensor but the routed experts over dp, the experts over their
// data-parallel group. The rank whose copy differs stops with a runtime fault naming it; the
// others say so.
void Trainer::check_replicas() {
  if (!dist_) return;
  const std::vector<std::vector<uint64_t>> regions = engine_->replica_hashes();
  for (size_t r = 0; r < regions.size(); ++r) {
    comm::Communicator* group = r == 0 ? dist_->context()->weights_dp() : dist_->context()->expert_dp();
    if (!group || group->size() < 2) continue;
    const int n = group->size();
    std::vector<uint64_t> mine = regions[r];  // (1 + n)
    if (mine.size() != static_cast<size_t>(n) + 1) continue;
    mine.insert(mine.begin(), static_cast<uint64_t>(dist_->rank()));
    // Each rank's words travel exactly, their bytes carried as floats, which a gather only copies.
    const int64_t per = static_cast<int64_t>(mine.size()) * 2;
    std::vector<float> all(static_cast<size_t>(per * n));
    std::memcpy(all.data() + per * group->rank(), mine.data(), static_cast<size_t>(per) * 4);
    group->all_gather(all.data() + per * group->rank(), all.data(), per)->wait();
    auto word = [&](int q, int k) {
      uint64_t v;
      std::memcpy(&v, all.data() + per * q + 2 * k, 8);
      return v;
    };
    for (int q = 0; q < n; ++q)
      for (int o = 0; o < n; ++o) {
        if (word(q, 2 + o) == word(o, 1)) continue;
        const std::string what =
            cat("silent data corruption at step ", step_, ": rank ", word(q, 0), "'s copy of the parameters rank ",
                word(o, 0), " updates differs from what that update left", r > 0 ? " (its experts)" : "");
        if (q == group->rank())
          throw FaultError(FaultKind::kSdc, ErrorClass::kRuntime, step_,
                           cat(what, "; restarting from the latest checkpoint (check this rank's device if it recurs)"),
                           static_cast<int>(word(q, 0)));
        log::warn(what);
      }
  }
}

namespace {
// The blend's counters after a batch (consumed, since, and each source's taken and base), as the
// ints the shared batch carries to the members that do not read: the rest of the position
// (names, weights, caps, orders) they hold already. Each count in two ints, exactly.
std::vector<int32_t> counters_of(const data::BlendPosition& p) {
  std::vector<int64_t> all = {p.consumed, p.since};
  all.insert(all.end(), p.taken.begin(), p.taken.end());
  all.insert(all.end(), p.base.begin(), p.base.end());
  std::vector<int32_t> out(all.size() * 2);
  std::memcpy(out.data(), all.data(), all.size() * sizeof(int64_t));
  return out;
}
data::BlendPosition with_counters(data::BlendPosition p, const int32_t* ints) {
  const size_t n = p.taken.size();
  std::vector<int64_t> all(2 + 2 * n);
  std::memcpy(all.data(), ints, all.size() * sizeof(int64_t));
  p.consumed = all[0], p.since = all[1];
  std::copy(all.begin() + 2, all.begin() + 2 + n, p.taken.begin());
  std::copy(all.begin() + 2 + n, all.end(), p.base.begin());
  return p;
}
}  // namespace

data::Batch Trainer::next_batch() {
  trace::Span span("data");
  data::Batch b;
  // The shared batch's wait, as a group of the tensor-parallel ranks, for the hang report.
  const std::string group = shared_ ? cat("batch.", dist_->context()->tp->name()) : "";
  const std::vector<int> members = shared_ ? dist_->topology().group(parallel::Dim::kTp, dist_->rank()) : std::vector<int>{};
  // Shared as one block of ints: the tokens, the document starts when there are any, then the
  // blend's counters after the batch.
  std::vector<int32_t> ints;
  if (loader_) {
    b = loader_->next();
    if (shared_) {
      ints = b.tokens;
      ints.insert(ints.end(), b.doc_starts.begin(), b.doc_starts.end());
      const std::vector<int32_t> counters = counters_of(b.position);
      ints.insert(ints.end(), counters.begin(), counters.end());
      shared_->publish(step_ + 1, ints.data());
      heartbeat_.set_batch(group, members, step_ + 1, "publish", true);
    }
  } else {
    b.B = rows_, b.T = cfg_.model.seq_len;
    ints.resize(static_cast<size_t>(batch_ints()));
    heartbeat_.set_batch(group, members, step_ + 1, "take", false);
    shared_->take(step_ + 1, ints.data());
    heartbeat_.set_batch(group, members, step_ + 1, "take", true);
    const int64_t tokens = b.B * (b.T + 1), starts = cfg_.data.document_mask ? tokens : 0;
    b.tokens.assign(ints.begin(), ints.begin() + tokens);
    b.doc_starts.assign(ints.begin() + tokens, ints.begin() + tokens + starts);
    b.position = with_counters(blend_->position(), ints.data() + tokens + starts);
  }
  return b;
}

int64_t Trainer::batch_ints() const {
  const int64_t T = cfg_.model.seq_len;
  return rows_ * (T + 1) * (cfg_.data.document_mask ? 2 : 1) + 4 + 4 * blend_->size();
}

Rows Trainer::rows_of(const data::Batch& b) {
  return {b.tokens.data(), b.doc_starts.empty() ? nullptr : b.doc_starts.data()};
}

void Trainer::evaluate(nlohmann::json& rec) {
  const int64_t mb = cfg_.train.micro_batch, T = cfg_.model.seq_len, G = cfg_.train.global_batch;
  double sum = 0, tokens = 0;
  std::string none;  // the sources that counted no target
  for (size_t v = 0; v < valid_files_.size(); ++v) {
    data::BatchLoader val(*valid_files_[v], T, cfg_.train.seed, /*shuffle=*/false, G, 0, G, 0,
                          cfg_.data.document_mask);
    double loss = 0;
    int64_t n = 0;       // micro-batches evaluated: those that count a target
    double counted = 0;  // the targets the loss counted (data.document_end_loss)
    for (int64_t s = 0; s < cfg_.train.eval_steps; ++s) {
      data::Batch b = val.next();
      for (int64_t i = 0; i < G / mb; ++i) {
        const Rows rows = rows_of(b).from(i * mb, T);  // every rank reads the same rows: all skip alike
        const int64_t c = rows.counted_targets(mb, T, cfg_.data.document_end_loss);
        if (c == 0) continue;
        loss += engine_->loss(rows, mb), ++n, counted += double(c);
      }
    }
    if (n == 0) {
      none += cat(none.empty() ? "" : ", ", "'", cfg_.data.valid[v].name, "'");
      continue;
    }
    const double mean = static_cast<float>(loss / n);
    if (valid_files_.size() > 1) rec["val_loss/" + cfg_.data.valid[v].name] = mean;
    sum += mean * counted, tokens += counted;
  }
  if (!none.empty() && !said_no_eval_target_)
    log::warn("eval: validation source(s) ", none, " counted no target in train.eval_steps = ", cfg_.train.eval_steps,
              " batches (each begins a document, and data.document_end_loss = false): left out of val_loss",
              tokens > 0 ? "" : ", which this evaluation therefore lacks", "; said once");
  said_no_eval_target_ = said_no_eval_target_ || !none.empty();
  if (tokens > 0) rec["val_loss"] = static_cast<float>(sum / tokens);
}

// The blend's place after the batch the step took (the loader's walk, data/loader.h): each
// source that starts a new epoch in it, or reaches its cap, is said.
void Trainer::take_position(const data::Batch& batch) {
  const data::BlendPosition before = blend_->position();
  for (int s = 0; s < blend_->size(); ++s) {
    const int64_t n = blend_->samples(s), from = before.taken[s], to = batch.position.taken[s];
    for (int64_t k = (std::max<int64_t>(from, 1) + n - 1) / n * n; k < to; k += n)
      log::info("data: source '", blend_->name(s), "' starts its epoch ", k / n + 1, " (a new order) in step ", step_);
  }
  blend_->advance_to(batch.position);
  for (int s = 0; s < blend_->size(); ++s)
    if (before.taken[s] != batch.position.taken[s] && !blend_->active(s))
      log::info("data: source '", blend_->name(s), "' reached its cap of ", cfg_.data.train[s].epochs, " epoch(s) in step ",
                step_, ": the other sources share its place from here");
}

void Trainer::describe_blend() const {
  const int64_t left = (cfg_.train.steps - step_) * cfg_.train.global_batch;
  for (int s = 0; s < blend_->size(); ++s) {
    const DataSource& d = cfg_.data.train[s];
    const double share = blend_->share(s);
    log::info("data: source '", d.name, "' (", d.path, "): ", fmt("%.1f", 100 * share), "% of the samples, ",
              train_files_[s]->num_tokens(), " tokens (", blend_->samples(s), " samples); ",
              fmt("%.2f", blend_->epochs_taken(s)), " epochs taken, about ",
              fmt("%.2f", blend_->epochs_taken(s) + share * double(left) / double(blend_->samples(s))), " by step ",
              cfg_.train.steps, d.epochs > 0 ? cat(" (capped at ", d.epochs, ")") : std::string());
  }
}

std::string Trainer::checkpoint_root() const { return cfg_.checkpoint_root(run_dir_); }

void Trainer::save_checkpoint(bool always) {
  // A save due while the last one is still being written waits for it, or (async_policy skip)
  // is skipped: by every rank, or the others would wait for its part in vain. The last step's
  // (and a preempted run's) is never skipped.
  if (cfg_.checkpoint.async_policy == "skip" && step_ != cfg_.train.steps && !always) {
    float busy = writer_.busy() ? 1.0f : 0.0f;
    if (dist_) dist_->world_comm().all_reduce(&busy, 1)->wait();
    if (busy > 0) {
      log::warn("checkpoint: skipped the save of step ", step_,
                ": the last one is still being written (checkpoint.async_policy = skip)");
      return;
    }
  }
  writer_.wait();
  trace_written_save();
  saved_step_ = step_;
  // Stage 1, in the step: the state as of this step, where training does not change it.
  const double t1 = now_s();
  const int64_t snapshot_us = trace::now_us();
  engine_->state_to_host();
  std::vector<checkpoint::Shard> shards = checkpoint::shards_of(state_, true);
  if (engine_->host_state_is_live() && cfg_.checkpoint.async) {
    struct Copy {
      float* to;
      const float* from;
      int64_t n;
    };
    std::vector<Copy> copies;  // in pieces of 4 Mi floats, for the threads to share large tensors
    constexpr int64_t kPiece = int64_t(1) << 22;
    float* at = snapshot_.data();
    for (checkpoint::Shard& s : shards) {
      for (int64_t i = 0; i < s.numel(); i += kPiece) copies.push_back({at + i, s.data + i, std::min(kPiece, s.numel() - i)});
      s.data = at, at += s.numel();
    }
    MYRIAD_CHECK(at == snapshot_.data() + snapshot_.size(), "the checkpoint snapshot is sized for ", snapshot_.size(),
                 " floats, the shards hold ", at - snapshot_.data());
#pragma omp parallel for schedule(dynamic)
    for (size_t i = 0; i < copies.size(); ++i) std::memcpy(copies[i].to, copies[i].from, copies[i].n * sizeof(float));
  }
  nlohmann::json meta = checkpoint::encode(checkpoint::meta_of(state_, to_toml(cfg_), cfg_.data.tokenizer));
  checkpoint::SaveGroup group;
  if (dist_) group.rank = dist_->rank(), group.world = dist_->world();
  group.id = start_id_, group.timeout_s = cfg_.comm.timeout_s, group.cancel = writer_.cancelled();
  const double snapshot_s = now_s() - t1;
  trace::complete("checkpoint_snapshot", "checkpoint", snapshot_us, trace::now_us(), 0);
  // Stage 2, on the writer's thread (or here, and waited for, without checkpoint.async).
  writer_.start([this, root = checkpoint_root(), step = step_, meta = std::move(meta), shards = std::move(shards),
                 group, snapshot_s] {
    const double t1 = now_s();
    const int64_t t1_us = trace::now_us();
    const std::string dir = checkpoint::save(root, step, meta, shards, group);
    written_ = {step, t1_us, trace::now_us()};  // read by the training thread once the writer is done
    if (group.rank != 0) return;
    log::info("checkpoint: saved ", dir, " in ", fmt("%.2f", now_s() - t1), " s", cfg_.checkpoint.async ? cat(
              " in the background (its snapshot took the step ", fmt("%.2f", snapshot_s), " s)") : "");
    checkpoint::prune(root, cfg_.checkpoint.keep_last, cfg_.checkpoint.keep_every, group.id, step);
  });
  if (!cfg_.checkpoint.async) {
    // A synchronous save has returned on a rank only once rank 0 committed it.
    writer_.wait();
    if (dist_) dist_->barrier();
  }
}

// The last background write on the trace (lane 3, under the step it saved), once it is done:
// from the training thread, which alone touches the trace buffer's owner.
void Trainer::trace_written_save() {
  if (writer_.busy() || written_.step < 0) return;
  trace::complete_for(written_.step, "checkpoint_write", "checkpoint", written_.t0_us, written_.t1_us, 3);
  written_.step = -1;
}

// Newest first; a corrupt checkpoint is passed over with a warning (keep_last keeps older ones
// for this). Every rank must resume from the same one: a checkpoint counts as good only when it
// loaded on all ranks.
void Trainer::resume_latest_good() {
  const std::vector<std::string> dirs = checkpoint::committed_newest_first(checkpoint_root());
  std::string newest_bad;
  for (const std::string& dir : dirs) {
    std::string bad;
    try {
      resume_from(dir);
    } catch (const checkpoint::Corrupt& e) {
      bad = e.what();
    }
    float failed = bad.empty() ? 0.0f : 1.0f;
    if (dist_) dist_->world_comm().all_reduce(&failed, 1)->wait();
    if (failed == 0) return;
    if (bad.empty()) bad = "it failed to load on another rank";
    log::warn("resume: passing over ", dir, ": ", bad);
    if (newest_bad.empty()) newest_bad = bad;
    step_ = 0, saved_step_ = -1;
    blend_->start();
    recent_loss_.clear();
  }
  if (!dirs.empty())
    throw_input("resume: none of the ", dirs.size(), " committed checkpoints under ",
                checkpoint_root(), " loads (the newest: ", newest_bad,
                "); resume from a copy with --resume DIR or start a new run directory");
  log::info("resume: no committed checkpoint under ", checkpoint_root(), ", starting fresh");
}

// checkpoint.init_from: the model's weights only; the step, the data position and the optimizer
// start afresh, under the run's own config.
void Trainer::init_from(const std::string& path) {
  const checkpoint::ReadHold held(path);  // another run's checkpoint: not pruned while it is read
  const std::string dir = held.dir();
  const nlohmann::json meta = checkpoint::read_meta(dir);
  const checkpoint::Meta saved_meta = checkpoint::decode_meta(meta, dir);
  const Config saved = parse_config(saved_meta.config, dir + "/meta.json");
  if (const std::string d = weights_mismatch(saved, tokenizer_of(saved_meta, saved), cfg_); !d.empty())
    throw_input("checkpoint.init_from: checkpoint ", dir, " does not fit this model: ", d,
                "; initialize from a checkpoint of the same architecture and tokenizer");
  std::vector<checkpoint::Shard> weights;
  for (checkpoint::Shard& s : checkpoint::shards_of(state_, false))
    if (checkpoint::is_param(s.name)) weights.push_back(std::move(s));
  try {
    checkpoint::load(dir, meta, weights);
  } catch (const Error& e) {
    if (e.cls() != ErrorClass::kInput) throw;
    throw_input("checkpoint.init_from: ", e.what());
  }
  engine_->state_from_host();
  log::info("init: the weights of ", dir, " (step ", saved_meta.step,
            "); step 0, a fresh optimizer, this run's config");
}

void Trainer::resume_from(const std::string& dir) {
  std::optional<checkpoint::ReadHold> held;  // --resume DIR may name a live run's checkpoint
  if (fs::exists(fs::path(dir) / "meta.json")) held.emplace(dir);  // (read_meta says what else is wrong)
  const nlohmann::json meta = checkpoint::read_meta(dir);
  const checkpoint::Meta saved_meta = checkpoint::decode_meta(meta, dir);
  Config saved = parse_config(saved_meta.config, dir + "/meta.json");
  if (std::string d = model_difference(saved, cfg_); !d.empty())
    throw_input("checkpoint ", dir, " is from a different model: ", d,
                "; resume with the checkpoint's model or use a new run directory");
  if (const std::string tok = tokenizer_of(saved_meta, saved); tok != cfg_.data.tokenizer)
    throw_input("checkpoint ", dir, " was trained on the ", tok, " tokenizer's ids but data.tokenizer = \"",
                cfg_.data.tokenizer, "\"; resume with data prepared by the ", tok, " tokenizer or use a new run directory");
  if (saved.optim.name != cfg_.optim.name)
    throw_input("checkpoint ", dir, " holds ", saved.optim.name, " state but optim.name = ",
                cfg_.optim.name);
  const double t0 = now_s();
  // checkpoint.load = broadcast: the parameters, the same on every rank of a data-parallel group,
  // are read by its rank 0 and broadcast over the group; each rank reads its own shard of the
  // optimizer state. An MoE model's routed experts differ between the ranks of an expert group:
  // they are read by rank 0 of their own data-parallel group and broadcast over it (the layout's
  // expert region). (On the CPU: a GPU's host copies are not yet handed to the communicators.)
  const parallel::ParallelContext* ctx = dist_ ? dist_->context() : nullptr;
  comm::Communicator* dp = ctx ? ctx->weights_dp() : nullptr;  // dp x cp under cp
  comm::Communicator* edp = ctx ? ctx->expert_dp() : nullptr;
  const bool broadcast = dp && dp->size() > 1 && cfg_.checkpoint.load == "broadcast" && engine_->host_state_is_live();
  std::set<std::string> experts;  // stored names of the expert tensors
  for (const ParamSpec& p : engine_->layout().tensors())
    if (p.expert) experts.insert(checkpoint::param_name(p.name));
  std::vector<checkpoint::Shard> reads;
  for (checkpoint::Shard& s : checkpoint::shards_of(state_, false)) {
    const bool reader = !broadcast || (experts.count(s.name) ? parallel::group_rank(edp) : dp->rank()) == 0;
    if (reader || !checkpoint::is_param(s.name)) reads.push_back(std::move(s));
  }
  std::exception_ptr failed;
  try {
    checkpoint::load(dir, meta, reads);
  } catch (...) {
    failed = std::current_exception();
  }
  if (broadcast) {
    // The group's ranks learn of a failed read before they would wait for its broadcast.
    float failures = failed ? 1.0f : 0.0f;
    dp->all_reduce(&failures, 1)->wait();
    if (failures > 0 && !failed)
      throw checkpoint::Corrupt(cat("checkpoint ", dir, ": another rank of data-parallel group ", dp->name(),
                                    " could not read it"));
    float* params = engine_->host_state().params;
    const FlatRange region = engine_->layout().expert_region();
    if (!failed) {
      dp->broadcast(params, engine_->layout().dense_total(), 0)->wait();
      if (region.size() > 0 && parallel::group_size(edp) > 1)
        edp->broadcast(params + region.begin, region.size(), 0)->wait();
    }
  }
  if (failed) std::rethrow_exception(failed);
  checkpoint::restore(state_, saved_meta);
  saved_step_ = step_;
  engine_->state_from_host();
  heartbeat_.set_resumed_from(dir);
  log::info("resume: ", dir, " (step ", step_, ", ", blend_->position().consumed, " samples consumed) in ", fmt("%.2f", now_s() - t0),
            " s", broadcast ? cat(", the parameters read by data-parallel rank 0 and broadcast") : "");
}

}  // namespace myriad
