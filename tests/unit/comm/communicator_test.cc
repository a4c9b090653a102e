#include "comm/communicator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <thread>

#include "comm/local_redis.h"
#include "comm/rendezvous.h"
#include "comm_test_util.h"
#include "core/config.h"

using namespace myriad;
using namespace myriad::comm;
using namespace myriad::comm::testing;

namespace {

// Ranks are threads, each with its own store connection and Gloo context, as separate processes
// would have. Values are small integers, so float sums are exact whatever the order.
class GlooTest : public ::testing::Test {
 protected:
  CommOptions options(double timeout_s = 20) const {
    CommOptions o;
    o.backend = "gloo";
    o.timeout_s = timeout_s;
    return o;
  }
  std::shared_ptr<Store> store(double timeout_s = 20) const {
    return make_store("file://" + dir_.path() + "/" + job_, "0", timeout_s);
  }
  // Runs fn(rank, world) on n ranks, as a new job; each rank creates and destroys its
  // communicator itself.
  void run_world(int n, const std::function<void(int, Communicator&)>& fn, double timeout_s = 20) {
    job_ = unique_job("gloo");
    run_ranks(n, [&](int r) {
      auto world = make_group(store(timeout_s), "world", r, n, options(timeout_s));
      ASSERT_EQ(world->rank(), r);
      ASSERT_EQ(world->size(), n);
      fn(r, *world);
    });
  }

  TempDir dir_;
  std::string job_ = unique_job("gloo");
};

float value(int rank, size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 13) - 5);
}

const int64_t kSizes[] = {1, 7, 1000003};

TEST_F(GlooTest, AllReduce) {
  for (int n : {2, 3, 4})
    run_world(n, [&](int r, Communicator& c) {
      for (int64_t count : kSizes) {
        std::vector<float> data(count);
        for (int64_t i = 0; i < count; ++i) data[i] = value(r, i);
        c.all_reduce(data.data(), count)->wait();
        for (int64_t i = 0; i < count; ++i) {
          float expect = 0;
          for (int q = 0; q < n; ++q) expect += value(q, i);
          ASSERT_EQ(data[i], expect) << "n=" << n << " count=" << count << " i=" << i;
        }
      }
    });
}

TEST_F(GlooTest, ReduceScatterChunks) {
  for (int n : {2, 3, 4})
    run_world(n, [&](int r, Communicator& c) {
      for (int64_t chunk : kSizes) {
        const size_t total = static_cast<size_t>(chunk) * n;
        std::vector<float> in(total), out(chunk, -1.f);
        for (size_t i = 0; i < total; ++i) in[i] = value(r, i);
        auto expect = [&](int64_t j) {
          float s = 0;
          for (int q = 0; q < n; ++q) s += value(q, static_cast<size_t>(r) * chunk + j);
          return s;
        };
        c.reduce_scatter(in.data(), out.data(), chunk)->wait();
        for (int64_t j = 0; j < chunk; ++j)
          ASSERT_EQ(out[j], expect(j)) << "n=" << n << " chunk=" << chunk;
        // In place: the output is this rank's chunk of the input.
        c.reduce_scatter(in.data(), in.data() + static_cast<size_t>(r) * chunk, chunk)->wait();
        for (int64_t j = 0; j < chunk; ++j)
          ASSERT_EQ(in[static_cast<size_t>(r) * chunk + j], out[j]);
      }
    });
}

TEST_F(GlooTest, AllGatherChunks) {
  for (int n : {2, 3, 4})
    run_world(n, [&](int r, Communicator& c) {
      for (int64_t chunk : kSizes) {
        std::vector<float> in(chunk), out(static_cast<size_t>(chunk) * n, -1.f);
        for (int64_t i = 0; i < chunk; ++i) in[i] = value(r, i);
        c.all_gather(in.data(), out.data(), chunk)->wait();
        for (int q = 0; q < n; ++q)
          for (int64_t i = 0; i < chunk; ++i)
            ASSERT_EQ(out[static_cast<size_t>(q) * chunk + i], value(q, i))
                << "n=" << n << " chunk=" << chunk;
        // In place.
        std::vector<float> inplace(static_cast<size_t>(chunk) * n, 0.f);
        std::memcpy(inplace.data() + static_cast<size_t>(r) * chunk, in.data(), chunk * 4);
        c.all_gather(inplace.data() + static_cast<size_t>(r) * chunk, inplace.data(), chunk)
            ->wait();
        ASSERT_EQ(inplace, out);
      }
    });
}

