// The fault-tolerant driver on simulated nodes: two node agents (`myriad launch --nnodes 2
// --node-rank R --max-restarts N`) of two workers each on this machine, meeting through a real
// redis-server on loopback, and a spare agent (`--spare`) where a test needs one. Each fault is
// injected into one node; the job must finish every step by itself, with the final weights of
// the run that never broke, bit for bit, and the events naming the right node, rank and class.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/local_redis.h"
#include "core/error.h"
#include "driver/job_board.h"
#include "test_util.h"

namespace fs = std::filesystem;
using myriad::cat;

namespace {

using myriad::test::Proc;
using myriad::test::jsonl;
using myriad::test::read_file;

class Nodes : public ::testing::Test {
 protected:
  static fs::path dir_;
  static std::string data_;
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / cat("myriad_nodes_", getpid());
    fs::create_directories(dir_);
    data_ = (dir_ / "corpus").string();
    Proc p(cat("prepare --input /usr/share/games/fortunes/computers --tokenizer byte --output ", data_,
               " --doc-separator %"), "", dir_ / "prepare.txt");
    ASSERT_EQ(p.wait(), 0) << p.output();
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // The worker command: 4 ranks in `layout`, 12 steps, a checkpoint every 4.
  static std::string train(const fs::path& rd, const std::string& layout, const std::string& extra) {
    return cat("train --config ", MYRIAD_SOURCE_DIR, "/configs/demo.toml --run-dir ", rd.string(),
               " --set model.layers=2 --set model.d_model=32 --set model.seq_len=16",
               " --set train.steps=12 --set checkpoint.every=4 --set checkpoint.keep_last=0 --set train.log_every=1",
               " --set train.eval_every=0 --set data.train=", data_, " --set data.valid= --set fault.heartbeat_s=0.5 ",
               layout, " ", extra);
  }
  // Node `node`'s agent (or a spare's, node < 0) of job `job` on `redis`.
  static std::unique_ptr<Proc> agent(const myriad::comm::LocalRedis& redis, const std::string& job, int node,
                                     const fs::path& rd, const std::string& layout, const std::string& extra = "",
                                     const std::string& env = "", int restarts = 2) {
    // Each a machine of its own name, as the block list tells machines apart by it.
    const std::string who = node < 0 ? "--spare --node-name spare" : cat("--node-rank ", node, " --node-name node", node);
    return std::make_unique<Proc>(cat("launch --nnodes 2 ", who, " --nproc-per-node 2 --max-restarts ", restarts,
                                      " --rdzv ", redis.url(job), " -- ", train(rd, layout, extra)),
                                  env, dir_ / cat(job, "_", node < 0 ? std::string("spare") : std::to_string(node), ".txt"));
  }
  // The fault-free run of a layout (and extra flags), once.
  static fs::path straight(const myriad::comm::LocalRedis& redis, const std::string& layout,
                           const std::string& extra = "") {
    static std::map<std::string, fs::path> done;
    const std::string key = layout + " " + extra;
    if (done.count(key)) return done[key];
    const std::string job = cat("straight", done.size());
    const fs::path rd = dir_ / job;
    auto a = agent(redis, job, 0, rd, layout, extra), b = agent(redis, job, 1, rd, layout, extra);
    EXPECT_EQ(a->wait(), 0) << a->output();
    EXPECT_EQ(b->wait(), 0) << b->output();
    return done[key] = rd;
  }
  static void expect_same_weights(const fs::path& rd, const fs::path& ref, int step = 12) {
    for (int r = 0; r < 4; ++r) {
      const std::string shard = cat("checkpoints/step_000000", step < 10 ? "0" : "", step, "/shard_0000", r, ".bin");
      if (!fs::exists(ref / shard)) continue;
      EXPECT_EQ(read_file(rd / shard), read_file(ref / shard)) << shard;
    }
  }
};
fs::path Nodes::dir_;
std::string Nodes::data_;

const char* kDpTp = "--set parallel.dp=2 --set parallel.tp=2";
const char* kPpDp = "--set parallel.pp=2 --set parallel.dp=2";

struct Case {
  const char* name;
  const char* layout;
  const char* fault;  // injected into node 1's ranks
  const char* cls;
  int rank;           // the rank the events must name (a stall's: the one its peers wait for)
  int node = 1;       // the node the events must name
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class NodeFaults : public Nodes, public ::testing::WithParamInterface<Case> {};

// A fault on node 1 stops node 0's workers too (through the job's store, not a collective's
// timeout: comm.timeout_s is 300 s); both nodes check themselves, pass, and restart in place
// from the step-4 checkpoint; the job ends with the weights of the run that never broke.
TEST_P(NodeFaults, TheJobRestartsEveryNodeAndEndsAsTheRunThatNeverBroke) {
  const Case& c = GetParam();
  myriad::comm::LocalRedis redis;
  const fs::path ref = straight(redis, c.layout);
  const std::string job = cat("fault_", c.name);
  const fs::path rd = dir_ / job;
  // A stall is found after fault.step_timeout_s; a frozen rank sooner, from its heartbeat (4 s).
  const std::string extra = "--set comm.timeout_s=300 --set fault.step_timeout_s=8 --set fault.sdc_check_every=1";
  const auto t0 = std::chrono::steady_clock::now();
  auto a = agent(redis, job, 0, rd, c.layout, extra), b = agent(redis, job, 1, rd, c.layout, extra,
                                                               cat("MYRIAD_INJECT_FAULT=", c.fault));
  ASSERT_EQ(a->wait(), 0) << a->output();
  ASSERT_EQ(b->wait(), 0) << b->output();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 90);
  expect_same_weights(rd, ref);
  // Node 0's record names node 1's fault.
  std::vector<nlohmann::json> ev = jsonl(rd / "driver/events.jsonl");
  ASSERT_GE(ev.size(), 5u) << a->output();
  EXPECT_EQ(ev[0]["event"], "fault");
  EXPECT_EQ(ev[0]["node"], c.node) << ev[0].dump();
  EXPECT_EQ(ev[0]["class"], c.cls) << ev[0].dump();
  EXPECT_EQ(ev[0]["rank"], c.rank) << ev[0].dump();
  EXPECT_EQ(ev[1]["event"], "stop");
  EXPECT_EQ(ev[2]["event"], "diagnose");
  size_t restart = 3;
  while (restart < ev.size() && ev[restart]["event"] == "diagnose") ++restart;
  ASSERT_LT(restart, ev.size()) << a->output();
  EXPECT_EQ(ev[restart]["event"], "restart");
  EXPECT_EQ(ev.back()["event"], "resumed");
  // A hang across nodes: node 0's agent gathers every rank's flight record (or, for a stopped
  // rank, its last heartbeat) through the store and writes the job's hang report.
  const std::string name = c.name;
  if (name.rfind("hang", 0) == 0 || name.rfind("stall", 0) == 0) {
    std::ifstream in(rd / "hang_report.json");
    const nlohmann::json report = nlohmann::json::parse(in, nullptr, false);
    ASSERT_TRUE(report.is_object()) << a->output();
    EXPECT_EQ(report["culprits"], nlohmann::json::array({c.rank})) << report.dump(2);
    bool said = false;
    for (const auto& e : ev)
      said |= e["event"] == "diagnose" && e["detail"].get<std::string>().rfind(cat("hang report: rank ", c.rank, " ("), 0) == 0;
    EXPECT_TRUE(said) << a->output();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Faults, NodeFaults,
    ::testing::Values(Case{"kill", kDpTp, "step:6:kill@rank=2", "runtime fault", 2},
                      Case{"hang", kDpTp, "step:6:hang@rank=3", "runtime fault", 3},
                      Case{"stall", kDpTp, "step:6:stall@rank=3", "runtime fault", 3},
                      Case{"nan", kDpTp, "step:6:nan@rank=2", "numerics fault", 2},
                      Case{"throw", kDpTp, "step:6:throw@rank=3", "runtime fault", 3},
                      Case{"flip", kDpTp, "step:6:flip@rank=2", "runtime fault", 2},
                      Case{"kill_pp", kPpDp, "step:6:kill@rank=3", "runtime fault", 3},
                      Case{"hang_pp", kPpDp, "step:6:hang@rank=2", "runtime fault", 2},
                      Case{"stall_pp", kPpDp, "step:6:stall@rank=3", "runtime fault", 3},
                      Case{"nan_pp", kPpDp, "step:6:nan@rank=2", "numerics fault", 2},
                      Case{"throw_pp", kPpDp, "step:6:throw@rank=3", "runtime fault", 3},
                      Case{"flip_pp", kPpDp, "step:6:flip@rank=2", "runtime fault", 2}),
    [](const auto& info) { return std::string(info.param.name); });

// Node 1 fails its self-check after a fault: it is evicted (its agent runs fault.evict_command,
// puts its host on the job's block list and exits 3), and the spare takes node 1's place; the
// job ends as the run that never broke.
TEST_F(Nodes, AFailedSelfCheckEvictsTheNodeAndASpareTakesItsPlace) {
  myriad::comm::LocalRedis redis;
  const fs::path ref = straight(redis, kDpTp);
  const fs::path rd = dir_ / "evict", marker = dir_ / "evicted_1";
  const std::string extra = cat("--set fault.evict_command='touch ", (dir_ / "evicted_").string(), "{node}'");
  auto spare = agent(redis, "evict", -1, rd, kDpTp, extra);
  auto a = agent(redis, "evict", 0, rd, kDpTp, extra),
       b = agent(redis, "evict", 1, rd, kDpTp, extra, "MYRIAD_INJECT_FAULT=step:6:kill@rank=2,diag:fail@node=1");
  ASSERT_EQ(b->wait(), 3) << b->output();
  EXPECT_NE(b->output().find("node 1 ("), std::string::npos) << b->output();
  EXPECT_NE(b->output().find("evicted: its self-check failed: "), std::string::npos) << b->output();
  EXPECT_TRUE(fs::exists(marker)) << "the evict command ran";
  ASSERT_EQ(a->wait(), 0) << a->output();
  ASSERT_EQ(spare->wait(), 0) << spare->output();
  EXPECT_NE(spare->output().find("takes over node 1"), std::string::npos) << spare->output();
  expect_same_weights(rd, ref);
  bool evicted = false;
  for (const auto& e : jsonl(rd / "driver/events.jsonl"))
    if (e["event"] == "evict" && e["node"] == 1) evicted = true;
  EXPECT_TRUE(evicted);
  // The evicted machine is on the job's block list: it may not join the job again.
  auto back = agent(redis, "evict", 1, rd, kDpTp, extra);
  EXPECT_EQ(back->wait(), 2) << back->output();
  EXPECT_NE(back->output().find("'node1' is on job evict's block list (node 1 (node1) evicted: its self-check failed"),
            std::string::npos) << back->output();
}

// Each agent's heartbeat in the job's store says who it is (host, node, pid, attempt) and what
// each of its workers is doing: rank, pid, running, step, phase, step time and tokens/s, and the
// last operation of each of its groups.
TEST_F(Nodes, AnAgentsHeartbeatCarriesItsNodeAndItsWorkers) {
  myriad::comm::LocalRedis redis;
  const fs::path rd = dir_ / "beats";
  auto a = agent(redis, "beats", 0, rd, kDpTp, "", "MYRIAD_INJECT_FAULT=step:1:slow:400"),
       b = agent(redis, "beats", 1, rd, kDpTp, "", "MYRIAD_INJECT_FAULT=step:1:slow:400");
  myriad::driver::JobBoard board(redis.url("beats"), 10);
  nlohmann::json seen;
  for (int i = 0; i < 200 && seen.is_null(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const std::optional<nlohmann::json> hb = board.heartbeat("node1");
    if (!hb || !hb->contains("workers") || (*hb)["workers"].size() != 2) continue;
    bool stepped = true;
    for (const auto& w : (*hb)["workers"]) stepped = stepped && w.value("step", -1) >= 2 && w.contains("pid");
    if (stepped) seen = *hb;
  }
  ASSERT_FALSE(seen.is_null()) << a->output() << b->output();
  EXPECT_EQ(seen["node"], 1) << seen.dump();
  EXPECT_TRUE(seen.contains("host") && seen.contains("pid") && seen.contains("attempt")) << seen.dump();
  for (const auto& w : seen["workers"]) {
    EXPECT_TRUE(w["rank"] == 2 || w["rank"] == 3) << w.dump();
    EXPECT_GT(w["pid"].get<int>(), 0) << w.dump();
    EXPECT_EQ(w["running"], true) << w.dump();
    for (const char* key : {"phase", "step_ms", "tokens_per_s", "groups"}) EXPECT_TRUE(w.contains(key)) << key << ": " << w.dump();
  }
  EXPECT_EQ(a->wait(), 0) << a->output();
  EXPECT_EQ(b->wait(), 0) << b->output();
}

// Rank 2's copy of the parameters is corrupt at step 6, and again when the restart reruns step
// 6: a persistent fault of its device. Its node is evicted at once (not after fault.evict_after
// faults), and the spare takes its place; the job ends as the run that never broke.
TEST_F(Nodes, APersistentCorruptionEvictsItsNode) {
  myriad::comm::LocalRedis redis;
  const fs::path ref = straight(redis, kDpTp);
  const fs::path rd = dir_ / "persistent";
  const std::string extra = "--set fault.sdc_check_every=1 --set fault.evict_after=5";
  auto spare = agent(redis, "persistent", -1, rd, kDpTp, extra);
  auto a = agent(redis, "persistent", 0, rd, kDpTp, extra),
       b = agent(redis, "persistent", 1, rd, kDpTp, extra, "MYRIAD_INJECT_FAULT=step:6:flip@rank=2,step:6:flip@rank=2@attempt=1");
  ASSERT_EQ(b->wait(), 3) << b->output();
  EXPECT_NE(b->output().find("; persistent: the rerun of step 6 corrupted it again"), std::string::npos) << b->output();
  ASSERT_EQ(a->wait(), 0) << a->output();
  ASSERT_EQ(spare->wait(), 0) << spare->output();
  // The restart budget is the job's: the spare joins its second restart, not a first of its own.
  EXPECT_NE(spare->output().find("takes over node 1 in the job's restart 2 of 2"), std::string::npos) << spare->output();
  expect_same_weights(rd, ref);
  int faults = 0;
  bool evicted = false;
  for (const auto& e : jsonl(rd / "driver/events.jsonl")) {
    faults += e["event"] == "fault";
    if (e["event"] == "evict" && e["node"] == 1 && e["detail"].get<std::string>().find("persistent") != std::string::npos)
      evicted = true;
  }
  EXPECT_EQ(faults, 2);
  EXPECT_TRUE(evicted);
}

// Node 1 causes two faults in a row (a worker killed after step 6, then after step 7 of the
// restart), in pp 2 x dp 2: with fault.evict_after 2 it is evicted as their culprit, and the
// spare takes its place; the job ends as the run that never broke, each fault event naming
// node 1, the rank and the class.
TEST_F(Nodes, TheCulpritOfFaultsInARowIsEvicted) {
  myriad::comm::LocalRedis redis;
  const fs::path ref = straight(redis, kPpDp);
  const fs::path rd = dir_ / "in_a_row";
  auto spare = agent(redis, "in_a_row", -1, rd, kPpDp);
  auto a = agent(redis, "in_a_row", 0, rd, kPpDp),
       b = agent(redis, "in_a_row", 1, rd, kPpDp, "", "MYRIAD_INJECT_FAULT=step:6:kill@rank=3,step:7:kill@rank=2@attempt=1");
  ASSERT_EQ(b->wait(), 3) << b->output();
  EXPECT_NE(b->output().find("evicted: it caused the last 2 faults (fault.evict_after = 2)"), std::string::npos)
      << b->output();
  ASSERT_EQ(a->wait(), 0) << a->output();
  ASSERT_EQ(spare->wait(), 0) << spare->output();
  expect_same_weights(rd, ref);
  std::vector<int> ranks;
  for (const auto& e : jsonl(rd / "driver/events.jsonl"))
    if (e["event"] == "fault") {
      EXPECT_EQ(e["node"], 1) << e.dump();
      EXPECT_EQ(e["class"], "runtime fault") << e.dump();
      ranks.push_back(e["rank"]);
    }
  EXPECT_EQ(ranks, (std::vector<int>{3, 2}));
}

// The skip list travels with the job: step 6's loss fault recurs on node 1 (attempts 0 and 1),
// so attempt 2 skips step 6; then node 1 fails (a worker killed at step 7, its self-check
// failing) and is evicted. The spare that takes its place resumes from step 4 with the job's
// restarts and skip list, and the job ends with the weights of a run told to skip step 6.
TEST_F(Nodes, ASpareJoinsWithTheJobsSkippedSteps) {
  myriad::comm::LocalRedis redis;
  const fs::path ref = straight(redis, kDpTp, "--set train.skip_steps=[6]");
  const fs::path rd = dir_ / "skip_spare";
  auto spare = agent(redis, "skip_spare", -1, rd, kDpTp, "", "", 3);
  auto a = agent(redis, "skip_spare", 0, rd, kDpTp, "", "", 3),
       b = agent(redis, "skip_spare", 1, rd, kDpTp, "",
                 "MYRIAD_INJECT_FAULT=step:6:nan@rank=2,step:6:nan@rank=2@attempt=1,step:7:kill@rank=2@attempt=2,"
                 "diag:fail@node=1@attempt=2", 3);
  ASSERT_EQ(b->wait(), 3) << b->output();
  ASSERT_EQ(a->wait(), 0) << a->output();
  ASSERT_EQ(spare->wait(), 0) << spare->output();
  EXPECT_NE(spare->output().find("takes over node 1 in the job's restart 3 of 3"), std::string::npos) << spare->output();
  // Had the spare's ranks trained on step 6 while node 0's skipped it, their collectives would
  // not have matched, nor would the weights.
  expect_same_weights(rd, ref);
}

// A spare that comes after its job ended leaves, saying so (it used to wait for ever, taking the
// end for an earlier run's under the name); a spare of a later run under the same name, whose
// earlier end is on the store, waits for that run and leaves at its end.
TEST_F(Nodes, ASpareAfterTheJobEndedLeavesAndOneOfALaterRunWaitsForIt) {
  myriad::comm::LocalRedis redis;
  {
    const fs::path rd = dir_ / "late_spare";
    auto a = agent(redis, "late", 0, rd, kDpTp), b = agent(redis, "late", 1, rd, kDpTp);
    ASSERT_EQ(a->wait(), 0) << a->output();
    ASSERT_EQ(b->wait(), 0) << b->output();
    auto spare = agent(redis, "late", -1, rd, kDpTp);
    ASSERT_EQ(spare->wait(30), 0) << spare->output();
    EXPECT_NE(spare->output().find("job late ended before this spare joined"), std::string::npos) << spare->output();
  }
  const fs::path rd = dir_ / "late_spare_again";
  auto spare = agent(redis, "late", -1, rd, kDpTp);
  auto a = agent(redis, "late", 0, rd, kDpTp), b = agent(redis, "late", 1, rd, kDpTp);
  ASSERT_EQ(a->wait(), 0) << a->output();
  ASSERT_EQ(b->wait(), 0) << b->output();
  ASSERT_EQ(spare->wait(30), 0) << spare->output();
  EXPECT_NE(spare->output().find(": the job ended"), std::string::npos) << spare->output();
  EXPECT_EQ(spare->output().find("before this spare joined"), std::string::npos) << spare->output();
}

// A bad config key on a job of two nodes: an input error, never retried, on both nodes.
TEST_F(Nodes, BadInputStopsEveryNodeWithoutARestart) {
  myriad::comm::LocalRedis redis;
  const fs::path rd = dir_ / "bad_input";
  auto a = agent(redis, "bad_input", 0, rd, kDpTp, "--set train.stepz=3"),
       b = agent(redis, "bad_input", 1, rd, kDpTp, "--set train.stepz=3");
  EXPECT_EQ(a->wait(), 2) << a->output();
  EXPECT_EQ(b->wait(), 2) << b->output();
  EXPECT_NE(a->output().find("stepz"), std::string::npos) << a->output();
  for (const auto& e : jsonl(rd / "driver/events.jsonl")) EXPECT_NE(e["event"], "restart") << e.dump();
}

// The same without a spare: the job goes on on node 0 alone, with data parallelism 1 instead
// of 2 and the same global batch, from the step-4 checkpoint; its losses are the fault-free
// run's within 1e-4 (the same sums, in another order).
TEST_F(Nodes, WithoutASpareTheDataParallelRanksShrink) {
  myriad::comm::LocalRedis redis;
  const fs::path ref = straight(redis, kDpTp);
  const fs::path rd = dir_ / "shrink";
  auto a = agent(redis, "shrink", 0, rd, kDpTp), b = agent(redis, "shrink", 1, rd, kDpTp, "",
                                                         "MYRIAD_INJECT_FAULT=step:6:kill@rank=2,diag:fail@node=1");
  EXPECT_EQ(b->wait(), 3) << b->output();
  ASSERT_EQ(a->wait(), 0) << a->output();
  EXPECT_NE(a->output().find("the job goes on on 1 of its 2 nodes, data parallelism 1"), std::string::npos)
      << a->output();
  std::vector<nlohmann::json> want = jsonl(ref / "metrics.jsonl"), got = jsonl(rd / "metrics.jsonl");
  ASSERT_EQ(want.size(), 12u);
  ASSERT_EQ(got.size(), 12u) << a->output();
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i]["loss"].get<double>(), want[i]["loss"].get<double>(), 1e-4 * want[i]["loss"].get<double>())
        << "step " << i + 1;
}

// A layout that cannot lose a node (tensor parallelism across both) stops, saying why.
TEST_F(Nodes, WithoutASpareAJobThatCannotShrinkStopsAndSaysWhy) {
  myriad::comm::LocalRedis redis;
  const fs::path rd = dir_ / "noshrink";
  const char* tp4 = "--set parallel.tp=4";
  auto a = agent(redis, "noshrink", 0, rd, tp4), b = agent(redis, "noshrink", 1, rd, tp4, "",
                                                         "MYRIAD_INJECT_FAULT=step:6:kill@rank=2,diag:fail@node=1");
  EXPECT_EQ(b->wait(), 3) << b->output();
  EXPECT_EQ(a->wait(), 3) << a->output();
  EXPECT_NE(a->output().find("no spare (myriad launch --spare) is there to take its place; the 2 ranks left do "
                             "not hold whole tensor x pipeline groups of 4"), std::string::npos) << a->output();
}

// Through restarts, the store's password stays out of every log, event and console line, and a
// wrong one is refused before any worker starts (an input error, never retried).
TEST_F(Nodes, TheStorePasswordNeverReachesALog) {
  myriad::comm::LocalRedis redis({"--requirepass", "s3cret"});
  const fs::path rd = dir_ / "secret";
  const std::string url = cat("redis://:s3cret@127.0.0.1:", redis.port(), "/secret");
  auto launch = [&](int node, const std::string& u, const std::string& env) {
    return std::make_unique<Proc>(cat("launch --nnodes 2 --node-rank ", node, " --nproc-per-node 2 --max-restarts 1",
                                      " --rdzv ", u, " -- ", train(rd, kDpTp, "")),
                                  env, dir_ / cat("secret_", node, ".txt"));
  };
  auto a = launch(0, url, ""), b = launch(1, url, "MYRIAD_INJECT_FAULT=step:6:kill@rank=2");
  ASSERT_EQ(a->wait(), 0) << a->output();
  ASSERT_EQ(b->wait(), 0) << b->output();
  for (const auto& e : fs::recursive_directory_iterator(rd))
    if (e.is_regular_file() && e.path().extension() != ".bin") {
      EXPECT_EQ(read_file(e.path()).find("s3cret"), std::string::npos) << e.path();
    }
  EXPECT_EQ(a->output().find("s3cret"), std::string::npos);
  auto wrong = launch(0, cat("redis://:wrong@127.0.0.1:", redis.port(), "/secret"), "");
  EXPECT_EQ(wrong->wait(), 2) << wrong->output();
  EXPECT_EQ(wrong->output().find("wrong"), std::string::npos) << wrong->output();
}

// A straggler (rank 2's steps take 4 times their own time, and at least 200 ms more: a slower
// device, whatever the machine's load, where a fixed sleep stops being twice the median once a
// loaded machine slows every step):
// found against the whole job's step times (its node's own ranks are all slow: rank 3 waits on
// it inside tensor parallelism) and, with fault.evict_stragglers, its node evicted; the spare
// takes its place; bitwise the fault-free end.
TEST_F(Nodes, AStragglerIsFoundAcrossNodesAndEvicted) {
  myriad::comm::LocalRedis redis;
  // 40 steps: found around step 9 (the median of its last 10), well before the end.
  const std::string layout = cat(kDpTp, " --set train.steps=40");
  const fs::path ref = straight(redis, layout);
  const fs::path rd = dir_ / "straggler";
  const std::string extra = "--set fault.evict_stragglers=true";
  auto spare = agent(redis, "straggler", -1, rd, layout, extra);
  auto a = agent(redis, "straggler", 0, rd, layout, extra),
       b = agent(redis, "straggler", 1, rd, layout, extra, "MYRIAD_INJECT_FAULT=step:2:slow:x4:200@rank=2");
  EXPECT_EQ(b->wait(), 3) << b->output();
  EXPECT_NE(b->output().find("evicted: straggler: rank 2's steps take "), std::string::npos) << b->output();
  ASSERT_EQ(a->wait(), 0) << a->output();
  ASSERT_EQ(spare->wait(), 0) << spare->output();
  expect_same_weights(rd, ref, 40);
}

// The store lost mid-run and restarted empty on its port: the workers, done with it, train on;
// the agents warn, then beat again, and nobody is taken for lost; the job ends as the run that
// never broke, with every checkpoint it committed.
TEST_F(Nodes, TheStoreRestartedMidRunLosesNothing) {
  auto redis = std::make_unique<myriad::comm::LocalRedis>();
  const int port = redis->port();
  const fs::path ref = straight(*redis, kDpTp);
  const fs::path rd = dir_ / "restarted";
  const std::string slow = "MYRIAD_INJECT_FAULT=step:2:slow:300";
  auto a = agent(*redis, "restarted", 0, rd, kDpTp, "", slow), b = agent(*redis, "restarted", 1, rd, kDpTp, "", slow);
  for (int i = 0; i < 600 && !fs::exists(rd / "checkpoints/step_00000004/COMMITTED"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  redis->kill();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  redis = std::make_unique<myriad::comm::LocalRedis>(std::vector<std::string>{}, port);
  ASSERT_EQ(a->wait(), 0) << a->output();
  ASSERT_EQ(b->wait(), 0) << b->output();
  EXPECT_NE(a->output().find("the job's store does not answer"), std::string::npos) << a->output();
  EXPECT_NE(a->output().find("the job's store answers again"), std::string::npos) << a->output();
  expect_same_weights(rd, ref);
  for (int step : {4, 8, 12}) EXPECT_TRUE(fs::exists(rd / cat("checkpoints/step_0000000", step, "/COMMITTED")) ||
                                          fs::exists(rd / cat("checkpoints/step_000000", step, "/COMMITTED")));
}

// A node's agent killed (SIGKILL: the node is gone, its workers with it): the other node finds
// its heartbeat gone, the spare takes its place, and the job ends as the run that never broke.
TEST_F(Nodes, ALostNodeIsReplacedByASpare) {
  myriad::comm::LocalRedis redis;
  const fs::path ref = straight(redis, kDpTp);
  const fs::path rd = dir_ / "lost";
  // Slow steps, so that node 1 is lost mid-run, after the step-4 checkpoint.
  const std::string slow = "MYRIAD_INJECT_FAULT=step:4:slow:300";
  auto spare = agent(redis, "lost", -1, rd, kDpTp);
  auto a = agent(redis, "lost", 0, rd, kDpTp, "", slow), b = agent(redis, "lost", 1, rd, kDpTp, "", slow);
  for (int i = 0; i < 600 && !fs::exists(rd / "checkpoints/step_00000004/COMMITTED"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  b->kill(SIGKILL);
  ASSERT_EQ(a->wait(), 0) << a->output();
  ASSERT_EQ(spare->wait(), 0) << spare->output();
  expect_same_weights(rd, ref);
  bool lost = false;
  for (const auto& e : jsonl(rd / "driver/events.jsonl"))
    if (e["event"] == "evict" && e["node"] == 1 && e["detail"].get<std::string>().find("lost") != std::string::npos)
      lost = true;
  EXPECT_TRUE(lost) << a->output();
}

}  // namespace
