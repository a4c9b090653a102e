// GlooCommunicator: CPU collectives over Gloo's TCP transport.
//
// Set-up: the group's id exchange (rendezvous.h) hands every member the leader's fresh token; the
// members then meet in Gloo's full-mesh rendezvous through our Store, under keys
// "gloo/<group>/<token>/" (so a group re-created within one attempt never reads stale addresses).
//
// Operations run in issue order on one thread per communicator, which is what makes them
// asynchronous. all_reduce, all_gather, broadcast and barrier are Gloo's, with the timeout in
// their options; reduce_scatter (a ring, bandwidth-optimal) and send/recv are ours, on Gloo's
// unbound buffers, under slot prefixes Gloo does not use. A send is posted by the worker and
// completed by a second thread, so that two ranks may each send to the other before receiving
// (Gloo's send waits for the matching recv to be posted).
//
// Device memory: Gloo's transport reads and writes host memory only, so a device buffer (the
// CUDA engine's, several ranks sharing one GPU) is staged through a pinned host copy: on the
// worker thread, copied out on the caller's stream (so after the work that produced it), the
// operation runs on the copy, and the result is copied back on the same stream before the Work
// completes. Slow, but every layout's GPU code runs through it.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <net/if.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <set>
#include <thread>

#include "comm/backends.h"
#include "comm/store.h"
#include "core/error.h"
#include "core/log.h"

#ifdef MYRIAD_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace myriad::comm {
namespace {

using UnboundBuffer = gloo::transport::UnboundBuffer;

// A buffer the operation works on in host memory: `data` itself, or, when `data` is device
// memory, a pinned copy that is filled from it (in()) and written back to it (out()) on `stream`.
class Staged {
 public:
  Staged(void* data, int64_t bytes, Stream stream) : data_(data), bytes_(bytes), stream_(stream) {
#ifdef MYRIAD_HAVE_CUDA
    if (!cuda_usable() || bytes <= 0) return;
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, data) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    if (a.type != cudaMemoryTypeDevice) return;
    device_ = a.device;
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaMallocHost(&host_, static_cast<size_t>(bytes)), "cudaMallocHost");
#endif
  }
  ~Staged() {
#ifdef MYRIAD_HAVE_CUDA
    if (host_) cudaFreeHost(host_);
#endif
  }
  Staged(const Staged&) = delete;
  Staged& operator=(const Staged&) = delete;

  template <class T = float>
  T* host() const { return static_cast<T*>(host_ ? host_ : data_); }
  bool staged() const { return host_ != nullptr; }
  // Device -> host copy; returns once the copy holds the data.
  void in() {
#ifdef MYRIAD_HAVE_CUDA
    if (!host_) return;
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaMemcpyAsync(host_, data_, bytes_, cudaMemcpyDeviceToHost, stream()), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
#endif
  }
  // Host -> device; returns once the device buffer holds the result.
  void out() {
#ifdef MYRIAD_HAVE_CUDA
    if (!host_) return;
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaMemcpyAsync(data_, host_, bytes_, cudaMemcpyHostToDevice, stream()), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
#endif
  }

 private:
#ifdef MYRIAD_HAVE_CUDA
  cudaStream_t stream() const { return static_cast<cudaStream_t>(stream_); }
  static bool cuda_usable() {
    static const bool usable = [] {
      int n = 0;
      const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
      (void)cudaGetLastError();
      return ok;
    }();
    return usable;
  }
  static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess)
      throw Error(ErrorClass::kRuntime, cat("gloo staging of device memory: ", what, ": ", cudaGetErrorString(e)));
  }
#endif
  void* data_;
  int64_t bytes_;
  Stream stream_;
  void* host_ = nullptr;
  int device_ = 0;
};

constexpr uint8_t kReduceScatterSlot = 0x4d;  // Gloo's own prefixes are 0x01..0x08
constexpr uint8_t kPointToPointSlot = 0x4e;
constexpr uint8_t kAllToAllSlot = 0x4f;

