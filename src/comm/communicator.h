// Communicators: a named group of ranks and its collectives, all asynchronous.
//
// Every operation returns a Work at once; the operations of one communicator run in the order
// they were issued (Gloo: on the communicator's own thread; NCCL: on the CUDA stream given per
// call). Work::wait() throws Error(kComm) naming the group, the operation, its sequence number and
// the step (set_step) when the operation failed, was aborted, or did not complete within the
// communicator's timeout. A failed communicator fails every later operation at once: recreate it
// (the driver restarts the job). abort() releases everything pending.
//
// Buffers are host memory for Gloo and device memory for NCCL; they must stay valid (and, for
// inputs, unchanged) until the operation's Work is done. Sums are over float32.
//
// Each communicator numbers its operations and keeps the last N records (seq, op, bytes, peer,
// state, timestamps), readable at any time from any thread by records(): what a hang report
// compares across ranks.
//
// Thread safety: the operations of one communicator are issued by one thread at a time; records(),
// abort() and the Work handles may be used from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace myriad {
struct CommConfig;
}

namespace myriad::comm {

class Store;
struct GroupSpec;

enum class OpKind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kSend, kRecv, kBarrier, kAllToAll };
const char* op_name(OpKind op);  // "all_reduce", ...

enum class OpState { kQueued, kRunning, kDone, kFailed, kAborted };
const char* state_name(OpState state);  // "queued", ...

struct OpRecord {
  uint64_t seq = 0;    // 1, 2, ... in the order this rank issued its operations
  uint64_t match = 0;  // what the peers share: the n-th collective of the group, or for send and
                       // recv the n-th message in that direction between the two ranks
  OpKind op = OpKind::kAllReduce;
  int64_t bytes = 0;  // of this rank's buffer (all_gather: its input; reduce_scatter: its output)
  int peer = -1;      // send/recv: the peer; broadcast: the root; otherwise -1 (the whole group)
  int64_t step = -1;  // set_step at issue; -1 = none
  OpState state = OpState::kQueued;
  // System clock, microseconds since the epoch; 0 = not yet. For NCCL, started and ended are
  // when the host observed the GPU reaching those points (Work::done/wait, records()).
  int64_t queued_us = 0, started_us = 0, ended_us = 0;
  std::string error;  // failed or aborted: why
};

