// NcclCommunicator: GPU collectives through NCCL (API of NCCL 2.28).
//
// Set-up: the group's id exchange (rendezvous.h) carries the ncclUniqueId from the group's rank 0
// to the members; every member then joins with ncclCommInitRankConfig. Subgroups made by split()
// come from ncclCommSplit of this communicator and need no store. Communicators are non-blocking
// (config.blocking = 0), so that set-up and every call can be bounded by the timeout and cut
// short by ncclCommAbort instead of hanging.
//
// Operations are enqueued on the stream given per call, between two CUDA events (start, end).
// A Work is the end event plus ncclCommGetAsyncError, polled until the event completes, NCCL
// reports an error, abort() is called or the timeout passes; on a timeout the communicator is
// aborted, which also releases the GPU kernels. Records learn that an operation started or ended
// when the host looks (Work::done/wait, records()).
//
// Environment: [comm] nccl_env is applied with setenv before the first NCCL call of a set-up,
// and NCCL_NVLS_ENABLE=0 is forced (NVLink SHARP multicast stays off).
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include "comm/backends.h"
#include "comm/store.h"
#include "core/error.h"
#include "core/log.h"

namespace myriad::comm {
namespace {

std::string nccl_text(ncclResult_t r, ncclComm_t comm) {
  std::string s = ncclGetErrorString(r);
  if (comm) {
    const char* last = ncclGetLastError(comm);
    if (last && *last) s += cat(" (", last, ")");
  }
  return s;
}

// A buffer an operation hands to NCCL: `data` itself when it is device memory, else (host
// memory: the step's scalars, norms and loss) a device copy filled before the operation and
// copied back after it, on the operation's stream; the copy back waits for the stream, so a
// host buffer holds its result when the call returns.
class HostStaged {
 public:
  HostStaged(void* data, int64_t bytes, cudaStream_t stream, bool fill)
      : data_(data), bytes_(bytes), stream_(stream) {
    if (bytes <= 0) return;
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, data) != cudaSuccess) (void)cudaGetLastError();
    else if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) return;
    check(cudaMalloc(&dev_, static_cast<size_t>(bytes)), "cudaMalloc");
    if (fill) check(cudaMemcpyAsync(dev_, data, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
  }
  ~HostStaged() {
    if (dev_) cudaFree(dev_);
  }
  HostStaged(const HostStaged&) = delete;
  HostStaged& operator=(const HostStaged&) = delete;
  template <class T = float>
  T* ptr() const { return static_cast<T*>(dev_ ? dev_ : data_); }
  bool staged() const { return dev_ != nullptr; }
  void back() {
    if (!dev_) return;
    check(cudaMemcpyAsync(data_, dev_, bytes_, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

 private:
  static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw_runtime("NCCL host staging: ", what, ": ", cudaGetErrorString(e));
  }
  void* data_;
  void* dev_ = nullptr;
  int64_t bytes_;
  cudaStream_t stream_;
};

// Makes `device` current for a scope, restoring the caller's device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(device);
    device_ = device;
  }
  ~DeviceScope() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0, device_ = 0;
};

void sleep_brief(double* interval_s) {
  std::this_thread::sleep_for(std::chrono::duration<double>(*interval_s));
  *interval_s = std::min(*interval_s * 2, 0.001);
}

// Polls a non-blocking communicator until its pending call (init, split, enqueue, finalize)
// settles. Returns the final result; ncclInProgress means the deadline passed.
ncclResult_t settle(ncclComm_t comm, double deadline) {
  double interval = 1e-5;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
    if (state != ncclInProgress) return state;
    if (steady_now_s() >= deadline) return ncclInProgress;
    sleep_brief(&interval);
  }
}

class NcclCommunicator;

// One operation, shared by its Work and, until it completes, the communicator.
struct Op {
  uint64_t seq = 0;
  std::string label;
  cudaEvent_t start = nullptr, end = nullptr;  // owned
  OpState state = OpState::kQueued;
  std::string error;

  Op() = default;
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;
  ~Op() {  // an event still pending is released by CUDA once it completes
    if (start) cudaEventDestroy(start);
    if (end) cudaEventDestroy(end);
  }
};

cudaEvent_t new_event(int device) {
  cudaEvent_t e = nullptr;
  if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess)
    throw_runtime("cudaEventCreate failed on device ", device);
  return e;
}

// State shared by a communicator and its Work handles (which may outlive it).