// Gloo's rendezvous store on top of ours, every key under `prefix`.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(comm::Store& store, std::string prefix)
      : store_(store), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(prefix_ + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    std::string v = store_.get(prefix_ + key);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override {
    wait(keys, std::chrono::milliseconds(-1));
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const std::string& k : keys) full.push_back(prefix_ + k);
    store_.wait(full, timeout.count() > 0 ? timeout.count() / 1000.0 : -1);
  }

 private:
  comm::Store& store_;
  std::string prefix_;
};

// Thrown inside an operation whose wait was cut short by abort().
struct Aborted {};

class GlooWork final : public Work {
 public:
  GlooWork(std::string label, double timeout_s) : label_(std::move(label)), timeout_s_(timeout_s) {}

  void wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    // Gloo enforces the timeout on a running operation and reports the details; this wait allows
    // a little more so that Gloo's error, not ours, is the one seen.
    const auto limit =
        std::chrono::duration<double>(timeout_s_ + std::min(5.0, 0.05 * timeout_s_ + 0.5));
    if (!cv_.wait_for(lock, limit, [&] { return final(); }))
      throw Error(ErrorClass::kComm, cat(label_, ": not completed within ", timeout_s_,
                                         " s (still ", state_name(state_), ")"));
    if (state_ == OpState::kFailed)
      throw Error(ErrorClass::kComm, cat(label_, " failed: ", error_));
    if (state_ == OpState::kAborted)
      throw Error(ErrorClass::kComm, cat(label_, " aborted: ", error_));
  }
  bool done() override {
    std::lock_guard<std::mutex> lock(mu_);
    return final();
  }
  void set_running() {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == OpState::kQueued) state_ = OpState::kRunning;
  }
  // The first final state stays.
  void finish(OpState state, const std::string& error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (final()) return;
      state_ = state, error_ = error;
    }
    cv_.notify_all();
  }

 private:
  bool final() const {
    return state_ == OpState::kDone || state_ == OpState::kFailed || state_ == OpState::kAborted;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  OpState state_ = OpState::kQueued;
  std::string error_;
  std::string label_;
  double timeout_s_;
};

