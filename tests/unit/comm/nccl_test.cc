// NcclCommunicator on two GPUs, ranks as threads (one GPU each). Built only with CUDA; skipped
// on machines with fewer than two GPUs (CI has none).
#ifdef MYRIAD_HAVE_CUDA
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <thread>

#include "comm/communicator.h"
#include "comm/rendezvous.h"
#include "comm_test_util.h"

using namespace myriad;
using namespace myriad::comm;
using namespace myriad::comm::testing;

namespace {

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) GTEST_SKIP() << "needs 2 GPUs";
  }
  CommOptions options(double timeout_s = 30) const {
    CommOptions o;
    o.backend = "nccl";
    o.timeout_s = timeout_s;
    return o;
  }
  std::shared_ptr<Store> store() const {
    return make_store("file://" + dir_.path() + "/" + job_, "0", 30);
  }

  TempDir dir_;
  std::string job_ = unique_job("nccl");
};

// A device buffer holding `values`, and the way back.
struct DeviceFloats {
  explicit DeviceFloats(size_t n) : n(n) { EXPECT_EQ(cudaMalloc(&p, n * 4), cudaSuccess); }
  ~DeviceFloats() { cudaFree(p); }
  void put(const std::vector<float>& v, size_t at = 0) {
    cudaMemcpy(p + at, v.data(), v.size() * 4, cudaMemcpyHostToDevice);
  }
  std::vector<float> get() const {
    std::vector<float> v(n);
    cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost);
    return v;
  }
  float* p = nullptr;
  size_t n;
};

TEST_F(NcclTest, CollectivesSplitAndRecords) {
  run_ranks(2, [&](int r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    auto comms = make_groups(store(), {{"world", r, 2}, {cat("solo", r), 0, 1}}, options());
    Communicator& world = *comms[0];
    EXPECT_STREQ(world.backend(), "nccl");
    cudaStream_t s, s2;
    cudaStreamCreate(&s);
    cudaStreamCreate(&s2);
    const size_t n = 1000003;
    DeviceFloats a(2 * n), b(2 * n);
    std::vector<float> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = static_cast<float>((r + 1) * static_cast<int>(i % 13));
    a.put(h);
    world.set_step(5);
    world.all_reduce(a.p, n, s)->wait();
    std::vector<float> got = a.get();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], 3.f * static_cast<float>(i % 13));
    // reduce_scatter of 2 x 7, all_gather in place, broadcast, an exchange on two streams.
    std::vector<float> in(14);
    for (int i = 0; i < 14; ++i) in[i] = static_cast<float>((r + 1) * i);
    a.put(in);
    world.reduce_scatter(a.p, b.p, 7, s)->wait();
    got = b.get();
    for (int j = 0; j < 7; ++j) EXPECT_EQ(got[j], 3.f * static_cast<float>(r * 7 + j));
    a.put(std::vector<float>(n, static_cast<float>(r + 1)), r * n);
    world.all_gather(a.p + r * n, a.p, n, s)->wait();
    got = a.get();
    EXPECT_EQ(got[0], 1.f);
    EXPECT_EQ(got[2 * n - 1], 2.f);
    a.put({static_cast<float>(r + 10)});
    world.broadcast(a.p, 1, 1, s)->wait();
    EXPECT_EQ(a.get()[0], 11.f);
    a.put({static_cast<float>(r + 1)});
    WorkPtr sent = world.send(a.p, 1, 1 - r, s);
    WorkPtr received = world.recv(b.p, 1, 1 - r, s2);
    received->wait();
    sent->wait();
    EXPECT_EQ(b.get()[0], static_cast<float>(2 - r));
    world.barrier(s)->wait();
    std::vector<OpRecord> rec = world.records();
    ASSERT_EQ(rec.size(), 8u);
    for (const OpRecord& x : rec) EXPECT_EQ(x.state, OpState::kDone) << op_name(x.op);
    EXPECT_EQ(rec[0].step, 5);
    // A group of one, and a split with the ranks reversed.
    a.put({3.f});
    comms[1]->all_reduce(a.p, 1, s)->wait();
    EXPECT_EQ(a.get()[0], 3.f);
    auto pair = world.split("pair", {1, 0});
    ASSERT_TRUE(pair);
    EXPECT_EQ(pair->rank(), 1 - r);
    a.put({static_cast<float>(r + 1)});
    pair->all_reduce(a.p, 1, s)->wait();
    EXPECT_EQ(a.get()[0], 3.f);
    auto none = world.split("rank0", r == 0 ? std::vector<int>{0} : std::vector<int>{});
    EXPECT_EQ(none != nullptr, r == 0);
    cudaStreamSynchronize(s);
  });
}

TEST_F(NcclTest, TimeoutAndAbort) {
  run_ranks(2, [&](int r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    cudaStream_t s;
    cudaStreamCreate(&s);
    DeviceFloats a(1000);
    {  // rank 1 never joins the all_reduce
      auto c = make_group(store(), "t", r, 2, options(2));
      if (r == 1) {
        std::this_thread::sleep_for(std::chrono::seconds(3));
        c->abort("rank 1 leaves");
      } else {
        c->set_step(9);
        auto t0 = std::chrono::steady_clock::now();
        WorkPtr w = c->all_reduce(a.p, 1000, s);
        std::string what = error_of(ErrorClass::kComm, [&] { w->wait(); });
        EXPECT_LT(seconds_since(t0), 4.0);
        EXPECT_NE(what.find("all_reduce #1"), std::string::npos) << what;
        EXPECT_NE(what.find("step 9"), std::string::npos) << what;
        error_of(ErrorClass::kComm, [&] { c->barrier(s)->wait(); });
      }
    }
    {  // abort() releases a recv that nobody serves
      auto c = make_group(store(), "a", r, 2, options());
      if (r == 1) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        c->abort("done");
      } else {
        WorkPtr w = c->recv(a.p, 10, 1, s);
        std::thread aborter([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          c->abort("test abort");
        });
        std::string what = error_of(ErrorClass::kComm, [&] { w->wait(); });
        EXPECT_NE(what.find("aborted: test abort"), std::string::npos) << what;
        aborter.join();
      }
    }
    cudaStreamSynchronize(s);
  });
}

}  // namespace
#endif  // MYRIAD_HAVE_CUDA