// Two-byte elements (the bf16 compute copy the data-parallel gather carries): odd byte counts,
// each byte naming its rank and place, in place as the gather of the weights runs.
TEST_F(GlooTest, AllGatherBytesOfTwoByteElements) {
  for (int n : {2, 3})
    run_world(n, [&](int r, Communicator& c) {
      for (int64_t elems : {1, 3, 1001}) {
        const int64_t chunk = 2 * elems;
        auto byte = [](int q, int64_t i) { return static_cast<uint8_t>(q * 37 + i * 11 + 5); };
        std::vector<uint8_t> all(static_cast<size_t>(chunk) * n, 0);
        for (int64_t i = 0; i < chunk; ++i) all[static_cast<size_t>(r) * chunk + i] = byte(r, i);
        c.all_gather_bytes(all.data() + static_cast<size_t>(r) * chunk, all.data(), chunk)->wait();
        for (int q = 0; q < n; ++q)
          for (int64_t i = 0; i < chunk; ++i)
            ASSERT_EQ(all[static_cast<size_t>(q) * chunk + i], byte(q, i)) << "n=" << n << " bytes=" << chunk;
      }
    });
}

// Variable counts, as a mixture of experts' dispatch sends: rank r sends rank p (r + 2p) % 5
// floats (some blocks empty, the one to itself included), each element naming its sender, its
// receiver and its index; every rank receives exactly its blocks, in rank order. Twice in a row
// (the slots of two operations do not mix), and the records name it.
TEST_F(GlooTest, AllToAllOfVariableCounts) {
  for (int n : {2, 3, 4})
    run_world(n, [&](int r, Communicator& c) {
      auto count = [](int from, int to) { return int64_t((from + 2 * to) % 5); };
      for (int round = 0; round < 2; ++round) {
        std::vector<int64_t> send(n), recv(n);
        std::vector<float> in;
        for (int p = 0; p < n; ++p) {
          send[p] = count(r, p) * 4, recv[p] = count(p, r) * 4;
          for (int64_t i = 0; i < count(r, p); ++i) in.push_back(float(1000 * round + 100 * r + 10 * p + i));
        }
        std::vector<float> out(static_cast<size_t>(std::accumulate(recv.begin(), recv.end(), int64_t(0)) / 4), -1.f);
        c.all_to_all_bytes(in.data(), send, out.data(), recv)->wait();
        size_t at = 0;
        for (int p = 0; p < n; ++p)
          for (int64_t i = 0; i < count(p, r); ++i, ++at)
            ASSERT_EQ(out[at], float(1000 * round + 100 * p + 10 * r + i)) << "n=" << n << " from " << p;
        EXPECT_EQ(at, out.size());
      }
      bool seen = false;
      for (const OpRecord& rec : c.records()) seen |= rec.op == OpKind::kAllToAll && rec.state == OpState::kDone;
      EXPECT_TRUE(seen);
      // Counts that do not agree with themselves are refused before anything is sent.
      std::vector<int64_t> wrong(n, 0);
      wrong[r] = 4;
      std::vector<float> x(1), y(1);
      EXPECT_NE(error_of(ErrorClass::kInternal, [&] {
                  c.all_to_all_bytes(x.data(), wrong, y.data(), std::vector<int64_t>(n, 0));
                }).find("sends itself 4 bytes but receives 0"),
                std::string::npos);
    });
}

TEST_F(GlooTest, BroadcastAndBarrier) {
  for (int n : {2, 3, 4})
    run_world(n, [&](int r, Communicator& c) {
      for (int64_t count : kSizes) {
        const int root = static_cast<int>(count % n);
        std::vector<float> data(count);
        for (int64_t i = 0; i < count; ++i) data[i] = value(r, i);
        c.broadcast(data.data(), count, root)->wait();
        for (int64_t i = 0; i < count; ++i) ASSERT_EQ(data[i], value(root, i));
      }
      char text[16] = {};
      if (r == n - 1) std::strcpy(text, "hello, ranks");
      c.broadcast_bytes(text, sizeof text, n - 1)->wait();
      EXPECT_STREQ(text, "hello, ranks");
      c.barrier()->wait();
    });
}

