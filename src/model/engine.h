// An Engine is a model with its gradients and optimizer state on one device: what the step
// loop drives. There is one engine, the one step of runtime/model_engine.h, on an op set: the
// CPU's (fp32) or CUDA's (fp32 master weights and optimizer state, bf16 or fp8 compute;
// runtime/engine.h builds it). Both hold the same canonical layout (model/params.h), so a
// checkpoint written by one loads into the other.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/params.h"
#include "model/rows.h"

namespace myriad {

// Wall seconds of one step's phases on this rank. Compute is forward and backward; the waits
// are the time this rank sat blocked on communication that the overlap did not hide: pipeline
// receives (the bubble) and data-parallel reduce-scatters and all-gathers; optimizer is the
// norm, clipping and update. The rest of the step (the batch, the loss) is not listed. Both op
// sets time them (the CPU's with its clock, CUDA's with events between the op set's marks).
struct StepTimes {
  double forward_s = 0, backward_s = 0, bubble_s = 0, dp_wait_s = 0, optimizer_s = 0;
};

// A mixture of experts' layer's routing over one step's global batch (every data-parallel
// rank's micro-batches): the rows each expert got, and its balance and z losses (before their
// coefficients), each the mean over the micro-batches.
struct ExpertLoad {
  int64_t layer = 0;
  std::vector<double> tokens;  // (E) after any drop
  double dropped = 0;          // rows past an expert's capacity (moe.capacity_factor)
  double aux_loss = 0, z_loss = 0;
};

struct StepResult {
  float loss = 0;        // mean over the global batch's tokens
  double grad_norm = 0;  // global L2 norm before clipping
  double lr = 0;
  StepTimes times;
  bool stop = false;  // some rank was asked to stop (train_step's `stop`): every rank sees the same
  // No target of the global batch counted (data.document_end_loss = false and every target
  // begins a document): nothing was computed or updated, and the loss is none.
  bool counted_nothing = false;
  std::vector<ExpertLoad> experts;  // each MoE layer's, in layer order (empty for a dense model)
  // Under cp with documents: the busiest context-parallel rank's attention pairs over the step's
  // rows against the ranks' mean (context_pairs; 1 when even), 0 otherwise.
  double cp_imbalance = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const ParamLayout& layout() const = 0;
  virtual std::string device() const = 0;  // for logs: "cpu (2 threads)", "cuda:0 NVIDIA H200"
  // Peak dense FLOP/s of the device for MFU, with its name; 0 when unknown (CPU).
  virtual double peak_flops() const { return 0; }

  // One optimizer step on this data-parallel rank's rows of the global batch, tokens
  // (global_batch / dp, T+1) in host memory (the whole batch with one rank): forward and
  // backward over the micro-batches, global-norm clipping, the update at learning rate lr.
  // `step` (1-based) names the step in errors. Throws a numerics Error when the loss is not
  // finite. A micro-batch that counts no target (data.document_end_loss = false) is left out of
  // the step's mean, its loss and its gradient alike; a step none of whose micro-batches counts
  // one is not taken (counted_nothing). `stop`: this rank was asked to stop (a preemption signal); it rides the gradient
  // norm's reduction, so StepResult::stop is true on every rank of the job at the same step, or
  // on none (the ranks agree on the step to save at without a collective of their own).
  virtual StepResult train_step(Rows rows, int64_t step, double lr, bool stop = false) = 0;

  // Who writes what to a checkpoint, so that every stored region has exactly one writer: each
  // rank writes the pieces it owns (host_state().owned) of the weights and the moments, of the
  // tensors p for which this is true (a replicated tensor's tensor-parallel copies, a second
  // stage's tied embedding: one of them writes). Loading reads everything a rank holds. One
  // process writes everything.
  virtual bool writes_to_checkpoint(const ParamSpec& p) const { return true; }
  // Mean loss over tokens (B, T+1), B <= micro_batch; no gradients.
  virtual float loss(Rows rows, int B) = 0;
  // Logits (B, Vp) of the last position of each row of tokens (B, T), T <= seq_len.
  virtual void last_logits(const int32_t* tokens, int B, int T, float* out) = 0;
  // Model FLOPs per trained token, 6N + 12 L d T_att.
  virtual double flops_per_token() const = 0;
  // Peak device memory in use so far, bytes (0 when not tracked).
  virtual int64_t peak_memory() const { return 0; }

  // What a checkpoint holds, in host memory, fp32, canonical layout: parameters, first and
  // second moments, and the optimizer's step count. state_to_host() makes these current;
  // after writing them, state_from_host() installs them on the device.
  // With a sharded optimizer (data parallelism) m and v hold only this rank's owned
  // elements, packed: `owned` lists them as ascending ranges of the flat buffer. params is the
  // whole layout, in layout order; after state_to_host() only its owned ranges are sure to be
  // current (the fp32 master weights are sharded like the moments); a load fills all of it.
  struct HostState {
    float* params;
    float* m;
    float* v;
    int64_t* steps_taken;
    std::vector<FlatRange> owned;
  };
  virtual HostState host_state() = 0;
  // Whether host_state() is the training state itself (the CPU), not a copy that only
  // state_to_host() changes (a GPU): a save written while training goes on must copy it first.
  virtual bool host_state_is_live() const = 0;

  // The silent-corruption check (fault.sdc_check_every): after the parameters' all-gather every
  // data-parallel replica must hold its peers' pieces bit for bit as their owners' updates left
  // them. Per region of the flat buffer (runtime/data_parallel.h: every tensor but the routed
  // experts over the data-parallel group, then an MoE model's experts over theirs), {the hash of
  // this rank's owned ranges as its update of a checked step left them, then the hash of each
  // group rank o's owned ranges as this rank holds them}. Empty where not kept.
  virtual std::vector<std::vector<uint64_t>> replica_hashes() { return {}; }
  // Fault injection (flip): one bit of this rank's copy of the parameters, after the gathers.
  virtual void flip_parameter_bit() {}
  virtual void state_to_host() = 0;
  virtual void state_from_host() = 0;
};

}  // namespace myriad
