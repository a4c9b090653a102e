// The learning-rate schedules at their boundaries, the warmup-stable-decay one above all: its
// stable phase, where its decay starts and ends for each shape, and the run continued with more
// steps, whose decay moves to the new end.
#include <gtest/gtest.h>

#include <cmath>

#include "core/config.h"
#include "core/error.h"
#include "optim/optimizer.h"

namespace myriad {
namespace {

OptimConfig wsd(const std::string& shape, int64_t decay_steps = 0, double fraction = 0.1) {
  OptimConfig o;
  o.decay = "wsd", o.decay_shape = shape, o.decay_steps = decay_steps, o.decay_fraction = fraction;
  o.lr = 1e-3, o.min_lr = 1e-4, o.warmup_steps = 10;
  return o;
}

TEST(LrSchedule, WarmupRisesLinearlyToThePeak) {
  const OptimConfig o = wsd("linear");
  EXPECT_DOUBLE_EQ(lr_at(o, 0, 1000), 1e-4);
  EXPECT_DOUBLE_EQ(lr_at(o, 4, 1000), 5e-4);
  EXPECT_DOUBLE_EQ(lr_at(o, 9, 1000), 1e-3);
}

TEST(LrSchedule, WsdHoldsThePeakUntilItsDecayThenEndsOnMinLr) {
  for (const char* shape : {"linear", "cosine", "1-sqrt"}) {
    SCOPED_TRACE(shape);
    const OptimConfig o = wsd(shape);  // 1000 steps: the decay is the last 100 (steps 900..999)
    EXPECT_EQ(wsd_decay_steps(o, 1000), 100);
    for (int64_t s : {10, 500, 899}) EXPECT_DOUBLE_EQ(lr_at(o, s, 1000), 1e-3) << s;
    EXPECT_LT(lr_at(o, 900, 1000), 1e-3);
    EXPECT_GT(lr_at(o, 900, 1000), lr_at(o, 950, 1000));
    EXPECT_NEAR(lr_at(o, 999, 1000), 1e-4, 1e-15);
    for (int64_t s = 900; s < 999; ++s) EXPECT_GT(lr_at(o, s, 1000), lr_at(o, s + 1, 1000)) << s;
  }
  // Halfway through the decay (progress 50 / 100), each shape's own value.
  const double half = 0.5;
  EXPECT_NEAR(lr_at(wsd("linear"), 949, 1000), 1e-4 + (1 - half) * 9e-4, 1e-15);
  EXPECT_NEAR(lr_at(wsd("cosine"), 949, 1000), 1e-4 + 0.5 * (1 + std::cos(M_PI * half)) * 9e-4, 1e-15);
  EXPECT_NEAR(lr_at(wsd("1-sqrt"), 949, 1000), 1e-4 + (1 - std::sqrt(half)) * 9e-4, 1e-15);
}

TEST(LrSchedule, WsdDecayLengthComesFromStepsOrFractionWithinTheRun) {
  EXPECT_EQ(wsd_decay_steps(wsd("linear", 40), 1000), 40);
  EXPECT_EQ(wsd_decay_steps(wsd("linear", 0, 0.25), 1000), 250);
  EXPECT_EQ(wsd_decay_steps(wsd("linear", 5000), 1000), 990);   // at most the steps after warmup
  EXPECT_EQ(wsd_decay_steps(wsd("linear", 0, 0.001), 100), 1);  // at least one step
  const OptimConfig o = wsd("linear", 40);
  EXPECT_DOUBLE_EQ(lr_at(o, 959, 1000), 1e-3);
  EXPECT_NEAR(lr_at(o, 999, 1000), 1e-4, 1e-15);
}

TEST(LrSchedule, AContinuedWsdRunDecaysAtItsNewEnd) {
  // A run of 1000 steps saved at step 800 (stable) and continued to 2000: the continued run's
  // steps up to 800 had the same rates, and its decay is the last 200 of 2000 (a fraction).
  const OptimConfig o = wsd("1-sqrt");
  for (int64_t s = 0; s < 800; ++s) EXPECT_EQ(lr_at(o, s, 1000), lr_at(o, s, 2000)) << s;
  EXPECT_DOUBLE_EQ(lr_at(o, 950, 2000), 1e-3);  // where the short run decayed
  EXPECT_DOUBLE_EQ(lr_at(o, 1799, 2000), 1e-3);
  EXPECT_LT(lr_at(o, 1800, 2000), 1e-3);
  EXPECT_NEAR(lr_at(o, 1999, 2000), 1e-4, 1e-15);
  // With decay_steps fixed the decay keeps its length.
  const OptimConfig fixed = wsd("linear", 100);
  EXPECT_DOUBLE_EQ(lr_at(fixed, 1899, 2000), 1e-3);
  EXPECT_LT(lr_at(fixed, 1900, 2000), 1e-3);
}

TEST(LrSchedule, WsdKeysOffWsdAndBadValuesAreRefused) {
  auto refused = [](const std::vector<std::string>& sets, const std::string& words) {
    try {
      parse_config("", "test.toml", sets);
      ADD_FAILURE() << "accepted: " << sets[0];
    } catch (const Error& e) {
      EXPECT_EQ(e.cls(), ErrorClass::kInput);
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused({"optim.decay_shape=1-sqrt", "optim.decay_steps=20"}, "set optim.decay = \"wsd\"");
  refused({"optim.decay=wsd", "optim.decay_shape=exp"}, "optim.decay_shape = \"exp\" is not one of");
  refused({"optim.decay=wsd", "optim.decay_fraction=0"}, "optim.decay_fraction (0) must be in (0, 1]");
  refused({"optim.decay=wsd", "optim.decay_steps=-1"}, "optim.decay_steps must be 0 or more");
  EXPECT_NO_THROW(parse_config("", "test.toml", {"optim.decay=wsd", "optim.decay_fraction=0.2"}));
  // Hardening III item 6: a decay of fixed length longer than the steps after warmup is refused,
  // naming the steps it would have had (it was cut to them without a word).
  refused({"optim.decay=wsd", "optim.decay_steps=50", "train.steps=20", "optim.warmup_steps=2"},
          "optim.decay_steps = 50 is longer than the steps after warmup (train.steps 20 - optim.warmup_steps 2 = 18)");
  EXPECT_NO_THROW(parse_config("", "test.toml", {"optim.decay=wsd", "optim.decay_steps=18", "train.steps=20",
                                                 "optim.warmup_steps=2"}));
}

// Hardening III item 6: what a run would not see of its schedule is said, with the values used.
TEST(LrSchedule, AScheduleLongerThanTheRunIsSaidWithTheValuesUsed) {
  OptimConfig o;
  o.lr = 1e-3, o.min_lr = 1e-4, o.warmup_steps = 700;
  const std::string w = schedule_warning(o, 20);
  EXPECT_NE(w.find("optim.warmup_steps = 700 is not shorter than train.steps = 20"), std::string::npos) << w;
  EXPECT_NE(w.find(cat("at lr ", lr_at(o, 19, 20))), std::string::npos) << w;
  EXPECT_NE(w.find("never decays to optim.min_lr 0.0001"), std::string::npos) << w;
  o.warmup_steps = 20;
  EXPECT_NE(schedule_warning(o, 20), "") << "a warmup of the whole run never decays";
  o.decay = "constant";
  EXPECT_EQ(schedule_warning(o, 20), "") << "a constant schedule reaches its lr on the last step";
  o.warmup_steps = 19;
  o.decay = "cosine";
  EXPECT_EQ(schedule_warning(o, 20), "");
  // WSD's fraction, cut to the steps after warmup.
  OptimConfig f = wsd("linear", 0, 0.6);  // warmup 10
  const std::string c = schedule_warning(f, 20);
  EXPECT_NE(c.find("optim.decay_fraction = 0.6 of train.steps = 20 is 12 decay steps, but 10 follow the warmup: the "
                   "decay takes 10"), std::string::npos) << c;
  EXPECT_EQ(schedule_warning(f, 30), "") << "18 decay steps fit after 10 of warmup";
  EXPECT_EQ(wsd_decay_steps(f, 30), 18);
}

}  // namespace
}  // namespace myriad
