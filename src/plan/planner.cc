#include "plan/planner.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/parallel_layout.h"
#include "model/flops.h"
#include "model/memory_plan.h"
#include "parallel/schedule.h"

namespace myriad::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

double get(const toml::table& t, const std::string& path, const char* section, const char* key, bool required = true,
           double fallback = 0) {
  const toml::node* n = t.at_path(cat(section, ".", key)).node();
  if (!n) {
    if (required) throw_input("cluster ", path, ": [", section, "] ", key, " is missing");
    return fallback;
  }
  if (auto v = n->value<double>()) return *v;
  throw_input("cluster ", path, ": [", section, "] ", key, " must be a number");
}

// The mean number of keys a query attends to: causal, within a window of W (0 = none).
double mean_keys(int64_t T, int64_t W) {
  double sum = 0;
  for (int64_t i = 0; i < T; ++i) sum += static_cast<double>(W > 0 ? std::min(i + 1, W) : i + 1);
  return sum / static_cast<double>(T);
}

}  // namespace

Cluster load_cluster(const std::string& path) {
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    throw_input("cluster ", path, ": ", std::string(e.description()), " (line ", e.source().begin.line, ")");
  }
  Cluster c;
  c.name = t["name"].value_or(path);
  c.peak_tflops = get(t, path, "gpu", "peak_tflops");
  c.gemm_efficiency = get(t, path, "gpu", "gemm_efficiency");
  c.gemm_half_flops = get(t, path, "gpu", "gemm_half_gflops") * 1e9;
  c.attention_efficiency = get(t, path, "gpu", "attention_efficiency");
  c.fp8_peak_tflops = get(t, path, "gpu", "fp8_peak_tflops", false, 0);
  c.fp8_gemm_efficiency = get(t, path, "gpu", "fp8_gemm_efficiency", false, 0);
  if (c.fp8_peak_tflops < 0 || c.fp8_gemm_efficiency < 0 || c.fp8_gemm_efficiency > 1)
    throw_input("cluster ", path, ": [gpu] fp8_peak_tflops must be >= 0 and fp8_gemm_efficiency in [0, 1]");
  c.hbm_gbps = get(t, path, "gpu", "hbm_gbps");
  c.memory_gib = get(t, path, "gpu", "memory_gib");
  c.act_bytes = get(t, path, "gpu", "act_bytes", false, 2);
  c.gpus_per_node = static_cast<int>(get(t, path, "node", "gpus"));
  c.nvlink_gbps = get(t, path, "node", "nvlink_gbps");
  c.nvlink_latency_us = get(t, path, "node", "nvlink_latency_us");
  c.net_gbps = get(t, path, "network", "gbps_per_gpu");
  c.net_latency_us = get(t, path, "network", "latency_us");
  c.nodes_per_pod = static_cast<int>(get(t, path, "network", "nodes_per_pod", false, 0));
  c.spine_oversubscription = get(t, path, "network", "spine_oversubscription", false, 1);
  c.unfused_memory_passes = get(t, path, "calibration", "unfused_memory_passes");
  c.fused_memory_passes = get(t, path, "calibration", "fused_memory_passes");
  c.tp_overlap_hidden = get(t, path, "calibration", "tp_overlap_hidden");
  c.pp_blocking = get(t, path, "calibration", "pp_blocking");
  c.misc_overhead = get(t, path, "calibration", "misc_overhead");
  c.step_overhead_s = get(t, path, "calibration", "step_overhead_s");
  c.grad_bytes = get(t, path, "calibration", "grad_bytes");
  for (double x : {c.peak_tflops, c.gemm_efficiency, c.attention_efficiency, c.hbm_gbps, c.memory_gib, c.nvlink_gbps,
                   c.net_gbps, c.act_bytes})
    if (!(x > 0)) throw_input("cluster ", path, ": every [gpu], [node] and [network] figure must be positive");
  if (c.gpus_per_node < 1) throw_input("cluster ", path, ": [node] gpus must be at least 1");
  return c;
}

Layout parse_layout(const std::string& text) {
  Layout l;
  std::stringstream s(text);
  std::set<std::string> seen;
  for (std::string item; std::getline(s, item, ',');) {
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    // tp=8,tp=4 is a typo or a pasted layout: which of the two was meant is not for us to guess.
    if (!seen.insert(key).second)
      throw_input("plan: --layout '", text, "' gives ", key, " twice: give each of tp, pp, v, mb, ep, cp, recompute once");
    auto number = [&] {
      try {
        const int n = std::stoi(value);
        if (n >= 1) return n;
      } catch (...) {
      }
      throw_input("plan: --layout ", key, "=", value, ": a positive integer is expected");
    };
    if (key == "tp") l.tp = number();
    else if (key == "pp") l.pp = number();
    else if (key == "v") l.v = number();
    else if (key == "mb") l.mb = number();
    else if (key == "ep") l.ep = number();
    else if (key == "cp") l.cp = number();
    else if (key == "recompute" && (value == "none" || value == "norms" || value == "selective" || value == "full")) l.recompute = value;
    else throw_input("plan: --layout '", item, "': expected tp=, pp=, v=, mb=, ep=, cp= or recompute=none|norms|selective|full");
  }
  return l;
}

