// The straggler rule of driver/hang_watch.h: a rank whose median own step time is over
// fault.straggler_factor x the job's median and fault.straggler_margin_ms more, over a window of
// at least kMinSteps steps, held for kSustain_s without a break. On a loaded machine a rank
// starved for a moment, or an attempt's first slow steps, do not make a straggler.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "driver/hang_watch.h"
#include "driver/launcher.h"

using namespace myriad;
using namespace myriad::driver;

namespace {

HeartbeatRecord beat(double own_ms, int64_t steps_run) {
  HeartbeatRecord h;
  h.own_ms = own_ms, h.steps_run = steps_run;
  return h;
}

TEST(Straggler, FoundOnlyOnceItsSlownessHasLasted) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / cat("myriad_straggler_", ::getpid());
  Launcher launcher({});
  HangWatch w(launcher, dir.string());
  for (int r = 0; r < 4; ++r) {
    HangWatch::Rank rank;
    rank.rank = r;
    w.ranks.push_back(rank);
  }
  auto look = [&](double slow_ms, int64_t steps) {
    for (int r = 0; r < 4; ++r) w.ranks[r].last = beat(r == 2 ? slow_ms : 20, steps);
    w.find_stragglers();
  };
  look(400, 20);
  EXPECT_TRUE(w.stragglers.empty()) << "over the thresholds at one look is not yet a straggler";
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  look(30, 20);  // a break: back under the thresholds
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  look(400, 20);
  EXPECT_TRUE(w.stragglers.empty()) << "the break restarted the clock";
  look(400, 3);  // a window too short to judge (a restarted attempt's first steps)
  std::this_thread::sleep_for(std::chrono::milliseconds(2200));
  look(400, 3);
  EXPECT_TRUE(w.stragglers.empty()) << "a window of 3 steps is not judged";
  look(400, 20);
  std::this_thread::sleep_for(std::chrono::milliseconds(2200));
  look(400, 20);
  ASSERT_EQ(w.stragglers.size(), 1u);
  EXPECT_EQ(w.stragglers[0].rank, 2);
  EXPECT_NE(w.stragglers[0].detail.find("straggler: rank 2's steps take 400 ms of their own, 20 x the median"),
            std::string::npos)
      << w.stragglers[0].detail;
  // Against the job's ranks (another node's), the same rule with a clock of its own.
  w.stragglers.clear();
  for (auto& r : w.ranks) r.straggler = false;
  w.find_stragglers({20, 20, 20, 20, 20, 400, 20, 20});
  EXPECT_TRUE(w.stragglers.empty());
  std::filesystem::remove_all(dir);
}

}  // namespace
