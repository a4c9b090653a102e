// Hardening II (the lead's part): one run per directory, a checkpoint's architecture and tokenizer
// checked before its weights are used, one job per Redis job name, and preemption (SIGTERM: save,
// then exit 6, resumable bit for bit). Every case runs real `myriad` processes, real signals and a
// real redis-server, as a user or a batch system would.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "comm/local_redis.h"
#include "test_util.h"

namespace fs = std::filesystem;
using myriad::cat;
using myriad::test::jsonl;
using myriad::test::Proc;
using myriad::test::read_file;
using myriad::test::Result;
using myriad::test::expect_input_error;
using myriad::test::run_myriad;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string last_line(std::string s) {
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s.substr(s.rfind('\n') == std::string::npos ? 0 : s.rfind('\n') + 1);
}

// Waits until `path` holds `needle` (a process's output); false after `seconds`.
bool wait_for(const fs::path& path, const std::string& needle, double seconds = 60) {
  for (auto t0 = std::chrono::steady_clock::now(); std::chrono::steady_clock::now() - t0 < std::chrono::duration<double>(seconds);
       std::this_thread::sleep_for(std::chrono::milliseconds(20)))
    if (contains(read_file(path), needle)) return true;
  return false;
}

// The bytes of every file of a checkpoint directory but meta.json and COMMITTED (which name the
// run's own paths and times): the tensors, bit for bit.
std::map<std::string, std::string> shard_bytes(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("shard_", 0) == 0) out[e.path().filename().string()] = read_file(e.path());
  return out;
}

class HardeningII : public ::testing::Test {
 protected:
  static fs::path dir_;
  static std::string data_;
  static void SetUpTestSuite() { data_ = myriad::test::make_corpus_dir("myriad_hardening2", dir_); }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // A tiny model; `extra` adds flags.
  static std::string train(const fs::path& run_dir, const std::string& extra = "") {
    return cat("train --config ", MYRIAD_SOURCE_DIR, "/configs/demo.toml --run-dir ", run_dir.string(),
               " --set model.layers=2 --set model.d_model=32 --set model.heads=2 --set model.seq_len=16",
               " --set train.global_batch=8 --set train.micro_batch=4 --set train.eval_every=0 --set data.train=", data_,
               " --set data.valid= --set train.log_every=1 --set checkpoint.keep_last=0 ", extra);
  }
  static std::string launch(int n, const fs::path& run_dir, const std::string& extra, const std::string& flags = "") {
    return cat("launch --nproc-per-node ", n, " ", flags, " -- ", train(run_dir, extra));
  }
};
fs::path HardeningII::dir_;
std::string HardeningII::data_;

// Item 2: a second trainer on a run directory in use is refused (exit 2) naming the holder, and
// so is a second launch and a run sharing the first one's checkpoint.dir; once the holder is
// killed (SIGKILL: nothing cleans up), the kernel has released the lock and the next run starts.
TEST_F(HardeningII, ARunDirectoryHoldsOneRunAtATime) {
  const fs::path rd = dir_ / "locked", out = dir_ / "locked.out";
  {
    Proc first(train(rd, "--set train.steps=100000 --set checkpoint.every=0"), "MYRIAD_INJECT_FAULT=step:1:slow:20", out);
    ASSERT_TRUE(wait_for(out, "step 2/")) << first.output();
    const Result second = run_myriad(train(rd, "--set train.steps=5 --set train.seed=7"));
    expect_input_error(second, cat("run directory ", rd.string(), " is in use by another run (host "));
    EXPECT_TRUE(contains(last_line(second.output), cat("pid ", first.pid(), ", started "))) << second.output;
    EXPECT_TRUE(contains(last_line(second.output), ", myriad train)")) << second.output;
    expect_input_error(run_myriad(launch(2, rd, "--set train.steps=5")), "is in use by another run");
    // Another run directory, the same checkpoint.dir.
    expect_input_error(run_myriad(train(dir_ / "other", cat("--set train.steps=5 --set checkpoint.dir=", (rd / "checkpoints").string()))),
                       "checkpoint directory");
    first.kill(SIGKILL);
    EXPECT_EQ(first.wait(30), 128 + SIGKILL);
  }
  const Result next = run_myriad(train(rd, "--set train.steps=3"));
  EXPECT_EQ(next.code, 0) << next.output;
  EXPECT_EQ(jsonl(rd / "metrics.jsonl").back()["step"], 3);
}

