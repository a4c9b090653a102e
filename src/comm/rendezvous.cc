#include "comm/rendezvous.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace myriad::comm {

Conversation::~Conversation() = default;

namespace {
std::string group_key(const GroupSpec& g, const char* what) {
  return cat("group/", g.name, "/", what);
}
}  // namespace

IdExchange::IdExchange(std::vector<GroupSpec> groups, std::vector<std::string> payloads)
    : groups_(std::move(groups)), payloads_(std::move(payloads)), ids_(groups_.size()) {
  if (payloads_.size() != groups_.size())
    throw Error(ErrorClass::kInternal, "IdExchange: one payload per group");
  for (const GroupSpec& g : groups_) {
    if (g.name.empty() || g.name.find('/') != std::string::npos)
      throw_input("communicator group name '", g.name, "' must be non-empty, without '/'");
    if (g.size < 1 || g.rank < 0 || g.rank >= g.size)
      throw_input("communicator group '", g.name, "': rank ", g.rank, " of size ", g.size);
  }
}

std::vector<StoreOp> IdExchange::next(const std::vector<StoreResult>& r) {
  std::vector<StoreOp> ops;
  const size_t n = groups_.size();
  if (phase_ == 0) {
    for (size_t i = 0; i < n; ++i)
      if (groups_[i].rank == 0) {
        ops.push_back(StoreOp::set(group_key(groups_[i], "id"), payloads_[i]));
        ids_[i] = payloads_[i];
      }
    for (size_t i = 0; i < n; ++i)
      if (groups_[i].rank != 0) {
        ops.push_back(StoreOp::wait(group_key(groups_[i], "id")));
        ops.push_back(StoreOp::get(group_key(groups_[i], "id")));
      }
    for (size_t i = 0; i < n; ++i) ops.push_back(StoreOp::add(group_key(groups_[i], "arrived"), 1));
    phase_ = n == 0 ? 3 : 1;
    return ops;
  }
  if (phase_ == 1) {
    size_t k = 0;
    for (size_t i = 0; i < n; ++i) k += groups_[i].rank == 0;
    for (size_t i = 0; i < n; ++i)
      if (groups_[i].rank != 0) {
        if (!r.at(k + 1).found)
          throw Error(ErrorClass::kComm, cat("communicator group '", groups_[i].name,
                                             "': its id vanished from the store after it was set"));
        ids_[i] = r[k + 1].value;
        k += 2;
      }
    std::vector<size_t> completed;
    for (size_t i = 0; i < n; ++i, ++k) {
      const int64_t arrived = r.at(k).number;
      if (arrived > groups_[i].size)
        throw Error(
            ErrorClass::kComm,
            cat("communicator group '", groups_[i].name, "': ", arrived,
                " members arrived for a group of ", groups_[i].size,
                " (a rank joined twice within one attempt, or two jobs share a store namespace)"));
      if (arrived == groups_[i].size) completed.push_back(i);
    }
    for (size_t i : completed) ops.push_back(StoreOp::set(group_key(groups_[i], "release"), "1"));
    for (size_t i = 0; i < n; ++i) ops.push_back(StoreOp::wait(group_key(groups_[i], "release")));
    phase_ = 2;
    return ops;
  }
  phase_ = 3;
  return ops;
}

std::vector<std::string> exchange_ids(Store& store, const std::vector<GroupSpec>& groups,
                                      const std::vector<std::string>& payloads) {
  IdExchange ex(groups, payloads);
  std::vector<StoreResult> results;
  try {
    for (std::vector<StoreOp> ops = ex.next({}); !ops.empty(); ops = ex.next(results))
      results = store.run(ops);
  } catch (const Error& e) {
    if (e.cls() != ErrorClass::kComm) throw;
    // Say which groups are incomplete (a short look: the store may be gone).
    std::string detail;
    try {
      std::vector<StoreOp> ops;
      for (const GroupSpec& g : groups) ops.push_back(StoreOp::get(group_key(g, "arrived")));
      std::vector<StoreResult> a = store.run(ops, std::min(2.0, store.timeout_s()));
      for (size_t i = 0; i < groups.size(); ++i) {
        int64_t count = a[i].found ? std::stoll(a[i].value) : 0;
        if (count < groups[i].size)
          detail += cat("group '", groups[i].name, "': ", count, " of ", groups[i].size,
                        " members arrived; ");
      }
    } catch (...) {
    }
    throw Error(ErrorClass::kComm, detail + e.what());
  }
  return ex.ids();
}

// ---- many conversations on few threads ----

namespace {

struct Slot {
  std::unique_ptr<Store> store;
  std::unique_ptr<Conversation> conv;
  bool finished = false;
};

struct Shared {
  std::mutex mu;
  MuxReport report;
  double open_done = 0;
  double last_finish = 0;

