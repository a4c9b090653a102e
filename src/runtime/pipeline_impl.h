// The definitions of the pipeline executor (runtime/pipeline.h), for the files that instantiate
// it with a model: runtime/engine.cc (the CPU op set) and runtime/cuda/ (the CUDA one).
#pragma once

#include "core/error.h"
#include "runtime/heartbeat.h"
#include "runtime/pipeline.h"

namespace myriad {

template <class Model>
Pipeline<Model>::Pipeline(Model& model, parallel::Schedule schedule, int stage, PipelineLinks links,
                   int micro_batch, int seq_len)
    : model_(model),
      schedule_(std::move(schedule)),
      stage_(stage),
      p_(schedule_.p),
      v_(schedule_.v),
      links_(links),
      B_(micro_batch),
      T_(seq_len),
      boundary_(model.boundary_elems(micro_batch)) {
  MYRIAD_CHECK(model_.num_chunks() == v_, "the model holds ", model_.num_chunks(),
               " chunks but the schedule has ", v_);
  MYRIAD_CHECK(p_ == 1 || (links_.act_to_next && links_.act_from_prev && links_.grad_to_prev &&
                           links_.grad_from_next),
               "pipeline links missing");
}

template <class Model>
comm::WorkPtr Pipeline<Model>::send(comm::Communicator* link, const Act* data, int64_t n) {
  return link->send_bytes(data, n * int64_t(sizeof(Act)), 1, model_.ops().comm_stream());
}
template <class Model>
comm::WorkPtr Pipeline<Model>::recv(comm::Communicator* link, Act* data, int64_t n) {
  return link->recv_bytes(data, n * int64_t(sizeof(Act)), 0, model_.ops().comm_stream());
}

template <class Model>
const typename Model::Act* Pipeline<Model>::received(parallel::ActionKind kind, int mb, int chunk) {
  using parallel::ActionKind;
  auto it = recvs_.find({kind, mb, chunk});
  MYRIAD_CHECK(it != recvs_.end(), "pipeline stage ", stage_, ": no receive posted for ",
               kind == ActionKind::kRecvActivation ? "the activation" : "the gradient",
               " of micro-batch ", mb, ", chunk ", chunk);
  if (hooks_ && hooks_->before_receive_wait) hooks_->before_receive_wait();
  times_.wait_s += comm::wait_blocked_s(*it->second.work);
  return it->second.data.data();
}

template <class Model>
void Pipeline<Model>::reap_sends(bool all) {
  for (auto it = sends_.begin(); it != sends_.end();) {
    if (!it->second.work) {  // a gradient whose send action comes next
      ++it;
    } else if (all || it->second.work->done()) {
      it->second.work->wait();  // rethrows a failure
      it = sends_.erase(it);
    } else {
      ++it;
    }
  }
}

template <class Model>
float Pipeline<Model>::train(Rows rows, float grad_scale, const Hooks& hooks) {
  hooks_ = &hooks;
  struct Unset {
    const Hooks*& h;
    ~Unset() { h = nullptr; }
  } unset{hooks_};
  using parallel::Action;
  using parallel::ActionKind;
  const int m = schedule_.m;
  std::vector<int> backwards(v_, 0);
  times_ = {};
  spans_.clear();
  for (const Action& a : schedule_.ranks[stage_]) {
    const int mb = a.microbatch, c = a.chunk;
    const Rows mb_rows = rows.from(int64_t(mb) * B_, T_);
    switch (a.kind) {
      case ActionKind::kRecvActivation: {
        Message& msg = recvs_[{a.kind, mb, c}];
        msg.data.zeros(boundary_);
        msg.work = recv(links_.act_from_prev, msg.data.data(), boundary_);
        break;
      }
      case ActionKind::kRecvGrad: {
        Message& msg = recvs_[{a.kind, mb, c}];
        msg.data.zeros(boundary_);
        msg.work = recv(links_.grad_from_next, msg.data.data(), boundary_);
        break;
      }
      case ActionKind::kForward: {
        if (hooks.before_forward) hooks.before_forward(c);
        const Act* input = nullptr;
        if (first(c)) input = nullptr;
        else if (p_ == 1) input = model_.chunk_output(c - 1, mb);
        else input = received(ActionKind::kRecvActivation, mb, c);
        set_phase("forward");
        const int t0 = model_.ops().mark();
        model_.forward_chunk(c, mb, B_, mb_rows, input, grad_scale);
        spans_.push_back({"forward", mb, c, t0, model_.ops().mark()});
        recvs_.erase({ActionKind::kRecvActivation, mb, c});
        break;
      }
      case ActionKind::kSendActivation: {
        // Sent from the chunk's slot, which stays until the chunk's backward.
        Message& msg = sends_[{a.kind, mb, c}];
        msg.work = send(links_.act_to_next, model_.chunk_output(c, mb), boundary_);
        break;
      }
      case ActionKind::kBackward: {
        const Act* dout = nullptr;
        if (last(c)) dout = nullptr;
        else if (p_ == 1) dout = local_grads_.at({ActionKind::kBackward, mb, c + 1}).data();
        else dout = received(ActionKind::kRecvGrad, mb, c);
        // The slot's output is about to be reused: its send must be done.
        if (auto s = sends_.find({ActionKind::kSendActivation, mb, c}); s != sends_.end()) {
          s->second.work->wait();
          sends_.erase(s);
        }
        Buffer din;
        if (!first(c)) din.zeros(boundary_);
        set_phase("backward");
        const int t0 = model_.ops().mark();
        model_.backward_chunk(c, mb, dout, first(c) ? nullptr : din.data(), grad_scale);
        spans_.push_back({"backward", mb, c, t0, model_.ops().mark()});
        recvs_.erase({ActionKind::kRecvGrad, mb, c});
        if (p_ == 1) {
          local_grads_.erase({ActionKind::kBackward, mb, c + 1});
          if (!first(c)) local_grads_[{ActionKind::kBackward, mb, c}] = std::move(din);
        } else if (!first(c)) {
          sends_[{ActionKind::kSendGrad, mb, c}].data = std::move(din);
        }
        if (++backwards[c] == m && hooks.chunk_done) hooks.chunk_done(c);
        reap_sends(false);
        break;
      }
      case ActionKind::kSendGrad: {
        Message& msg = sends_.at({a.kind, mb, c});
        msg.work = send(links_.grad_to_prev, msg.data.data(), boundary_);
        break;
      }
    }
  }
  reap_sends(true);
  MYRIAD_CHECK(recvs_.empty() && local_grads_.empty(), "pipeline stage ", stage_,
               ": messages left over after the step");
  // The micro-batches' mean losses, summed in the model's memory: one read for the step.
  return last(v_ - 1) ? static_cast<float>(model_.take_loss() / m) : 0.0f;
}

template <class Model>
const PipelineTimes& Pipeline<Model>::times() {
  times_.forward_s = times_.backward_s = 0;
  for (const ComputeSpan& s : spans_)
    (s.name[0] == 'f' ? times_.forward_s : times_.backward_s) += model_.ops().seconds(s.from, s.to);
  return times_;
}

template <class Model>
float Pipeline<Model>::evaluate(Rows rows, int B) {
  // The virtual stages in order, one micro-batch; no overlap needed for validation.
  constexpr int kEval = 1 << 29;
  const int64_t n = model_.boundary_elems(B);
  Buffer in;
  if (p_ > 1) in.zeros(n);
  float loss = 0;
  for (int c = 0; c < v_; ++c) {
    const Act* input = nullptr;
    if (!first(c) && p_ > 1) {
      recv(links_.act_from_prev, in.data(), n)->wait();
      input = in.data();
    } else if (!first(c)) {
      input = model_.chunk_output(c - 1, kEval);
    }
    model_.forward_chunk(c, kEval, B, rows, input, 0.0f);
    if (last(c)) loss = static_cast<float>(model_.take_loss());
    if (!last(c) && p_ > 1) send(links_.act_to_next, model_.chunk_output(c, kEval), n)->wait();
    if (p_ > 1) model_.drop_chunk(c, kEval);
  }
  if (p_ == 1)
    for (int c = 0; c < v_; ++c) model_.drop_chunk(c, kEval);
  return loss;
}

}  // namespace myriad
