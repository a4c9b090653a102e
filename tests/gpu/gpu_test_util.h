// Helpers for the GPU tests: device buffers, bf16 conversion, fresh random inputs, poisoning,
// and the relative error ||a - b|| / ||b|| used to compare with the CPU oracle.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#define CUDA_OK(call)                                                                  \
  do {                                                                                 \
    cudaError_t e_ = (call);                                                           \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorString(e_);             \
  } while (0)

namespace gpu_test {

using bf16 = __nv_bfloat16;

// A device allocation of n elements of T; freed on destruction.
template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    if (cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)) != cudaSuccess) p = nullptr;
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  void upload(const std::vector<T>& h) { cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
  // Fills with a NaN pattern (0xFF bytes), so that any element a kernel fails to write shows.
  // Both fills finish before they return: cudaMemset runs on the legacy default stream, which the
  // op sets' non-blocking streams do not wait for, so an unfinished fill could land after a kernel
  // queued next (a norm's amax, poisoned after the kernel wrote it, read NaN on an H100).
  void poison() { cudaMemset(p, 0xFF, n * sizeof(T)), cudaDeviceSynchronize(); }
  void zero() { cudaMemset(p, 0, n * sizeof(T)), cudaDeviceSynchronize(); }
};

inline std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = __float2bfloat16(x[i]);
  return y;
}
inline std::vector<float> to_float(const std::vector<bf16>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = __bfloat162float(x[i]);
  return y;
}
// Rounds through bf16, so that the CPU oracle sees exactly the GPU's inputs.
inline std::vector<float> round_bf16(const std::vector<float>& x) { return to_float(to_bf16(x)); }

inline std::vector<float> randn(size_t n, std::mt19937_64& gen, float std = 1.0f, float mean = 0.0f) {
  std::normal_distribution<float> d(mean, std);
  std::vector<float> x(n);
  for (auto& v : x) v = d(gen);
  return x;
}

// A bf16 device buffer's values, and values rounded into one.
inline std::vector<float> down(const Dev<bf16>& d) { return to_float(d.download()); }
inline void up(Dev<bf16>& d, const std::vector<float>& x) { d.upload(to_bf16(x)); }

// Random document starts for B rows of T (data.document_mask): row 0 one document begun before
// the row and running past it; the others new documents at random (mean length mean_len), with
// documents of one token back to back a third of the way in.
inline std::vector<int32_t> random_docs(int B, int T, int mean_len, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<int32_t> d(size_t(B) * T, 0);
  for (int b = 1; b < B; ++b)
    for (int i = 0, start = 0; i < T; ++i) {
      if (i > 0 && (gen() % mean_len == 0 || i == T / 3 || i == T / 3 + 1)) start = i;
      d[size_t(b) * T + i] = start;
    }
  return d;
}

// ||a - b|| / ||b||; NaN in a gives NaN (which fails every < comparison).
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, r = 0;
  for (size_t i = 0; i < a.size(); ++i) d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), r += double(b[i]) * b[i];
  return r > 0 ? std::sqrt(d / r) : std::sqrt(d);
}

inline bool all_finite(const std::vector<float>& a) {
  for (float v : a)
    if (!std::isfinite(v)) return false;
  return true;
}

// A fresh seed per test run, printed so a failure can be replayed (GPU_TEST_SEED=...).
inline uint64_t seed() {
  static uint64_t s = [] {
    const char* e = std::getenv("GPU_TEST_SEED");
    uint64_t v = e ? std::strtoull(e, nullptr, 10) : std::random_device{}();
    std::printf("GPU_TEST_SEED=%llu\n", static_cast<unsigned long long>(v));
    return v;
  }();
  return s;
}

}  // namespace gpu_test