// The handle of one asynchronous operation.
class Work {
 public:
  virtual ~Work();
  // Blocks until the operation completed. Throws Error(kComm) when it failed or was aborted, or
  // when it has not completed within the communicator's timeout.
  virtual void wait() = 0;
  // True once the operation completed, failed or was aborted; never blocks, never throws.
  virtual bool done() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

// An opaque CUDA stream (cudaStream_t) for NCCL; nullptr = the default stream. Gloo ignores it.
using Stream = void*;

struct CommOptions {
  double timeout_s = 300;        // per operation, and for set-up
  std::string backend = "gloo";  // gloo, nccl
  size_t records = 256;          // operation records kept per communicator
  std::string host;              // Gloo: the address, host name or network interface to bind and
                                 // publish; empty = $MYRIAD_GLOO_HOST, else 127.0.0.1
  std::map<std::string, std::string> nccl_env;  // NCCL_* variables set before NCCL starts
};

// Options from the [comm] section. backend "auto" becomes nccl when Myriad was built with CUDA and
// a GPU is visible, else gloo.
CommOptions comm_options(const CommConfig& cfg);

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }  // e.g. "world", "tp0", "dp1"
  virtual const char* backend() const = 0;           // "gloo", "nccl"
  // Whether an operation's result is there for later work on its stream without wait(): NCCL's
  // run on that stream, so wait() there only watches for a failure or the timeout; Gloo's run on
  // the communicator's own thread, device buffers staged by the host.
  virtual bool stream_ordered() const = 0;
  double timeout_s() const { return options_.timeout_s; }
  // The training step, named in errors and records of the operations issued from now on.
  void set_step(int64_t step) { step_.store(step); }

  // Sum over the group, in place: data[count].
  virtual WorkPtr all_reduce(float* data, int64_t count, Stream stream = nullptr) = 0;
  // in[size() * chunk] summed over the group; this rank receives chunk rank() in out[chunk].
  // out may be in + rank() * chunk.
  virtual WorkPtr reduce_scatter(const float* in, float* out, int64_t chunk,
                                 Stream stream = nullptr) = 0;
  // out[size() * chunk] = every rank's in[chunk], in rank order. in may be out + rank() * chunk.
  // The bytes form carries any element type (the bf16 compute copy of the weights).
  virtual WorkPtr all_gather_bytes(const void* in, void* out, int64_t chunk_bytes, Stream stream = nullptr) = 0;
  WorkPtr all_gather(const float* in, float* out, int64_t chunk, Stream stream = nullptr) {
    return all_gather_bytes(in, out, chunk * int64_t(sizeof(float)), stream);
  }
  // data[count] of rank `root` to every rank.
  virtual WorkPtr broadcast(float* data, int64_t count, int root, Stream stream = nullptr) = 0;
  virtual WorkPtr broadcast_bytes(void* data, int64_t bytes, int root, Stream stream = nullptr) = 0;
  // Point to point; messages between two ranks match in issue order. Gloo: a send does not wait
  // for the matching recv, so two ranks may each send to the other before receiving. NCCL: a send
  // and its recv are kernels that wait for each other, so such an exchange puts the send and
  // the recv on different streams.
  // The bytes forms carry any element type (bf16 activations between pipeline stages).
  virtual WorkPtr send_bytes(const void* data, int64_t bytes, int peer, Stream stream = nullptr) = 0;
  virtual WorkPtr recv_bytes(void* data, int64_t bytes, int peer, Stream stream = nullptr) = 0;
  WorkPtr send(const float* data, int64_t count, int peer, Stream stream = nullptr) {
    return send_bytes(data, count * int64_t(sizeof(float)), peer, stream);
  }
  WorkPtr recv(float* data, int64_t count, int peer, Stream stream = nullptr) {
    return recv_bytes(data, count * int64_t(sizeof(float)), peer, stream);
  }
  virtual WorkPtr barrier(Stream stream = nullptr) = 0;
  // Variable-count all-to-all (a mixture of experts' dispatch and combine): in holds size()
  // consecutive blocks, block p of send[p] bytes for rank p; out receives size() blocks, block p
  // of recv[p] bytes from rank p, in rank order. recv[p] must equal rank p's send[rank()] (the
  // caller exchanges the counts first); send[rank()] == recv[rank()] is copied locally. in and
  // out do not overlap. NCCL: one grouped ncclSend/ncclRecv per peer, host buffers staged.
  virtual WorkPtr all_to_all_bytes(const void* in, const std::vector<int64_t>& send, void* out,
                                   const std::vector<int64_t>& recv, Stream stream = nullptr) = 0;

  // Fails every pending operation (state aborted, waiters get an Error(kComm) carrying `why`) at
  // once, and every later one. Idempotent; any thread. NCCL: ncclCommAbort. Gloo: our own waits
  // end at once, but a Gloo collective already running ends only when a peer closes or at its
  // timeout; the destructor waits for it (its buffers stay in use until then).
  virtual void abort(const std::string& why = "aborted") = 0;

  // A subgroup. Collective over this communicator: every rank calls it, each with the member
  // list (ranks of this communicator, in the new group's rank order) of its own new group, or an
  // empty list (then it gets nullptr). `name` must be unique per new group ("tp0", "tp1").
  virtual std::unique_ptr<Communicator> split(const std::string& name,
                                              const std::vector<int>& ranks) = 0;

  // The last records, oldest first.
  virtual std::vector<OpRecord> records() const;

  // The members' ranks in the job (global ranks), in group rank order, when the caller knows
  // them: a timed-out operation then names the ranks it was waiting on.
  void set_members(std::vector<int> global_ranks) { members_ = std::move(global_ranks); }
  const std::vector<int>& members() const { return members_; }

 protected:
  Communicator(std::string name, int rank, int size, CommOptions options);

  // "comm group 'tp0' (gloo, rank 1 of 4): all_reduce #7 (step 12, 4096 bytes)"
  std::string label(uint64_t seq, OpKind op, int64_t bytes, int peer, int64_t step) const;
  // What a timeout of an operation with `peer` (-1: a collective) was waiting on, as far as this
  // rank can tell: "; waiting on global rank 3 (group rank 1), which did not take part in time".
  // Empty without set_members().
  std::string waiting_on(int peer) const;
  int64_t step() const { return step_.load(); }
  const CommOptions& options() const { return options_; }

  // The record ring. add() returns the new record's seq.
  uint64_t log_add(OpKind op, int64_t bytes, int peer, uint64_t match, int64_t step);
  void log_update(uint64_t seq, OpState state, const std::string& error = "");

 private:
  std::string name_;
  int rank_, size_;
  std::vector<int> members_;  // global ranks by group rank; empty: unknown
  CommOptions options_;
  std::atomic<int64_t> step_{-1};
  mutable std::mutex log_mu_;
  std::vector<OpRecord> ring_;
  uint64_t next_seq_ = 1;
};

// Creates this rank's communicators of `groups` (in that order; each rank lists its groups in the
// same global order, e.g. world, tp, pp, dp) with one batched store exchange for all of them
// (rendezvous.h), then the backend's set-up per group. The store must outlive the communicators
// when split() is used (Gloo subgroups meet through it), and is used by one thread at a time.
std::vector<std::unique_ptr<Communicator>> make_groups(const std::shared_ptr<Store>& store,
                                                       const std::vector<GroupSpec>& groups,
                                                       const CommOptions& options);
std::unique_ptr<Communicator> make_group(const std::shared_ptr<Store>& store,
                                         const std::string& name, int rank, int size,
                                         const CommOptions& options);

// Microseconds since the epoch on the system clock (record timestamps).
int64_t wall_us();

// Waits for `work` (rethrowing its failure) and returns the seconds this thread was blocked:
// 0 when it had already completed. What the phase timers count as communication not hidden.
double wait_blocked_s(Work& work);

}  // namespace myriad::comm
