// The trainer tried as a hostile but realistic user would (issue: hardening): a batch that does
// not split, relaunches under one Redis job, a store that is not there, unusable directories,
// damaged checkpoints, a vocabulary smaller than the tokenizer's, runs that have nothing left to
// do, sampling flags, shared memory left by killed workers, and models that cannot fit. Each case
// runs the `myriad` binary as a user would and checks its exit code and one-line message.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "comm/local_redis.h"
#include "core/error.h"
#include "test_util.h"
#include "runtime/engine.h"

namespace fs = std::filesystem;
using myriad::cat;

namespace {

using myriad::test::Result;
using myriad::test::expect_input_error;
using myriad::test::last_line;
using myriad::test::read_file;
Result run(const std::string& args, const std::string& env = "") { return myriad::test::run_myriad(args, env); }


bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }



void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

// A loopback port nothing listens on (bound, then released).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

class Hardening : public ::testing::Test {
 protected:
  static fs::path dir_;
  static std::string data_;

  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / cat("myriad_hardening_", getpid());
    fs::create_directories(dir_);
    data_ = (dir_ / "corpus").string();
    Result r = run(cat("prepare --input /usr/share/games/fortunes/computers --tokenizer byte --output ",
                       data_, " --valid-fraction 0.1 --doc-separator %"));
    ASSERT_EQ(r.code, 0) << r.output;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // A tiny model on the corpus; `extra` adds flags.
  static std::string train(const fs::path& run_dir, const std::string& extra) {
    return cat("train --config ", MYRIAD_SOURCE_DIR, "/configs/demo.toml --run-dir ", run_dir.string(),
               " --set model.layers=2 --set model.d_model=32 --set model.heads=2 --set model.seq_len=16",
               " --set train.global_batch=8 --set train.micro_batch=4 --set train.eval_every=0",
               " --set data.train=", data_, "_train --set data.valid=", data_, "_valid ", extra);
  }
  static std::string launch(int n, const fs::path& run_dir, const std::string& extra,
                            const std::string& launch_flags = "") {
    return cat("launch --nproc-per-node ", n, " ", launch_flags, " -- ", train(run_dir, extra));
  }
};
fs::path Hardening::dir_;
std::string Hardening::data_;

// 1. global_batch must split into micro_batch x dp pieces, and interleaved 1F1B needs a multiple
// of pp micro-batches: otherwise the run is refused, naming the keys and the nearest valid value.
TEST_F(Hardening, BatchThatDoesNotSplitIsRefused) {
  const fs::path rd = dir_ / "batch";
  Result dp = run(launch(2, rd, "--set parallel.dp=2 --set train.global_batch=12 --set train.micro_batch=4"));
  EXPECT_EQ(dp.code, 2) << dp.output;
  EXPECT_TRUE(contains(dp.output, "train.global_batch (12) must be a multiple of train.micro_batch (4) "
                                  "x parallel.dp (2) = 8; use train.global_batch = 8 or 16"))
      << dp.output;
  EXPECT_FALSE(contains(dp.output, "step 1/")) << dp.output;
  // dp taken from the world size (parallel.dp = 0), found before any rendezvous.
  Result world = run(launch(2, rd, "--set train.global_batch=6 --set train.micro_batch=2"));
  EXPECT_EQ(world.code, 2) << world.output;
  EXPECT_TRUE(contains(world.output, "x parallel.dp (2) = 4; use train.global_batch = 4 or 8")) << world.output;
  // Fewer sequences than one micro-batch per rank: the keys, not the "pipeline schedule".
  Result zero = run(launch(2, rd, "--set train.global_batch=4 --set train.micro_batch=4"));
  EXPECT_EQ(zero.code, 2) << zero.output;
  EXPECT_TRUE(contains(zero.output, "use train.global_batch = 8\n")) << zero.output;
  // Interleaved 1F1B over pp 2: 3 micro-batches do not divide over 2 stages.
  Result inter = run(launch(2, rd, "--set parallel.pp=2 --set parallel.virtual_stages=2 "
                                   "--set model.layers=4 --set train.global_batch=12"));
  EXPECT_EQ(inter.code, 2) << inter.output;
  EXPECT_TRUE(contains(inter.output, "x parallel.pp (2, for the interleaved schedule) = 8")) << inter.output;
  // One process; the value came from --set, and the message says so.
  expect_input_error(run(train(rd, "--set train.global_batch=6")),
                     "--set train.global_batch=6: train.global_batch (6) must be a multiple of "
                     "train.micro_batch (4) = 4; use train.global_batch = 4 or 8");
}

