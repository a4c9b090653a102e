// Host memory counters per category: bytes held now and at peak, for tests and logs (e.g. that a
// sharded optimizer holds 1/dp of the state). Containers opt in through CountingAllocator.
//
// The counters are process-wide on purpose, like malloc's statistics: they observe, they never
// steer. Relaxed atomics: any thread may allocate; a reading is exact once the allocating
// threads are joined, and the peak is the largest total any single update produced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace myriad {

enum class MemoryKind { kOptimizerState, kActivations, kParams, kGrads };
inline constexpr int kMemoryKinds = 4;

const char* memory_kind_name(MemoryKind kind);  // "optimizer_state", ...
int64_t memory_bytes(MemoryKind kind);           // held now
int64_t memory_peak_bytes(MemoryKind kind);      // most held at once since start (or the reset)
void memory_reset_peak(MemoryKind kind);         // peak := now
void memory_count(MemoryKind kind, int64_t bytes);  // + on allocation, - on release

// std::allocator with counting; stateless, so containers of one kind swap and move freely.
template <class T, MemoryKind K>
struct CountingAllocator {
  using value_type = T;
  // Spelled out: allocator_traits cannot rebind a template with a non-type parameter.
  template <class U>
  struct rebind {
    using other = CountingAllocator<U, K>;
  };
  CountingAllocator() noexcept = default;
  template <class U>
  CountingAllocator(const CountingAllocator<U, K>&) noexcept {}

  T* allocate(size_t n) {
    T* p = std::allocator<T>().allocate(n);
    memory_count(K, static_cast<int64_t>(n * sizeof(T)));
    return p;
  }
  void deallocate(T* p, size_t n) noexcept {
    memory_count(K, -static_cast<int64_t>(n * sizeof(T)));
    std::allocator<T>().deallocate(p, n);
  }
  template <class U>
  bool operator==(const CountingAllocator<U, K>&) const noexcept { return true; }
};

template <class T, MemoryKind K>
using CountedVector = std::vector<T, CountingAllocator<T, K>>;

}  // namespace myriad
