#include "data/shared_batch.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>

#include "core/error.h"

using myriad::data::SharedBatch;

namespace {

std::string segment(const char* what) { return myriad::cat("/myriad-test-", getpid(), "-", what); }

// One reader and two members over 12 steps: every member sees every step's batch, in order,
// while the reader runs ahead by at most the two slots.
TEST(SharedBatch, EveryMemberGetsEveryBatch) {
  const int64_t ints = 1000;
  const std::string name = segment("ok");
  SharedBatch reader(name, true, 3, ints, 10);
  std::vector<std::thread> members;
  std::vector<int> bad(2, 0);
  for (int m = 0; m < 2; ++m)
    members.emplace_back([&, m] {
      SharedBatch member(name, false, 3, ints, 10);
      std::vector<int32_t> got(ints);
      for (int64_t step = 1; step <= 12; ++step) {
        member.take(step, got.data());
        for (int64_t i = 0; i < ints; ++i) bad[m] += got[i] != int32_t(step * 100000 + i);
        if (m == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a slow member
      }
    });
  std::vector<int32_t> batch(ints);
  for (int64_t step = 1; step <= 12; ++step) {
    for (int64_t i = 0; i < ints; ++i) batch[i] = int32_t(step * 100000 + i);
    reader.publish(step, batch.data());
  }
  for (auto& t : members) t.join();
  EXPECT_EQ(bad[0], 0);
  EXPECT_EQ(bad[1], 0);
}

TEST(SharedBatch, MissingReaderIsACommErrorWithinTheTimeout) {
  try {
    SharedBatch member(segment("lonely"), false, 2, 10, 0.3);
    FAIL() << "no error";
  } catch (const myriad::Error& e) {
    EXPECT_EQ(e.cls(), myriad::ErrorClass::kComm) << e.what();
  }
  // A reader whose member never takes: the third publish (slot reuse) times out.
  SharedBatch reader(segment("stuck"), true, 2, 10, 0.3);
  std::vector<int32_t> b(10, 1);
  reader.publish(1, b.data());
  reader.publish(2, b.data());
  EXPECT_THROW(reader.publish(3, b.data()), myriad::Error);
}

}  // namespace