// 2. Each launch under one Redis job name is an attempt of its own: a relaunch after success, and
// the retry after a failure, both start; the older attempts' keys are dropped.
TEST_F(Hardening, RelaunchUnderTheSameRedisJob) {
  myriad::comm::LocalRedis redis;
  const std::string url = redis.url("relaunch");
  const fs::path rd = dir_ / "relaunch";
  const std::string flags = cat("--rdzv ", url);
  Result first = run(cat("launch --nproc-per-node 2 ", flags, " -- comm-check --run-dir ", rd.string()));
  ASSERT_EQ(first.code, 0) << first.output;
  EXPECT_TRUE(contains(first.output, "attempt 0,")) << first.output;
  Result again = run(cat("launch --nproc-per-node 2 ", flags, " -- comm-check --run-dir ", rd.string()));
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_TRUE(contains(again.output, "attempt 1,")) << again.output;
  EXPECT_TRUE(contains(again.output, "store entries of the job's earlier attempts")) << again.output;
  Result failed = run(cat("launch --nproc-per-node 2 ", flags, " -- comm-check --run-dir ", rd.string()),
                      "MYRIAD_INJECT_FAULT=comm_check:fail@rank=1@attempt=2");
  EXPECT_EQ(failed.code, 3) << failed.output;
  // The retry that exit 3 asks for, now a training run.
  Result retry = run(launch(2, dir_ / "relaunch_train", "--set train.steps=2", flags));
  EXPECT_EQ(retry.code, 0) << retry.output;
  EXPECT_TRUE(contains(retry.output, "attempt 3,")) << retry.output;
}

// 3. No server at the store's address: refused connections fail within seconds, naming it.
TEST_F(Hardening, NoRedisServerFailsFast) {
  const std::string url = cat("redis://127.0.0.1:", free_port(), "/nobody");
  Result r = run(cat("launch --nproc-per-node 2 --rdzv ", url, " -- comm-check --run-dir ",
                     (dir_ / "noredis").string()));
  EXPECT_EQ(r.code, 4) << r.output;
  EXPECT_TRUE(contains(last_line(r.output), url)) << r.output;
  EXPECT_TRUE(contains(last_line(r.output), "refused the connection")) << r.output;
  EXPECT_LT(r.seconds, 30) << "a refused connection must not be retried for comm.timeout_s";
  // A port that is not a number is refused before anything starts.
  expect_input_error(run("launch --nproc-per-node 1 --rdzv redis://127.0.0.1:abc/j -- comm-check"),
                     "bad port 'abc'");
}

// 4, 5. Directories the run cannot use are input errors found at start, before any step.
TEST_F(Hardening, UnusableDirectoriesAreFoundAtStart) {
  const fs::path file = dir_ / "a_file";
  write_file(file, "x");
  expect_input_error(run(train(file, "")), cat("run directory ", file.string()));
  expect_input_error(run(train(file / "sub", "")), "choose a writable --run-dir");
  Result ck = run(train(dir_ / "ckdir", cat("--set checkpoint.dir=", (file / "ck").string())));
  expect_input_error(ck, cat("checkpoint directory ", (file / "ck").string()));
  EXPECT_FALSE(contains(ck.output, "step 1/")) << ck.output;
}

