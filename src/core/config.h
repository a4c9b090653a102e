// The run configuration: one struct per TOML section, every key listed once in Config::visit.
//
// A config is read from a TOML file, then `--set section.key=value` overrides are applied, then
// every key is bound to its field with a type check, then validate() checks the arithmetic
// between keys. All failures are input errors that name the file or override and the key.
// docs/CONFIG.md documents every key.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace myriad {

// The block's variant keys (norm ... tied_embeddings) have Hugging Face LlamaConfig's meaning;
// docs/CONFIG.md maps each to its field. Their defaults are GPT-2's block.
struct ModelConfig {
  int64_t layers = 8;
  int64_t d_model = 128;
  int64_t heads = 4;
  int64_t seq_len = 128;      // training context length
  int64_t positions = 0;      // learned: rows of wpe; rope: the longest context meant; 0 = seq_len
  int64_t vocab_size = 256;   // of the tokenizer; padded inside to a multiple of 128 x tp
  int64_t window = 0;         // sliding attention window in tokens; 0 = full causal
  bool parallel_block = false;
  bool bias = true;           // biases of the linears (and of LayerNorms)
  std::string norm = "layernorm";            // layernorm, rmsnorm
  double norm_eps = 1e-5;                    // RMSNorm's epsilon (LayerNorm's is fixed at 1e-5)
  std::string position_encoding = "learned"; // learned (wpe), rope (rotary, no table)
  double rope_theta = 10000;
  std::string rope_scaling;                  // "" none, "llama3" (Llama 3.1's long context)
  double rope_factor = 8;                    // llama3 scaling: HF rope_scaling.factor
  double rope_low_freq_factor = 1;
  double rope_high_freq_factor = 4;
  int64_t rope_original_positions = 8192;    // HF original_max_position_embeddings
  std::string mlp = "gelu";                  // gelu, swiglu
  int64_t mlp_hidden = 0;                    // the MLP's features F; 0 = 4 d_model
  int64_t kv_heads = 0;                      // key/value heads (GQA; 1 = MQA); 0 = heads
  int64_t head_size = 0;                     // key "head_dim": each head's features D; 0 = d_model / heads
  // RMSNorm on the queries and keys after the QKV GEMM, before RoPE: "" none, "head" over each
  // head's D features with one weight (D) for q and one for k (Qwen3), "all" over a token's
  // H D query and Hkv D key features (OLMoE, OLMo 2).
  std::string qk_norm;
  bool tied_embeddings = true;               // the LM head is the token embedding
  double init_std = 0.02;
  int64_t seed = 1234;        // initialization seed
  // Mixture of experts (docs/notes/moe.md; HF Qwen3MoeConfig, MixtralConfig, DeepseekV3Config):
  // an MoE layer's MLP is `experts` SwiGLU experts of expert_hidden features, each token sent to
  // experts_per_token of them by a router, plus shared_experts always-on ones.
  int64_t experts = 0;                 // routed experts per MoE layer; 0 = a dense model
  int64_t experts_per_token = 2;       // top-k
  int64_t expert_hidden = 0;           // each expert's SwiGLU features; 0 = mlp_hidden (ffn())
  int64_t shared_experts = 0;          // always-on experts, one SwiGLU of shared_experts x shared_expert_hidden
  int64_t shared_expert_hidden = 0;    // 0 = expert_hidden
  int64_t dense_layers = 0;            // the first layers stay dense (DeepSeek's first_k_dense_replace)
  int64_t moe_every = 1;               // then layer l is MoE when (l + 1) % moe_every == 0 (Qwen's decoder_sparse_step)
  std::string router_score = "softmax";  // softmax, sigmoid (DeepSeek-V3's scoring_func)
  bool router_norm_topk = true;        // the k weights renormalized to sum 1 (norm_topk_prob)
  double router_scale = 1;             // multiplies the k weights (routed_scaling_factor)
  bool router_bias = false;            // a per-expert bias on the scores for the choice only (DeepSeek-V3's e_score_correction_bias)
  int64_t router_groups = 1;           // group-limited routing: groups of experts (n_group); 1 = none
  int64_t router_top_groups = 1;       // the groups a token may use (topk_group)

