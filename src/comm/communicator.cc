#include "comm/communicator.h"

#include <chrono>

#include "comm/backends.h"
#include "comm/store.h"
#include "core/clock.h"
#include "core/config.h"
#include "core/error.h"

namespace myriad::comm {

double wait_blocked_s(Work& work) {
  double blocked = 0;
  if (!work.done()) {
    const double t0 = now_s();
    work.wait();
    blocked = now_s() - t0;
  }
  work.wait();  // rethrows a failure
  return blocked;
}

int64_t wall_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::kAllReduce:
      return "all_reduce";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kAllGather:
      return "all_gather";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kAllToAll:
      return "all_to_all";
  }
  return "?";
}

const char* state_name(OpState state) {
  switch (state) {
    case OpState::kQueued:
      return "queued";
    case OpState::kRunning:
      return "running";
    case OpState::kDone:
      return "done";
    case OpState::kFailed:
      return "failed";
    case OpState::kAborted:
      return "aborted";
  }
  return "?";
}

Work::~Work() = default;

CommOptions comm_options(const CommConfig& cfg) {
  CommOptions o;
  o.timeout_s = cfg.timeout_s;
  o.nccl_env = cfg.nccl_env;
  if (!(cfg.timeout_s > 0)) throw_input("comm.timeout_s must be > 0, got ", cfg.timeout_s);
  if (cfg.backend == "gloo") {
    o.backend = "gloo";
  } else if (cfg.backend == "nccl") {
#ifndef MYRIAD_HAVE_CUDA
    throw_input("comm.backend = \"nccl\" needs Myriad built with CUDA (nvcc); use gloo or auto");
#endif
    o.backend = "nccl";
  } else if (cfg.backend == "auto") {
#ifdef MYRIAD_HAVE_CUDA
    o.backend = cuda_device_visible() ? "nccl" : "gloo";
#else
    o.backend = "gloo";
#endif
  } else {
    throw_input("comm.backend must be auto, gloo or nccl, got '", cfg.backend, "'");
  }
  return o;
}

Communicator::Communicator(std::string name, int rank, int size, CommOptions options)
    : name_(std::move(name)), rank_(rank), size_(size), options_(std::move(options)) {
  if (options_.records == 0) options_.records = 1;
  ring_.resize(options_.records);
}

Communicator::~Communicator() = default;

std::string Communicator::label(uint64_t seq, OpKind op, int64_t bytes, int peer,
                                int64_t step) const {
  std::string where;
  if (op == OpKind::kSend) where = cat(" to rank ", peer);
  if (op == OpKind::kRecv) where = cat(" from rank ", peer);
  if (op == OpKind::kBroadcast) where = cat(" from root ", peer);
  return cat("comm group '", name_, "' (", backend(), ", rank ", rank_, " of ", size_,
             "): ", op_name(op), " #", seq, where, " (", step >= 0 ? cat("step ", step, ", ") : "",
             bytes, " bytes)");
}

std::string Communicator::waiting_on(int peer) const {
  if (static_cast<int>(members_.size()) != size_) return "";
  const char* late = " did not take part in time (stopped, hung or lost)";
  if (peer < 0 && size_ == 2) peer = 1 - rank_;  // a collective of two waits on the other
  if (peer >= 0 && peer < size_)
    return cat("; waiting on global rank ", members_[peer], " (group rank ", peer, "), which", late);
  std::string others;
  for (int r = 0, listed = 0; r < size_; ++r)
    if (r != rank_ && listed++ < 16) others += cat(others.empty() ? "" : ", ", members_[r]);
  if (size_ - 1 > 16) others += ", ...";
  return cat("; one of the other members (global ranks ", others, ")", late);
}

uint64_t Communicator::log_add(OpKind op, int64_t bytes, int peer, uint64_t match, int64_t step) {
  std::lock_guard<std::mutex> lock(log_mu_);
  const uint64_t seq = next_seq_++;
  OpRecord& r = ring_[(seq - 1) % ring_.size()];
  r = OpRecord{};
  r.seq = seq, r.match = match, r.op = op, r.bytes = bytes, r.peer = peer, r.step = step;
  r.state = OpState::kQueued;
  r.queued_us = wall_us();
  return seq;
}

void Communicator::log_update(uint64_t seq, OpState state, const std::string& error) {
  std::lock_guard<std::mutex> lock(log_mu_);
  OpRecord& r = ring_[(seq - 1) % ring_.size()];
  if (r.seq != seq) return;  // already overwritten by newer records
  const int64_t now = wall_us();
  if (state == OpState::kRunning) {
    r.started_us = now;
  } else if (state != OpState::kQueued) {
    if (r.state == OpState::kDone || r.state == OpState::kFailed || r.state == OpState::kAborted)
      return;  // the first final state stays
    r.ended_us = now;
    r.error = error;
  }
  r.state = state;
}

std::vector<OpRecord> Communicator::records() const {
  std::lock_guard<std::mutex> lock(log_mu_);
  std::vector<OpRecord> out;
  const uint64_t first = next_seq_ > ring_.size() ? next_seq_ - ring_.size() : 1;
  for (uint64_t s = first; s < next_seq_; ++s) out.push_back(ring_[(s - 1) % ring_.size()]);
  return out;
}

std::vector<std::unique_ptr<Communicator>> make_groups(const std::shared_ptr<Store>& store,
                                                       const std::vector<GroupSpec>& groups,
                                                       const CommOptions& options) {
  if (!store) throw Error(ErrorClass::kInternal, "make_groups: no store");
  if (!(options.timeout_s > 0))
    throw_input("communicator timeout must be > 0, got ", options.timeout_s);
  if (options.backend == "gloo") return make_gloo_groups(store, groups, options);
#ifdef MYRIAD_HAVE_CUDA
  if (options.backend == "nccl") return make_nccl_groups(store, groups, options);
#endif
  throw_input("communicator backend '", options.backend, "' is not available in this build");
}

std::unique_ptr<Communicator> make_group(const std::shared_ptr<Store>& store,
                                         const std::string& name, int rank, int size,
                                         const CommOptions& options) {
  GroupSpec g;
  g.name = name, g.rank = rank, g.size = size;
  return std::move(make_groups(store, {g}, options).front());
}

}  // namespace myriad::comm