Features parse_features(const std::string& text) {
  Features f;
  if (text == "megatron" || text.empty()) return f;
  // MegaScale's window is not published: 512 of the 2,048 positions is assumed (docs/PLANNER.md).
  if (text == "megascale") return {true, 512, true, true, true, true, true, "lamb"};
  std::stringstream s(text);
  for (std::string item; std::getline(s, item, ',');) {
    if (item == "parallel_block") f.parallel_block = true;
    else if (item.rfind("window=", 0) == 0) f.window = std::atoll(item.c_str() + 7);
    else if (item == "tp_overlap") f.tp_overlap = true;
    else if (item == "pp_overlap") f.pp_overlap = true;
    else if (item == "dp_overlap") f.dp_overlap = true;
    else if (item == "fused_ops") f.fused_ops = true;
    else if (item == "misc") f.misc = true;
    else if (item == "lamb") f.optimizer = "lamb";
    else if (item == "fp8") f.fp8 = true;
    else if (item == "ep_overlap") f.ep_overlap = true;
    else if (item == "cp_overlap") f.cp_overlap = true;
    else
      throw_input("plan: --features '", item, "': expected megatron, megascale, or a list of parallel_block, window=W, "
                  "tp_overlap, pp_overlap, dp_overlap, fused_ops, misc, lamb, fp8, ep_overlap, cp_overlap");
  }
  return f;
}

double ring_all_gather_s(double bytes, int n, double gbps, double latency_us) {
  if (n <= 1) return 0;
  return (n - 1) * latency_us * 1e-6 + double(n - 1) / n * bytes / (gbps * 1e9);
}
double ring_all_reduce_s(double bytes, int n, double gbps, double latency_us) {
  return 2 * ring_all_gather_s(bytes, n, gbps, latency_us);
}
double tree_all_reduce_s(double bytes, int n, double gbps, double latency_us) {
  if (n <= 1) return 0;
  const double depth = std::ceil(std::log2(double(n)));
  return 2 * depth * latency_us * 1e-6 + 2 * bytes / (gbps * 1e9);
}
double all_reduce_s(double bytes, int n, double gbps, double latency_us) {
  return std::min(ring_all_reduce_s(bytes, n, gbps, latency_us), tree_all_reduce_s(bytes, n, gbps, latency_us));
}

double flops_per_token(const ModelConfig& m, int64_t tp) {
  return model::flops_per_token(m, padded_vocab(m.vocab_size, tp));  // the engine's count
}

// An all-to-all of `bytes` per rank over n ranks that are consecutive in the job (a stage's
// ranks): each rank keeps 1/n and sends the rest; the peers inside its node over NVLink, the
// others through its NIC, both at once.
double all_to_all_s(double bytes, int n, const Cluster& c, double net_gbps) {
  if (n <= 1) return 0;
  const int inside = std::min(n, c.gpus_per_node);
  const double nvlink = double(inside - 1) / n * bytes / (c.nvlink_gbps * 1e9);
  const double net = n > inside ? double(n - inside) / n * bytes / (net_gbps * 1e9) : 0;
  return (n > inside ? c.net_latency_us : c.nvlink_latency_us) * 1e-6 + std::max(nvlink, net);
}

