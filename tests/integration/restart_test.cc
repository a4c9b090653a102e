// `myriad launch --max-restarts N`: a worker killed mid-run is restarted by the launch itself,
// which resumes from the latest committed checkpoint and ends with the weights of the run that
// never broke; bad input is never retried; restarts run out. Real processes through the
// launcher, a real fault (SIGKILL) injected with MYRIAD_INJECT_FAULT.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "test_util.h"

namespace fs = std::filesystem;
using myriad::cat;

namespace {

using myriad::test::Result;
Result run(const std::string& args, const std::string& env = "") { return myriad::test::run_myriad(args, env); }

using myriad::test::jsonl;
using myriad::test::read_file;

class Restart : public ::testing::Test {
 protected:
  static fs::path dir_;
  static std::string data_;
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / cat("myriad_restart_", getpid());
    fs::create_directories(dir_);
    data_ = (dir_ / "corpus").string();
    ASSERT_EQ(run(cat("prepare --input /usr/share/games/fortunes/computers --tokenizer byte --output ", data_,
                      " --doc-separator %")).code, 0);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  // Synchronous saves: a restart must resume from a known step (step 4 for a fault at step 6). An
  // asynchronous save may still be written when a fault strikes two steps later; the restarts
  // of those are tests/fault/checkpoint_test.cc's and nodes_test.cc's.
  static std::string launch(const fs::path& rd, const std::string& flags, const std::string& extra = "") {
    return cat("launch --nproc-per-node 2 ", flags, " -- train --config ", MYRIAD_SOURCE_DIR, "/configs/demo.toml",
               " --run-dir ", rd.string(), " --set model.layers=2 --set model.d_model=32 --set model.seq_len=16",
               " --set parallel.dp=2 --set train.steps=12 --set checkpoint.every=4 --set checkpoint.keep_last=0",
               " --set checkpoint.async=false --set train.log_every=1 --set train.eval_every=0 --set data.train=", data_, " --set data.valid= ",
               extra);
  }
};
fs::path Restart::dir_;
std::string Restart::data_;

TEST_F(Restart, KilledWorkerIsRestartedAndEndsWithTheWeightsOfTheRunThatNeverBroke) {
  const fs::path straight = dir_ / "straight", broken = dir_ / "broken";
  ASSERT_EQ(run(launch(straight, "")).code, 0);
  // Rank 1 is killed after step 6 (its checkpoint of step 4 committed) in the first attempt.
  Result r = run(launch(broken, "--max-restarts 2"), "MYRIAD_INJECT_FAULT=step:6:kill@rank=1");
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<nlohmann::json> ev = jsonl(broken / "driver/events.jsonl");
  std::vector<std::string> kinds;
  for (const auto& e : ev) kinds.push_back(e["event"]);
  ASSERT_EQ(kinds, (std::vector<std::string>{"fault", "stop", "diagnose", "restart", "resumed"})) << r.output;
  EXPECT_EQ(ev[0]["rank"], 1) << ev[0].dump() << "\n" << r.output;
  EXPECT_EQ(ev[0]["class"], "runtime fault");
  EXPECT_EQ(ev[0]["attempt"], 0);
  // Stop and check: the node's self-check passed, so it restarts in place.
  EXPECT_NE(ev[2]["detail"].get<std::string>().find("self-check of node 0: self-check ok: compute "),
            std::string::npos) << ev[2].dump();
  EXPECT_NE(ev[2]["detail"].get<std::string>().find(", all-reduce of 2 processes "), std::string::npos) << ev[2].dump();
  EXPECT_EQ(ev[3]["attempt"], 1);  // the attempt the restart starts
  EXPECT_EQ(ev[4]["attempt"], 1);
  EXPECT_NE(ev[4]["detail"].get<std::string>().find("step 5/12, from "), std::string::npos) << ev[4].dump();
  EXPECT_NE(ev[4]["detail"].get<std::string>().find("step_00000004"), std::string::npos) << ev[4].dump();
  for (const auto& e : ev) EXPECT_GT(e["time"].get<double>(), 1.7e9);
  // The same weights and optimizer state, bit for bit, and the same losses.
  for (const char* shard : {"shard_00000.bin", "shard_00001.bin"})
    EXPECT_EQ(read_file(broken / "checkpoints/step_00000012" / shard),
              read_file(straight / "checkpoints/step_00000012" / shard)) << shard;
  std::vector<nlohmann::json> a = jsonl(straight / "metrics.jsonl"), b = jsonl(broken / "metrics.jsonl");
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << i;
}

// Hangs, found from the heartbeats long before the collectives' timeout (comm.timeout_s = 300):
// a frozen rank (SIGSTOP: no heartbeat) is the culprit and is killed; a stalled one (its
// training thread stuck, its heartbeat alive) leaves every rank without a new step: all are
// stopped, and the rank its peer waits for in their groups (the heartbeats' collective records)
// is named. Either way the run restarts from step 4 and ends as the run that never broke.
TEST_F(Restart, HangsAreFoundAndTheRunRestarts) {
  const fs::path straight = dir_ / "hang_straight";
  ASSERT_EQ(run(launch(straight, "")).code, 0);
  for (const char* action : {"hang", "stall"}) {
    const fs::path rd = dir_ / cat("hang_", action);
    const auto t0 = std::chrono::steady_clock::now();
    Result r = run(launch(rd, "--max-restarts 1", "--set fault.step_timeout_s=3"),
                   cat("MYRIAD_INJECT_FAULT=step:5:", action, "@rank=1"));
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_LT(took, 60) << "found by the heartbeats, not by a collective timeout";
    std::vector<nlohmann::json> ev = jsonl(rd / "driver/events.jsonl");
    ASSERT_GE(ev.size(), 4u) << r.output;
    EXPECT_EQ(ev[0]["event"], "fault");
    const std::string detail = ev[0]["detail"];
    if (std::string(action) == "hang") {
      EXPECT_NE(detail.find("hang: rank 1 is frozen"), std::string::npos) << detail;
      EXPECT_EQ(ev[0]["rank"], 1);
    } else {
      EXPECT_NE(detail.find("hang: no rank of this node completed a step"), std::string::npos) << detail;
      EXPECT_NE(detail.find("rank 1 (its last step 5, phase data, its last finished operation "), std::string::npos)
          << detail;
      EXPECT_NE(detail.find(") holds the job up: rank 0 in dp0's"), std::string::npos) << detail;
      EXPECT_EQ(ev[0]["rank"], 1);
    }
    EXPECT_EQ(ev.back()["event"], "resumed");
    EXPECT_EQ(read_file(rd / "checkpoints/step_00000012/shard_00000.bin"),
              read_file(straight / "checkpoints/step_00000012/shard_00000.bin")) << action;
  }
}

// Without fault.step_timeout_s a stall is found from the observed step time: the steps of this
// tiny model take milliseconds, so the allowance is fault.stall_floor_s (5 s), not a minute.
TEST_F(Restart, AStallIsFoundFromTheObservedStepTime) {
  const fs::path rd = dir_ / "stall_observed";
  Result r = run(launch(rd, "--max-restarts 1"), "MYRIAD_INJECT_FAULT=step:5:stall@rank=1");
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<nlohmann::json> ev = jsonl(rd / "driver/events.jsonl");
  ASSERT_GE(ev.size(), 4u) << r.output;
  EXPECT_EQ(ev[0]["event"], "fault");
  const std::string detail = ev[0]["detail"];
  long long waited = -1;
  double allowance = -1;
  const size_t at = detail.find("completed a step for ");
  ASSERT_NE(at, std::string::npos) << detail;
  ASSERT_EQ(std::sscanf(detail.c_str() + at, "completed a step for %lld s (allowance %lf s", &waited, &allowance), 2)
      << detail;
  EXPECT_EQ(allowance, 5) << detail;
  EXPECT_LE(waited, 10) << "found within the floor and the watch's second: " << detail;
  EXPECT_EQ(ev.back()["event"], "resumed");
}

// The self-check's collective: the node's processes all-reduce and check every element; a
// A fault written into a running worker's live injection file (core/fault.h), as a chaos run
// does: rank 1 takes step:next:spike at its next step, the spike check finds it, the job
// restarts and ends as the run that never broke; `myriad report` then draws the recovery.
TEST_F(Restart, ALiveInjectedFaultStrikesTheRunningJobAndTheReportDrawsItsRecovery) {
  const fs::path straight = dir_ / "live_straight", rd = dir_ / "live";
  ASSERT_EQ(run(launch(straight, "", "--set train.steps=40")).code, 0);
  Result r;
  // Its first attempt's steps take 100 ms each (numerics unchanged), so the fault lands mid-run.
  std::thread job([&] {
    r = run(launch(rd, "--max-restarts 1", "--set fault.spike_factor=3 --set train.steps=40"),
            "MYRIAD_INJECT_FAULT=step:1:slow:100");
  });
  // Once rank 1 has completed step 8 (the spike check has its 5 losses), the fault goes in.
  bool injected = false;
  for (int i = 0; i < 600 && !injected; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream in(rd / "driver/heartbeat_rank_1");
    const nlohmann::json beat = nlohmann::json::parse(in, nullptr, false);
    if (beat.is_object() && beat.value("step", 0) >= 8) {
      std::ofstream(rd / "driver/inject_rank_1.tmp") << "step:next:spike\n";
      fs::rename(rd / "driver/inject_rank_1.tmp", rd / "driver/inject_rank_1");
      injected = true;
    }
  }
  job.join();
  ASSERT_TRUE(injected) << r.output;
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<nlohmann::json> ev = jsonl(rd / "driver/events.jsonl");
  ASSERT_GE(ev.size(), 5u) << r.output;
  EXPECT_EQ(ev[0]["event"], "fault");
  EXPECT_EQ(ev[0]["class"], "numerics fault");
  EXPECT_NE(ev[0]["detail"].get<std::string>().find("a loss spike"), std::string::npos) << ev[0].dump();
  EXPECT_EQ(ev.back()["event"], "resumed");
  EXPECT_EQ(read_file(rd / "checkpoints/step_00000040/shard_00000.bin"),
            read_file(straight / "checkpoints/step_00000040/shard_00000.bin"));
  // The report: without traces, the timeline alone, each phase of the recovery named.
  Result report = run(cat("report ", rd.string()));
  ASSERT_EQ(report.code, 0) << report.output;
  EXPECT_NE(report.output.find("report: recovery: attempt 0: "), std::string::npos) << report.output;
  for (const char* phase : {"detect ", "stop ", "check ", "restart ", "load and first step "})
    EXPECT_NE(report.output.find(phase), std::string::npos) << phase << " in " << report.output;
  EXPECT_TRUE(fs::exists(rd / "report/timeline.png"));
}

// bandwidth below what fault.diag_min_bus_gbps expects fails the node (the agent evicts it).
TEST_F(Restart, SelfCheckMeasuresTheNodesCollectiveAgainstItsExpectedBandwidth) {
  const std::string dir = (dir_ / "check").string();
  Result ok = run(cat("self-check --checkpoint-dir ", dir, " --ranks 3"));
  ASSERT_EQ(ok.code, 0) << ok.output;
  EXPECT_NE(ok.output.find("self-check ok: compute "), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find(", all-reduce of 3 processes "), std::string::npos) << ok.output;
  Result slow = run(cat("self-check --checkpoint-dir ", dir, " --ranks 2 --min-bus-gbps 100000"));
  EXPECT_EQ(slow.code, 3) << slow.output;
  EXPECT_NE(slow.output.find("GB/s of bus bandwidth, below fault.diag_min_bus_gbps (100000)"), std::string::npos)
      << slow.output;
  EXPECT_FALSE(fs::exists(dir + "/.self_check_0")) << "nothing left behind";
}

TEST_F(Restart, BadInputIsNeverRetried) {
  const fs::path rd = dir_ / "bad";
  Result r = run(launch(rd, "--max-restarts 3", "--set train.global_batch=12 --set train.micro_batch=4"));
  EXPECT_EQ(r.code, 2) << r.output;
  std::vector<nlohmann::json> ev = jsonl(rd / "driver/events.jsonl");
  ASSERT_EQ(ev.size(), 2u) << r.output;
  EXPECT_EQ(ev[0]["event"], "fault");
  EXPECT_EQ(ev[0]["class"], "input error");
  EXPECT_EQ(r.output.find("attempt 1,"), std::string::npos) << r.output;
}

TEST_F(Restart, RestartsRunOut) {
  const fs::path rd = dir_ / "runout";
  Result r = run(launch(rd, "--max-restarts 1"), "MYRIAD_INJECT_FAULT=step:2:kill,step:3:kill@attempt=1");
  EXPECT_EQ(r.code, 3) << r.output;
  int faults = 0, restarts = 0;
  for (const auto& e : jsonl(rd / "driver/events.jsonl"))
    faults += e["event"] == "fault", restarts += e["event"] == "restart";
  EXPECT_EQ(faults, 2);
  EXPECT_EQ(restarts, 1);
  EXPECT_NE(r.output.find("myriad: launch: rank "), std::string::npos) << r.output;
}


// Faults the step's own checks catch (core/fault.h's nan and flip; fault.spike_factor and
// fault.sdc_check_every): each is raised before the step is saved, names its rank and class,
// and the restart from the checkpoint before it ends as the run that never broke. The unbroken
// run checks its replicas every step too: no false alarm.
TEST_F(Restart, BadNumericsAndSilentCorruptionAreFoundAndTheRunRestarts) {
  const fs::path straight = dir_ / "checked_straight";
  const std::string checked = "--set fault.sdc_check_every=1";
  ASSERT_EQ(run(launch(straight, "", checked)).code, 0);
  struct Case {
    const char *fault, *cls, *needle;
    int rank;
  };
  for (const Case& c : {Case{"step:6:flip@rank=1", "runtime fault",
                             "silent data corruption at step 6: rank 1's copy of the parameters rank ", 1},
                        Case{"step:6:nan@rank=0", "numerics fault", "step 6: loss is nan", 0}}) {
    const fs::path rd = dir_ / cat("checked_", c.rank);
    Result r = run(launch(rd, "--max-restarts 1", checked), cat("MYRIAD_INJECT_FAULT=", c.fault));
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find(c.needle), std::string::npos) << r.output;
    std::vector<nlohmann::json> ev = jsonl(rd / "driver/events.jsonl");
    ASSERT_GE(ev.size(), 4u) << r.output;
    EXPECT_EQ(ev[0]["event"], "fault");
    EXPECT_EQ(ev[0]["rank"], c.rank) << c.fault;
    EXPECT_EQ(ev[0]["class"], c.cls) << c.fault;
    std::string resumed, transient;
    for (const auto& e : ev) {
      if (e["event"] == "resumed") resumed = e["detail"];
      if (e["event"] == "diagnose" && e["detail"].get<std::string>().find("transient") != std::string::npos)
        transient = e["detail"];
    }
    EXPECT_NE(resumed.find("step_00000004"), std::string::npos) << r.output;
    // The restart reruns step 6 on rank 1: clean, so the corruption was transient.
    if (c.rank == 1) {
      EXPECT_EQ(transient, "the silent data corruption of rank 1 at step 6 was transient: the rerun of that step "
                           "passed the replicas' check") << r.output;
    }
    for (const char* shard : {"shard_00000.bin", "shard_00001.bin"})
      EXPECT_EQ(read_file(rd / "checkpoints/step_00000012" / shard),
                read_file(straight / "checkpoints/step_00000012" / shard)) << c.fault << " " << shard;
  }
  // Corrupt again on the rerun: a faulty device. On one node there is nowhere else to run, so
  // the job stops (on several, that node is evicted: nodes_test), restarts left or not.
  const fs::path rd = dir_ / "checked_persistent";
  Result r = run(launch(rd, "--max-restarts 3", checked),
                 "MYRIAD_INJECT_FAULT=step:6:flip@rank=1,step:6:flip@rank=1@attempt=1");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("; persistent: the rerun of step 6 corrupted it again; replace this node's faulty device"),
            std::string::npos) << r.output;
  int restarts = 0;
  for (const auto& e : jsonl(rd / "driver/events.jsonl")) restarts += e["event"] == "restart";
  EXPECT_EQ(restarts, 1);
}

