// The pipeline executor: walks this rank's action list of a schedule (parallel/schedule.h) over
// the model's chunks, with decoupled asynchronous sends and receives (MegaScale section 3.2).
//
// Each receive is posted where the schedule lists it (one compute ahead of its consumer) and
// waited for only by the Forward/Backward that consumes it; each send is posted right after the
// compute that produced it and waited for only before its buffer is reused. Activations live in
// the model's per-micro-batch slots from a chunk's forward to its backward; gradients over the
// micro-batches accumulate in the model's gradient buffer.
//
// Links: a separate two-rank communicator per direction and kind (activations to the next
// stage, gradients to the previous one), on which one rank only sends and the other only
// receives. A receive occupies its communicator's worker until the data arrives (Gloo), so
// sends must never queue behind receives; and each link's messages match in order, which the
// schedule guarantees. With p = 1 the chunks pass activations and gradients in memory.
//
// The executor is written once for every device: Model is a GptModel<Ops>, and the messages
// are the op set's buffers of its activation type (bf16 device memory on a GPU), passed to the
// links with the op set's stream. Definitions in pipeline_impl.h.
#pragma once

#include <functional>
#include <map>
#include <tuple>
#include <vector>

#include "comm/communicator.h"
#include "model/gpt.h"
#include "parallel/schedule.h"

namespace myriad {

struct PipelineLinks {
  comm::Communicator* act_to_next = nullptr;     // this rank sends
  comm::Communicator* act_from_prev = nullptr;   // this rank receives
  comm::Communicator* grad_to_prev = nullptr;    // this rank sends
  comm::Communicator* grad_from_next = nullptr;  // this rank receives
};

struct PipelineHooks {
  std::function<void(int chunk)> before_forward;  // e.g. wait for the chunk's parameters
  std::function<void(int chunk)> chunk_done;      // the chunk's last backward of the step
  std::function<void()> before_receive_wait;      // before waiting for a stage's activation or gradient
};

// Wall seconds of the last train(): in the chunks' forwards and backwards (tensor-parallel
// collectives run inside them and count here), and blocked on receives: this rank's share of
// the bubble. The compute is timed on the op set's timeline (CUDA events on a GPU), read by
// times() after the step.
struct PipelineTimes {
  double forward_s = 0, backward_s = 0, wait_s = 0;
};

// One forward or backward of a micro-batch's chunk in the last train(), between two marks of the
// op set's timeline (observe/trace.h places them on the host clock after the step).
struct ComputeSpan {
  const char* name;  // "forward", "backward"
  int microbatch, chunk;
  int from, to;  // op-set marks
};

template <class Model>
class Pipeline {
 public:
  using Act = typename Model::Act;
  using Hooks = PipelineHooks;
  using Times = PipelineTimes;

  // stage: this rank's pipeline coordinate; the model holds its v chunks. Micro-batches are
  // micro_batch rows of seq_len + 1 tokens.
  Pipeline(Model& model, parallel::Schedule schedule, int stage, PipelineLinks links,
           int micro_batch, int seq_len);

  // One step's forward and backward over m micro-batches: tokens (m * micro_batch, T+1), this
  // data-parallel rank's rows, host memory. Returns the mean loss over the micro-batches on the
  // rank holding the last virtual stage (read once, after the last backward is issued), 0 on
  // the others.
  float train(Rows rows, float grad_scale, const Hooks& hooks);
  // Forward only of B rows of tokens (B, T+1) through every virtual stage; the mean loss on the
  // last stage's rank, 0 elsewhere.
  float evaluate(Rows rows, int B);

  const parallel::Schedule& schedule() const { return schedule_; }
  // Resolves the compute marks of the last train() (waits for the last of them).
  const Times& times();
  // The last train()'s forwards and backwards, in the order they ran.
  const std::vector<ComputeSpan>& spans() const { return spans_; }

 private:
  using Key = std::tuple<parallel::ActionKind, int, int>;  // (what, micro-batch, chunk)
  using Buffer = typename Model::template Buffer<Act>;
  struct Message {
    Buffer data;  // (R, C) in the op set's memory
    comm::WorkPtr work;
  };
  int global_stage(int chunk) const { return chunk * p_ + stage_; }
  bool first(int chunk) const { return global_stage(chunk) == 0; }
  bool last(int chunk) const { return global_stage(chunk) == p_ * v_ - 1; }
  // Waits for a posted receive (counted as bubble) and returns its data.
  const Act* received(parallel::ActionKind kind, int mb, int chunk);
  // A boundary message of n elements: posted on `link` with the op set's stream.
  comm::WorkPtr send(comm::Communicator* link, const Act* data, int64_t n);
  comm::WorkPtr recv(comm::Communicator* link, Act* data, int64_t n);
  void reap_sends(bool all);

  Model& model_;
  parallel::Schedule schedule_;
  int stage_, p_, v_;
  PipelineLinks links_;
  int B_, T_;               // rows per micro-batch, tokens per row
  int64_t boundary_;        // elements of one activation or gradient message
  std::map<Key, Message> recvs_;       // posted receives, until consumed
  const Hooks* hooks_ = nullptr;       // train()'s, while it runs
  std::map<Key, Message> sends_;       // posted sends (gradients with their buffers), until done
  std::map<Key, Buffer> local_grads_;  // p = 1: chunk c's input gradient for c-1
  Times times_;
  std::vector<ComputeSpan> spans_;  // the last train()'s, in order
};

}  // namespace myriad