namespace {

// Why layout l of `run` on `gpus` GPUs of cluster c cannot be predicted or would not run ("" when
// it can: *layout is then the layout the engine would take).
std::string refusal(const Config& run, int64_t gpus, const Cluster& c, const Layout& l, const Features& f,
                    ParallelLayout* layout) {
  const ModelConfig& model = run.model;
  const int64_t group = ParallelLayout::replica_of(run.parallel);
  if (gpus % group != 0)
    return l.cp > 1 ? cat("tp x pp x cp = ", group, " does not divide ", gpus, " GPUs")
                    : cat("tp x pp = ", group, " does not divide ", gpus, " GPUs");
  if (l.tp > c.gpus_per_node) return cat("tp ", l.tp, " spans nodes of ", c.gpus_per_node, " GPUs");
  // Chunks of unequal layers (94 layers over pp 8 x v 4) are costed at the mean, as if the
  // partition balanced them exactly (the engine's puts the embedding and the head's loss on the
  // lighter ones); the engine's rules (below) only ask every chunk to hold a layer.
  if (model.layers < int64_t(l.pp) * l.v)
    return cat("pp x v = ", l.pp * l.v, " chunks for ", model.layers, " layers: each needs one");
  if (f.fp8 && !(c.fp8_peak_tflops > 0 && c.fp8_gemm_efficiency > 0))
    return cat("fp8: the cluster ", c.name, " has no FP8 GEMM rate ([gpu] fp8_peak_tflops, fp8_gemm_efficiency)");
  if (l.v > 1 && l.pp == 1) return cat("interleaving (v ", l.v, ") needs pp > 1");
  // What a run of this layout would be refused for (core/parallel_layout.h): tp against the
  // heads and the MLP, the batch's split, FP8's multiples of 16.
  try {
    *layout = ParallelLayout::for_world(run, gpus);
  } catch (const Error& e) {
    const std::string what = e.what();
    return what.rfind("config: ", 0) == 0 ? what.substr(8) : what;
  }
  return "";
}

// Memory per GPU (GiB) of layout l of `run`, whose rank holds held_params weights, updates
// `owned` of them and takes m micro-batches a step, as Myriad's CUDA engine holds it: bf16
// weights, fp32 gradients, the optimizer's fp32 master and moments over dp (the experts' over
// their group); the layers' activations of the micro-batches in flight, the logits and the step's
// buffers by the model's own memory plan (model/memory_plan.h, which GptModel checks its
// allocations against; the experts' rows as balanced routing gives them); the op set's scratch;
// cuDNN's attention workspace; with fp8 the op set's cast buffers and the weights' casts.
Prediction::Memory memory(const Config& run, const Cluster& c, const Layout& l, const Features& f, double held_params,
                          double owned, int m) {
  const ModelConfig& model = run.model;
  const double layers_per_chunk = double(model.layers) / (l.pp * l.v);
  model::GptMemoryShape ms = model::memory_shape(model, l.tp, l.mb, padded_vocab(model.vocab_size, l.tp), l.cp);
  ms.tp = l.tp > 1, ms.parallel_block = f.parallel_block, ms.recompute = l.recompute, ms.act_bytes = static_cast<int>(c.act_bytes);
  ms.ep = l.ep;
  ms.logits_rows = model::logits_rows(run.train.logits_mib, ms.Vl, ms.act_bytes);
  ms.fp8 = f.fp8, ms.fp8_head = f.fp8 && run.train.fp8_lm_head;
  ms.micro_batches = m;
  const double per_layer = double(model::slot_bytes(ms, 1, false) - model::slot_bytes(ms, 0, false));
  const double per_slot = double(model::slot_bytes(ms, 0, false) + model::slot_token_bytes(ms));
  const double head = double(model::slot_bytes(ms, 0, true) - model::slot_bytes(ms, 0, false));
  // Layer-micro-batches in flight at the first stage (1F1B: pp micro-batches of its layers;
  // interleaved: a little more), and micro-batches in flight there.
  const double in_flight = std::min<double>(
      double(model.layers) * (l.v > 1 ? 1 + double(l.pp - 1) / (l.pp * l.v) : 1), double(model.layers) / l.pp * m);
  const double slots = in_flight / layers_per_chunk;
  Prediction::Memory mem;
  mem.weights = held_params * c.act_bytes / kGiB;
  mem.gradients = held_params * 4 / kGiB;
  mem.optimizer = owned * 12 / kGiB;
  mem.activations = (per_layer * in_flight + per_slot * slots) / kGiB;
  mem.logits = head / kGiB;
  mem.buffers = double(model::buffer_bytes(ms)) / kGiB;
  mem.scratch = double(model::scratch_bytes(ms)) / kGiB;
  mem.workspace = double(model::attention_workspace_bytes(ms)) / kGiB;
  // The cast buffers, and the weights' casts a step that casts them once holds (the first stage's
  // layers, at most ceil(L / pp); the head with one stage).
  const int64_t stage_layers = (model.layers + l.pp - 1) / l.pp, stage_moe = (model.moe_layers() + l.pp - 1) / l.pp;
  mem.casts =
      double(model::fp8_cast_bytes(ms) + model::weight_cast_bytes(ms, stage_layers, stage_moe, l.pp == 1)) / kGiB;
  return mem;
}

}  // namespace