// Item 2 under launch: node 0's launcher holds the lock across its workers' lives; its workers
// (which do not take it) train, and a trainer started by hand into the same directory is refused.
TEST_F(HardeningII, ALaunchHoldsItsRunDirectory) {
  const fs::path rd = dir_ / "launch_locked", out = dir_ / "launch_locked.out";
  Proc first(launch(2, rd, "--set train.steps=100000 --set checkpoint.every=0"), "MYRIAD_INJECT_FAULT=step:1:slow:20", out);
  ASSERT_TRUE(wait_for(out, "step 2/")) << first.output();
  expect_input_error(run_myriad(train(rd, "--set train.steps=5")), "is in use by another run");
  first.kill(SIGINT);
  EXPECT_NE(first.wait(60), -1);
}

// Item 3: equal shapes are not the same layout: a checkpoint of 2 heads gives no weights to a
// model of 4 heads of the same width (its QKV rows would be read in another order).
TEST_F(HardeningII, InitFromAnotherHeadCountIsRefused) {
  const fs::path two = dir_ / "heads2";
  ASSERT_EQ(run_myriad(train(two, "--set train.steps=1")).code, 0);
  expect_input_error(run_myriad(train(dir_ / "heads4", cat("--set train.steps=1 --set model.heads=4 --set checkpoint.init_from=", two.string()))),
                     "model.heads = 2 in the checkpoint but 4 in the config");
  // The same architecture still initializes.
  EXPECT_EQ(run_myriad(train(dir_ / "heads2b", cat("--set train.steps=1 --set checkpoint.init_from=", two.string()))).code, 0);
}

// Item 4: token ids mean nothing under another tokenizer, even where the vocabulary sizes agree.
TEST_F(HardeningII, ACheckpointOfAnotherTokenizerIsRefused) {
  const std::string gpt2_data = (dir_ / "gpt2corpus").string();
  ASSERT_EQ(run_myriad(cat("prepare --input /usr/share/games/fortunes/computers --tokenizer gpt2 --output ", gpt2_data,
                           " --doc-separator %")).code, 0);
  const fs::path byte = dir_ / "byte50304";
  ASSERT_EQ(run_myriad(train(byte, "--set train.steps=1 --set model.vocab_size=50304")).code, 0);
  const std::string gpt2 = cat("--set data.tokenizer=gpt2 --set model.vocab_size=50304 --set data.train=", gpt2_data);
  expect_input_error(run_myriad(train(byte, cat(gpt2, " --set train.steps=2 --resume auto"))),
                     "was trained on the byte tokenizer's ids but data.tokenizer = \"gpt2\"");
  expect_input_error(run_myriad(train(dir_ / "gpt2init", cat(gpt2, " --set train.steps=1 --set checkpoint.init_from=", byte.string()))),
                     "its token ids are the byte tokenizer's but data.tokenizer = \"gpt2\"");
}

// Item 9: a second launch under the job name of a live supervised job is refused before it claims
// an attempt, naming the live job's host and run directory; the job itself trains on untouched,
// and once it ended, the documented relaunch under the same name works.
TEST_F(HardeningII, ALiveJobNameIsNotTakenOver) {
  myriad::comm::LocalRedis redis;
  const std::string rdzv = cat("--max-restarts 2 --rdzv ", redis.url("shared"));
  const fs::path a = dir_ / "job_a", out = dir_ / "job_a.out";
  Proc first(launch(2, a, "--set train.steps=100000 --set checkpoint.every=0", rdzv), "MYRIAD_INJECT_FAULT=step:1:slow:20",
             out);
  ASSERT_TRUE(wait_for(out, "step 2/")) << first.output();
  const Result second = run_myriad(launch(2, dir_ / "job_b", "--set train.steps=5 --set train.seed=3", rdzv));
  expect_input_error(second, "launch: job shared is running: node 0's agent (host ");
  EXPECT_TRUE(contains(last_line(second.output), cat("run directory ", fs::absolute(a).string()))) << second.output;
  EXPECT_FALSE(fs::exists(dir_ / "job_b" / "metrics.jsonl"));
  // A launch without --max-restarts is refused as well.
  const Result third = run_myriad(launch(2, dir_ / "job_b", "--set train.steps=5", cat("--rdzv ", redis.url("shared"))));
  expect_input_error(third, "launch: job shared is running");
  // The live job trained on untouched: its keys were not dropped, it stops only when told.
  EXPECT_TRUE(wait_for(out, "step 20/")) << first.output();
  EXPECT_FALSE(contains(read_file(out), "dropped")) << first.output();
  first.kill(SIGINT);
  EXPECT_EQ(first.wait(60), 3) << first.output();
  const Result again = run_myriad(launch(2, dir_ / "job_b", "--set train.steps=5 --set train.seed=3", rdzv));
  EXPECT_EQ(again.code, 0) << again.output;
}

