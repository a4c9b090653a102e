// The planner: a model of one training step of a GPT on a cluster, for a layout, before any
// hardware is rented. It predicts the step time, MFU, tokens/s, memory per GPU, the pipeline
// bubble and the exposed communication of each kind, from
//   - per-op costs of the model's forward and backward on one GPU (GEMMs, attention, the
//     memory-bound ops) at the cluster's measured or published efficiencies;
//   - collectives by an alpha-beta model per link (NVLink inside a node, the network across
//     nodes, slower past the spine's oversubscription);
//   - the pipeline from the project's own schedules and simulator (parallel/schedule.h);
//   - MegaScale's overlap rules and optimizations, each a switch (Features), so that its
//     ablation can be replayed.
// docs/PLANNER.md gives every term and every calibration number with its source.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"

namespace myriad::plan {

// One GPU kind and its network (configs/clusters/*.toml).
struct Cluster {
  std::string name;
  double peak_tflops = 0;       // dense bf16 per GPU
  double gemm_efficiency = 0;   // of peak, large GEMMs
  double gemm_half_flops = 0;   // a GEMM of this many FLOPs reaches half of gemm_efficiency (small shapes)
  double attention_efficiency = 0;  // of peak, fused attention forward and backward
  double fp8_peak_tflops = 0;      // dense FP8 (e4m3) per GPU; 0: no FP8 (--features fp8 is refused)
  double fp8_gemm_efficiency = 0;  // of fp8_peak_tflops, large FP8 GEMMs
  double hbm_gbps = 0;          // achieved memory bandwidth, for the memory-bound ops
  double memory_gib = 0;        // per GPU
  double act_bytes = 2;         // bytes of an activation or weight element as computed: bf16 on GPUs, fp32 on CPUs
  int gpus_per_node = 8;
  double nvlink_gbps = 0;       // per GPU, one direction, as a ring collective achieves it
  double nvlink_latency_us = 0;
  double net_gbps = 0;          // per GPU, one direction (its rail NIC), as a ring achieves it
  double net_latency_us = 0;
  int nodes_per_pod = 0;        // nodes under one spine block at full bandwidth; 0 = all
  double spine_oversubscription = 1;  // bandwidth divides by this for rings that leave a pod
  // Calibration (docs/PLANNER.md says which are fitted, once, for all rows together).
  double unfused_memory_passes = 0;  // memory passes over (tokens x d) per layer, forward, unfused
  double fused_memory_passes = 0;    // the same with fused operators
  double tp_overlap_hidden = 0;      // share of the TP collectives the chunked overlap hides
  double pp_blocking = 0;            // without decoupled send/recv: transfers' time on the compute path, x
  double misc_overhead = 0;          // share of the step (launches, synchronizations) MegaScale's misc removes
  double step_overhead_s = 0;        // per step whatever the batch (data, the update's synchronizations)
  double grad_bytes = 4;             // bytes per gradient element the data-parallel reduce-scatter moves
};
// Reads a cluster file; input errors name the file and the key.
Cluster load_cluster(const std::string& path);

struct Layout {
  int tp = 1, pp = 1, v = 1;  // v: virtual stages (interleaving) per pipeline rank
  int mb = 1;                 // sequences per micro-batch
  std::string recompute = "none";  // none, norms, selective, full
  int ep = 1;                 // expert parallelism (an MoE model's), folded into a stage's tp x dp ranks
  int cp = 1;                 // context parallelism: each sequence over cp ranks (right after tp in rank order)
};
// "tp=8,pp=8,v=6,mb=1,ep=8,cp=2", each key at most once; input error on anything else.
Layout parse_layout(const std::string& text);

// MegaScale's optimizations (its Table 3 ablation), each a switch; all off is Megatron-LM.
struct Features {
  bool parallel_block = false;
  int64_t window = 0;      // sliding attention window; 0 = full causal
  bool tp_overlap = false;  // TP all-gather / reduce-scatter in chunks behind the GEMMs
  bool pp_overlap = false;  // decoupled PP send/receive
  bool dp_overlap = false;  // DP reduce-scatter / all-gather behind compute, the first all-gather prefetched
  bool fused_ops = false;
  bool misc = false;        // MegaScale's remaining items (its "misc")
  std::string optimizer = "adamw";
  bool fp8 = false;  // the block's linear GEMMs in FP8 (train.precision = "fp8"); the LM head in bf16
  // Mixtures of experts: the all-to-alls behind another micro-batch's compute (Megatron-Core's
  // overlap_moe_expert_parallel_comm; without it only the shared experts' GEMMs hide the
  // dispatch, as in Myriad's engine).
  bool ep_overlap = false;
  // Context parallelism: the keys' and values' exchange behind the attention's compute (a ring's
  // overlap, Transformer Engine's and torchtitan's); without it every gather and reduce-scatter
  // waits in place, as in Myriad's engine today.
  bool cp_overlap = false;
};
// "megatron", "megascale", or a comma list of parallel_block, window=W, tp_overlap, pp_overlap,
// dp_overlap, fused_ops, misc, lamb, fp8, ep_overlap, cp_overlap.
Features parse_features(const std::string& text);

struct Prediction {
  bool fits = true;
  std::string why_not;           // when it does not fit or the layout is invalid
  int dp = 1, microbatches = 0;  // per data-parallel rank
  double step_s = 0, mfu = 0, tokens_per_s = 0;
  double memory_gib = 0;         // peak per GPU: the sum of `memory`'s parts
  // The peak by what holds it (GiB per GPU), as Myriad's CUDA engine allocates it: the bf16
  // weights; their fp32 gradients; the optimizer's fp32 master and two moments (the rank's 1/dp
  // share); the layers' saved activations of the micro-batches in flight with their slots'
  // tokens and outputs; the logits; the step's buffers (activations' gradients, recompute's
  // shared set); the op set's scratch; cuDNN's attention workspace; FP8's cast buffers.
  struct Memory {
    double weights = 0, gradients = 0, optimizer = 0, activations = 0, logits = 0, buffers = 0, scratch = 0,
           workspace = 0, casts = 0;
  } memory;
  double bubble = 0;             // of the pipeline's ideal compute
  // The step by phase (seconds): compute of the pipeline's critical path and the exposed parts.
  double compute_s = 0, bubble_s = 0, tp_exposed_s = 0, pp_exposed_s = 0, dp_exposed_s = 0, optimizer_s = 0,
         other_s = 0;  // other: the per-step overhead, the scalar all-reduces, and without MegaScale's misc its share
  double tp_comm_s = 0, pp_comm_s = 0, dp_comm_s = 0;  // before overlap
  double ep_comm_s = 0, ep_exposed_s = 0;  // the MoE layers' all-to-alls, before and after overlap
  double cp_comm_s = 0, cp_exposed_s = 0;  // context parallelism's key/value exchanges, before and after overlap
  double scalars_s = 0;  // the step's scalar all-reduces (the loss, the gradient norm), on the critical path
};

// The step of `model` (its layers, d_model, heads, seq_len, vocab_size) with `global_batch`
// sequences on `gpus` GPUs.
Prediction predict(const ModelConfig& model, int64_t global_batch, int64_t gpus, const Cluster& cluster,
                   const Layout& layout, const Features& features);

// Every layout that fits, fastest first (tp up to a node, pp dividing the layers, v, mb; for an
// MoE model ep, powers of two dividing the experts and tp x dp). cp (powers of two dividing the
// GPUs with tp x pp, seq_len into 2 cp chunks) is searched only where no layout without it fits:
// the smallest cp with layouts that fit, for sequences too long for one device.
std::vector<std::pair<Layout, Prediction>> search(const ModelConfig& model, int64_t global_batch, int64_t gpus,
                                                  const Cluster& cluster, const Features& features);

// Collective time by the ring's alpha-beta model: `bytes` the whole buffer, n ranks.
double ring_all_gather_s(double bytes, int n, double gbps, double latency_us);
double ring_all_reduce_s(double bytes, int n, double gbps, double latency_us);
// NCCL's (double binary) tree all-reduce: a reduction up and a broadcast down the tree, each
// ceil(log2 n) hops deep, the buffer pipelined through at the link's bandwidth each way.
double tree_all_reduce_s(double bytes, int n, double gbps, double latency_us);
// The all-reduce as NCCL runs it: whichever of ring and tree is faster for this size and n
// (latency-bound small buffers over many ranks take the tree).
double all_reduce_s(double bytes, int n, double gbps, double latency_us);

// Model FLOPs per trained token, as MFU counts them (model/flops.h, the engine's count: its
// vocabulary padded for tensor parallelism `tp`, attention over the window when there is one).
double flops_per_token(const ModelConfig& model, int64_t tp = 1);

// The prediction as the text `myriad plan` prints.
std::string describe(const Prediction& p, const Layout& layout);

}  // namespace myriad::plan