  int64_t head_dim() const { return head_size > 0 ? head_size : d_model / heads; }
  int64_t kv() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t ffn() const { return mlp_hidden > 0 ? mlp_hidden : 4 * d_model; }
  bool rope() const { return position_encoding == "rope"; }
  bool swiglu() const { return mlp == "swiglu"; }
  bool rmsnorm() const { return norm == "rmsnorm"; }
  bool moe() const { return experts > 0; }
  bool layer_is_moe(int64_t l) const { return experts > 0 && l >= dense_layers && (l + 1) % moe_every == 0; }
  int64_t moe_layers() const {
    int64_t n = 0;
    for (int64_t l = 0; l < layers; ++l) n += layer_is_moe(l);
    return n;
  }
  int64_t expert_ffn() const { return expert_hidden > 0 ? expert_hidden : ffn(); }
  // The shared experts' features, as one SwiGLU (0: none).
  int64_t shared_ffn() const { return shared_experts * (shared_expert_hidden > 0 ? shared_expert_hidden : expert_ffn()); }
};

// Training the routers of a mixture of experts (the model's routing itself is ModelConfig's).
struct MoeConfig {
  // The load-balancing loss's coefficient: per MoE layer E x sum_e f_e P_e, f_e the share of the
  // micro-batch's N x k routed slots that went to expert e, P_e its mean router score (1 when
  // balanced), summed over the MoE layers. 0 = off.
  double aux_loss = 0.01;
  // The router z-loss's coefficient: per MoE layer the mean over tokens of logsumexp(logits)^2,
  // summed over the MoE layers (ST-MoE). 0 = off.
  double z_loss = 0;
  // Each expert takes at most ceil(capacity_factor x N k / E) of a micro-batch's N k routed rows,
  // those of the highest weights; the rest are dropped (their tokens keep the other experts'
  // rows and the residual). 0 = dropless.
  double capacity_factor = 0;
  // With model.router_bias, after each step: bias_e += bias_rate x sign(mean load - load_e), the
  // loads the step's rows per expert over the global batch (DeepSeek-V3's auxiliary-loss-free
  // balancing; its update speed is 1e-3).
  double bias_rate = 1e-3;
  // Expert parallelism: the shared experts' GEMMs run while the rows travel to their experts'
  // ranks (forward and backward); false waits for each exchange first (the same bits).
  bool overlap_dispatch = true;
};

// One token file (.bin/.idx, from `myriad prepare` or Megatron-LM) of a blend or of validation.
struct DataSource {
  std::string name;    // unique in its list: the metrics' and the checkpoint's key for it
  std::string path;    // prefix of .bin/.idx
  double weight = 1;   // training: its share of the samples (the weights are normalized)
  int64_t epochs = 0;  // training: at most this many passes over it, then it leaves the blend; 0 = no cap
  // (Spelled out: CUDA sources include this header as C++17.)
  bool operator==(const DataSource& o) const {
    return name == o.name && path == o.path && weight == o.weight && epochs == o.epochs;
  }
};
// In TOML either one prefix ("data/web": one source named for its file, weight 1) or an array
// of tables: [{name = "web", path = "data/web", weight = 0.7}, ...] (or [[data.train]] blocks).
using DataSources = std::vector<DataSource>;
// The source a lone prefix stands for (named for its file's stem).
DataSource source_of_prefix(const std::string& prefix);

struct DataConfig {
  DataSources train;              // the training blend
  DataSources valid;              // evaluated each; empty = no validation
  std::string tokenizer = "byte"; // byte, gpt2, llama3, qwen3, or hf:DIR (canonical_tokenizer's)
  // Attention stays inside each document of a packed row (boundaries from the .idx document
  // index); positions are not reset at the boundaries.
  bool document_mask = false;
  // Whether each document's last position, whose target begins the next document, counts in
  // the loss (false: Megatron's eod_mask_loss; needs document_mask).
  bool document_end_loss = true;
};

