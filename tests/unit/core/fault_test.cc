// The fault-injection grammar (core/fault.h): POINT:ACTION[:ARG][@rank=R][@node=N][@attempt=A].
#include "core/fault.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "core/error.h"

using namespace myriad;

namespace {

struct Env {
  Env(const char* faults, const char* rank, const char* node, const char* attempt) {
    setenv("MYRIAD_INJECT_FAULT", faults, 1);
    setenv("MYRIAD_RANK", rank, 1);
    setenv("MYRIAD_NODE_RANK", node, 1);
    setenv("MYRIAD_ATTEMPT", attempt, 1);
  }
  ~Env() {
    for (const char* v : {"MYRIAD_INJECT_FAULT", "MYRIAD_RANK", "MYRIAD_NODE_RANK", "MYRIAD_ATTEMPT"}) unsetenv(v);
  }
};

TEST(Fault, QualifiersChooseTheProcessAndTheAttempt) {
  const char* items = "step:20:kill@rank=1,step:5:slow:200@rank=3@node=1,step:7:nan@attempt=1,checkpoint_write:fail";
  {
    Env e(items, "1", "0", "0");
    EXPECT_EQ(fault::action("step:20"), "kill");
    EXPECT_EQ(fault::action("step:2"), "");  // another step ("step:20" is not "step:2")
    EXPECT_EQ(fault::action("step:5"), "");  // rank 3 on node 1 only
    EXPECT_EQ(fault::action("step:7"), "");  // attempt 1 only
    EXPECT_EQ(fault::action("checkpoint_write"), "fail");  // every rank, attempt 0
  }
  {
    Env e(items, "3", "1", "0");
    EXPECT_EQ(fault::action("step:20"), "");
    EXPECT_EQ(fault::action("step:5"), "slow:200");
  }
  {
    Env e(items, "3", "0", "1");
    EXPECT_EQ(fault::action("step:5"), "");  // node 0
    EXPECT_EQ(fault::action("step:7"), "nan");
    EXPECT_EQ(fault::action("checkpoint_write"), "");  // a restarted attempt runs clean
  }
}

TEST(Fault, TriggerCarriesOutWhatTheProcessCan) {
  Env e("step:1:throw,step:2:slow:40,step:3:flip,step:4:slow:x,step:5:kill@rank=9,step:6:slow:x3,step:7:slow:x3:150",
        "0", "0", "0");
  try {
    fault::trigger("step:1");
    ADD_FAILURE() << "no error";
  } catch (const Error& err) {
    EXPECT_EQ(err.cls(), ErrorClass::kRuntime);
  }
  EXPECT_EQ(fault::delay_ms(), 0);
  EXPECT_EQ(fault::trigger("step:2"), "");
  EXPECT_EQ(fault::delay_ms(), 40);  // from then on
  EXPECT_EQ(fault::trigger("step:3"), "flip");  // for the trainer to carry out
  EXPECT_THROW(fault::trigger("step:4"), Error);
  EXPECT_EQ(fault::trigger("step:5"), "");  // rank 9 only: this process lives on
  // slow:xK: each step K times its own time, whatever that time is (a loaded machine's too).
  EXPECT_EQ(fault::delay_ms(100), 40);
  EXPECT_EQ(fault::trigger("step:6"), "");
  EXPECT_EQ(fault::delay_ms(100), 40 + 200);
  EXPECT_EQ(fault::delay_ms(300), 40 + 600);
  // slow:xK:MS: and at least MS (a step too short for K alone to make a straggler).
  EXPECT_EQ(fault::trigger("step:7"), "");
  EXPECT_EQ(fault::delay_ms(10), 40 + 150);
  EXPECT_EQ(fault::delay_ms(100), 40 + 200);
}

TEST(Fault, AnUnknownQualifierIsAnInputError) {
  Env e("step:1:kill@rnak=1", "0", "0", "0");
  try {
    fault::action("step:1");
    ADD_FAILURE() << "no error";
  } catch (const Error& err) {
    EXPECT_EQ(err.cls(), ErrorClass::kInput);
    EXPECT_NE(std::string(err.what()).find("@rnak"), std::string::npos) << err.what();
  }
}

// Every item is checked at start against the grammar: a misspelt fault is refused, naming the
// item, instead of never firing.
TEST(Fault, CheckInjectionRefusesWhatWouldNeverFire) {
  for (const char* good : {"step:20:kill@rank=1,step:5:slow:200@rank=3@node=1,step:7:nan@attempt=1",
                           "checkpoint_write:pause:80,diag:fail@node=1,comm_check:sleep_ignore_term@rank=1",
                           "fwd:6:hang@rank=5,bwd:6:stall,dp_gather:6:throw,pp_recv:6:hang,shared_batch_created:kill",
                           "step:2:slow:x4@rank=1,step:3:slow:x2.5:200@rank=2"}) {
    Env e(good, "0", "0", "0");
    EXPECT_NO_THROW(fault::check_injection()) << good;
  }
  struct Bad {
    const char *item, *says;
  };
  for (const Bad& b : {Bad{"step:6:nam", "unknown action 'nam'"}, Bad{"fwd:6:nan", "nan acts on a training step"},
                       Bad{"checkpoint_write:flip", "flip acts on a training step"},
                       Bad{"comm_check:pause:10", "the communication check takes kill, fail"},
                       Bad{"stp:6:kill", "unknown point"}, Bad{"step:x:kill", "step:S needs a step number"},
                       Bad{"step:6:slow", "slow:MS needs MS"}, Bad{"step:6:kill:3", "kill takes no argument"},
                       Bad{"step:6:slow:x1", "slow:xK[:MS] needs K"}, Bad{"step:6:slow:x3:fast", "slow:xK[:MS] needs K"},
                       Bad{"step:6:kill@rank=", "@rank needs a number"}, Bad{"diag:sleep", "the communication check's"}}) {
    Env e(cat("step:1:kill,", b.item).c_str(), "0", "0", "0");
    try {
      fault::check_injection();
      ADD_FAILURE() << b.item << ": no error";
    } catch (const Error& err) {
      EXPECT_EQ(err.cls(), ErrorClass::kInput);
      const std::string what = err.what();
      EXPECT_NE(what.find(cat("'", b.item, "'")), std::string::npos) << what;
      EXPECT_NE(what.find(b.says), std::string::npos) << what;
    }
  }
}

}  // namespace