TEST_F(GlooTest, SendRecv) {
  for (int n : {2, 3, 4})
    run_world(n, [&](int r, Communicator& c) {
      // A ring shift where every rank sends before it receives.
      const int right = (r + 1) % n, left = (r + n - 1) % n;
      for (int64_t count : kSizes) {
        std::vector<float> out(count), in(count, -1.f);
        for (int64_t i = 0; i < count; ++i) out[i] = value(r, i);
        WorkPtr s = c.send(out.data(), count, right);
        WorkPtr v = c.recv(in.data(), count, left);
        v->wait();
        s->wait();
        for (int64_t i = 0; i < count; ++i) ASSERT_EQ(in[i], value(left, i));
      }
      // Several messages to one peer arrive in order, interleaved with a collective.
      if (r == 0) {
        float a = 1, b = 2;
        auto w1 = c.send(&a, 1, n - 1);
        auto w2 = c.send(&b, 1, n - 1);
        w1->wait(), w2->wait();
      }
      if (r == n - 1) {
        float a = 0, b = 0;
        c.recv(&a, 1, 0)->wait();
        c.recv(&b, 1, 0)->wait();
        EXPECT_EQ(a, 1);
        EXPECT_EQ(b, 2);
      }
      c.barrier()->wait();
    });
}

TEST_F(GlooTest, OperationsRunInIssueOrderAsynchronously) {
  run_world(3, [&](int r, Communicator& c) {
    std::vector<std::vector<float>> bufs(20, std::vector<float>(1000, static_cast<float>(r)));
    std::vector<WorkPtr> works;
    for (auto& b : bufs) works.push_back(c.all_reduce(b.data(), 1000));
    for (auto& w : works) w->wait();
    for (auto& b : bufs) EXPECT_EQ(b[999], 0.f + 1.f + 2.f);
    EXPECT_TRUE(works.back()->done());
    EXPECT_FALSE(c.stream_ordered()) << "Gloo's results are there once waited for, not by a stream's order";
  });
}

TEST_F(GlooTest, RecordsShowTheOperations) {
  run_ranks(2, [&](int r) {
    CommOptions o = options();
    o.records = 4;
    auto c = make_group(store(), "recorded", r, 2, o);
    c->set_step(42);
    std::vector<float> x(10, 1.f), y(20);
    c->all_reduce(x.data(), 10)->wait();
    c->all_gather(x.data(), y.data(), 10)->wait();
    if (r == 0) c->send(x.data(), 3, 1)->wait();
    if (r == 1) c->recv(x.data(), 3, 0)->wait();
    c->broadcast(x.data(), 5, 1)->wait();
    std::vector<OpRecord> rec = c->records();
    ASSERT_EQ(rec.size(), 4u);
    EXPECT_EQ(rec[0].seq, 1u);
    EXPECT_EQ(rec[0].op, OpKind::kAllReduce);
    EXPECT_EQ(rec[0].bytes, 40);
    EXPECT_EQ(rec[0].step, 42);
    EXPECT_EQ(rec[0].match, 1u);
    EXPECT_EQ(rec[1].op, OpKind::kAllGather);
    EXPECT_EQ(rec[2].op, r == 0 ? OpKind::kSend : OpKind::kRecv);
    EXPECT_EQ(rec[2].peer, 1 - r);
    EXPECT_EQ(rec[2].match, 1u);  // the first message between the two
    EXPECT_EQ(rec[3].op, OpKind::kBroadcast);
    EXPECT_EQ(rec[3].peer, 1);    // the root
    EXPECT_EQ(rec[3].match, 3u);  // the third collective
    for (const OpRecord& x : rec) {
      EXPECT_EQ(x.state, OpState::kDone) << op_name(x.op);
      EXPECT_GT(x.queued_us, 0);
      EXPECT_GE(x.started_us, x.queued_us);
      EXPECT_GE(x.ended_us, x.started_us);
    }
    // The ring keeps the last four.
    c->barrier()->wait();
    rec = c->records();
    ASSERT_EQ(rec.size(), 4u);
    EXPECT_EQ(rec.front().seq, 2u);
    EXPECT_EQ(rec.back().op, OpKind::kBarrier);
  });
}