struct Shared {
  std::mutex mu;
  ncclComm_t comm = nullptr;  // null once aborted or destroyed
  int device = 0;
  bool aborted = false, failed = false;
  std::string reason;                 // why aborted or failed
  NcclCommunicator* owner = nullptr;  // null once the communicator is gone
};

bool final_state(OpState s) {
  return s == OpState::kDone || s == OpState::kFailed || s == OpState::kAborted;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, const GroupSpec& g, std::shared_ptr<Store> store,
                   const CommOptions& options)
      : Communicator(g.name, g.rank, g.size, options),
        store_(std::move(store)),
        shared_(std::make_shared<Shared>()),
        sends_(g.size),
        recvs_(g.size) {
    shared_->comm = comm;
    cudaGetDevice(&shared_->device);
    shared_->owner = this;
    if (cudaMalloc(&scratch_, sizeof(float)) != cudaSuccess) {
      ncclCommAbort(comm);
      throw_runtime("comm group '", name(), "': cudaMalloc of 4 bytes failed");
    }
  }

  ~NcclCommunicator() override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (ncclComm_t comm = shared_->comm) {
      DeviceScope device(shared_->device);
      // Healthy: flush what is pending (within the timeout), then the ops still tracked are done.
      // Otherwise, or when the flush does not finish: abort.
      bool clean = false;
      if (!shared_->aborted && !shared_->failed) {
        ncclResult_t r = ncclCommFinalize(comm);
        clean = (r == ncclSuccess || r == ncclInProgress) &&
                settle(comm, steady_now_s() + timeout_s()) == ncclSuccess;
      }
      for (auto& op : outstanding_)
        if (!final_state(op->state)) {
          op->state = clean ? OpState::kDone : OpState::kAborted;
          op->error = clean ? "" : "communicator destroyed";
          note(*op);
        }
      if (clean) {
        ncclCommDestroy(comm);
      } else {
        ncclCommAbort(comm);
      }
    }
    shared_->comm = nullptr;
    if (!shared_->aborted && !shared_->failed) shared_->reason = "communicator destroyed";
    shared_->aborted = true;
    shared_->owner = nullptr;
    cudaFree(scratch_);
  }

  const char* backend() const override { return "nccl"; }
  bool stream_ordered() const override { return true; }

  // Host buffers are staged through device copies (HostStaged); device buffers go as they are.
  WorkPtr all_reduce(float* data, int64_t count, Stream stream) override {
    check_count(count);
    HostStaged buf(data, count * 4, cuda_stream(stream), true);
    WorkPtr w = issue(OpKind::kAllReduce, count * 4, -1, stream, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(buf.ptr(), buf.ptr(), static_cast<size_t>(count), ncclFloat32, ncclSum, c, s);
    });
    return finish(w, buf);
  }
  WorkPtr reduce_scatter(const float* in, float* out, int64_t chunk, Stream stream) override {
    check_count(chunk);
    HostStaged src(const_cast<float*>(in), chunk * 4 * size(), cuda_stream(stream), true),
        dst(out, chunk * 4, cuda_stream(stream), false);
    WorkPtr w = issue(OpKind::kReduceScatter, chunk * 4, -1, stream, [&](ncclComm_t c, cudaStream_t s) {
      return ncclReduceScatter(src.ptr(), dst.ptr(), static_cast<size_t>(chunk), ncclFloat32, ncclSum, c, s);
    });
    return finish(w, dst);
  }
  WorkPtr all_gather_bytes(const void* in, void* out, int64_t chunk, Stream stream) override {
    check_count(chunk);
    HostStaged src(const_cast<void*>(in), chunk, cuda_stream(stream), true),
        dst(out, chunk * size(), cuda_stream(stream), false);
    WorkPtr w = issue(OpKind::kAllGather, chunk, -1, stream, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllGather(src.ptr(), dst.ptr(), static_cast<size_t>(chunk), ncclUint8, c, s);
    });
    return finish(w, dst);
  }
  WorkPtr broadcast(float* data, int64_t count, int root, Stream stream) override {
    check_count(count);
    check_root(root);
    HostStaged buf(data, count * 4, cuda_stream(stream), true);
    WorkPtr w = issue(OpKind::kBroadcast, count * 4, root, stream, [&](ncclComm_t c, cudaStream_t s) {
      return ncclBroadcast(buf.ptr(), buf.ptr(), static_cast<size_t>(count), ncclFloat32, root, c, s);
    });
    return finish(w, buf);
  }
  WorkPtr broadcast_bytes(void* data, int64_t bytes, int root, Stream stream) override {
    check_count(bytes);
    check_root(root);
    HostStaged buf(data, bytes, cuda_stream(stream), true);
    WorkPtr w = issue(OpKind::kBroadcast, bytes, root, stream, [&](ncclComm_t c, cudaStream_t s) {
      return ncclBroadcast(buf.ptr(), buf.ptr(), static_cast<size_t>(bytes), ncclUint8, root, c, s);
    });
    return finish(w, buf);
  }
  // Point to point takes device memory only: a staged send would have to wait for its receive
  // inside the call, and two ranks that both send first would wait on each other.
  WorkPtr send_bytes(const void* data, int64_t bytes, int peer, Stream stream) override {
    check_count(bytes);
    check_peer(peer, "send");
    check_device(data, bytes, "send");
    return issue(OpKind::kSend, bytes, peer, stream, [&](ncclComm_t c, cudaStream_t s) {
      return ncclSend(data, static_cast<size_t>(bytes), ncclUint8, peer, c, s);
    });
  }
  WorkPtr recv_bytes(void* data, int64_t bytes, int peer, Stream stream) override {
    check_count(bytes);
    check_peer(peer, "recv");
    check_device(data, bytes, "recv");
    return issue(OpKind::kRecv, bytes, peer, stream, [&](ncclComm_t c, cudaStream_t s) {
      return ncclRecv(data, static_cast<size_t>(bytes), ncclUint8, peer, c, s);
    });
  }
  // One ncclSend and one ncclRecv per peer with bytes to move (itself included), in one NCCL
  // group: every rank issues the group at once, so none waits on another's order. Host buffers
  // (an expert layer's counts) are staged as the collectives' are: the exchange is collective.
  WorkPtr all_to_all_bytes(const void* in, const std::vector<int64_t>& send, void* out,
                           const std::vector<int64_t>& recv, Stream stream) override {
    if (int(send.size()) != size() || int(recv.size()) != size())
      throw Error(ErrorClass::kInternal, cat("all_to_all in group ", name(), " of ", size(), " ranks: ", send.size(),
                                             " send and ", recv.size(), " receive counts"));
    std::vector<int64_t> soff(size() + 1, 0), roff(size() + 1, 0);
    for (int p = 0; p < size(); ++p) {
      check_count(send[p]);
      check_count(recv[p]);
      soff[p + 1] = soff[p] + send[p], roff[p + 1] = roff[p] + recv[p];
    }
    if (send[rank()] != recv[rank()])
      throw Error(ErrorClass::kInternal, cat("all_to_all in group ", name(), ": rank ", rank(), " sends itself ",
                                             send[rank()], " bytes but receives ", recv[rank()]));
    HostStaged src(const_cast<void*>(in), soff[size()], cuda_stream(stream), true),
        dst(out, roff[size()], cuda_stream(stream), false);
    WorkPtr w = issue(OpKind::kAllToAll, soff[size()], -1, stream, [&](ncclComm_t c, cudaStream_t s) {
      ncclResult_t r = ncclGroupStart();
      for (int p = 0; p < size() && r == ncclSuccess; ++p) {
        if (send[p] > 0) r = ncclSend(src.ptr<char>() + soff[p], static_cast<size_t>(send[p]), ncclUint8, p, c, s);
        if (r == ncclSuccess && recv[p] > 0)
          r = ncclRecv(dst.ptr<char>() + roff[p], static_cast<size_t>(recv[p]), ncclUint8, p, c, s);
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
    return finish(w, dst);
  }

  WorkPtr barrier(Stream stream) override {
    return issue(OpKind::kBarrier, 0, -1, stream, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, c, s);
    });
  }

  void abort(const std::string& why) override { abort_shared(*shared_, why); }

 private:
  static cudaStream_t cuda_stream(Stream s) { return static_cast<cudaStream_t>(s); }
  // A staged operation's result is copied back, and the call returns with it in place.
  WorkPtr finish(WorkPtr w, HostStaged& staged) {
    if (staged.staged()) {
      w->wait();
      staged.back();
    }
    return w;
  }
  void check_device(const void* data, int64_t bytes, const char* op) const {
    if (bytes <= 0) return;
    cudaPointerAttributes a{};
    const bool device = cudaPointerGetAttributes(&a, data) == cudaSuccess &&
                        (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged);
    if (!device) (void)cudaGetLastError();
    MYRIAD_CHECK(device, "comm group '", name(), "' (nccl): ", op, " takes device memory");
  }

 public:

  std::unique_ptr<Communicator> split(const std::string& name,
                                      const std::vector<int>& ranks) override {
    int pos = -1;
    std::set<int> seen;
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] < 0 || ranks[i] >= size() || !seen.insert(ranks[i]).second)
        throw_input("comm group '", this->name(), "': split '", name, "': bad or repeated rank ",
                    ranks[i]);
      if (ranks[i] == rank()) pos = static_cast<int>(i);
    }
    if (!ranks.empty() && pos < 0)
      throw_input("comm group '", this->name(), "': split '", name, "': rank ", rank(),
                  " passed a member list without itself");
    // Held throughout, so that no abort() frees the parent under the split (bounded by the
    // timeout).
    std::unique_lock<std::mutex> lock(shared_->mu);
    if (!shared_->comm)
      throw Error(ErrorClass::kComm, cat(where(), ": split '", name, "': ", shared_->reason));
    ncclComm_t parent = shared_->comm;
    DeviceScope device(shared_->device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = name.c_str();
    ncclComm_t child = nullptr;
    const double deadline = steady_now_s() + timeout_s();
    // The color names the group by its first member (distinct for disjoint groups).
    ncclResult_t r = ncclCommSplit(parent, ranks.empty() ? NCCL_SPLIT_NOCOLOR : ranks[0],
                                   std::max(pos, 0), &child, &config);
    if (r == ncclInProgress) r = settle(parent, deadline);
    if (r == ncclSuccess && child) r = settle(child, deadline);
    if (r != ncclSuccess) {
      const std::string text = r == ncclInProgress ? cat("not complete within ", timeout_s(), " s")
                                                   : nccl_text(r, parent);
      if (child) ncclCommAbort(child);
      lock.unlock();
      abort(cat("split '", name, "' failed"));
      throw Error(ErrorClass::kComm, cat(where(), ": split '", name, "': ", text));
    }
    lock.unlock();
    if (ranks.empty()) return nullptr;
    GroupSpec g;
    g.name = name, g.rank = pos, g.size = static_cast<int>(ranks.size());
    return std::make_unique<NcclCommunicator>(child, g, store_, options());
  }

  std::vector<OpRecord> records() const override {
    const_cast<NcclCommunicator*>(this)->refresh();
    return Communicator::records();
  }

  // Called with shared.mu held, by whoever observed an op's change.
  void note(const Op& op) { log_update(op.seq, op.state, op.error); }

  // Marks the communicator aborted: ncclCommAbort, every outstanding op aborted.
  static void abort_shared(Shared& sh, const std::string& why) {
    std::lock_guard<std::mutex> lock(sh.mu);
    if (sh.aborted) return;
    sh.aborted = true;
    sh.reason = why;
    if (sh.comm) {
      DeviceScope device(sh.device);
      ncclCommAbort(sh.comm);
      sh.comm = nullptr;
    }
    if (sh.owner) sh.owner->abort_outstanding(why);
  }

 private:
  class NcclWork;

  std::string where() const {
    return cat("comm group '", name(), "' (nccl, rank ", rank(), " of ", size(), ")");
  }
  void check_count(int64_t count) const {
    if (count < 0) throw_input(where(), ": negative element count ", count);
  }
  void check_peer(int peer, const char* op) const {
    if (peer < 0 || peer >= size() || peer == rank())
      throw_input(where(), ": ", op, " with peer ", peer);
  }
  void check_root(int root) const {
    if (root < 0 || root >= size()) throw_input(where(), ": broadcast from root ", root);
  }

  template <class F>
  WorkPtr issue(OpKind kind, int64_t bytes, int peer, Stream stream, F&& call);

  // Updates the states of outstanding ops from their events and forgets the finished ones.
  void refresh();
  void refresh_locked();  // caller holds shared.mu
  // Caller holds shared.mu.
  void abort_outstanding(const std::string& why) {
    for (auto& op : outstanding_) {
      if (final_state(op->state)) continue;
      op->state = OpState::kAborted;
      op->error = why;
      note(*op);
    }
    outstanding_.clear();
  }

  std::shared_ptr<Store> store_;
  std::shared_ptr<Shared> shared_;
  float* scratch_ = nullptr;  // device memory for barrier()
  uint64_t collectives_ = 0;
  std::vector<uint64_t> sends_, recvs_;
  std::deque<std::shared_ptr<Op>> outstanding_;  // guarded by shared_->mu
};