// A loss fault that recurs when its step is replayed is the data's, not a machine's: the third
// attempt skips that step's batch (train.skip_steps) and the job ends with the weights of a run
// told to skip it from the start, bit for bit. The driver's decision is an event, and the
// skipped step is in metrics.jsonl.
TEST_F(Restart, ALossFaultThatRecursOnReplaySkipsItsBatch) {
  const fs::path told = dir_ / "told_to_skip", found = dir_ / "found_to_skip";
  ASSERT_EQ(run(launch(told, "", "--set train.skip_steps=[6]")).code, 0);
  Result r = run(launch(found, "--max-restarts 3"), "MYRIAD_INJECT_FAULT=step:6:nan@attempt=0,step:6:nan@attempt=1");
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<std::string> kinds, skip_notes;
  for (const auto& e : jsonl(found / "driver/events.jsonl")) {
    kinds.push_back(e["event"]);
    const std::string d = e.value("detail", "");
    if (e["event"] == "diagnose" && d.find("recurred on the replay") != std::string::npos) skip_notes.push_back(d);
  }
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), "restart"), 2) << r.output;
  ASSERT_EQ(skip_notes.size(), 1u) << r.output;
  EXPECT_NE(skip_notes[0].find("the loss fault at step 6 recurred"), std::string::npos) << skip_notes[0];
  EXPECT_NE(r.output.find("step 6/12 skipped: its batch is dropped (train.skip_steps)"), std::string::npos) << r.output;
  for (const char* shard : {"shard_00000.bin", "shard_00001.bin"})
    EXPECT_EQ(read_file(found / "checkpoints/step_00000012" / shard), read_file(told / "checkpoints/step_00000012" / shard))
        << shard;
  bool logged = false;
  for (const auto& m : jsonl(told / "metrics.jsonl")) logged |= m["step"] == 6 && m.value("skipped", false);
  EXPECT_TRUE(logged);
  // Skipping drops the batch: not the same weights as the run that trained on step 6.
  const fs::path plain = dir_ / "no_skip";
  ASSERT_EQ(run(launch(plain, "")).code, 0);
  EXPECT_NE(read_file(plain / "checkpoints/step_00000012/shard_00000.bin"),
            read_file(told / "checkpoints/step_00000012/shard_00000.bin"));
  // A step outside the run is refused.
  Result bad = run(launch(dir_ / "bad_skip", "", "--set train.skip_steps=[13]"));
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("train.skip_steps lists step 13, not one of 1..train.steps (12)"), std::string::npos)
      << bad.output;
}

