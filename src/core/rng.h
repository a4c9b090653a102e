// Counter-based random numbers: every value is a pure function of (key, counter), so any
// process can draw any element of any tensor without drawing the ones before it. This is what
// makes initialization independent of the parallel layout.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace myriad::rng {

// splitmix64's finalizer: a bijective 64-bit mix with good avalanche.
inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline uint64_t key(uint64_t a, uint64_t b) { return mix(a ^ mix(b)); }

// FNV-1a, to key streams by name ("h.3.attn.qkv.w").
inline uint64_t hash(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// Uniform in (0, 1): 53 random bits, never exactly 0 (safe for log).
inline double uniform(uint64_t k, uint64_t counter) {
  return (static_cast<double>(mix(key(k, counter)) >> 11) + 0.5) * 0x1.0p-53;
}

// Standard normal by Box-Muller from the counters 2i and 2i+1.
inline double normal(uint64_t k, uint64_t i) {
  double u1 = uniform(k, 2 * i), u2 = uniform(k, 2 * i + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace myriad::rng