// The Work of one NCCL operation.
class NcclCommunicator::NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Shared> shared, std::shared_ptr<Op> op, double timeout_s)
      : shared_(std::move(shared)), op_(std::move(op)), timeout_s_(timeout_s) {}
  bool done() override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    observe();
    return final_state(op_->state);
  }

  void wait() override {
    const double deadline = steady_now_s() + timeout_s_;
    double interval = 1e-5;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(shared_->mu);
        observe();
        if (op_->state == OpState::kDone) return;
        if (op_->state == OpState::kFailed)
          throw Error(ErrorClass::kComm, cat(op_->label, " failed: ", op_->error));
        if (op_->state == OpState::kAborted)
          throw Error(ErrorClass::kComm, cat(op_->label, " aborted: ", op_->error));
      }
      if (steady_now_s() >= deadline) {
        const std::string why = cat(op_->label, ": not completed within ", timeout_s_, " s");
        NcclCommunicator::abort_shared(*shared_, why);  // frees the GPU from the stuck kernels
        throw Error(ErrorClass::kComm, why);
      }
      sleep_brief(&interval);
    }
  }

 private:
  // Moves op_ forward from its events and the communicator's error state. Holds shared.mu.
  void observe() {
    if (final_state(op_->state)) return;
    if (shared_->aborted || shared_->failed) {
      set(shared_->aborted ? OpState::kAborted : OpState::kFailed, shared_->reason);
      return;
    }
    DeviceScope device(shared_->device);
    if (op_->state == OpState::kQueued && op_->start && cudaEventQuery(op_->start) == cudaSuccess)
      set(OpState::kRunning, "");
    cudaError_t e = cudaEventQuery(op_->end);
    if (e == cudaSuccess) {
      if (op_->state == OpState::kQueued) set(OpState::kRunning, "");
      set(OpState::kDone, "");
      return;
    }
    if (e != cudaErrorNotReady) {
      cudaGetLastError();  // clear the sticky-free error
      fail(cat("CUDA: ", cudaGetErrorString(e)));
      return;
    }
    ncclResult_t async = ncclSuccess;
    if (shared_->comm && ncclCommGetAsyncError(shared_->comm, &async) == ncclSuccess &&
        async != ncclSuccess && async != ncclInProgress)
      fail(cat("NCCL: ", nccl_text(async, shared_->comm)));
  }
  void set(OpState s, const std::string& error) {
    op_->state = s;
    op_->error = error;
    if (shared_->owner) shared_->owner->note(*op_);
  }
  // An asynchronous NCCL or CUDA error breaks the communicator: abort it, fail this op.
  void fail(const std::string& why) {
    set(OpState::kFailed, why);
    shared_->failed = true;
    shared_->reason = cat("not run: operation #", op_->seq, " failed: ", why);
    if (shared_->comm) {
      ncclCommAbort(shared_->comm);
      shared_->comm = nullptr;
    }
    if (shared_->owner) shared_->owner->abort_outstanding(shared_->reason);
  }
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<Op> op_;
  double timeout_s_;
};

