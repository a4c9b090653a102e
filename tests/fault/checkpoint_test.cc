// Asynchronous checkpoints (checkpoint.async): the step takes a snapshot, a thread writes it.
// They must be the synchronous save's bytes, never cost a committed checkpoint when the process
// is killed while the thread writes, and give a save due while one is written its policy.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <chrono>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace fs = std::filesystem;
using myriad::cat;
using myriad::test::jsonl;
using myriad::test::Proc;
using myriad::test::read_file;
using myriad::test::Result;
using myriad::test::run_myriad;

namespace {

class AsyncCheckpoint : public ::testing::Test {
 protected:
  static fs::path dir_;
  static std::string data_;
  static void SetUpTestSuite() { data_ = myriad::test::make_corpus_dir("myriad_ckpt", dir_); }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // A small model, a save every `every` steps, every checkpoint kept.
  static std::string train(const fs::path& rd, int steps, int every, const std::string& extra = "") {
    return cat("train --config ", MYRIAD_SOURCE_DIR, "/configs/demo.toml --run-dir ", rd.string(),
               " --set model.layers=2 --set model.d_model=64 --set model.seq_len=32 --set train.global_batch=8",
               " --set train.micro_batch=4 --set train.eval_every=0 --set train.log_every=1 --set data.train=", data_,
               " --set data.valid= --set train.steps=", steps, " --set checkpoint.every=", every,
               " --set checkpoint.keep_last=0 ", extra);
  }
  static std::vector<fs::path> files(const fs::path& step_dir) {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(step_dir))
      if (e.path().filename().string().rfind("shard_", 0) == 0) out.push_back(e.path().filename());
    std::sort(out.begin(), out.end());
    return out;
  }
  // Every checkpoint of `a` and `b`: the same shard files, bit for bit, and the same index.
  static void expect_same_checkpoints(const fs::path& a, const fs::path& b, const std::vector<int>& steps) {
    for (int s : steps) {
      char name[32];
      std::snprintf(name, sizeof name, "step_%08d", s);
      const fs::path da = a / "checkpoints" / name, db = b / "checkpoints" / name;
      ASSERT_TRUE(fs::exists(da / "COMMITTED")) << da;
      ASSERT_TRUE(fs::exists(db / "COMMITTED")) << db;
      ASSERT_EQ(files(da), files(db)) << s;
      ASSERT_FALSE(files(da).empty());
      for (const fs::path& f : files(da)) EXPECT_EQ(read_file(da / f), read_file(db / f)) << da / f;
      const auto ma = nlohmann::json::parse(read_file(da / "meta.json")), mb = nlohmann::json::parse(read_file(db / "meta.json"));
      EXPECT_EQ(ma["tensors"], mb["tensors"]) << s;
      EXPECT_EQ(ma["data"], mb["data"]) << s;
      EXPECT_EQ(ma["optimizer"], mb["optimizer"]) << s;
    }
  }
  // Whole lines in a file another process appends to.
  static int jsonl_lines(const fs::path& p) {
    const std::string text = read_file(p);
    return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
  }
  static std::vector<double> losses(const fs::path& rd) {
    std::vector<double> out;
    for (const auto& m : jsonl(rd / "metrics.jsonl")) out.push_back(m["loss"].get<double>());
    return out;
  }
};
fs::path AsyncCheckpoint::dir_;
std::string AsyncCheckpoint::data_;

