// Gloo given device memory: two ranks (threads) on the one GPU, as several processes sharing a
// GPU talk when NCCL cannot serve them. Every operation stages through pinned host copies, on
// the caller's stream, and must leave the right result in device memory.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "comm/communicator.h"
#include "comm/rendezvous.h"
#include "comm/store.h"
#include "core/error.h"

using namespace myriad;

namespace {

std::vector<float> get(const float* d, int64_t n) {
  std::vector<float> h(n);
  cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost);
  return h;
}

TEST(GlooStaging, DeviceBuffersOnTwoRanksOfOneGpu) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / cat("myriad_gloo_dev_", getpid())).string();
  const int64_t n = 300007;  // odd: no size lines up with a page
  std::vector<std::string> failures(2);
  auto rank = [&](int r) {
    try {
      comm::CommOptions o;
      o.backend = "gloo";
      o.timeout_s = 60;
      auto store = std::shared_ptr<comm::Store>(comm::make_store("file://" + dir + "/job", "0", 60));
      auto groups = comm::make_groups(store, {comm::GroupSpec{"world", r, 2}}, o);
      comm::Communicator& w = *groups.at(0);
      cudaStream_t s;
      cudaStreamCreate(&s);
      float *a, *b;
      cudaMalloc(&a, 2 * n * 4);
      cudaMalloc(&b, 2 * n * 4);
      std::vector<float> h(2 * n);
      for (int64_t i = 0; i < 2 * n; ++i) h[i] = float((r + 1) * (i % 101));
      // Written on the stream just before the collective: the staging copy must come after it.
      cudaMemcpyAsync(a, h.data(), 2 * n * 4, cudaMemcpyHostToDevice, s);
      w.all_reduce(a, 2 * n, s)->wait();
      std::vector<float> got = get(a, 2 * n);
      for (int64_t i = 0; i < 2 * n; ++i)
        if (got[i] != 3.0f * float(i % 101)) throw std::runtime_error(cat("all_reduce at ", i, ": ", got[i]));
      cudaMemcpy(a, h.data(), 2 * n * 4, cudaMemcpyHostToDevice);
      w.reduce_scatter(a, b, n, s)->wait();
      got = get(b, n);
      for (int64_t i = 0; i < n; ++i)
        if (got[i] != 3.0f * float((r * n + i) % 101)) throw std::runtime_error(cat("reduce_scatter at ", i));
      cudaMemcpy(b + r * n, h.data(), n * 4, cudaMemcpyHostToDevice);
      w.all_gather(b + r * n, b, n, s)->wait();  // in place
      got = get(b, 2 * n);
      for (int q = 0; q < 2; ++q)
        for (int64_t i = 0; i < n; i += 997)
          if (got[q * n + i] != float((q + 1) * (i % 101))) throw std::runtime_error(cat("all_gather ", q, " ", i));
      float v = float(100 + r);
      cudaMemcpy(a, &v, 4, cudaMemcpyHostToDevice);
      w.broadcast(a, 1, 1, s)->wait();
      if (get(a, 1)[0] != 101.0f) throw std::runtime_error(cat("broadcast: ", get(a, 1)[0]));
      v = float(10 + r);
      cudaMemcpy(a, &v, 4, cudaMemcpyHostToDevice);
      comm::WorkPtr sent = w.send(a, 1, 1 - r, s);
      w.recv(b, 1, 1 - r, s)->wait();
      sent->wait();
      if (get(b, 1)[0] != float(11 - r)) throw std::runtime_error(cat("send/recv: ", get(b, 1)[0]));
      w.barrier()->wait();
      cudaFree(a), cudaFree(b);
      cudaStreamDestroy(s);
    } catch (const std::exception& e) {
      failures[r] = e.what();
    }
  };
  std::thread t0(rank, 0), t1(rank, 1);
  t0.join(), t1.join();
  EXPECT_EQ(failures[0], "");
  EXPECT_EQ(failures[1], "");
  std::filesystem::remove_all(dir);
}

}  // namespace
