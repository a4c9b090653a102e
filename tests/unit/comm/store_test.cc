#include "comm/store.h"

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <filesystem>
#include <thread>

#include "comm/local_redis.h"
#include "comm_test_util.h"

using namespace myriad;
using namespace myriad::comm;
using namespace myriad::comm::testing;

namespace {

// Every test runs on both stores: a file store in a temporary directory and a private
// redis-server started for the suite.
class StoreTest : public ::testing::TestWithParam<std::string> {
 public:
  static void SetUpTestSuite() { redis_ = new LocalRedis(); }
  static void TearDownTestSuite() {
    delete redis_;
    redis_ = nullptr;
  }

 protected:
  void SetUp() override { job_ = unique_job("store"); }

  std::string url(const std::string& job) const {
    return GetParam() == "redis" ? redis_->url(job) : "file://" + dir_.path() + "/" + job;
  }
  std::unique_ptr<Store> open(const std::string& attempt = "0", double timeout_s = 5) const {
    return make_store(url(job_), attempt, timeout_s);
  }

  static LocalRedis* redis_;
  TempDir dir_;
  std::string job_;
};
LocalRedis* StoreTest::redis_ = nullptr;

TEST_P(StoreTest, SetGetDelete) {
  auto s = open();
  EXPECT_EQ(s->try_get("a"), std::nullopt);
  s->set("a", "1");
  EXPECT_EQ(s->get("a"), "1");
  s->set("a", "two");  // overwrite
  EXPECT_EQ(s->try_get("a"), "two");
  const std::string binary("x\0y\nz\r\n", 7);  // values are bytes
  s->set("group/x/id", binary);
  EXPECT_EQ(s->get("group/x/id"), binary);
  EXPECT_TRUE(s->del("a"));
  EXPECT_FALSE(s->del("a"));
  EXPECT_EQ(s->try_get("a"), std::nullopt);
  // Another connection sees the same keys.
  auto t = open();
  EXPECT_EQ(t->get("group/x/id"), binary);
}

// A relaunch drops the keys of the job's earlier numbered attempts, and only those: its own,
// later ones, the launchers' namespace and other jobs keep theirs.
TEST_P(StoreTest, DropAttemptsBelowKeepsTheRest) {
  for (const char* a : {"0", "1", "2", "3", "launch"}) {
    auto s = open(a);
    s->set("k", a);
    s->add("n", 1);
    s->set("group/x/id", a);
  }
  auto other = make_store(url(job_ + "x"), "0", 5);
  other->set("k", "other");
  EXPECT_GT(open("2")->drop_attempts_below(2), 0);
  EXPECT_EQ(open("0")->try_get("k"), std::nullopt);
  EXPECT_EQ(open("1")->try_get("group/x/id"), std::nullopt);
  EXPECT_EQ(open("1")->try_get("n"), std::nullopt);
  EXPECT_EQ(open("2")->try_get("k"), "2");
  EXPECT_EQ(open("3")->try_get("group/x/id"), "3");
  EXPECT_EQ(open("launch")->try_get("n"), "1");
  EXPECT_EQ(other->try_get("k"), "other");
  EXPECT_EQ(open("2")->drop_attempts_below(2), 0);  // nothing left to drop
  // A dropped key that is set again notifies its waiters as before.
  auto s = open("0");
  s->set("k", "again");
  EXPECT_EQ(s->get("k"), "again");
}

TEST_P(StoreTest, AddIsAtomicAcrossConnections) {
  auto s = open();
  EXPECT_EQ(s->add("n"), 1);
  EXPECT_EQ(s->add("n", 5), 6);
  EXPECT_EQ(s->add("n", -2), 4);
  EXPECT_EQ(s->get("n"), "4");
  constexpr int kThreads = 4, kAdds = 100;
  run_ranks(kThreads, [&](int) {
    auto mine = open();
    for (int i = 0; i < kAdds; ++i) mine->add("counter");
  });
  EXPECT_EQ(s->add("counter", 0), kThreads * kAdds);
  s->set("text", "abc");
  std::string what = error_of(ErrorClass::kInternal, [&] { s->add("text"); });
  EXPECT_NE(what.find("text"), std::string::npos) << what;
}

TEST_P(StoreTest, CompareSet) {
  auto s = open();
  EXPECT_EQ(s->compare_set("k", std::string("x"), "y"), std::nullopt);  // absent: no change
  EXPECT_EQ(s->try_get("k"), std::nullopt);
  EXPECT_EQ(s->compare_set("k", std::nullopt, "first"), "first");  // absent expected: set
  EXPECT_EQ(s->compare_set("k", std::nullopt, "again"), "first");  // present: no change
  EXPECT_EQ(s->compare_set("k", std::string("wrong"), "z"), "first");
  EXPECT_EQ(s->compare_set("k", std::string("first"), "second"), "second");
  EXPECT_EQ(s->get("k"), "second");
  // Exactly one of many racing claimants wins.
  std::atomic<int> winners{0};
  run_ranks(4, [&](int r) {
    auto mine = open();
    if (mine->compare_set("leader", std::nullopt, std::to_string(r)) == std::to_string(r))
      ++winners;
  });
  EXPECT_EQ(winners.load(), 1);
}

TEST_P(StoreTest, WaitAndGetWaitForTheKey) {
  auto s = open();
  std::thread setter([&] {
    auto t = open();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    t->set("late", "v");
    t->add("late-counter", 3);
  });
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(s->get("late"), "v");
  s->wait({"late", "late-counter"});  // add creates a key too
  EXPECT_GE(seconds_since(t0), 0.15);
  setter.join();
}

TEST_P(StoreTest, TimeoutsNameTheKeyAndTheStore) {
  auto s = open("0", 0.5);
  auto t0 = std::chrono::steady_clock::now();
  std::string what = error_of(ErrorClass::kComm, [&] { s->get("never"); });
  const double took = seconds_since(t0);
  EXPECT_GE(took, 0.45);
  EXPECT_LT(took, 2.0);
  EXPECT_NE(what.find(s->prefix() + "never"), std::string::npos) << what;
  EXPECT_NE(what.find(url(job_)), std::string::npos) << what;
  EXPECT_NE(what.find("timed out"), std::string::npos) << what;
  // wait with its own timeout; the store stays usable afterwards.
  s->set("present", "1");
  what = error_of(ErrorClass::kComm, [&] { s->wait({"present", "absent"}, 0.3); });
  EXPECT_NE(what.find("absent"), std::string::npos) << what;
  EXPECT_EQ(s->get("present"), "1");
}

TEST_P(StoreTest, Expiry) {
  auto s = open();
  s->set("short", "v", 0.3);
  s->set("long", "v", 30);
  EXPECT_EQ(s->try_get("short"), "v");
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_EQ(s->try_get("short"), std::nullopt);
  EXPECT_EQ(s->try_get("long"), "v");
  EXPECT_FALSE(s->del("short"));
  // An expired key is absent for add and compare_set too, and waits wait for a new value.
  EXPECT_EQ(s->compare_set("short", std::nullopt, "new"), "new");
  s->set("gone", "1", 0.2);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(s->add("gone", 2), 2);
  s->set("again", "1", 0.2);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  error_of(ErrorClass::kComm, [&] { s->wait({"again"}, 0.3); });
}

TEST_P(StoreTest, KeysAreNamespacedByJobAndAttempt) {
  auto a0 = open("0"), a1 = open("1");
  EXPECT_EQ(a0->prefix(), "myriad/" + job_ + "/0/");
  a0->set("k", "attempt 0");
  EXPECT_EQ(a1->try_get("k"), std::nullopt);
  a1->set("k", "attempt 1");
  EXPECT_EQ(a0->get("k"), "attempt 0");
  auto other = make_store(url(job_ + "-other"), "0", 5);
  EXPECT_EQ(other->try_get("k"), std::nullopt);
  // Where the key actually lives.
  if (GetParam() == "redis") {
    redisContext* c = redisConnect("127.0.0.1", redis_->port());
    ASSERT_TRUE(c && !c->err);
    auto* r =
        static_cast<redisReply*>(redisCommand(c, "GET %s", ("myriad/" + job_ + "/1/k").c_str()));
    ASSERT_TRUE(r);
    EXPECT_EQ(std::string(r->str, r->len), "attempt 1");
    freeReplyObject(r);
    redisFree(c);
  } else {
    EXPECT_TRUE(std::filesystem::exists(dir_.path() + "/myriad/" + job_ + "/1/k"));
  }
}

TEST_P(StoreTest, BatchesAreOneRoundTrip) {
  auto s = open();
  const int64_t trips = s->stats().round_trips;
  std::vector<StoreResult> r = s->run(
      {StoreOp::set("b1", "x"), StoreOp::add("b2", 2), StoreOp::wait("b1"), StoreOp::get("b1"),
       StoreOp::get("none"), StoreOp::compare_set("b3", std::nullopt, "c"), StoreOp::del("b1")});
  EXPECT_EQ(s->stats().round_trips, trips + 1);
  ASSERT_EQ(r.size(), 7u);
  EXPECT_EQ(r[1].number, 2);
  EXPECT_TRUE(r[2].found);
  EXPECT_EQ(r[3].value, "x");
  EXPECT_FALSE(r[4].found);
  EXPECT_EQ(r[5].value, "c");
  EXPECT_TRUE(r[6].found);
}

TEST_P(StoreTest, NonBlockingStartAndPoll) {
  auto s = open();
  s->start({StoreOp::wait("nb"), StoreOp::get("nb")});
  std::vector<StoreResult> out;
  EXPECT_FALSE(s->poll(&out));
  open()->set("nb", "ready");
  auto t0 = std::chrono::steady_clock::now();
  while (!s->poll(&out)) {
    ASSERT_LT(seconds_since(t0), 5.0);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].value, "ready");
  // A timeout surfaces from poll().
  s->start({StoreOp::wait("nb-never")}, 0.2);
  std::string what = error_of(ErrorClass::kComm, [&] {
    while (!s->poll(&out)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  EXPECT_NE(what.find("nb-never"), std::string::npos) << what;
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreTest, ::testing::Values("file", "redis"),
                         [](const auto& info) { return info.param; });

// ---- Redis only ----

TEST(RedisStore, ServerKilledDuringAWaitIsACommErrorNotAHang) {
  LocalRedis redis;
  auto s = make_store(redis.url("killed"), "0", 10);
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    redis.kill();
  });
  auto t0 = std::chrono::steady_clock::now();
  std::string what = error_of(ErrorClass::kComm, [&] { s->get("never"); });
  killer.join();
  EXPECT_LT(seconds_since(t0), 3.0);
  EXPECT_NE(what.find(cat("127.0.0.1:", redis.port())), std::string::npos) << what;
  EXPECT_NE(what.find("lost"), std::string::npos) << what;
  // The next operation tries to reconnect and fails within the timeout (usually "cannot
  // connect"; "lost" when the dying server still accepted the connection).
  s->set_timeout(0.5);
  t0 = std::chrono::steady_clock::now();
  what = error_of(ErrorClass::kComm, [&] { s->set("k", "v"); });
  EXPECT_LT(seconds_since(t0), 2.0);
  EXPECT_NE(what.find(cat("127.0.0.1:", redis.port())), std::string::npos) << what;
}

TEST(RedisStore, UnreachableServerFailsWithinTheTimeout) {
  int port;
  {
    LocalRedis gone;  // a port that was just served, now closed
    port = gone.port();
  }
  auto t0 = std::chrono::steady_clock::now();
  std::string what = error_of(
      ErrorClass::kComm, [&] { make_store(cat("redis://127.0.0.1:", port, "/job"), "0", 0.5); });
  EXPECT_GE(seconds_since(t0), 0.4);
  EXPECT_LT(seconds_since(t0), 2.0);
  EXPECT_NE(what.find(cat("127.0.0.1:", port)), std::string::npos) << what;
}

TEST(RedisStore, Password) {
  LocalRedis redis({"--requirepass", "s3cret"});
  const std::string hostport = cat("127.0.0.1:", redis.port());
  auto s = make_store("redis://:s3cret@" + hostport + "/job", "0", 5);
  s->set("k", "v");
  EXPECT_EQ(s->get("k"), "v");
  EXPECT_EQ(s->url().find("s3cret"), std::string::npos) << "the password must not show in messages";
  std::string what = error_of(ErrorClass::kInput,
                              [&] { make_store("redis://:wrong@" + hostport + "/job", "0", 5); });
  EXPECT_EQ(what.find("wrong"), std::string::npos) << what;
  auto anonymous = make_store("redis://" + hostport + "/job", "0", 5);
  what = error_of(ErrorClass::kInput, [&] { anonymous->try_get("k"); });
  EXPECT_NE(what.find("NOAUTH"), std::string::npos) << what;
}

TEST(Store, BadUrlsAreInputErrors) {
  for (const char* url : {"", "ftp://host/job", "redis://127.0.0.1:6379", "redis://127.0.0.1:6379/",
                          "redis://127.0.0.1:99999/job", "redis://127.0.0.1:port/job",
                          "redis:///job", "redis://127.0.0.1:6379/a/b", "file://"})
    error_of(ErrorClass::kInput, [&] { make_store(url, "0", 1); });
  TempDir dir;
  error_of(ErrorClass::kInput, [&] { make_store(dir.path() + "/job", "a/b", 1); });
  error_of(ErrorClass::kInput, [&] { make_store(dir.path() + "/job", "0", 0); });
  // A plain path is a file store.
  auto s = make_store(dir.path() + "/job", "7", 1);
  s->set("k", "v");
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/myriad/job/7/k"));
  EXPECT_EQ(s->url(), "file://" + dir.path() + "/job");
}

}  // namespace