  void fail(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (report.failed++ == 0) report.first_error = what;
  }
};

void drive(int thread, int threads, int count,
           const std::function<std::unique_ptr<Store>(int)>& open,
           const std::function<std::unique_ptr<Conversation>(int)>& make, double t0,
           double deadline, Shared* shared) {
  std::vector<Slot> slots;
  std::vector<int> ids;  // conversation index of each slot
  for (int i = thread; i < count; i += threads) ids.push_back(i);
  slots.resize(ids.size());
  int epfd = epoll_create1(EPOLL_CLOEXEC);
  if (epfd < 0) throw_runtime("epoll_create1 failed");
  std::vector<size_t> polled;  // slots whose store has no descriptor
  size_t active = 0;
  int64_t ops = 0, trips = 0, max_ops = 0, max_trips = 0;
  double last_finish = 0;

  auto finish = [&](size_t k) {
    Slot& s = slots[k];
    s.finished = true;
    --active;
    last_finish = steady_now_s() - t0;
    if (s.store) {
      const Store::Stats& st = s.store->stats();
      ops += st.ops, trips += st.round_trips;
      max_ops = std::max(max_ops, st.ops), max_trips = std::max(max_trips, st.round_trips);
    }
  };
  // Runs slot k as far as its store allows without blocking; whether it moved.
  auto advance = [&](size_t k) {
    Slot& s = slots[k];
    if (s.finished) return false;
    bool moved = false;
    try {
      std::vector<StoreResult> results;
      while (s.store->poll(&results)) {
        moved = true;
        std::vector<StoreOp> next = s.conv->next(results);
        if (next.empty()) {
          finish(k);
          return true;
        }
        s.store->start(next);
      }
    } catch (const std::exception& e) {
      shared->fail(cat("rank ", ids[k], ": ", e.what()));
      finish(k);
      return true;
    }
    return moved;
  };
  epoll_event evs[512];
  auto serve_sockets = [&](int timeout_ms) {
    int n = epoll_wait(epfd, evs, 512, timeout_ms);
    for (int e = 0; e < n; ++e) advance(evs[e].data.u32);
  };
  // Stores without a descriptor are polled in passes; a pass that moved nothing backs off, so
  // that waiting ranks do not spin on the store.
  double idle_sleep_s = 0;
  auto serve_polled = [&] {
    bool moved = false;
    for (size_t k : polled) moved |= advance(k);
    if (moved) {
      idle_sleep_s = 0;
    } else {
      idle_sleep_s = std::min(std::max(idle_sleep_s * 2, 0.0005), 0.01);
      std::this_thread::sleep_for(std::chrono::duration<double>(idle_sleep_s));
    }
  };

  for (size_t k = 0; k < slots.size(); ++k) {
    Slot& s = slots[k];
    ++active;
    try {
      s.store = open(ids[k]);
      s.conv = make(ids[k]);
      std::vector<StoreOp> first = s.conv->next({});
      if (first.empty()) {
        finish(k);
        continue;
      }
      s.store->start(first);
      if (int fd = s.store->fd(); fd >= 0) {
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLOUT | EPOLLET;
        ev.data.u32 = static_cast<uint32_t>(k);
        if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) throw_runtime("epoll_ctl failed");
      } else {
        polled.push_back(k);
        advance(k);  // runs what it can: its leader sets, maybe more
      }
    } catch (const std::exception& e) {
      shared->fail(cat("rank ", ids[k], ": ", e.what()));
      finish(k);
      continue;
    }
    if (k % 64 == 63) serve_sockets(0);  // keep the early ranks moving while the rest connect
  }
  {
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->open_done = std::max(shared->open_done, steady_now_s() - t0);
  }
  while (active > 0) {
    if (polled.empty()) {
      serve_sockets(50);
    } else {
      serve_sockets(0);
      serve_polled();
    }
    if (steady_now_s() > deadline) {
      for (size_t k = 0; k < slots.size(); ++k)
        if (!slots[k].finished) {
          shared->fail(cat("rank ", ids[k], ": not finished within the timeout"));
          finish(k);
        }
    }
  }
  ::close(epfd);
  std::lock_guard<std::mutex> lock(shared->mu);
  shared->report.ops += ops, shared->report.round_trips += trips;
  shared->last_finish = std::max(shared->last_finish, last_finish);
  shared->report.max_ops = std::max(shared->report.max_ops, max_ops);
  shared->report.max_round_trips = std::max(shared->report.max_round_trips, max_trips);
  // Slots (and their connections) close when this thread returns: every rank stayed connected
  // until its own thread was done, as real ranks stay connected.
}

}  // namespace

MuxReport run_conversations(int count, int threads,
                            const std::function<std::unique_ptr<Store>(int)>& open,
                            const std::function<std::unique_ptr<Conversation>(int)>& make,
                            double timeout_s) {
  threads = std::max(1, std::min(threads, count));
  Shared shared;
  const double t0 = steady_now_s(), deadline = t0 + timeout_s;
  std::vector<std::thread> pool;
  std::vector<std::string> errors(threads);
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      try {
        drive(t, threads, count, open, make, t0, deadline, &shared);
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  for (std::thread& t : pool) t.join();
  for (const std::string& e : errors)
    if (!e.empty()) throw_runtime("run_conversations: ", e);
  shared.report.conversations = count;
  shared.report.wall_s = shared.last_finish;
  shared.report.open_s = shared.open_done;
  return shared.report;
}

}  // namespace myriad::comm