// 5, 6. A committed checkpoint missing a shard, or whose meta.json was edited, is refused as an
// input error (a retry reads the same bytes) that says what to do.
TEST_F(Hardening, DamagedCheckpointsAreInputErrors) {
  const fs::path rd = dir_ / "damaged";
  ASSERT_EQ(run(train(rd, "--set train.steps=2")).code, 0);
  const fs::path ck = rd / "checkpoints/step_00000002";
  const std::string meta = read_file(ck / "meta.json");
  // The data position, 16 samples consumed, changed to 96: every trusted byte is checked.
  std::string edited = meta;
  const size_t at = edited.find("\"consumed\": 16");
  ASSERT_NE(at, std::string::npos) << meta;
  edited.replace(at, 14, "\"consumed\": 96");
  write_file(ck / "meta.json", edited);
  expect_input_error(run(train(rd, cat("--set train.steps=4 --resume ", ck.string()))),
                     "meta.json: checksum mismatch");
  write_file(ck / "meta.json", meta);
  fs::rename(ck / "shard_00000.bin", rd / "shard.bin");
  expect_input_error(run(train(rd, cat("--set train.steps=4 --resume ", ck.string()))),
                     "shard_00000.bin is missing");
  fs::rename(rd / "shard.bin", ck / "shard_00000.bin");
  // Another model: booleans read as booleans.
  expect_input_error(run(train(rd, cat("--set train.steps=4 --set model.bias=false --resume ", ck.string()))),
                     "model.bias = true in the checkpoint but false in the config");
  EXPECT_EQ(run(train(rd, cat("--set train.steps=4 --resume ", ck.string()))).code, 0);
}

// 7. --resume auto passes over a corrupt latest checkpoint to the newest good one.
TEST_F(Hardening, ResumeAutoFallsBackPastACorruptCheckpoint) {
  const fs::path rd = dir_ / "fallback", straight = dir_ / "fallback_straight";
  ASSERT_EQ(run(train(rd, "--set train.steps=4 --set checkpoint.every=2")).code, 0);
  const fs::path shard = rd / "checkpoints/step_00000004/shard_00000.bin";
  std::string bytes = read_file(shard);
  bytes[bytes.size() / 6] ^= 0x10;
  write_file(shard, bytes);
  Result r = run(train(rd, "--set train.steps=6 --set checkpoint.every=2 --resume auto"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, cat("passing over ", (rd / "checkpoints/step_00000004").string())))
      << r.output;
  EXPECT_TRUE(contains(r.output, cat("resume: ", (rd / "checkpoints/step_00000002").string(), " (step 2,")))
      << r.output;
  // Steps 3..6 retrained from step 2: the same weights as a run that never broke.
  ASSERT_EQ(run(train(straight, "--set train.steps=6 --set checkpoint.every=2")).code, 0);
  EXPECT_EQ(read_file(rd / "checkpoints/step_00000006/shard_00000.bin"),
            read_file(straight / "checkpoints/step_00000006/shard_00000.bin"));
  // When none is good, the run stops rather than start afresh over them.
  for (const char* step : {"step_00000002", "step_00000004", "step_00000006"}) {
    const fs::path s = rd / "checkpoints" / step / "shard_00000.bin";
    if (!fs::exists(s)) continue;
    std::string b = read_file(s);
    b[b.size() / 6] ^= 0x10;
    write_file(s, b);
  }
  expect_input_error(run(train(rd, "--set train.steps=8 --resume auto")), "loads (the newest: ");
}