struct OptimConfig {
  std::string name = "adamw";  // adamw, lamb
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup_steps = 10;
  std::string decay = "cosine";  // cosine, linear, constant, wsd
  // wsd (warmup-stable-decay): lr from warmup to the decay's start, then down to min_lr over the
  // last decay_steps steps (0: decay_fraction x train.steps), shaped decay_shape.
  int64_t decay_steps = 0;
  double decay_fraction = 0.1;
  std::string decay_shape = "1-sqrt";  // linear, cosine, 1-sqrt
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // global gradient norm; 0 = no clipping
};

struct TrainConfig {
  int64_t steps = 100;
  int64_t global_batch = 8;  // sequences per optimizer step, whatever the layout
  int64_t micro_batch = 4;   // sequences per forward/backward
  std::string device = "auto";  // auto, cpu, cuda
  int64_t seed = 1234;       // data order
  int64_t log_every = 1;
  int64_t eval_every = 0;    // 0 = never
  int64_t eval_steps = 4;    // validation batches (of global_batch sequences) per evaluation
  std::string recompute = "none";  // none, norms, selective, full
  // The CUDA attention: auto (cuDNN's fused attention where it takes the shape, else Myriad's
  // kernel), cudnn (an error where it cannot), myriad. The CPU has one.
  std::string attention = "auto";
  bool deterministic = true;  // bitwise-repeatable steps; false lets cuDNN's backward add atomically
  // The LM head's logits held at once, MiB: the head, the loss and the head's backward run over
  // row chunks of about this size, inside the forward (model/gpt.h, "the LM head").
  double logits_mib = 512;
  // The linear layers' GEMMs: bf16 (the CPU engine: fp32), or fp8 (Hopper and later; ops/fp8.h).
  // A compute format only: the weights, the optimizer and the checkpoints are the same either way.
  std::string precision = "bf16";
  bool fp8_lm_head = false;  // with precision fp8: the LM head's GEMMs in FP8 too
  std::string fp8_gradients = "e5m2";  // with precision fp8: the output gradients' format, e5m2 or e4m3
  // With precision fp8: cuBLASLt's fast (coarser) accumulation in the forward GEMM. Off by default: it
  // gains 1-2% in speed and costs loss (docs/notes/fp8.md).
  bool fp8_fast_accum = false;
  // With precision fp8: what one scale covers, "tensor" (each operand whole) or "block" (1 x 128
  // tiles of activations and gradients, 128 x 128 blocks of weights: DeepSeek-V3's; ops/fp8.h).
  std::string fp8_scaling = "tensor";
  // Steps whose batch is read and dropped, with no update: the data around a loss spike that
  // recurs on replay (a supervised launch adds them by itself).
  std::vector<int64_t> skip_steps;
};

struct ParallelConfig {
  int64_t tp = 1;
  int64_t pp = 1;
  int64_t dp = 0;  // 0 = world / (tp x pp)
  int64_t ep = 1;  // expert parallelism: the ranks an MoE layer's experts are split over (folded into dp)
  int64_t cp = 1;  // context parallelism: the ranks each sequence's tokens split over (core/parallel_layout.h)
  int64_t virtual_stages = 1;
  bool sequence_parallel = false;
  std::string order = "tp-dp-pp";
  std::vector<int64_t> stage_layers;  // layers per pipeline stage; empty = automatic
  std::string schedule = "auto";      // auto, gpipe, 1f1b, interleaved
  double bucket_mb = 4;               // data-parallel gradient bucket size, MiB of fp32
  bool overlap_dp = true;  // reduce-scatters during backward, all-gathers during the next forward
  bool overlap_cp = true;  // cp: a layer's key/value gather in the backward runs behind its MLP's backward
};