// A loss far above the recent median is a numerics fault (exit 5) before the step is saved;
// without fault.spike_factor the same run trains on.
TEST_F(Restart, LossSpikeIsANumericsFault) {
  const std::string args = cat("train --config ", MYRIAD_SOURCE_DIR, "/configs/demo.toml --set model.layers=2",
                               " --set model.d_model=32 --set model.seq_len=16 --set train.steps=80",
                               " --set checkpoint.every=10 --set train.eval_every=0 --set data.train=", data_,
                               " --set data.valid= ");
  Result r = run(cat(args, "--run-dir ", (dir_ / "spike").string(), " --set fault.spike_factor=1.02"));
  EXPECT_EQ(r.code, 5) << r.output;
  const size_t at = r.output.find(" is above fault.spike_factor (1.02) x the median of the last ");
  ASSERT_NE(at, std::string::npos) << r.output;
  // Nothing of the spike's step was saved: the newest checkpoint comes before it.
  const int spike = std::stoi(r.output.substr(r.output.rfind("step ", at) + 5));
  int newest = 0;
  for (const auto& e : fs::directory_iterator(dir_ / "spike/checkpoints"))
    if (e.path().filename().string().rfind("step_", 0) == 0)  // not the run's lock file
      newest = std::max(newest, std::stoi(e.path().filename().string().substr(5)));
  EXPECT_LT(newest, spike);
  EXPECT_EQ(run(cat(args, "--run-dir ", (dir_ / "no_spike_check").string())).code, 0);
}