namespace {

// Live injection: a file written while the process runs arms its items, each firing once where
// its point is next reached; `step:next` is the step about to run; an item off the grammar is
// dropped and the rest armed.
TEST(Fault, ALiveFileArmsItsItemsOnceEach) {
  const std::string path = ::testing::TempDir() + "myriad_inject_live";
  setenv("MYRIAD_INJECT_LIVE", path.c_str(), 1);
  EXPECT_EQ(fault::poll_live(7), "");  // no file: nothing
  {
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs("step:next:spike\ncheckpoint_write:fail, step:3:meteor ,diag:fail\n", f);
    std::fclose(f);
  }
  EXPECT_EQ(fault::poll_live(7), "step:7:spike,checkpoint_write:fail,diag:fail");
  EXPECT_EQ(std::fopen(path.c_str(), "r"), nullptr) << "the file is taken";
  EXPECT_EQ(fault::action("step:6"), "");
  EXPECT_EQ(fault::action("step:7"), "spike");
  EXPECT_EQ(fault::action("step:7"), "") << "once";
  EXPECT_THROW(fault::trigger("checkpoint_write"), Error);
  EXPECT_EQ(fault::trigger("checkpoint_write"), "");
  EXPECT_EQ(fault::action("diag"), "fail");
  unsetenv("MYRIAD_INJECT_LIVE");
}

}  // namespace