struct CommConfig {
  double timeout_s = 300;
  std::string backend = "auto";  // auto, gloo, nccl
  std::map<std::string, std::string> nccl_env;
};

// What a supervised launch (myriad launch) reads from each worker's heartbeat.
struct FaultConfig {
  double step_timeout_s = 0;       // no new step for this long is a stall; 0 = from the observed step time:
  double stall_factor = 5;         // ... this x the median of the last 21 steps,
  double stall_floor_s = 5;        // ... and at least this
  double startup_timeout_s = 1800;  // allowance before the first step, and around evaluations and saves
  double spike_factor = 0;          // a loss above this x the median of the last 21 is a numerics fault; 0 = off
  int64_t sdc_check_every = 0;      // steps between the data-parallel replicas' parameter check; 0 = off
  double heartbeat_s = 1;           // between a node agent's heartbeats in the store; lost after 5 missed
  int64_t evict_after = 2;          // a node that causes this many faults in a row is evicted
  std::string evict_command;        // run for an evicted node ({host}, {node} replaced); empty = none
  bool evict_stragglers = false;    // a node with a straggler is evicted (else they are reported)
  double straggler_factor = 2;      // a straggler's own step time is over this x the job's median ...
  double straggler_margin_ms = 50;  // ... and this much more
  double diag_min_bus_gbps = 0.02;  // the self-check's all-reduce among the node's processes must reach this
  double preempt_grace_s = 25;      // from a preemption signal to the process's exit, the save included
  std::string preempt_signal;       // a signal besides SIGTERM that preempts (SIGUSR2, SIGHUP, ...); "" = none
};

struct ObserveConfig {
  bool tensorboard = true;  // RUN_DIR/tensorboard/: the logged steps' scalars, for TensorBoard
  bool trace = false;       // RUN_DIR/traces/: every rank's timeline (observe/trace.h)
  int64_t trace_every = 1;  // trace the steps that are multiples of this
};

struct CheckpointConfig {
  int64_t every = 0;       // steps between saves; 0 = only at the end
  int64_t keep_last = 3;   // committed checkpoints kept, newest first; 0 = all
  int64_t keep_every = 0;  // also keep every checkpoint whose step is a multiple; 0 = none
  std::string dir;         // empty = RUN_DIR/checkpoints
  std::string resume = "none";  // none, auto (latest committed), or a checkpoint directory
  std::string init_from;   // a fresh run starts from this checkpoint's weights (a fresh optimizer)
  bool async = true;       // write in the background (the step waits only for a snapshot)
  std::string async_policy = "wait";  // a save due while the last one is still written: wait or skip
  std::string load = "broadcast";     // resume: broadcast (one reader per data-parallel group) or all
};

// A vocabulary of `vocab` rows padded to a multiple of 128 x tp (each rank's rows a multiple of
// 128): what the model, the checkpoint and the planner hold.
inline int64_t padded_vocab(int64_t vocab, int64_t tp) { return (vocab + 128 * tp - 1) / (128 * tp) * (128 * tp); }

struct Config {
  ModelConfig model;
  DataConfig data;
  OptimConfig optim;
  TrainConfig train;
  ParallelConfig parallel;
  CommConfig comm;
  CheckpointConfig checkpoint;
  FaultConfig fault;
  ObserveConfig observe;
  MoeConfig moe;