template <class F>
WorkPtr NcclCommunicator::issue(OpKind kind, int64_t bytes, int peer, Stream stream, F&& call) {
  const int64_t st = step();
  auto s = static_cast<cudaStream_t>(stream);
  std::lock_guard<std::mutex> lock(shared_->mu);
  uint64_t match = kind == OpKind::kSend   ? ++sends_[peer]
                   : kind == OpKind::kRecv ? ++recvs_[peer]
                                           : ++collectives_;
  const int record_peer =
      kind == OpKind::kSend || kind == OpKind::kRecv || kind == OpKind::kBroadcast ? peer : -1;
  auto op = std::make_shared<Op>();
  op->seq = log_add(kind, bytes, record_peer, match, st);
  op->label = label(op->seq, kind, bytes, record_peer, st);
  auto work = std::make_shared<NcclWork>(shared_, op, timeout_s());
  if (!shared_->comm) {
    op->state = shared_->failed ? OpState::kFailed : OpState::kAborted;
    op->error = shared_->reason;
    note(*op);
    return work;
  }
  DeviceScope device(shared_->device);
  op->start = new_event(shared_->device);
  op->end = new_event(shared_->device);
  cudaEventRecord(op->start, s);
  ncclResult_t r = call(shared_->comm, s);
  if (r == ncclInProgress) r = settle(shared_->comm, steady_now_s() + timeout_s());
  if (r != ncclSuccess) {
    const std::string why = r == ncclInProgress
                                ? cat("enqueue not complete within ", timeout_s(), " s")
                                : nccl_text(r, shared_->comm);
    op->state = OpState::kFailed;
    op->error = why;
    note(*op);
    shared_->failed = true;
    shared_->reason = cat("not run: operation #", op->seq, " failed: ", why);
    ncclCommAbort(shared_->comm);
    shared_->comm = nullptr;
    abort_outstanding(shared_->reason);
    return work;
  }
  cudaEventRecord(op->end, s);
  outstanding_.push_back(op);
  refresh_locked();  // keeps the list short when nobody waits (ordering by streams alone)
  return work;
}