TEST_F(GlooTest, PeerThatNeverCallsTheCollectiveTimesOut) {
  run_ranks(2, [&](int r) {
    auto c = make_group(store(), "lonely", r, 2, options(1.0));
    if (r == 1) {  // never joins the all_reduce; leaves without the closing barrier
      std::this_thread::sleep_for(std::chrono::milliseconds(2000));
      c->abort("test: rank 1 leaves");
      return;
    }
    c->set_step(7);
    std::vector<float> x(100, 1.f);
    auto t0 = std::chrono::steady_clock::now();
    WorkPtr w = c->all_reduce(x.data(), 100);
    std::string what = error_of(ErrorClass::kComm, [&] { w->wait(); });
    EXPECT_LT(seconds_since(t0), 3.0);
    EXPECT_NE(what.find("'lonely'"), std::string::npos) << what;
    EXPECT_NE(what.find("all_reduce #1"), std::string::npos) << what;
    EXPECT_NE(what.find("step 7"), std::string::npos) << what;
    // The communicator is broken now: later operations fail at once.
    what = error_of(ErrorClass::kComm, [&] { c->barrier()->wait(); });
    EXPECT_NE(what.find("barrier #2"), std::string::npos) << what;
    EXPECT_EQ(c->records()[0].state, OpState::kFailed);
  });
}

TEST_F(GlooTest, RankThatNeverArrivesAtSetUp) {
  auto t0 = std::chrono::steady_clock::now();
  std::string what =
      error_of(ErrorClass::kComm, [&] { make_group(store(1.0), "half", 0, 2, options(1.0)); });
  EXPECT_LT(seconds_since(t0), 4.0);
  EXPECT_NE(what.find("group 'half': 1 of 2 members arrived"), std::string::npos) << what;
}

TEST_F(GlooTest, AbortReleasesAWaiter) {
  run_ranks(2, [&](int r) {
    auto c = make_group(store(), "aborted", r, 2, options(3.0));
    if (r == 1) {  // receives nothing: rank 0's recv waits
      std::this_thread::sleep_for(std::chrono::milliseconds(600));
      c->abort("test: peer gone");
      return;
    }
    std::vector<float> x(10);
    WorkPtr w = c->recv(x.data(), 10, 1);
    WorkPtr later = c->all_reduce(x.data(), 10);  // queued behind the recv
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      c->abort("test: abort");
    });
    auto t0 = std::chrono::steady_clock::now();
    std::string what = error_of(ErrorClass::kComm, [&] { w->wait(); });
    EXPECT_LT(seconds_since(t0), 1.5);
    EXPECT_NE(what.find("aborted: test: abort"), std::string::npos) << what;
    EXPECT_NE(what.find("recv #1 from rank 1"), std::string::npos) << what;
    what = error_of(ErrorClass::kComm, [&] { later->wait(); });
    EXPECT_NE(what.find("all_reduce #2"), std::string::npos) << what;
    aborter.join();
    std::vector<OpRecord> rec = c->records();
    ASSERT_EQ(rec.size(), 2u);
    EXPECT_EQ(rec[0].state, OpState::kAborted);
    EXPECT_EQ(rec[1].state, OpState::kAborted);
    EXPECT_EQ(rec[0].error, "test: abort");
    // Later operations fail at once.
    error_of(ErrorClass::kComm, [&] { c->barrier()->wait(); });
  });
}

TEST_F(GlooTest, AbortDuringACollective) {
  run_ranks(2, [&](int r) {
    auto t0 = std::chrono::steady_clock::now();
    {
      auto c = make_group(store(), "abort-collective", r, 2, options(10.0));
      if (r == 1) {  // alive for a while, but never joins the collective
        std::this_thread::sleep_for(std::chrono::milliseconds(1000));
        c->abort("test: peer gone");
        return;
      }
      std::vector<float> x(1000, 1.f);
      WorkPtr w = c->all_reduce(x.data(), 1000);
      std::thread aborter([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        c->abort("test: abort");
      });
      std::string what = error_of(ErrorClass::kComm, [&] { w->wait(); });
      EXPECT_NE(what.find("all_reduce #1"), std::string::npos) << what;
      EXPECT_NE(what.find("aborted"), std::string::npos) << what;
      EXPECT_LT(seconds_since(t0), 0.8);  // released by the abort, long before rank 1 leaves
      aborter.join();
    }
    // The Gloo collective itself ends when the peer closes its connections (at 1 s), not at its
    // timeout (10 s); destruction waits for that.
    if (r == 0) {
      EXPECT_LT(seconds_since(t0), 3.0);
    }
  });
}