Prediction predict(const ModelConfig& model, int64_t global_batch, int64_t gpus, const Cluster& c, const Layout& l,
                   const Features& f) {
  Prediction p;
  // The run this layout would be (core/parallel_layout.h judges it below).
  Config run;
  run.model = model;
  run.parallel.tp = l.tp, run.parallel.pp = l.pp, run.parallel.virtual_stages = l.v;
  run.parallel.sequence_parallel = l.tp > 1;
  run.parallel.ep = l.ep;
  run.parallel.cp = l.cp;
  run.train.micro_batch = l.mb, run.train.global_batch = global_batch;
  run.train.precision = f.fp8 ? "fp8" : "bf16";
  ParallelLayout layout;
  if (const std::string why = refusal(run, gpus, c, l, f, &layout); !why.empty()) {
    p.fits = false, p.why_not = why;
    return p;
  }
  p.dp = static_cast<int>(layout.dp);
  const int m = static_cast<int>(layout.micro_batches);
  p.microbatches = m;

  const double peak = c.peak_tflops * 1e12, d = double(model.d_model), T = double(model.seq_len);
  // Tokens per micro-batch on this rank: under cp its two chunks of each sequence (balanced, so
  // its attention is 1/cp of the sequence's too: its queries against all the keys they see).
  const double t = double(l.mb) * T / l.cp;
  const double tp = l.tp, V = double(model.vocab_size);
  const double layers_per_chunk = double(model.layers) / (l.pp * l.v);

  // One layer's forward on one GPU (its tensor-parallel shard), seconds.
  auto gemm_s = [&](double flops) {
    return flops / (peak * c.gemm_efficiency * flops / (flops + c.gemm_half_flops));
  };
  // The block's linear GEMMs: bf16, or FP8 at the cluster's FP8 rate (the LM head stays bf16).
  auto block_gemm_s = [&](double flops) {
    if (!f.fp8) return gemm_s(flops);
    return flops / (c.fp8_peak_tflops * 1e12 * c.fp8_gemm_efficiency * flops / (flops + c.gemm_half_flops));
  };
  // The layer's GEMM widths: QKV (3d with as many key/value heads as query heads), the MLP's
  // features and its first GEMM's outputs (twice the features for SwiGLU's gate and up).
  const double qkv_w = double((model.heads + 2 * model.kv()) * model.head_dim()), ffn = double(model.ffn());
  const double fc_w = ffn * (model.swiglu() ? 2 : 1);
  const double attn_w = double(model.heads * model.head_dim());  // the attention's output width
  const double hbm = c.hbm_gbps * 1e9;
  const double attn_fwd = 4 * t * mean_keys(model.seq_len, f.window) * attn_w / tp / (peak * c.attention_efficiency);
  const double passes = f.fused_ops ? c.fused_memory_passes : c.unfused_memory_passes;
  const double mem_fwd = passes * t * d * c.act_bytes / tp / hbm;  // sequence parallel: 1/tp of the tokens
  // Sequence parallelism: an all-gather before and a reduce-scatter after each of attention and
  // the MLP, forward and backward; the parallel block shares one of each.
  const double tp_op = ring_all_gather_s(t * d * c.act_bytes, l.tp, c.nvlink_gbps, c.nvlink_latency_us);
  const double tp_layer = (f.parallel_block ? 2 : 4) * tp_op;  // per direction
  const double tp_exposed = f.tp_overlap ? tp_layer * (1 - c.tp_overlap_hidden) : tp_layer;
  // The norms' outputs refilled before a layer's backward (recompute norms and selective; full
  // repeats the whole forward): a memory-bound pass a norm (its input read, its output written)
  // and, under tp, its sequence-parallel all-gather again.
  const bool refills_norms = l.recompute == "norms" || l.recompute == "selective";
  const double norms_refill = refills_norms ? (f.parallel_block ? 1 : 2) *
                                                  (2 * t * d * c.act_bytes / tp / hbm + (l.tp > 1 ? tp_op : 0))
                                            : 0;
  const int64_t nodes = gpus / c.gpus_per_node;
  const double net = c.nodes_per_pod > 0 && nodes > c.nodes_per_pod ? c.net_gbps / c.spine_oversubscription : c.net_gbps;
  // Context parallelism (docs/notes/cp.md): per layer, the forward all-gathers the sequence's
  // keys and values of this rank's heads (2 kv heads x head size per token) over the cp ranks;
  // the backward gathers them again (full recompute's refill does, and the backward reuses it)
  // and reduce-scatters their gradients. The cp ranks sit right after tp: inside a node while
  // tp x cp fits one.
  const bool cp_in_node = int64_t(l.tp) * l.cp <= c.gpus_per_node;
  const double kv_bytes = double(l.mb) * T * 2 * double(model.kv() * model.head_dim()) / tp * c.act_bytes;
  const double cp_op = ring_all_gather_s(kv_bytes, l.cp, cp_in_node ? c.nvlink_gbps : net,
                                         cp_in_node ? c.nvlink_latency_us : c.net_latency_us);
  const double cp_fwd = cp_op, cp_bwd = 2 * cp_op;
  // Overlapped, the exchange hides behind the attention's compute of the same pass.
  const double cp_fwd_exposed = f.cp_overlap ? std::max(0.0, cp_fwd - attn_fwd) : cp_fwd;
  const double cp_bwd_exposed = f.cp_overlap ? std::max(0.0, cp_bwd - 2.5 * attn_fwd) : cp_bwd;

  // One layer's forward, backward and recompute on one GPU (its shard), seconds.
  struct LayerCost {
    double fwd = 0, bwd = 0, ep_comm = 0, ep_exposed = 0;
  };
  // A dense layer: the parallel block fuses QKV with fc and the two output projections (PaLM).
  auto dense_layer = [&] {
    const double gemm_fwd = f.parallel_block
                                ? block_gemm_s(2 * t * d * (qkv_w + fc_w) / tp) + block_gemm_s(2 * t * (attn_w + ffn) * d / tp)
                                : block_gemm_s(2 * t * d * qkv_w / tp) + block_gemm_s(2 * t * attn_w * d / tp) +
                                      block_gemm_s(2 * t * d * fc_w / tp) + block_gemm_s(2 * t * ffn * d / tp);
    // FP8's casts as the engine makes them (but for the norms' amaxes, which the forward casts of
    // QKV's and fc's inputs no longer take: unmodeled): each operand of each block GEMM per call, its amax
    // read (bf16), then read again and written as one byte: 5 bytes an element. Forward: the four
    // GEMMs' inputs and weights; backward: each output gradient once into both layouts (6 bytes:
    // as it is for the input gradient, transposed for the weight gradient), the weights again
    // (transposed) and the inputs transposed at the forward's kept scale (read, written: 3
    // bytes; the MLP projection's from fc's output, which SwiGLU reads as (gate, up) pairs: 5).
    // With recompute none the norms' outputs (QKV's and fc's inputs) are kept as those casts:
    // the forward writes a byte more of each, the backward casts them no more. The activation
    // measures the amaxes of what it writes: the MLP projection's input (its forward cast 3
    // bytes) and fc's output gradient (4).
    const double weights = (qkv_w + d + fc_w + ffn) * d / tp;
    const double inputs = t * (2 * d + d / tp + ffn / tp), out_grads = t * (qkv_w / tp + d + fc_w / tp + d);
    // A step that casts each weight once (model::casts_block_weights_once) makes its amax and one
    // pass into both layouts (6 bytes an element) for all its micro-batches, here a micro-batch's
    // share in its forward, in place of 5 bytes a call.
    model::GptMemoryShape casts;
    casts.fp8 = f.fp8, casts.micro_batches = m, casts.recompute = l.recompute;
    const bool once = model::casts_block_weights_once(casts);
    const double weight_casts_fwd = once ? 6 * weights / m : 5 * weights, weight_casts_bwd = once ? 0 : 5 * weights;
    const double kept_inputs = l.recompute == "none" ? t * 2 * d : 0;
    // With GELU, FP8 GEMMs have no GELU epilogue: the activation is a pass of its own (pre read,
    // out written: 4 bytes a feature), and its backward too (pre and dact read, dpre written: 6).
    const double gelu_fwd = f.fp8 && !model.swiglu() ? 4 * t * ffn / tp / hbm : 0;
    const double gelu_bwd = f.fp8 && !model.swiglu() ? 6 * t * ffn / tp / hbm : 0;
    const double cast_fwd =
        f.fp8 ? (5 * inputs + weight_casts_fwd - 2 * t * ffn / tp + kept_inputs) / hbm + gelu_fwd : 0;
    const double act_cast = (model.swiglu() ? 5 : 3) * t * ffn / tp;
    const double cast_bwd =
        f.fp8 ? (6 * out_grads - 2 * t * fc_w / tp + 3 * (inputs - kept_inputs - t * ffn / tp) + act_cast +
                 weight_casts_bwd) / hbm +
                    gelu_bwd
              : 0;
    // Recompute in the backward: full repeats the layer's forward; selective (the engine's) the
    // fc GEMM with its activation, whose outputs are the layer's largest, and the norms.
    const double recompute = norms_refill +
                             (l.recompute == "full" ? gemm_fwd + attn_fwd + mem_fwd + tp_exposed + cast_fwd -
                                                          (once ? weight_casts_fwd / hbm : 0)
                              : l.recompute == "selective"
                                  ? block_gemm_s(2 * t * d * fc_w / tp) +
                                        (f.fp8 ? 5 * (t * d + fc_w * d / tp) / hbm + gelu_fwd : 0)
                                  : 0);
    LayerCost x;
    x.fwd = gemm_fwd + attn_fwd + mem_fwd + tp_exposed + cast_fwd + cp_fwd_exposed;
    x.bwd = 2 * gemm_fwd + 2.5 * attn_fwd + 2 * mem_fwd + tp_exposed + recompute + cast_bwd + cp_bwd_exposed;
    return x;
  };
  // An MoE layer (docs/notes/moe.md): attention as a dense layer's; under tp each rank routes its
  // t / tp tokens; their t k / tp rows go to the experts' ranks (balanced: as many arrive as
  // leave) and run through the rank's E / ep experts, each a GEMM pair of its share of the rows;
  // the shared experts split over tp as the dense MLP. Two all-to-alls forward (dispatch,
  // combine) and two backward, over the stage's ep consecutive ranks.
  auto moe_layer = [&] {
    const double E = double(model.experts), k = double(model.experts_per_token), Fe = double(model.expert_ffn());
    const double Fs = double(model.shared_ffn()), El = E / l.ep, rows = t / tp * k;
    const double attn_gemm = block_gemm_s(2 * t * d * qkv_w / tp) + block_gemm_s(2 * t * attn_w * d / tp);
    const double router = gemm_s(2 * t / tp * d * E);
    const double experts = El * (block_gemm_s(2 * rows / El * d * 2 * Fe) + block_gemm_s(2 * rows / El * Fe * d));
    const double shared = Fs > 0 ? block_gemm_s(2 * t * d * 2 * Fs / tp) + block_gemm_s(2 * t * Fs * d / tp) : 0;
    // The rows' gather into expert order and the weighted combine: a read and a write of the rows
    // each way, and the exchange's permutation on the arriving rows.
    const double permute = 4 * rows * d * c.act_bytes / hbm;
    const double a2a = all_to_all_s(rows * d * c.act_bytes, l.ep, c, net);
    const double compute = attn_gemm + router + experts + shared;
    // Exposed: behind another micro-batch's compute (ep_overlap), or only the dispatch behind the
    // shared experts' GEMMs (the engine's moe.overlap_dispatch).
    const double exposed = f.ep_overlap ? std::max(0.0, 2 * a2a - compute) : 2 * a2a - std::min(a2a, shared);
    const double weights = (qkv_w + d) * d / tp + El * 3 * d * Fe + 3 * d * Fs / tp;
    const double inputs = t * (d + d / tp) + rows * (d + Fe) + t * (d + Fs / tp);
    const double cast_fwd = f.fp8 ? 5 * (inputs + weights) / hbm : 0;
    const double cast_bwd = f.fp8 ? (6 * (t * (qkv_w / tp + d) + rows * (2 * Fe + d) + t * (2 * Fs / tp + d)) +
                                     5 * (inputs + weights)) / hbm
                                  : 0;
    LayerCost x;
    x.ep_comm = 2 * a2a, x.ep_exposed = exposed;
    x.fwd = compute + attn_fwd + mem_fwd + permute + tp_exposed + exposed + cast_fwd + cp_fwd_exposed;
    // Full recompute repeats the forward (its all-to-alls too); selective the experts' and the
    // shared experts' first GEMMs, the dispatch again, and the norms.
    const double recompute =
        norms_refill + (l.recompute == "full"        ? x.fwd
                        : l.recompute == "selective" ? El * block_gemm_s(2 * rows / El * d * 2 * Fe) +
                                                           (Fs > 0 ? block_gemm_s(2 * t * d * 2 * Fs / tp) : 0) + a2a
                                                     : 0);
    x.bwd = 2 * compute + 2.5 * attn_fwd + 2 * mem_fwd + permute + tp_exposed + exposed + recompute + cast_bwd +
            cp_bwd_exposed;
    return x;
  };
  const double moe_layers = double(model.moe_layers()), dense_layers = double(model.layers) - moe_layers;
  const LayerCost dl = dense_layer(), ml = model.moe() ? moe_layer() : LayerCost{};
  const double layer_fwd = (dense_layers * dl.fwd + moe_layers * ml.fwd) / double(model.layers);
  const double layer_bwd = (dense_layers * dl.bwd + moe_layers * ml.bwd) / double(model.layers);
  // The LM head and loss (last stage) spread over every chunk, as balanced stages do (the
  // project's partition_layers gives the last stage fewer layers).
  // The loss over the logits: unfused (Megatron-LM's), four passes over them in fp32 forward and
  // twice that backward; fused (the engine's cross-entropy), the logits read once and the
  // gradient written over them in the same pass, forward and backward together.
  const double logits = t * V / tp;
  const double loss_fwd = f.fused_ops ? 2 * logits * c.act_bytes / (c.hbm_gbps * 1e9) : 4 * logits * 4 / (c.hbm_gbps * 1e9);
  const double loss_bwd = f.fused_ops ? 0 : 2 * loss_fwd;
  const double head_gemm = gemm_s(2 * t * d * V / tp);
  const double head_fwd = head_gemm + loss_fwd, head_bwd = 2 * head_gemm + loss_bwd;
  const double chunks = double(l.pp) * l.v;
  double F = layers_per_chunk * layer_fwd + head_fwd / chunks, B = layers_per_chunk * layer_bwd + head_bwd / chunks;

  // Pipeline: each activation or gradient crosses the network, split over the tensor-parallel
  // GPUs' NICs (sequence parallel shards). Without decoupled send/receive a transfer holds the
  // compute path up.
  double send = 0;
  if (l.pp > 1) {
    send = c.net_latency_us * 1e-6 + t * d * c.act_bytes / tp / (c.net_gbps * 1e9);
    p.pp_comm_s = 2.0 * m * l.v * send;
    if (!f.pp_overlap) F += c.pp_blocking * send, B += c.pp_blocking * send;
  }
  const parallel::SimResult sim =
      parallel::simulate(parallel::make_schedule(parallel::schedule_kind(layout.schedule), l.pp, l.v, m), {F, B, send});
  const double work = double(m) * l.v * (F + B);
  p.bubble = sim.bubble;
  p.bubble_s = sim.makespan - work;
  p.tp_comm_s = 2.0 * m * l.v * layers_per_chunk * tp_layer;
  p.tp_exposed_s = 2.0 * m * l.v * layers_per_chunk * tp_exposed;
  p.pp_exposed_s = f.pp_overlap ? 0 : 2.0 * m * l.v * c.pp_blocking * send;
  // The MoE layers' all-to-alls: two each way per layer and micro-batch, on the first stage's path.
  p.ep_comm_s = 2.0 * m * moe_layers / l.pp * ml.ep_comm;
  p.ep_exposed_s = 2.0 * m * moe_layers / l.pp * ml.ep_exposed;
  // Context parallelism's exchanges: on every layer's path, dense or MoE.
  p.cp_comm_s = double(m) * l.v * layers_per_chunk * (cp_fwd + cp_bwd);
  p.cp_exposed_s = double(m) * l.v * layers_per_chunk * (cp_fwd_exposed + cp_bwd_exposed);
  p.compute_s = work - p.tp_exposed_s - p.pp_exposed_s - p.ep_exposed_s - p.cp_exposed_s;

  // Data parallelism (distributed optimizer): fp32 gradients reduce-scattered, bf16 parameters
  // all-gathered, over the network; a ring that leaves a pod shares the spine.
  // Every weight (the matmuls, and an untied embedding, a lookup the FLOPs do not count); an MoE
  // model's routed experts apart (the FLOPs count k of E): E / ep of them on each rank of a
  // stage, reduced over their own data-parallel group of tp cp dp / ep ranks.
  const double expert_w = 3 * d * double(model.expert_ffn());
  const double routed = moe_layers * double(model.experts) * expert_w;
  const double params = (model::matmul_params(model, model.vocab_size) + (model.tied_embeddings ? 0.0 : V * d) -
                         moe_layers * double(model.experts_per_token) * expert_w) / (int64_t(l.tp) * l.pp);
  const double expert_params = routed / (double(l.ep) * l.pp);
  const int edp = std::max(1, l.tp * l.cp * p.dp / l.ep);
  // The ranks holding the same weights: dp, x cp under context parallelism. Every ring and
  // all-reduce of a job inside one node runs over NVLink.
  const int wdp = p.dp * l.cp;
  const bool one_node = gpus <= c.gpus_per_node;
  const double dp_gbps = one_node ? c.nvlink_gbps : net, dp_lat = one_node ? c.nvlink_latency_us : c.net_latency_us;
  const double rs = ring_all_gather_s(params * c.grad_bytes, wdp, dp_gbps, dp_lat) +
                    ring_all_gather_s(expert_params * c.grad_bytes, edp, dp_gbps, dp_lat),
               ag = ring_all_gather_s(params * c.act_bytes, wdp, dp_gbps, dp_lat) +
                    ring_all_gather_s(expert_params * c.act_bytes, edp, dp_gbps, dp_lat);
  p.dp_comm_s = rs + ag;
  // Overlapped: each chunk's reduce-scatter runs behind the backward of the chunks after it and
  // its all-gather behind the forward of the chunks before it: one chunk's of each is left (the
  // first chunk's all-gather, prefetched, still waits on the step's start).
  p.dp_exposed_s = f.dp_overlap ? (rs + ag) / l.v : rs + ag;
  // The update of this rank's shard: fp32 master, moments and gradient read, three written.
  const double owned = params / wdp + expert_params / edp;
  p.optimizer_s = owned * 4 * 7 / (c.hbm_gbps * 1e9) * (f.optimizer == "lamb" ? 1.3 : 1.0);
  // The step's scalars, each waited for: the loss averaged over dp, and the gradient norm's sum
  // over tp, pp and dp (runtime/model_engine.h), 8 bytes each: latency, where the tree wins.
  p.scalars_s = all_reduce_s(8, p.dp, dp_gbps, dp_lat) + all_reduce_s(8, l.tp, c.nvlink_gbps, c.nvlink_latency_us) +
                all_reduce_s(8, l.pp, dp_gbps, dp_lat) + all_reduce_s(8, wdp, dp_gbps, dp_lat) +
                all_reduce_s(8, l.cp, c.nvlink_gbps, c.nvlink_latency_us);  // the loss's parts over cp
  const double step = sim.makespan + p.dp_exposed_s + p.optimizer_s + p.scalars_s + c.step_overhead_s;
  p.other_s = c.step_overhead_s + p.scalars_s + (f.misc ? 0 : step * c.misc_overhead);
  p.step_s = step + (f.misc ? 0 : step * c.misc_overhead);
  p.tokens_per_s = double(global_batch) * T / p.step_s;
  p.mfu = p.tokens_per_s * flops_per_token(model, l.tp) / (double(gpus) * peak);

  p.memory = memory(run, c, l, f, params + expert_params, owned, m);
  const Prediction::Memory& mem = p.memory;
  p.memory_gib = mem.weights + mem.gradients + mem.optimizer + mem.activations + mem.logits + mem.buffers + mem.scratch +
                 mem.workspace + mem.casts;
  if (p.memory_gib > c.memory_gib)
    p.fits = false, p.why_not = cat("needs ", std::round(p.memory_gib), " GiB of ", c.memory_gib, " per GPU");
  return p;
}