void NcclCommunicator::refresh() {
  std::lock_guard<std::mutex> lock(shared_->mu);
  refresh_locked();
}

void NcclCommunicator::refresh_locked() {
  DeviceScope device(shared_->device);
  while (!outstanding_.empty()) {
    Op& op = *outstanding_.front();
    if (!final_state(op.state)) {
      if (op.state == OpState::kQueued && cudaEventQuery(op.start) == cudaSuccess) {
        op.state = OpState::kRunning;
        note(op);
      }
      if (cudaEventQuery(op.end) != cudaSuccess) break;  // in order on its stream: stop here
      op.state = OpState::kDone;
      note(op);
    }
    outstanding_.pop_front();
  }
}

void apply_nccl_env(const CommOptions& options) {
  for (const auto& [key, value] : options.nccl_env) {
    if (key.rfind("NCCL_", 0) != 0)
      throw_input("comm.nccl_env: '", key, "' is not an NCCL_* variable");
    if (key == "NCCL_NVLS_ENABLE" && value != "0")
      log::warn("comm.nccl_env: NCCL_NVLS_ENABLE=", value, " ignored: Myriad keeps NVLS off");
    ::setenv(key.c_str(), value.c_str(), 1);
  }
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
}

}  // namespace

bool cuda_device_visible() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::vector<std::unique_ptr<Communicator>> make_nccl_groups(const std::shared_ptr<Store>& store,
                                                            const std::vector<GroupSpec>& groups,
                                                            const CommOptions& options) {
  apply_nccl_env(options);
  std::vector<std::string> payloads;
  for (const GroupSpec& g : groups) {
    std::string p;
    if (g.rank == 0) {
      ncclUniqueId id;
      ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess)
        throw Error(ErrorClass::kComm, cat("comm group '", g.name,
                                           "' (nccl): ncclGetUniqueId: ", nccl_text(r, nullptr)));
      p.assign(id.internal, sizeof id.internal);
    }
    payloads.push_back(std::move(p));
  }
  std::vector<std::string> ids = exchange_ids(*store, groups, payloads);
  std::vector<std::unique_ptr<Communicator>> out;
  // One group at a time, in the same order on every rank: each init completes only when all of
  // its members have joined.
  for (size_t i = 0; i < groups.size(); ++i) {
    const GroupSpec& g = groups[i];
    const std::string where =
        cat("comm group '", g.name, "' (nccl, rank ", g.rank, " of ", g.size, ")");
    ncclUniqueId id;
    if (ids[i].size() != sizeof id.internal)
      throw Error(ErrorClass::kComm, cat(where, ": the id from the store has ", ids[i].size(),
                                         " bytes, not ", sizeof id.internal));
    std::memcpy(id.internal, ids[i].data(), sizeof id.internal);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = g.name.c_str();
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&comm, g.size, id, g.rank, &config);
    if ((r == ncclSuccess || r == ncclInProgress) && comm)
      r = settle(comm, steady_now_s() + options.timeout_s);
    if (r != ncclSuccess) {
      const std::string text = r == ncclInProgress
                                   ? cat("not complete within ", options.timeout_s, " s")
                                   : nccl_text(r, comm);
      if (comm) ncclCommAbort(comm);
      throw Error(ErrorClass::kComm, cat(where, ": ncclCommInitRank: ", text));
    }
    out.push_back(std::make_unique<NcclCommunicator>(comm, g, store, options));
  }
  return out;
}

}  // namespace myriad::comm