std::string random_token() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
  return buf;
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<Store> store, const GroupSpec& g, const std::string& token,
                   const CommOptions& options)
      : Communicator(g.name, g.rank, g.size, options),
        store_(std::move(store)),
        sends_(g.size),
        recvs_(g.size) {
    connect(token);
    worker_ = std::thread([this] { work_loop(); });
  }

  ~GlooCommunicator() override {
    bool healthy;
    {
      std::lock_guard<std::mutex> lock(mu_);
      healthy = !aborted_ && !broken_;
    }
    // Every rank passes this barrier before any tears its connections down: a rank that closed
    // early would break a peer still finishing its last operation.
    if (healthy && size() > 1) {
      try {
        barrier()->wait();
      } catch (const std::exception& e) {
        log::warn("comm group '", name(), "': closing barrier failed: ", e.what());
        healthy = false;
      }
    }
    if (!healthy) abort("communicator destroyed");  // releases sends and recvs still waiting
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    send_cv_.notify_all();
    if (worker_.joinable()) worker_.join();
    if (completer_.joinable()) completer_.join();
    context_.reset();
    device_.reset();
  }

  const char* backend() const override { return "gloo"; }
  bool stream_ordered() const override { return false; }

  WorkPtr all_reduce(float* data, int64_t count, Stream stream) override {
    check_count(count);
    return enqueue(OpKind::kAllReduce, count * 4, -1, [this, data, count, stream](uint32_t tag) {
      if (count == 0 || size() == 1) return none();
      Staged buf(data, count * 4, stream);
      buf.in();
      gloo::AllreduceOptions o(context_);
      o.setOutput(buf.host(), static_cast<size_t>(count));
      o.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      o.setTag(tag);
      o.setTimeout(timeout_ms());
      gloo::allreduce(o);
      buf.out();
      return none();
    });
  }

  WorkPtr reduce_scatter(const float* in, float* out, int64_t chunk, Stream stream) override {
    check_count(chunk);
    return enqueue(OpKind::kReduceScatter, chunk * 4, -1, [this, in, out, chunk, stream](uint32_t tag) {
      Staged src(const_cast<float*>(in), chunk * 4 * size(), stream), dst(out, chunk * 4, stream);
      src.in();
      ring_reduce_scatter(src.host(), dst.host(), chunk, tag);
      dst.out();
      return none();
    });
  }

  WorkPtr all_gather_bytes(const void* in, void* out, int64_t chunk, Stream stream) override {
    check_count(chunk);
    return enqueue(OpKind::kAllGather, chunk, -1, [this, in, out, chunk, stream](uint32_t tag) {
      const size_t n = static_cast<size_t>(chunk);
      if (chunk == 0) return none();
      Staged src(const_cast<void*>(in), chunk, stream), dst(out, chunk * size(), stream);
      src.in();
      uint8_t* mine = dst.host<uint8_t>() + static_cast<size_t>(rank()) * n;
      if (size() == 1) {
        if (src.host<uint8_t>() != mine) std::memmove(mine, src.host<uint8_t>(), n);
        dst.out();
        return none();
      }
      std::vector<uint8_t> copy;
      const uint8_t* from = src.host<uint8_t>();
      if (from == mine) {  // in place: Gloo wants an input apart from the output
        copy.assign(from, from + n);
        from = copy.data();
      }
      gloo::AllgatherOptions o(context_);
      o.setInput(const_cast<uint8_t*>(from), n);
      o.setOutput(dst.host<uint8_t>(), n * static_cast<size_t>(size()));
      o.setTag(tag);
      o.setTimeout(timeout_ms());
      gloo::allgather(o);
      dst.out();
      return none();
    });
  }

  WorkPtr broadcast(float* data, int64_t count, int root, Stream stream) override {
    check_count(count);
    return broadcast_raw(data, count * 4, root, stream);
  }
  WorkPtr broadcast_bytes(void* data, int64_t bytes, int root, Stream stream) override {
    check_count(bytes);
    return broadcast_raw(data, bytes, root, stream);
  }

  WorkPtr send_bytes(const void* data, int64_t bytes, int peer, Stream stream) override {
    check_count(bytes);
    check_peer(peer, "send");
    // The staging copy lives in the task, which lives until the completer has finished the send.
    auto staged = std::make_shared<std::unique_ptr<Staged>>();
    return enqueue(OpKind::kSend, bytes, peer, [this, data, bytes, peer, stream, staged](uint32_t tag) {
      if (bytes == 0) return none();
      *staged = std::make_unique<Staged>(const_cast<void*>(data), bytes, stream);
      (*staged)->in();
      auto buf = context_->createUnboundBuffer((*staged)->host<char>(), static_cast<size_t>(bytes));
      buf->send(peer, gloo::Slot::build(kPointToPointSlot, tag));
      return buf;  // completed by the completer thread
    });
  }

  WorkPtr recv_bytes(void* data, int64_t bytes, int peer, Stream stream) override {
    check_count(bytes);
    check_peer(peer, "recv");
    return enqueue(OpKind::kRecv, bytes, peer, [this, data, bytes, peer, stream](uint32_t tag) {
      if (bytes == 0) return none();
      Staged dst(data, bytes, stream);
      auto buf = context_->createUnboundBuffer(dst.host<char>(), static_cast<size_t>(bytes));
      buf->recv(peer, gloo::Slot::build(kPointToPointSlot, tag));
      wait_recv(*buf);
      dst.out();
      return none();
    });
  }

  // Every block a message of its own on unbound buffers (one per peer and direction, under a
  // slot of the operation's tag): all receives posted, then all sends, then each awaited.
  WorkPtr all_to_all_bytes(const void* in, const std::vector<int64_t>& send, void* out,
                           const std::vector<int64_t>& recv, Stream stream) override {
    if (int(send.size()) != size() || int(recv.size()) != size())
      throw Error(ErrorClass::kInternal, cat("all_to_all in group ", name(), " of ", size(), " ranks: ", send.size(),
                                             " send and ", recv.size(), " receive counts"));
    int64_t sent = 0, received = 0;
    for (int p = 0; p < size(); ++p) {
      check_count(send[p]);
      check_count(recv[p]);
      sent += send[p], received += recv[p];
    }
    if (send[rank()] != recv[rank()])
      throw Error(ErrorClass::kInternal, cat("all_to_all in group ", name(), ": rank ", rank(), " sends itself ",
                                             send[rank()], " bytes but receives ", recv[rank()]));
    return enqueue(OpKind::kAllToAll, sent, -1, [this, in, send, out, recv, sent, received, stream](uint32_t tag) {
      Staged src(const_cast<void*>(in), sent, stream), dst(out, received, stream);
      src.in();
      char *from = src.host<char>(), *to = dst.host<char>();
      std::vector<int64_t> soff(size() + 1, 0), roff(size() + 1, 0);
      for (int p = 0; p < size(); ++p) soff[p + 1] = soff[p] + send[p], roff[p + 1] = roff[p] + recv[p];
      if (send[rank()] > 0) std::memcpy(to + roff[rank()], from + soff[rank()], static_cast<size_t>(send[rank()]));
      const uint64_t slot = gloo::Slot::build(kAllToAllSlot, tag);
      std::vector<std::unique_ptr<UnboundBuffer>> receives, sends;
      for (int p = 0; p < size(); ++p)
        if (p != rank() && recv[p] > 0) {
          receives.push_back(context_->createUnboundBuffer(to + roff[p], static_cast<size_t>(recv[p])));
          receives.back()->recv(p, slot);
        }
      for (int p = 0; p < size(); ++p)
        if (p != rank() && send[p] > 0) {
          sends.push_back(context_->createUnboundBuffer(from + soff[p], static_cast<size_t>(send[p])));
          sends.back()->send(p, slot);
        }
      for (auto& b : receives) wait_recv(*b);
      for (auto& b : sends) wait_send(*b);
      dst.out();
      return none();
    });
  }

  WorkPtr barrier(Stream = nullptr) override {
    return enqueue(OpKind::kBarrier, 0, -1, [this](uint32_t tag) {
      if (size() == 1) return none();
      gloo::BarrierOptions o(context_);
      o.setTag(tag);
      o.setTimeout(timeout_ms());
      gloo::barrier(o);
      return none();
    });
  }

  void abort(const std::string& why) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    aborted_ = true;
    abort_reason_ = why;
    for (Task& t : queue_) finish(t, OpState::kAborted, why);
    queue_.clear();
    for (Pending& p : pending_sends_) finish(p.task, OpState::kAborted, why);
    if (running_) finish(*running_, OpState::kAborted, why);
    if (sending_) finish(*sending_, OpState::kAborted, why);
    // Release the threads blocked in our own waits (send, recv, reduce_scatter). A Gloo collective
    // in progress cannot be interrupted: it ends when a peer closes its connections or at its
    // timeout, and the destructor waits for that. (Closing our side of the pairs does not wake
    // it: Gloo then waits out the full timeout.)
    for (UnboundBuffer* b : waiting_recv_) b->abortWaitRecv();
    for (UnboundBuffer* b : waiting_send_) b->abortWaitSend();
    cv_.notify_all();
    send_cv_.notify_all();
  }

  std::unique_ptr<Communicator> split(const std::string& name,
                                      const std::vector<int>& ranks) override {
    if (ranks.empty()) return nullptr;
    std::set<int> seen;
    int pos = -1;
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] < 0 || ranks[i] >= size() || !seen.insert(ranks[i]).second)
        throw_input("comm group '", this->name(), "': split '", name, "': bad or repeated rank ",
                    ranks[i]);
      if (ranks[i] == rank()) pos = static_cast<int>(i);
    }
    if (pos < 0)
      throw_input("comm group '", this->name(), "': split '", name, "': rank ", rank(),
                  " passed a member list without itself");
    GroupSpec g;
    g.name = name, g.rank = pos, g.size = static_cast<int>(ranks.size());
    return std::move(make_gloo_groups(store_, {g}, options()).front());
  }

 private:
  using Run = std::function<std::unique_ptr<UnboundBuffer>(uint32_t tag)>;
  struct Task {
    uint64_t seq = 0;
    uint32_t tag = 0;
    std::string waiting_on;  // appended to a timeout's error (Communicator::waiting_on)
    std::shared_ptr<GlooWork> work;
    Run run;
  };
  struct Pending {  // a posted send, awaiting completion
    Task task;
    std::unique_ptr<UnboundBuffer> buffer;
  };

  static std::unique_ptr<UnboundBuffer> none() { return nullptr; }

  std::chrono::milliseconds timeout_ms() const {
    return std::chrono::milliseconds(std::max<int64_t>(1, std::llround(timeout_s() * 1000)));
  }
  void check_count(int64_t count) const {
    if (count < 0) throw_input("comm group '", name(), "': negative element count ", count);
  }
  void check_peer(int peer, const char* op) const {
    if (peer < 0 || peer >= size() || peer == rank())
      throw_input("comm group '", name(), "': ", op, " with peer ", peer, " (rank ", rank(), " of ",
                  size(), ")");
  }

  void connect(const std::string& token) {
    std::string host = options().host;
    if (host.empty()) {
      const char* env = std::getenv("MYRIAD_GLOO_HOST");
      host = env && *env ? env : "127.0.0.1";
    }
    const std::string where =
        cat("comm group '", name(), "' (gloo, rank ", rank(), " of ", size(), ")");
    try {
      gloo::transport::tcp::attr attr;
      if (::if_nametoindex(host.c_str()) != 0) {
        attr.iface = host;  // a network interface: Gloo binds to its address
      } else {
        attr.hostname = host;  // an address or a host name
      }
      device_ = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(rank(), size());
      context->setTimeout(timeout_ms());
      StoreAdapter adapter(*store_, cat("gloo/", name(), "/", token, "/"));
      context->connectFullMesh(adapter, device_);
      context_ = std::move(context);
    } catch (const Error& e) {
      throw Error(e.cls(), cat(where, ": set-up: ", e.what()));
    } catch (const std::exception& e) {
      throw Error(ErrorClass::kComm, cat(where, ": set-up through ", host, " failed: ", e.what()));
    }
  }

  WorkPtr broadcast_raw(void* data, int64_t bytes, int root, Stream stream) {
    if (root < 0 || root >= size())
      throw_input("comm group '", name(), "': broadcast from root ", root, " (size ", size(), ")");
    return enqueue(OpKind::kBroadcast, bytes, root, [this, data, bytes, root, stream](uint32_t tag) {
      if (bytes == 0 || size() == 1) return none();
      Staged buf(data, bytes, stream);
      if (rank() == root) buf.in();
      gloo::BroadcastOptions o(context_);
      o.setOutput(buf.host<uint8_t>(), static_cast<size_t>(bytes));
      o.setRoot(root);
      o.setTag(tag);
      o.setTimeout(timeout_ms());
      gloo::broadcast(o);
      buf.out();
      return none();
    });
  }

  WorkPtr enqueue(OpKind op, int64_t bytes, int peer, Run run) {
    const int64_t st = step();
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t match;
    if (op == OpKind::kSend) {
      match = ++sends_[peer];
    } else if (op == OpKind::kRecv) {
      match = ++recvs_[peer];
    } else {
      match = ++collectives_;
    }
    const int record_peer =
        op == OpKind::kSend || op == OpKind::kRecv || op == OpKind::kBroadcast ? peer : -1;
    Task t;
    t.seq = log_add(op, bytes, record_peer, match, st);
    t.tag = static_cast<uint32_t>(match);
    t.work = std::make_shared<GlooWork>(label(t.seq, op, bytes, record_peer, st), timeout_s());
    t.waiting_on = waiting_on(record_peer);
    t.run = std::move(run);
    WorkPtr w = t.work;
    if (aborted_) {
      finish(t, OpState::kAborted, abort_reason_);
    } else if (broken_) {
      finish(t, OpState::kFailed, broken_reason_);
    } else {
      queue_.push_back(std::move(t));
      cv_.notify_all();
    }
    return w;
  }

  // Caller holds mu_.
  void finish(Task& t, OpState state, const std::string& error = "") {
    log_update(t.seq, state, error);
    t.work->finish(state, error);
  }

  void work_loop() {
    for (;;) {
      Task t;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        t = std::move(queue_.front());
        queue_.pop_front();
        if (aborted_ || broken_) {
          finish(t, aborted_ ? OpState::kAborted : OpState::kFailed,
                 aborted_ ? abort_reason_ : broken_reason_);
          continue;
        }
        log_update(t.seq, OpState::kRunning);
        t.work->set_running();
        running_ = &t;
      }
      std::string error;
      bool was_aborted = false;
      std::unique_ptr<UnboundBuffer> posted;
      try {
        posted = t.run(t.tag);
      } catch (const Aborted&) {
        was_aborted = true;
      } catch (const std::exception& e) {
        error = e.what();
        if (error.find("Timed out") != std::string::npos) error += t.waiting_on;
      }
      std::lock_guard<std::mutex> lock(mu_);
      running_ = nullptr;
      if (aborted_ || was_aborted) {
        finish(t, OpState::kAborted, abort_reason_);
      } else if (!error.empty()) {
        broken_ = true;
        broken_reason_ =
            cat("not run: operation #", t.seq, " of this communicator failed: ", error);
        finish(t, OpState::kFailed, error);
      } else if (posted) {
        pending_sends_.push_back(Pending{std::move(t), std::move(posted)});
        if (!completer_.joinable()) completer_ = std::thread([this] { complete_loop(); });
        send_cv_.notify_all();
      } else {
        finish(t, OpState::kDone);
      }
    }
  }

  // Completes posted sends, in order.
  void complete_loop() {
    for (;;) {
      Pending p;
      {
        std::unique_lock<std::mutex> lock(mu_);
        send_cv_.wait(lock, [&] { return stop_ || aborted_ || !pending_sends_.empty(); });
        if (pending_sends_.empty()) {
          if (stop_ || aborted_) return;
          continue;
        }
        p = std::move(pending_sends_.front());
        pending_sends_.pop_front();
        if (aborted_) {
          finish(p.task, OpState::kAborted, abort_reason_);
          continue;
        }
        waiting_send_.insert(p.buffer.get());
        sending_ = &p.task;
      }
      std::string error;
      bool ok = false;
      try {
        ok = p.buffer->waitSend(timeout_ms());
      } catch (const std::exception& e) {
        error = e.what();
      }
      std::lock_guard<std::mutex> lock(mu_);
      waiting_send_.erase(p.buffer.get());
      sending_ = nullptr;
      if (aborted_ || (!ok && error.empty())) {
        finish(p.task, OpState::kAborted, abort_reason_);
      } else if (!error.empty()) {
        broken_ = true;
        broken_reason_ =
            cat("not run: operation #", p.task.seq, " of this communicator failed: ", error);
        finish(p.task, OpState::kFailed, error);
      } else {
        finish(p.task, OpState::kDone);
      }
    }
  }

  // A recv wait that abort() can cut short.
  void wait_recv(UnboundBuffer& b) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_) throw Aborted{};
      waiting_recv_.insert(&b);
    }
    bool ok = false;
    try {
      ok = b.waitRecv(timeout_ms());
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      waiting_recv_.erase(&b);
      throw;
    }
    std::lock_guard<std::mutex> lock(mu_);
    waiting_recv_.erase(&b);
    if (!ok || aborted_) throw Aborted{};
  }
  void wait_send(UnboundBuffer& b) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_) throw Aborted{};
      waiting_send_.insert(&b);
    }
    bool ok = false;
    try {
      ok = b.waitSend(timeout_ms());
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      waiting_send_.erase(&b);
      throw;
    }
    std::lock_guard<std::mutex> lock(mu_);
    waiting_send_.erase(&b);
    if (!ok || aborted_) throw Aborted{};
  }

  // Ring reduce-scatter: in n-1 steps each rank passes a running partial sum of one chunk to its
  // right neighbour and adds its own contribution to the partial it receives from the left; the
  // partial a rank receives last is its own chunk, summed over all ranks.
  std::unique_ptr<UnboundBuffer> ring_reduce_scatter(const float* in, float* out, int64_t chunk,
                                                     uint32_t tag) {
    const int n = size(), r = rank();
    const size_t c = static_cast<size_t>(chunk);
    if (chunk == 0) return none();
    if (n == 1) {
      if (in != out) std::memmove(out, in, c * 4);
      return none();
    }
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    std::vector<float> cur(in + static_cast<size_t>(left) * c,
                           in + static_cast<size_t>(left) * c + c);
    std::vector<float> next(c);
    auto cur_buf = context_->createUnboundBuffer(cur.data(), c * 4);
    auto next_buf = context_->createUnboundBuffer(next.data(), c * 4);
    const uint64_t slot = gloo::Slot::build(kReduceScatterSlot, tag);
    for (int s = 0; s < n - 1; ++s) {
      cur_buf->send(right, slot);
      next_buf->recv(left, slot);
      wait_recv(*next_buf);
      wait_send(*cur_buf);
      const float* own = in + static_cast<size_t>((r - s - 2 + 2 * n) % n) * c;
      for (size_t i = 0; i < c; ++i) next[i] += own[i];
      std::swap(cur, next);
      std::swap(cur_buf, next_buf);
    }
    std::memcpy(out, cur.data(), c * 4);
    return none();
  }

  std::shared_ptr<Store> store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;

  std::mutex mu_;
  std::condition_variable cv_, send_cv_;
  std::deque<Task> queue_;
  std::deque<Pending> pending_sends_;
  Task* running_ = nullptr;  // the worker's current task
  Task* sending_ = nullptr;  // the completer's current send
  std::set<UnboundBuffer*> waiting_recv_, waiting_send_;
  bool stop_ = false, aborted_ = false, broken_ = false;
  std::string abort_reason_, broken_reason_;
  uint64_t collectives_ = 0;
  std::vector<uint64_t> sends_, recvs_;  // messages issued per peer
  std::thread worker_, completer_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_gloo_groups(const std::shared_ptr<Store>& store,
                                                            const std::vector<GroupSpec>& groups,
                                                            const CommOptions& options) {
  std::vector<std::string> tokens;
  for (const GroupSpec& g : groups) tokens.push_back(g.rank == 0 ? random_token() : "");
  std::vector<std::string> ids = exchange_ids(*store, groups, tokens);
  std::vector<std::unique_ptr<Communicator>> out;
  for (size_t i = 0; i < groups.size(); ++i)
    out.push_back(std::make_unique<GlooCommunicator>(store, groups[i], ids[i], options));
  return out;
}

}  // namespace myriad::comm