std::vector<std::pair<Layout, Prediction>> search(const ModelConfig& model, int64_t global_batch, int64_t gpus,
                                                  const Cluster& c, const Features& f) {
  std::vector<std::pair<Layout, Prediction>> out;
  // cp 1 first; cp > 1 only when nothing fits without it. Why: the model does not cost what a
  // rank's shorter attention loses (against torchtitan's rows it predicts cp 4 and 8 23-28% fast,
  // docs/PLANNER.md), so at lengths one device holds it would rank cp layouts above better ones.
  for (int cp = 1; cp <= gpus && out.empty() && (cp == 1 || model.seq_len % (2 * cp) == 0); cp *= 2)
    for (int tp = 1; tp <= c.gpus_per_node; tp *= 2)
      for (int pp = 1; pp <= model.layers; ++pp)
        for (int v : {1, 2, 3, 4, 6, 8})
          for (int mb : {1, 2, 4})
            for (const char* rc : {"none", "norms", "selective", "full"})
              for (int ep = 1; ep <= std::max<int64_t>(model.experts, 1); ep *= 2) {
                if (model.layers % (int64_t(pp) * v) != 0 || (v > 1 && pp == 1) || gpus % (int64_t(tp) * pp * cp) != 0)
                  continue;
                if (ep > 1 && model.experts % ep != 0) continue;  // predict() refuses what else does not fit
                const Layout l{tp, pp, v, mb, rc, ep, cp};
                Prediction p = predict(model, global_batch, gpus, c, l, f);
                if (p.fits) out.emplace_back(l, p);
              }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second.step_s < b.second.step_s; });
  return out;
}

