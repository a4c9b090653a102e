// NCCL with one rank on the one GPU a session is lent: the communicator's set-up (unique id
// through a real file store, ncclCommInitRank), every collective on device memory and a stream,
// and the op records. With one rank the results are the inputs, so what is checked is the
// plumbing: device buffers in and out, completion through Work, no hang, no error.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "comm/communicator.h"
#include "comm/rendezvous.h"
#include "comm/store.h"
#include "core/error.h"

using namespace myriad;

namespace {

TEST(NcclOneRank, CollectivesOnDeviceMemory) {
  const std::string dir = (std::filesystem::temp_directory_path() / cat("myriad_nccl1_", getpid())).string();
  comm::CommOptions o;
  o.backend = "nccl";
  o.timeout_s = 60;
  auto store = std::shared_ptr<comm::Store>(comm::make_store("file://" + dir + "/job", "0", 60));
  auto groups = comm::make_groups(store, {comm::GroupSpec{"world", 0, 1}}, o);
  comm::Communicator& world = *groups.at(0);
  EXPECT_STREQ(world.backend(), "nccl");
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  const int64_t n = 1 << 20;
  float *a = nullptr, *b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, n * 4), cudaSuccess);
  std::vector<float> h(n), got(n);
  for (int64_t i = 0; i < n; ++i) h[i] = static_cast<float>(i % 977) - 300.0f;
  cudaMemcpy(a, h.data(), n * 4, cudaMemcpyHostToDevice);
  world.set_step(3);
  world.all_reduce(a, n, s)->wait();
  world.reduce_scatter(a, b, n, s)->wait();
  world.all_gather(b, a, n, s)->wait();
  world.broadcast(a, n, 0, s)->wait();
  world.barrier(s)->wait();
  cudaMemcpy(got.data(), a, n * 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(got, h);
  const std::vector<comm::OpRecord> rec = world.records();
  ASSERT_EQ(rec.size(), 5u);
  for (const comm::OpRecord& r : rec) EXPECT_EQ(r.state, comm::OpState::kDone) << comm::op_name(r.op);
  EXPECT_EQ(rec[0].step, 3);
  // Stream-ordered: the result is there for the stream's next work without a wait (the FP8 amax
  // gather leaves the host running on it).
  EXPECT_TRUE(world.stream_ordered());
  std::fill(got.begin(), got.end(), 0.0f);
  cudaMemsetAsync(b, 0, n * 4, s);
  comm::WorkPtr gathered = world.all_gather(a, b, n, s);
  cudaMemcpyAsync(got.data(), b, n * 4, cudaMemcpyDeviceToHost, s);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(got, h);
  gathered->wait();
  // Host memory (the step's loss, norms and maxima) is staged through device copies: each
  // operation returns with its result in place.
  std::vector<float> ha = h, hb(n);
  world.all_reduce(ha.data(), n, s)->wait();
  world.reduce_scatter(ha.data(), hb.data(), n, s)->wait();
  std::fill(ha.begin(), ha.end(), 0.0f);
  world.all_gather(hb.data(), ha.data(), n, s)->wait();
  double x = 2.5;
  world.broadcast_bytes(&x, sizeof x, 0, s)->wait();
  world.broadcast(ha.data(), n, 0, s)->wait();
  EXPECT_EQ(ha, h);
  EXPECT_EQ(x, 2.5);
  EXPECT_THROW(world.send(ha.data(), 1, 0, s), Error) << "point to point takes device memory";
  // The all-to-all (expert parallelism's exchange): one rank sends itself its block, on device
  // memory and staged from the host.
  const std::vector<int64_t> bytes = {n * 4};
  cudaMemcpy(a, h.data(), n * 4, cudaMemcpyHostToDevice);
  world.all_to_all_bytes(a, bytes, b, bytes, s)->wait();
  cudaMemcpy(got.data(), b, n * 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(got, h);
  std::vector<int64_t> counts = {7, 11, 13}, back(3, 0);
  world.all_to_all_bytes(counts.data(), {24}, back.data(), {24}, s)->wait();
  EXPECT_EQ(back, counts);
  cudaFree(a), cudaFree(b);
  cudaStreamDestroy(s);
  std::filesystem::remove_all(dir);
}

}  // namespace