// Item 13: SIGTERM to a trainer: the step under way ends, is saved (not a checkpoint.every step),
// the process exits 6 (preempted); a duplicate of the signal before the save counts once, and
// --resume auto ends bit for bit where the unbroken run ends.
TEST_F(HardeningII, APreemptedTrainerSavesAndResumesBitwise) {
  const std::string steps = "--set train.steps=300 --set checkpoint.every=1000";
  const fs::path whole = dir_ / "unbroken", cut = dir_ / "preempted", out = dir_ / "preempted.out";
  ASSERT_EQ(run_myriad(train(whole, steps)).code, 0);
  Proc p(train(cut, steps), "MYRIAD_INJECT_FAULT=step:1:slow:20", out);
  ASSERT_TRUE(wait_for(out, "step 20/")) << p.output();
  p.kill(SIGTERM);
  p.kill(SIGTERM);  // a copy (Slurm, a launcher and `timeout` may each send one)
  EXPECT_EQ(p.wait(60), 6) << p.output();
  const std::vector<std::string> saved = myriad::checkpoint::committed_newest_first((cut / "checkpoints").string());
  ASSERT_EQ(saved.size(), 1u) << p.output();
  const int64_t at = myriad::checkpoint::read_meta(saved[0])["step"];
  EXPECT_GE(at, 20);
  EXPECT_LT(at, 300);
  EXPECT_TRUE(contains(p.output(), cat("preempted: step ", at, " of 300 is saved"))) << p.output();
  const Result rest = run_myriad(train(cut, cat(steps, " --resume auto")));
  ASSERT_EQ(rest.code, 0) << rest.output;
  EXPECT_TRUE(contains(rest.output, cat("(step ", at, ", "))) << rest.output;
  EXPECT_EQ(shard_bytes(whole / "checkpoints/step_00000300"), shard_bytes(cut / "checkpoints/step_00000300"));
}

// Item 13: a further signal once the preemption's save has started ends the process at once (the
// save is slow here), and so does the grace period running out; neither touches the committed
// checkpoint.
TEST_F(HardeningII, ASecondSignalOrTheGraceEndsASlowSaveAtOnce) {
  const fs::path rd = dir_ / "slowsave";
  ASSERT_EQ(run_myriad(train(rd, "--set train.steps=10")).code, 0);  // step 10, committed
  const std::string more = "--set train.steps=100000 --set checkpoint.every=0 --resume auto";
  for (const bool grace : {false, true}) {
    const fs::path out = dir_ / cat("slowsave", grace, ".out");
    Proc p(train(rd, cat(more, grace ? " --set fault.preempt_grace_s=1" : "")),
           "MYRIAD_INJECT_FAULT=step:1:slow:20,checkpoint_write:pause:20000", out);
    ASSERT_TRUE(wait_for(out, "step 15/")) << p.output();
    p.kill(SIGTERM);
    ASSERT_TRUE(wait_for(out, "preempted: saving step", 30)) << p.output();  // the save has started, and pauses
    const auto t0 = std::chrono::steady_clock::now();
    if (!grace) p.kill(SIGTERM);
    EXPECT_EQ(p.wait(30), 6) << p.output();
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 15) << p.output();
    EXPECT_TRUE(contains(p.output(), grace ? "fault.preempt_grace_s ran out" : "signalled again while saving")) << p.output();
    EXPECT_EQ(myriad::checkpoint::latest((rd / "checkpoints").string()), (rd / "checkpoints/step_00000010").string());
    EXPECT_EQ(run_myriad(cat("verify ", (rd / "checkpoints/step_00000010").string())).code, 0);
  }
}