  // Calls f(section, key, field&) for every key. The one list of keys: parsing, printing and
  // the unknown-key check all walk it.
  template <class F>
  void visit(F&& f) {
    f("model", "layers", model.layers);
    f("model", "d_model", model.d_model);
    f("model", "heads", model.heads);
    f("model", "seq_len", model.seq_len);
    f("model", "positions", model.positions);
    f("model", "vocab_size", model.vocab_size);
    f("model", "window", model.window);
    f("model", "parallel_block", model.parallel_block);
    f("model", "bias", model.bias);
    f("model", "norm", model.norm);
    f("model", "norm_eps", model.norm_eps);
    f("model", "position_encoding", model.position_encoding);
    f("model", "rope_theta", model.rope_theta);
    f("model", "rope_scaling", model.rope_scaling);
    f("model", "rope_factor", model.rope_factor);
    f("model", "rope_low_freq_factor", model.rope_low_freq_factor);
    f("model", "rope_high_freq_factor", model.rope_high_freq_factor);
    f("model", "rope_original_positions", model.rope_original_positions);
    f("model", "mlp", model.mlp);
    f("model", "mlp_hidden", model.mlp_hidden);
    f("model", "kv_heads", model.kv_heads);
    f("model", "head_dim", model.head_size);
    f("model", "qk_norm", model.qk_norm);
    f("model", "tied_embeddings", model.tied_embeddings);
    f("model", "init_std", model.init_std);
    f("model", "seed", model.seed);
    f("model", "experts", model.experts);
    f("model", "experts_per_token", model.experts_per_token);
    f("model", "expert_hidden", model.expert_hidden);
    f("model", "shared_experts", model.shared_experts);
    f("model", "shared_expert_hidden", model.shared_expert_hidden);
    f("model", "dense_layers", model.dense_layers);
    f("model", "moe_every", model.moe_every);
    f("model", "router_score", model.router_score);
    f("model", "router_norm_topk", model.router_norm_topk);
    f("model", "router_scale", model.router_scale);
    f("model", "router_bias", model.router_bias);
    f("model", "router_groups", model.router_groups);
    f("model", "router_top_groups", model.router_top_groups);
    f("data", "train", data.train);
    f("data", "valid", data.valid);
    f("data", "tokenizer", data.tokenizer);
    f("data", "document_mask", data.document_mask);
    f("data", "document_end_loss", data.document_end_loss);
    f("optim", "name", optim.name);
    f("optim", "lr", optim.lr);
    f("optim", "min_lr", optim.min_lr);
    f("optim", "warmup_steps", optim.warmup_steps);
    f("optim", "decay", optim.decay);
    f("optim", "decay_steps", optim.decay_steps);
    f("optim", "decay_fraction", optim.decay_fraction);
    f("optim", "decay_shape", optim.decay_shape);
    f("optim", "weight_decay", optim.weight_decay);
    f("optim", "beta1", optim.beta1);
    f("optim", "beta2", optim.beta2);
    f("optim", "eps", optim.eps);
    f("optim", "grad_clip", optim.grad_clip);
    f("train", "steps", train.steps);
    f("train", "global_batch", train.global_batch);
    f("train", "micro_batch", train.micro_batch);
    f("train", "device", train.device);
    f("train", "seed", train.seed);
    f("train", "log_every", train.log_every);
    f("train", "eval_every", train.eval_every);
    f("train", "eval_steps", train.eval_steps);
    f("train", "recompute", train.recompute);
    f("train", "attention", train.attention);
    f("train", "deterministic", train.deterministic);
    f("train", "logits_mib", train.logits_mib);
    f("train", "precision", train.precision);
    f("train", "fp8_lm_head", train.fp8_lm_head);
    f("train", "fp8_gradients", train.fp8_gradients);
    f("train", "fp8_fast_accum", train.fp8_fast_accum);
    f("train", "fp8_scaling", train.fp8_scaling);
    f("train", "skip_steps", train.skip_steps);
    f("parallel", "tp", parallel.tp);
    f("parallel", "pp", parallel.pp);
    f("parallel", "dp", parallel.dp);
    f("parallel", "virtual_stages", parallel.virtual_stages);
    f("parallel", "ep", parallel.ep);
    f("parallel", "cp", parallel.cp);
    f("parallel", "sequence_parallel", parallel.sequence_parallel);
    f("parallel", "order", parallel.order);
    f("parallel", "stage_layers", parallel.stage_layers);
    f("parallel", "schedule", parallel.schedule);
    f("parallel", "bucket_mb", parallel.bucket_mb);
    f("parallel", "overlap_dp", parallel.overlap_dp);
    f("parallel", "overlap_cp", parallel.overlap_cp);
    f("comm", "timeout_s", comm.timeout_s);
    f("comm", "backend", comm.backend);
    f("comm", "nccl_env", comm.nccl_env);
    f("checkpoint", "every", checkpoint.every);
    f("checkpoint", "keep_last", checkpoint.keep_last);
    f("checkpoint", "keep_every", checkpoint.keep_every);
    f("checkpoint", "dir", checkpoint.dir);
    f("checkpoint", "resume", checkpoint.resume);
    f("checkpoint", "init_from", checkpoint.init_from);
    f("checkpoint", "async", checkpoint.async);
    f("checkpoint", "async_policy", checkpoint.async_policy);
    f("checkpoint", "load", checkpoint.load);
    f("fault", "step_timeout_s", fault.step_timeout_s);
    f("fault", "stall_factor", fault.stall_factor);
    f("fault", "stall_floor_s", fault.stall_floor_s);
    f("fault", "startup_timeout_s", fault.startup_timeout_s);
    f("fault", "spike_factor", fault.spike_factor);
    f("fault", "sdc_check_every", fault.sdc_check_every);
    f("fault", "heartbeat_s", fault.heartbeat_s);
    f("fault", "evict_after", fault.evict_after);
    f("fault", "evict_command", fault.evict_command);
    f("fault", "evict_stragglers", fault.evict_stragglers);
    f("fault", "straggler_factor", fault.straggler_factor);
    f("fault", "straggler_margin_ms", fault.straggler_margin_ms);
    f("fault", "diag_min_bus_gbps", fault.diag_min_bus_gbps);
    f("fault", "preempt_grace_s", fault.preempt_grace_s);
    f("fault", "preempt_signal", fault.preempt_signal);
    f("observe", "tensorboard", observe.tensorboard);
    f("observe", "trace", observe.trace);
    f("observe", "trace_every", observe.trace_every);
    f("moe", "aux_loss", moe.aux_loss);
    f("moe", "z_loss", moe.z_loss);
    f("moe", "capacity_factor", moe.capacity_factor);
    f("moe", "bias_rate", moe.bias_rate);
    f("moe", "overlap_dispatch", moe.overlap_dispatch);
  }
  template <class F>
  void visit(F&& f) const { const_cast<Config*>(this)->visit(f); }