// One process, and four (tensor x data parallel, and pipeline x data parallel, where rank 0
// commits what the others' threads wrote): the background saves are the synchronous ones.
TEST_F(AsyncCheckpoint, WritesTheSynchronousSavesBytes) {
  const fs::path sync = dir_ / "sync", async = dir_ / "async";
  Result a = run_myriad(train(sync, 6, 2, "--set checkpoint.async=false"));
  ASSERT_EQ(a.code, 0) << a.output;
  Result b = run_myriad(train(async, 6, 2));
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_NE(b.output.find("in the background (its snapshot took the step "), std::string::npos) << b.output;
  expect_same_checkpoints(sync, async, {2, 4, 6});
  EXPECT_EQ(losses(sync), losses(async));
  // The stall is recorded on the save steps, and only there.
  for (const auto& m : jsonl(async / "metrics.jsonl"))
    EXPECT_EQ(m.contains("checkpoint_stall_ms"), m["step"].get<int>() % 2 == 0) << m.dump();

  for (const char* layout : {"--set parallel.tp=2 --set parallel.dp=2", "--set parallel.pp=2 --set parallel.dp=2"}) {
    const fs::path ls = dir_ / cat("sync_", layout[15]), la = dir_ / cat("async_", layout[15]);
    Result c = run_myriad(cat("launch --nproc-per-node 4 -- ", train(ls, 6, 2, cat(layout, " --set checkpoint.async=false"))));
    ASSERT_EQ(c.code, 0) << c.output;
    Result d = run_myriad(cat("launch --nproc-per-node 4 -- ", train(la, 6, 2, layout)));
    ASSERT_EQ(d.code, 0) << d.output;
    expect_same_checkpoints(ls, la, {2, 4, 6});
    EXPECT_EQ(losses(ls), losses(la));
  }
}

// One reader per data-parallel group (checkpoint.load = broadcast, the default) resumes exactly
// as every rank reading: tensor x data and pipeline x data parallel, 4 processes each.
TEST_F(AsyncCheckpoint, BroadcastLoadIsEveryRankReading) {
  for (const char* layout : {"--set parallel.tp=2 --set parallel.dp=2", "--set parallel.pp=2 --set parallel.dp=2"}) {
    const fs::path first = dir_ / cat("load_", layout[15]);
    Result a = run_myriad(cat("launch --nproc-per-node 4 -- ", train(first, 2, 2, layout)));
    ASSERT_EQ(a.code, 0) << a.output;
    std::map<std::string, fs::path> runs;
    for (const char* how : {"broadcast", "all"}) {
      runs[how] = dir_ / cat("load_", layout[15], "_", how);
      fs::copy(first, runs[how], fs::copy_options::recursive);
      Result r = run_myriad(cat("launch --nproc-per-node 4 -- ", train(runs[how], 4, 2, cat(layout, " --resume auto --set checkpoint.load=", how))));
      ASSERT_EQ(r.code, 0) << r.output;
      EXPECT_EQ(r.output.find("broadcast") != std::string::npos, std::string(how) == "broadcast") << r.output;
    }
    expect_same_checkpoints(runs["broadcast"], runs["all"], {4});
    EXPECT_EQ(losses(runs["broadcast"]), losses(runs["all"]));
  }
}

// A slow disk (each save's write paused 1 s halfway): a synchronous save stalls its step for the
// pause; an asynchronous one does not, and the next save (the last step's) waits for it.
TEST_F(AsyncCheckpoint, TheStepDoesNotWaitForTheWrite) {
  const std::string slow = "MYRIAD_INJECT_FAULT=checkpoint_write:pause:1000";
  auto stall = [](const fs::path& rd, int step) {
    for (const auto& m : jsonl(rd / "metrics.jsonl"))
      if (m["step"] == step) return m.value("checkpoint_stall_ms", -1.0);
    return -2.0;
  };
  const fs::path sync = dir_ / "slow_sync", async = dir_ / "slow_async";
  ASSERT_EQ(run_myriad(train(sync, 4, 3, "--set checkpoint.async=false"), slow).code, 0);
  ASSERT_EQ(run_myriad(train(async, 4, 3), slow).code, 0);
  EXPECT_GE(stall(sync, 3), 1000);
  EXPECT_LT(stall(async, 3), 1000);
  EXPECT_GE(stall(async, 4), 500);  // it waited for the rest of step 3's write (its own, at the end)
  expect_same_checkpoints(sync, async, {3, 4});
}