// The pid of the worker of rank `rank` training into `run_dir` (0 when none).
pid_t worker_pid(const fs::path& run_dir, int rank) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = read_file(e.path() / "cmdline"), env = read_file(e.path() / "environ");
    for (char& c : cmd) c = c == '\0' ? ' ' : c;
    env = std::string(1, '\0') + env;
    if (contains(cmd, cat(" train ")) && contains(cmd, cat("--run-dir ", run_dir.string(), " ")) &&
        contains(env, cat(std::string(1, '\0'), "MYRIAD_RANK=", rank, std::string(1, '\0'))))
      return static_cast<pid_t>(std::stol(name));
  }
  return 0;
}

// Item 13, one rank signalled (the batch system's signal reached one process): the request rides
// the step's gradient-norm reduction, so both ranks stop after the same step and save it
// together; the launch sees workers exit preempted, not failing, and neither restarts nor
// stops them early.
TEST_F(HardeningII, ASignalToOneRankStopsEveryRankAtTheSameStep) {
  const fs::path rd = dir_ / "one_rank", out = dir_ / "one_rank.out";
  Proc p(launch(2, rd, "--set train.steps=100000 --set checkpoint.every=0 --set parallel.dp=2", "--max-restarts 3"),
         "MYRIAD_INJECT_FAULT=step:1:slow:20", out);
  ASSERT_TRUE(wait_for(out, "step 20/")) << p.output();
  const pid_t rank1 = worker_pid(rd, 1);
  ASSERT_GT(rank1, 0) << p.output();
  ::kill(rank1, SIGTERM);
  EXPECT_EQ(p.wait(60), 6) << p.output();
  const std::vector<std::string> saved = myriad::checkpoint::committed_newest_first((rd / "checkpoints").string());
  ASSERT_EQ(saved.size(), 1u) << p.output();
  EXPECT_GT(myriad::checkpoint::verify(saved[0]), 0);  // whole: both ranks' parts, every checksum
  const std::string log = read_file(out);
  EXPECT_FALSE(contains(log, "restart 1 of")) << p.output();
  EXPECT_FALSE(contains(log, "stopping the other")) << p.output();
  EXPECT_TRUE(contains(log, "[rank 0] ") && contains(log, cat("preempted: step ", myriad::checkpoint::read_meta(saved[0])["step"].get<int64_t>())))
      << p.output();
}

// Item 13 through the launcher (dp 2, supervised): SIGTERM to the launch reaches both workers,
// which agree on the step, save it together and exit 6; the launch does not restart and exits 6;
// the relaunch with --resume auto ends bit for bit as the unbroken dp 2 run.
TEST_F(HardeningII, APreemptedLaunchSavesOnceAndDoesNotRestart) {
  const std::string steps = "--set train.steps=300 --set checkpoint.every=1000 --set parallel.dp=2";
  const fs::path whole = dir_ / "launch_unbroken", cut = dir_ / "launch_preempted", out = dir_ / "launch_preempted.out";
  ASSERT_EQ(run_myriad(launch(2, whole, steps)).code, 0);
  Proc p(launch(2, cut, steps, "--max-restarts 3"), "MYRIAD_INJECT_FAULT=step:1:slow:20", out);
  ASSERT_TRUE(wait_for(out, "step 20/")) << p.output();
  p.kill(SIGTERM);
  EXPECT_EQ(p.wait(60), 6) << p.output();
  const std::string log = read_file(out);
  EXPECT_TRUE(contains(log, "a preemption; passing SIGTERM on to 2 worker(s)")) << p.output();
  EXPECT_FALSE(contains(log, "restart 1 of")) << p.output();
  EXPECT_TRUE(contains(last_line(log), "myriad: launch: preempted")) << p.output();
  const std::vector<std::string> saved = myriad::checkpoint::committed_newest_first((cut / "checkpoints").string());
  ASSERT_EQ(saved.size(), 1u) << p.output();
  const Result rest = run_myriad(launch(2, cut, cat(steps, " --resume auto")));
  ASSERT_EQ(rest.code, 0) << rest.output;
  EXPECT_EQ(shard_bytes(whole / "checkpoints/step_00000300"), shard_bytes(cut / "checkpoints/step_00000300"));
}

}  // namespace