  // Throws an input error naming the key when keys disagree (d_model % heads, ...); the
  // parallel layout's rules are core/parallel_layout.h's, checked here with parallel.dp's
  // replicas (1 when it is 0, until a world size decides).
  void validate() const;
  // The vocabulary as the model holds it: vocab_size rounded up to a multiple of 128 x tp.
  int64_t padded_vocab() const { return myriad::padded_vocab(model.vocab_size, parallel.tp); }
  // Rows of the position table (learned positions): model.positions, or seq_len when 0.
  int64_t positions() const { return model.positions > 0 ? model.positions : model.seq_len; }
  // Where a run in `run_dir` keeps its checkpoints: checkpoint.dir, or RUN_DIR/checkpoints.
  std::string checkpoint_root(const std::string& run_dir) const;
};

// An input error naming `key` unless `value` is one of `allowed` (with the nearest as a hint).
void require_one_of(const std::string& key, const std::string& value, const std::vector<std::string>& allowed);


// A tokenizer's name as runs record it: "hf:DIR" (DIR/tokenizer.json) with DIR absolute and
// normal, relative to the working directory, so that two spellings of one directory are one
// tokenizer; any other name as it is. An empty DIR is an input error. parse_config applies it to
// data.tokenizer.
std::string canonical_tokenizer(const std::string& name);

// Reads `path`, applies `overrides` ("section.key=value"), binds and validates.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// The same from TOML text; `origin` names it in errors (a path, or "checkpoint metadata").
Config parse_config(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides = {});
// TOML text holding every key: parse_config(to_toml(c)) == c.
std::string to_toml(const Config& c);

}  // namespace myriad