std::string describe(const Prediction& p, const Layout& l) {
  char buf[2048];
  const std::string ep = (l.ep > 1 ? cat(" (ep ", l.ep, ")") : std::string()) + (l.cp > 1 ? cat(" x cp ", l.cp) : std::string());
  char a2a[96] = "", kv[96] = "";
  if (p.ep_comm_s > 0) std::snprintf(a2a, sizeof a2a, ", EP all-to-all %.3f s (of %.3f)", p.ep_exposed_s, p.ep_comm_s);
  if (p.cp_comm_s > 0) std::snprintf(kv, sizeof kv, ", CP keys and values %.3f s (of %.3f)", p.cp_exposed_s, p.cp_comm_s);
  const std::string casts = p.memory.casts > 0 ? cat(", fp8 casts ", std::round(p.memory.casts * 10) / 10) : "";
  std::snprintf(buf, sizeof buf,
                "layout tp %d x pp %d (v %d) x dp %d%s, micro-batch %d (%d per step), recompute %s\n"
                "step %.3f s | MFU %.1f%% | %.0f tokens/s | memory %.1f GiB per GPU | bubble %.1f%%\n"
                "  pipeline compute %.3f s, bubble %.3f s\n"
                "  exposed communication: TP %.3f s (of %.3f), PP %.3f s (of %.3f), DP %.3f s (of %.3f)%s%s\n"
                "  optimizer %.3f s, other overhead %.3f s (the loss's and the norm's all-reduces %.2f ms)\n"
                "  memory (GiB): weights %.1f, gradients %.1f, optimizer state %.1f, activations %.1f, logits %.1f, "
                "step buffers %.1f, scratch %.1f, attention workspace %.1f%s%s%s\n",
                l.tp, l.pp, l.v, p.dp, ep.c_str(), l.mb, p.microbatches, l.recompute.c_str(), p.step_s, 100 * p.mfu,
                p.tokens_per_s, p.memory_gib, 100 * p.bubble, p.compute_s, p.bubble_s, p.tp_exposed_s, p.tp_comm_s,
                p.pp_exposed_s, p.pp_comm_s, p.dp_exposed_s, p.dp_comm_s, a2a, kv, p.optimizer_s, p.other_s,
                1e3 * p.scalars_s, p.memory.weights, p.memory.gradients, p.memory.optimizer, p.memory.activations,
                p.memory.logits, p.memory.buffers, p.memory.scratch, p.memory.workspace, casts.c_str(),
                p.fits ? "" : "\n  DOES NOT FIT: ", p.fits ? "" : p.why_not.c_str());
  return buf;
}

}  // namespace myriad::plan
