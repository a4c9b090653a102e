#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "model/cuda/cuda_check.h"
#include "model/cuda/device.h"
#include "model/cuda/matmul.h"

namespace myriad {
namespace {

// Device memory freed on every path out, a failed check's throw included.
template <class T>
struct DeviceBuffer {
  T* p = nullptr;
  explicit DeviceBuffer(size_t n) { CUDA_CHECK(cudaMalloc(&p, n * sizeof(T))); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

}  // namespace

double cuda_self_check(int index) {
  cuda_use_device(index);
  // dW (n,n) += dout (n,n)^T @ inp (n,n), the weight-gradient GEMM of every linear layer, in fp32
  // from zero. The operands are integers in [-3, 3] (exact in bf16), the sums below 2^24 (exact in fp32).
  constexpr int n = 2048;
  auto a_at = [](int64_t i, int64_t k) { return float((i + 2 * k) % 7 - 3); };
  auto b_at = [](int64_t j, int64_t k) { return float((3 * j + k) % 5 - 2); };
  std::vector<cuda::bf16> dout(size_t(n) * n), inp(size_t(n) * n);
  for (int64_t r = 0; r < n; ++r)  // row r of each: dout[r][i] = a(i, r), inp[r][j] = b(j, r)
    for (int64_t c = 0; c < n; ++c)
      dout[r * n + c] = __float2bfloat16(a_at(c, r)), inp[r * n + c] = __float2bfloat16(b_at(c, r));
  DeviceBuffer<cuda::bf16> buf_dout(dout.size()), buf_inp(inp.size());
  DeviceBuffer<float> buf_w(size_t(n) * n);
  cuda::bf16 *d_dout = buf_dout.p, *d_inp = buf_inp.p;
  float* d_w = buf_w.p;
  CUDA_CHECK(cudaMemcpy(d_dout, dout.data(), dout.size() * sizeof(cuda::bf16), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_inp, inp.data(), inp.size() * sizeof(cuda::bf16), cudaMemcpyHostToDevice));
  double best_s = 1e30;
  std::vector<float> w(size_t(n) * n);
  {
    cuda::Matmul mm;
    for (int iter = 0; iter < 3; ++iter) {  // the first picks the algorithm
      CUDA_CHECK(cudaMemset(d_w, 0, size_t(n) * n * sizeof(float)));
      CUDA_CHECK(cudaDeviceSynchronize());
      const auto t0 = std::chrono::steady_clock::now();
      mm.backward_weight(d_w, d_dout, d_inp, n, n, n, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      if (iter > 0) best_s = std::min(best_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  CUDA_CHECK(cudaMemcpy(w.data(), d_w, w.size() * sizeof(float), cudaMemcpyDeviceToHost));
  for (int64_t i = 0; i < n; i += 61)  // dW[i][j] = sum over r of a(i, r) b(j, r)
    for (int64_t j = 0; j < n; ++j) {
      int64_t want = 0;
      for (int64_t r = 0; r < n; ++r) want += int64_t(a_at(i, r)) * int64_t(b_at(j, r));
      if (w[i * n + j] != float(want))
        throw_runtime("self-check: GPU ", index, ": a GEMM gave ", w[i * n + j], " at (", i, ", ", j, "), expected ", want,
                      ": this GPU computes wrongly");
    }
  // 256 MiB through the GPU's memory and back.
  const size_t words = (256u << 20) / sizeof(uint64_t);
  std::vector<uint64_t> host(words), back(words);
  for (size_t i = 0; i < words; ++i) host[i] = (i + uint64_t(index)) * 0x9E3779B97F4A7C15ull;
  DeviceBuffer<uint64_t> mem(words);
  CUDA_CHECK(cudaMemcpy(mem.p, host.data(), words * sizeof(uint64_t), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(back.data(), mem.p, words * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < words; ++i)
    if (back[i] != host[i])
      throw_runtime("self-check: GPU ", index, ": word ", i, " of 256 MiB read back wrong: this GPU's memory is bad");
  return 2.0 * n * n * n / best_s / 1e12;
}

}  // namespace myriad
