#include "core/memory.h"

#include <atomic>

namespace myriad {
namespace {

std::atomic<int64_t> g_now[kMemoryKinds], g_peak[kMemoryKinds];

int index(MemoryKind kind) { return static_cast<int>(kind); }

}  // namespace

const char* memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kOptimizerState: return "optimizer_state";
    case MemoryKind::kActivations: return "activations";
    case MemoryKind::kParams: return "params";
    case MemoryKind::kGrads: return "grads";
  }
  return "?";
}

int64_t memory_bytes(MemoryKind kind) { return g_now[index(kind)].load(std::memory_order_relaxed); }

int64_t memory_peak_bytes(MemoryKind kind) {
  return g_peak[index(kind)].load(std::memory_order_relaxed);
}

void memory_reset_peak(MemoryKind kind) {
  g_peak[index(kind)].store(memory_bytes(kind), std::memory_order_relaxed);
}

void memory_count(MemoryKind kind, int64_t bytes) {
  const int64_t now = g_now[index(kind)].fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::atomic<int64_t>& peak = g_peak[index(kind)];
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

}  // namespace myriad