// 8. A save that fails (a full disk) removes its partial directory at once.
TEST_F(Hardening, FailedSaveLeavesNoPartialBehind) {
  const fs::path rd = dir_ / "partial";
  ASSERT_EQ(run(train(rd, "--set train.steps=2")).code, 0);
  Result full = run(train(rd, "--set train.steps=4 --resume auto"), "MYRIAD_INJECT_FAULT=checkpoint_write:fail");
  EXPECT_EQ(full.code, 3) << full.output;
  for (const auto& e : fs::directory_iterator(rd / "checkpoints"))
    EXPECT_FALSE(contains(e.path().filename().string(), "partial")) << e.path();
  EXPECT_TRUE(fs::exists(rd / "checkpoints/step_00000002/COMMITTED"));
  // A killed save cannot clean up: the next start does, before it trains.
  Result killed = run(train(rd, "--set train.steps=4 --resume auto"), "MYRIAD_INJECT_FAULT=checkpoint_write:kill");
  EXPECT_EQ(killed.code, 128 + 9) << killed.output;
  auto partial = [&] {  // step_00000004.<the start's id>.partial
    for (const auto& e : fs::directory_iterator(rd / "checkpoints")) {
      const std::string n = e.path().filename().string();
      if (n.rfind("step_00000004.", 0) == 0 && n.ends_with(".partial")) return true;
    }
    return false;
  };
  EXPECT_TRUE(partial());
  Result next = run(train(rd, "--set train.steps=3 --resume auto"));
  EXPECT_EQ(next.code, 0) << next.output;
  EXPECT_TRUE(contains(next.output, ".partial, left by a save that did not finish")) << next.output;
  EXPECT_FALSE(partial());
}

// 9. The model's vocabulary must hold the tokenizer's (a larger one is fine).
TEST_F(Hardening, VocabularySmallerThanTheTokenizersIsRefused) {
  expect_input_error(run(train(dir_ / "vocab", "--set data.tokenizer=gpt2 --set model.vocab_size=256")),
                     "model.vocab_size (256) is below the gpt2 tokenizer's vocabulary (50257)");
  expect_input_error(run(train(dir_ / "vocab", "--set model.vocab_size=200")),
                     "set model.vocab_size to at least 256");
  EXPECT_EQ(run(train(dir_ / "vocab", "--set model.vocab_size=300 --set train.steps=1")).code, 0);
}

// 10. Resuming with train.steps below the checkpoint's step is an input error; equal to it, the
// run is complete and there is nothing to do.
TEST_F(Hardening, ResumePastTrainStepsIsAnInputError) {
  const fs::path rd = dir_ / "pastend";
  ASSERT_EQ(run(train(rd, "--set train.steps=4")).code, 0);
  expect_input_error(run(train(rd, "--set train.steps=2 --resume auto")),
                     "train.steps = 2 but the checkpoint resumed is at step 4");
  Result done = run(train(rd, "--set train.steps=4 --resume auto"));
  EXPECT_EQ(done.code, 0) << done.output;
  EXPECT_TRUE(contains(done.output, "the run is complete")) << done.output;
}

// 11. Sampling flags: no NaN temperature, a bounded token count.
TEST_F(Hardening, SampleFlagsAreChecked) {
  const fs::path rd = dir_ / "sample";
  ASSERT_EQ(run(train(rd, "--set train.steps=1")).code, 0);
  expect_input_error(run(cat("sample --checkpoint ", rd.string(), " --prompt a --temperature nan")),
                     "--temperature must be a finite number >= 0");
  expect_input_error(run(cat("sample --checkpoint ", rd.string(), " --prompt a --tokens 2147483648")),
                     "--tokens must be 0..1048576");
}

// 12. A tensor-parallel reader killed right after creating the node's batch segment: the
// launcher removes the segment its workers left.
TEST_F(Hardening, KilledWorkersLeaveNoSharedMemory) {
  const fs::path rd = dir_ / "shmleak";  // the default store: the job is named after it
  auto segments = [] {
    int n = 0;
    for (const auto& e : fs::directory_iterator("/dev/shm"))
      n += e.path().filename().string().rfind("myriad-shmleak-", 0) == 0;
    return n;
  };
  Result r = run(launch(2, rd, "--set parallel.tp=2 --set train.steps=2"),
                 "MYRIAD_INJECT_FAULT=shared_batch_created:kill");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_TRUE(contains(r.output, "removed 1 shared-memory segment")) << r.output;
  EXPECT_EQ(segments(), 0);
}