TEST_F(GlooTest, SplitAndLayoutGroups) {
  run_world(4, [&](int r, Communicator& world) {
    // Pairs {0,1} and {2,3}, ranks listed in reverse: rank order in the group follows the list.
    std::vector<int> members = r < 2 ? std::vector<int>{1, 0} : std::vector<int>{3, 2};
    auto pair = world.split(r < 2 ? "pair0" : "pair1", members);
    ASSERT_TRUE(pair);
    EXPECT_EQ(pair->rank(), r % 2 == 1 ? 0 : 1);
    EXPECT_EQ(pair->size(), 2);
    float x = static_cast<float>(r);
    pair->all_reduce(&x, 1)->wait();
    EXPECT_EQ(x, r < 2 ? 1.f : 5.f);
    // A rank outside every new group gets nullptr.
    auto none = world.split("odd", r % 2 == 1 ? std::vector<int>{1, 3} : std::vector<int>{});
    EXPECT_EQ(none == nullptr, r % 2 == 0);
  });
  // The batched set-up of a 2 x 2 layout: world, tp (consecutive ranks), dp (strided).
  job_ = unique_job("layout");
  run_ranks(4, [&](int r) {
    std::vector<GroupSpec> groups = {
        {"world", r, 4}, {cat("tp", r / 2), r % 2, 2}, {cat("dp", r % 2), r / 2, 2}};
    auto s = store();
    const int64_t trips = s->stats().round_trips;
    auto comms = make_groups(s, groups, options());
    ASSERT_EQ(comms.size(), 3u);
    float w = 1, t = static_cast<float>(r), d = static_cast<float>(r);
    comms[0]->all_reduce(&w, 1)->wait();
    comms[1]->all_reduce(&t, 1)->wait();
    comms[2]->all_reduce(&d, 1)->wait();
    EXPECT_EQ(w, 4.f);
    EXPECT_EQ(t, r < 2 ? 1.f : 5.f);
    EXPECT_EQ(d, r % 2 == 0 ? 2.f : 4.f);
    EXPECT_EQ(comms[1]->name(), cat("tp", r / 2));
    EXPECT_GT(s->stats().round_trips, trips);
  });
}

TEST_F(GlooTest, ThroughRedis) {
  LocalRedis redis;
  const std::string url = redis.url(unique_job("gloo-redis"));
  run_ranks(3, [&](int r) {
    auto c = make_group(make_store(url, "0", 20), "world", r, 3, options());
    std::vector<float> x(1000, static_cast<float>(r + 1));
    c->all_reduce(x.data(), 1000)->wait();
    EXPECT_EQ(x[0], 6.f);
  });
}

TEST_F(GlooTest, HostByInterfaceName) {
  run_ranks(2, [&](int r) {
    CommOptions o = options();
    o.host = "lo";  // a network interface rather than an address
    auto c = make_group(store(), "by-interface", r, 2, o);
    float x = 1;
    c->all_reduce(&x, 1)->wait();
    EXPECT_EQ(x, 2.f);
  });
}

TEST(CommOptions, FromConfig) {
  CommConfig cfg;
  cfg.timeout_s = 12;
  cfg.backend = "gloo";
  cfg.nccl_env = {{"NCCL_DEBUG", "WARN"}};
  CommOptions o = comm_options(cfg);
  EXPECT_EQ(o.timeout_s, 12);
  EXPECT_EQ(o.backend, "gloo");
  EXPECT_EQ(o.nccl_env.at("NCCL_DEBUG"), "WARN");
  cfg.backend = "auto";
  EXPECT_FALSE(comm_options(cfg).backend.empty());
  cfg.backend = "mpi";
  error_of(ErrorClass::kInput, [&] { comm_options(cfg); });
}

}  // namespace