// checkpoint.async_policy = skip: a save due while the last one is written is skipped, with a
// warning, except the last step's.
TEST_F(AsyncCheckpoint, ASaveDueWhileOneIsWrittenIsSkippedUnderSkip) {
  const fs::path rd = dir_ / "skip";
  Result r = run_myriad(train(rd, 4, 1, "--set checkpoint.async_policy=skip"), "MYRIAD_INJECT_FAULT=checkpoint_write:pause:1500");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(rd / "checkpoints/step_00000001/COMMITTED"));
  EXPECT_FALSE(fs::exists(rd / "checkpoints/step_00000002"));
  EXPECT_NE(r.output.find("skipped the save of step 2: the last one is still being written"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(rd / "checkpoints/step_00000004/COMMITTED"));
  Result bad = run_myriad(train(dir_ / "bad", 4, 1, "--set checkpoint.async_policy=later"));
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("checkpoint.async_policy"), std::string::npos) << bad.output;
}

// A save that fails in the background (a full disk) fails the run at the next step's end, not
// at the next save: exit 3, the committed checkpoints untouched, no partial directory left.
TEST_F(AsyncCheckpoint, ASaveThatFailsInTheBackgroundFailsTheRunAtOnce) {
  const fs::path rd = dir_ / "fail";
  ASSERT_EQ(run_myriad(train(rd, 2, 2)).code, 0);
  Result r = run_myriad(train(rd, 12, 4, "--resume auto"), "MYRIAD_INJECT_FAULT=checkpoint_write:fail");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("checkpoint: the save failed: injected fault at checkpoint_write"), std::string::npos) << r.output;
  EXPECT_LT(jsonl(rd / "metrics.jsonl").back()["step"].get<int>(), 8) << "it trained on to the next save";
  EXPECT_TRUE(fs::exists(rd / "checkpoints/step_00000002/COMMITTED"));
  for (const auto& e : fs::directory_iterator(rd / "checkpoints"))
    EXPECT_FALSE(e.path().filename().string().ends_with(".partial")) << e.path();
}

// 20 kills at random moments of a run that saves every step, each save's write slowed so that
// most kills land while one is written: the resume always finds a committed checkpoint, and the
// run ends with the weights and losses of the run that was never killed.
TEST_F(AsyncCheckpoint, AKillWhileASaveIsWrittenLosesNoCommittedCheckpoint) {
  const int steps = 12;
  const fs::path ref = dir_ / "kill_ref";
  ASSERT_EQ(run_myriad(train(ref, steps, 1, "--set checkpoint.async=false")).code, 0);
  const std::vector<double> want = losses(ref);
  std::mt19937 rng(1234);
  int in_stage2 = 0;
  for (int trial = 0; trial < 20; ++trial) {
    const fs::path rd = dir_ / cat("kill_", trial);
    {
      Proc p(train(rd, steps, 1), "MYRIAD_INJECT_FAULT=checkpoint_write:pause:80", dir_ / cat("kill_", trial, ".txt"));
      // Some steps in, then a random moment.
      const int after = std::uniform_int_distribution<int>(1, steps - 3)(rng);
      for (auto t0 = std::chrono::steady_clock::now();
           jsonl_lines(rd / "metrics.jsonl") < after && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60);)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 100)(rng)));
      p.kill(SIGKILL);
      ASSERT_EQ(p.wait(), 128 + SIGKILL) << p.output();
    }
    for (const auto& e : fs::directory_iterator(rd / "checkpoints"))
      in_stage2 += e.path().filename().string().ends_with(".partial");
    Result r = run_myriad(train(rd, steps, 1, "--resume auto"));
    ASSERT_EQ(r.code, 0) << r.output;
    expect_same_checkpoints(ref, rd, {steps});
    // Each step's loss, the ones trained again after the resume included, is the reference's.
    for (const auto& m : jsonl(rd / "metrics.jsonl"))
      EXPECT_EQ(m["loss"].get<double>(), want[m["step"].get<int>() - 1]) << trial << ": " << m.dump();
  }
  std::printf("%d of 20 kills landed while a save was written\n", in_stage2);
  EXPECT_GE(in_stage2, 5) << "too few kills landed while a save was written";
}

}  // namespace