// 13. A model that cannot fit is an input error that names its size, not a retryable fault.
TEST_F(Hardening, ModelThatCannotFitIsAnInputError) {
  Result r = run(cat("train --config ", MYRIAD_SOURCE_DIR, "/configs/gpt-175b.toml --run-dir ",
                     (dir_ / "huge").string(), " --set train.device=cpu --set data.tokenizer=byte",
                     " --set model.seq_len=64 --set data.train=", data_, "_train --set data.valid="));
  expect_input_error(r, "out of host memory while allocating the model: ");
  EXPECT_TRUE(contains(last_line(r.output), "GiB per rank")) << r.output;
}

}  // namespace

namespace {

// 14. A stuck worker (its training thread stalled, its heartbeat alive: a stopped process would
// be found by its heartbeat first): the others' collective times out, naming the rank it waited
// on (the one that exit 4 tells the supervisor to leave out).
TEST_F(Hardening, TimeoutNamesTheRankThatNeverArrived) {
  Result r = run(launch(2, dir_ / "stopped", "--set train.steps=50 --set comm.timeout_s=3", "--grace-period 1"),
                 "MYRIAD_INJECT_FAULT=step:2:stall@rank=1");
  EXPECT_EQ(r.code, 4) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 0] myriad: communication fault: ")) << r.output;
  EXPECT_TRUE(contains(r.output, "waiting on global rank 1 (group rank 1), which did not take part in time"))
      << r.output;
}

}  // namespace

namespace {

// The communication backend follows the engine's device: NCCL moves GPU memory only, so asking
// for it on the CPU engine is refused before any rendezvous, and so is a GPU run whose node has
// no GPU. (On a GPU machine, NCCL with two ranks sharing a GPU is refused naming both: test_gpu
// cannot launch; scripts/gpu_session.sh checks it.)
TEST_F(Hardening, BackendFollowsTheDevice) {
  Result cpu = run(launch(2, dir_ / "backend", "--set train.device=cpu --set comm.backend=nccl"));
  EXPECT_EQ(cpu.code, 2) << cpu.output;
  EXPECT_TRUE(contains(cpu.output, "comm.backend = \"nccl\" moves GPU memory, but train.device = \"cpu\""))
      << cpu.output;
  // auto on the CPU engine: Gloo, on a GPU machine as here.
  Result ok = run(launch(2, dir_ / "backend", "--set train.device=cpu --set train.steps=2"));
  EXPECT_EQ(ok.code, 0) << ok.output;
  if (!myriad::cuda_available()) {  // CI: no GPU
    Result none = run(launch(2, dir_ / "backend", "--set train.device=cuda"));
    EXPECT_EQ(none.code, 2) << none.output;
    EXPECT_TRUE(contains(none.output, "no GPU is visible")) << none.output;
  }
}

}  // namespace

namespace {

// 14. The store lost while the workers train: they no longer need it, so the run goes on, but
// the launcher says so (a restart or a late rendezvous would fail).
TEST_F(Hardening, LostStoreMidRunIsReported) {
  myriad::comm::LocalRedis redis;
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    redis.kill();
  });
  // 20 ms a step from step 1 on: the run lasts 8 s or more however fast the machine is.
  Result r = run(launch(2, dir_ / "lostredis",
                        "--set train.steps=400 --set model.d_model=64 --set model.seq_len=64 --set train.log_every=100",
                        cat("--rdzv ", redis.url("lostredis"))),
                 "MYRIAD_INJECT_FAULT=step:1:slow:20");
  killer.join();
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "does not answer")) << r.output;
  EXPECT_GT(r.seconds, 7) << "the run must outlast a check after the store went away";
}

}  // namespace