// A straggler (from step 3 rank 1's steps take 4 times their own time and at least 200 ms more,
// on a loaded machine too) is reported by the launcher within 20
// steps, as a diagnose event naming it, while the run trains on to its end; 1,000 clean steps
// of a tiny model raise no such report.
TEST_F(Restart, StragglerIsReportedAndCleanRunsRaiseNoAlarm) {
  const fs::path rd = dir_ / "straggler";
  Result r = run(launch(rd, "--max-restarts 1", "--set train.steps=30"), "MYRIAD_INJECT_FAULT=step:3:slow:x4:200@rank=1");
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<nlohmann::json> ev = jsonl(rd / "driver/events.jsonl");
  ASSERT_EQ(ev.size(), 1u) << r.output;
  EXPECT_EQ(ev[0]["event"], "diagnose");
  EXPECT_EQ(ev[0]["rank"], 1);
  const std::string detail = ev[0]["detail"];
  ASSERT_EQ(detail.rfind("straggler: rank 1's steps take ", 0), 0u) << detail;
  EXPECT_LE(std::stoi(detail.substr(detail.rfind("up to step ") + 11)), 23) << detail;
  const fs::path clean = dir_ / "clean_1000";
  Result c = run(launch(clean, "--max-restarts 1",
                        "--set train.steps=1000 --set model.layers=1 --set model.d_model=16 --set model.seq_len=8 "
                        "--set checkpoint.every=0 --set train.log_every=100"));
  ASSERT_EQ(c.code, 0) << c.output;
  EXPECT_FALSE(fs::exists(clean / "driver/events.jsonl")) << read_file(clean / "driver/events.jsonl");
}

}  // namespace
