#include "data/shared_batch.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "core/error.h"
#include "core/fault.h"

namespace myriad::data {

struct SharedBatch::Header {
  std::atomic<int64_t> published[2];  // the step each slot holds (0 = none yet)
  std::atomic<int32_t> taken[2];      // members (readers excluded) done with that step
  std::atomic<int32_t> attached;      // members (readers excluded) that have mapped it
};

namespace {

using Clock = std::chrono::steady_clock;

// Spins briefly, then sleeps: a step is milliseconds to seconds long.
template <class Pred>
void wait_until(Pred ready, double timeout_s, const std::string& what) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  for (int i = 0; !ready(); ++i) {
    if (Clock::now() > deadline)
      throw Error(ErrorClass::kComm, cat("shared batch: ", what, " did not happen within ",
                                         timeout_s, " s (comm.timeout_s): a rank of the node is lost"));
    if (i > 100) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace

SharedBatch::SharedBatch(const std::string& name, bool reader, int members, int64_t ints, double timeout_s)
    : name_(name), reader_(reader), members_(members), ints_(ints), timeout_s_(timeout_s) {
  bytes_ = sizeof(Header) + 2 * ints * sizeof(int32_t);
  int fd = -1;
  if (reader) {
    // A segment left by an earlier attempt is replaced: the protocol starts from zero.
    shm_unlink(name.c_str());
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, bytes_) != 0)
      throw_runtime("shared batch: cannot create ", name, ": ", std::strerror(errno));
    linked_ = true;
    fault::trigger("shared_batch_created");
  } else {
    wait_until([&] { return (fd = shm_open(name.c_str(), O_RDWR, 0600)) >= 0; }, timeout_s, "creating " + name);
    // The reader sizes the segment right after creating it.
    struct stat st{};
    wait_until([&] { return fstat(fd, &st) == 0 && size_t(st.st_size) == bytes_; }, timeout_s, "sizing " + name);
  }
  base_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base_ == MAP_FAILED) throw_runtime("shared batch: cannot map ", name, ": ", std::strerror(errno));
  if (!reader) header()->attached.fetch_add(1, std::memory_order_acq_rel);
}

SharedBatch::~SharedBatch() {
  if (base_ && base_ != MAP_FAILED) munmap(base_, bytes_);
  if (linked_) shm_unlink(name_.c_str());
}

std::string node_segment_prefix(const std::string& job, const std::string& store, const std::string& attempt,
                                int node) {
  uint32_t h = 2166136261u;  // FNV-1a: the same on every process, unlike std::hash
  for (unsigned char c : store) h = (h ^ c) * 16777619u;
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", h);
  return cat("/myriad-", job, "-", hex, "-", attempt, "-n", node, "-");
}

int remove_node_segments(const std::string& job, const std::string& store, const std::string& attempt, int node) {
  const std::string prefix = node_segment_prefix(job, store, attempt, node).substr(1);
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && shm_unlink(("/" + name).c_str()) == 0) ++n;
  }
  return n;
}

SharedBatch::Header* SharedBatch::header() const { return static_cast<Header*>(base_); }

int32_t* SharedBatch::slot(int64_t step) const {
  return reinterpret_cast<int32_t*>(static_cast<char*>(base_) + sizeof(Header)) + (step % 2) * ints_;
}

void SharedBatch::publish(int64_t step, const int32_t* tokens) {
  Header* h = header();
  const int s = step % 2;
  // The slot's previous batch (step - 2) must have been taken by every other member.
  if (h->published[s].load(std::memory_order_acquire) != 0)
    wait_until([&] { return h->taken[s].load(std::memory_order_acquire) == members_ - 1; }, timeout_s_,
               cat("taking the batch of step ", step - 2));
  std::memcpy(slot(step), tokens, ints_ * sizeof(int32_t));
  h->taken[s].store(0, std::memory_order_relaxed);
  h->published[s].store(step, std::memory_order_release);
  // Every member has mapped the segment once it has taken a batch; the name is no longer needed.
  if (linked_ && h->attached.load(std::memory_order_acquire) == members_ - 1) {
    shm_unlink(name_.c_str());
    linked_ = false;
  }
}

void SharedBatch::take(int64_t step, int32_t* tokens) {
  Header* h = header();
  const int s = step % 2;
  wait_until([&] { return h->published[s].load(std::memory_order_acquire) == step; }, timeout_s_,
             cat("publishing the batch of step ", step));
  std::memcpy(tokens, slot(step), ints_ * sizeof(int32_t));
  h->taken[s].fetch_add(1, std::memory_order_acq_rel);
}

}  // namespace myriad::data
