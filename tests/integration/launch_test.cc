// `myriad launch` end to end: ranks, environment and logs; a failing or killed worker and the
// launcher's exit class; SIGTERM/SIGINT/SIGKILL to the launcher (no orphans); bad flags; and two
// launchers on one machine acting as the two nodes of a job (one of them placed by Slurm's
// variables). Workers run the hidden `myriad comm-check`, steered by MYRIAD_INJECT_FAULT.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "test_util.h"

namespace fs = std::filesystem;
using myriad::cat;

namespace {

// Variables of the test's own environment that would change what the launcher does.
const char* kClean =
    "env -u SLURM_JOB_ID -u SLURM_NODEID -u SLURM_NNODES -u SLURM_STEP_NUM_NODES "
    "-u SLURM_STEP_NUM_TASKS -u SLURM_STEP_ID -u JOB_COMPLETION_INDEX -u MYRIAD_NNODES "
    "-u MYRIAD_NODE_RANK -u MYRIAD_RDZV -u MYRIAD_JOB -u MYRIAD_INJECT_FAULT -u OMP_NUM_THREADS";

// A shell command that becomes `myriad ARGS` (exec), in `cwd`, with `env` added.
std::string command(const fs::path& cwd, const std::string& env, const std::string& args) {
  return cat("cd '", cwd.string(), "' && exec ", kClean, " ", env, " ", MYRIAD_BINARY_DIR,
             "/myriad ", args);
}

using myriad::test::Result;
using myriad::test::last_line;
using myriad::test::read_file;

Result run(const fs::path& cwd, const std::string& args, const std::string& env = "") {
  return myriad::test::run_shell(command(cwd, env, args) + " 2>&1");
}



bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A launcher started in the background (its pid is the launcher's: the shell execs it), its
// output in a file.
class Background {
 public:
  Background(const fs::path& cwd, const std::string& args, const std::string& env,
             const fs::path& out)
      : out_(out) {
    const std::string cmd = command(cwd, env, args) + " > '" + out.string() + "' 2>&1";
    pid_ = fork();
    if (pid_ == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~Background() {
    if (pid_ > 0 && code_ < 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  // The exit code (128 + signal when killed), or -1 when it did not end within timeout_s.
  int wait(double timeout_s) {
    const double end = now_s() + timeout_s;
    while (code_ < 0 && now_s() < end) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_)
        code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return code_;
  }
  std::string output() const { return read_file(out_); }

 private:
  fs::path out_;
  pid_t pid_ = -1;
  int code_ = -1;
};

// The processes whose environment says MYRIAD_JOB=job: the workers of that job still alive.
std::vector<int> processes_of_job(const std::string& job) {
  std::vector<int> pids;
  const std::string needle = "MYRIAD_JOB=" + job;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string env = read_file(e.path() / "environ");
    std::stringstream ss(env);
    for (std::string var; std::getline(ss, var, '\0');)
      if (var == needle) pids.push_back(std::stoi(name));
  }
  return pids;
}

// Waits until `pred` holds (true) or timeout_s passes (false).
template <class F>
bool eventually(F pred, double timeout_s) {
  const double end = now_s() + timeout_s;
  while (!pred()) {
    if (now_s() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

std::string log_of(const fs::path& run_dir, int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank_%05d.log", rank);
  return read_file(run_dir / "logs" / name);
}

class Launch : public ::testing::Test {
 protected:
  static fs::path dir_;  // the tests' working directory: run directories go in here
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / cat("myriad_launch_", getpid());
    fs::create_directories(dir_);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  // A job name of this test process alone.
  static std::string job(const std::string& name) { return cat("lt", getpid(), "-", name); }
};
fs::path Launch::dir_;

TEST_F(Launch, CommCheckOnThreeRanks) {
  const std::string j = job("ok");
  Result r = run(dir_, cat("launch --nproc-per-node 3 --job ", j, " -- comm-check --size-kb 16 --run-dir ok"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 0] comm-check ok: rank 0 of 3\n")) << r.output;
  EXPECT_FALSE(contains(r.output, "[rank 1]")) << "only rank 0's output is shown\n" << r.output;
  EXPECT_FALSE(contains(r.output, "[rank 2]")) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string log = log_of(dir_ / "ok", rank);
    EXPECT_TRUE(contains(log, cat("\ncomm-check ok: rank ", rank, " of 3\n"))) << log;
    for (const std::string& var :
         {cat("MYRIAD_RANK=", rank), std::string("MYRIAD_WORLD_SIZE=3"), cat("MYRIAD_LOCAL_RANK=", rank),
          std::string("MYRIAD_LOCAL_WORLD_SIZE=3"), std::string("MYRIAD_NODE_RANK=0"),
          std::string("MYRIAD_NNODES=1"), cat("MYRIAD_JOB=", j), std::string("MYRIAD_ATTEMPT=0"),
          cat("MYRIAD_RDZV=file://", (dir_ / "ok" / "rdzv" / j).string()),
          std::string("OMP_NUM_THREADS=")})
      EXPECT_TRUE(contains(log, " " + var)) << var << " missing in\n" << log;
    EXPECT_TRUE(contains(log, "exited with code 0")) << log;
  }
  EXPECT_TRUE(processes_of_job(j).empty());
}

// The temporary directory is removed after a launch that succeeded, and kept (and named) when
// its logs tell of a failure.
TEST_F(Launch, WithoutRunDirTheLogsGoToATemporaryDirectory) {
  Result r = run(dir_, "launch --nproc-per-node 2 -- comm-check --size-kb 1");
  ASSERT_EQ(r.code, 0) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex("logs in (/\\S+)/logs\n"))) << r.output;
  EXPECT_FALSE(fs::exists(m[1].str())) << "left behind: " << m[1].str();
  Result f = run(dir_, "launch --nproc-per-node 2 -- comm-check --size-kb 1", "MYRIAD_INJECT_FAULT=comm_check:fail@rank=1");
  ASSERT_EQ(f.code, 3) << f.output;
  ASSERT_TRUE(std::regex_search(f.output, m, std::regex("logs in (/\\S+)/logs\n"))) << f.output;
  const fs::path run_dir = m[1].str();
  EXPECT_TRUE(contains(log_of(run_dir, 1), "injected fault at comm_check")) << log_of(run_dir, 1);
  fs::remove_all(run_dir);
}

TEST_F(Launch, FailingWorkerGivesTheLaunchItsExitClass) {
  // Every rank fails its config: an input error, exit 2, naming the rank and the logs.
  Result r = run(dir_, "launch --nproc-per-node 2 -- train --config /nonexistent.toml");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(std::regex_match(last_line(r.output),
                               std::regex("myriad: launch: rank [01] exited with code 2 \\(input "
                                          "error\\): .*/nonexistent.toml.*; logs in runs/nonexistent/logs")))
      << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("\\[rank [01]\\] myriad: input error: .*/nonexistent.toml")))
      << r.output;
  EXPECT_TRUE(fs::exists(dir_ / "runs/nonexistent/logs/rank_00001.log"));
}

TEST_F(Launch, ErrorLinesOfEveryRankReachTheConsole) {
  const std::string j = job("fail");
  Result r = run(dir_, cat("launch --nproc-per-node 3 --job ", j, " -- comm-check --run-dir fail"),
                 "MYRIAD_INJECT_FAULT=comm_check:fail@rank=2");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 2] myriad: runtime fault: injected fault at comm_check: rank 2 failed\n"))
      << r.output;
  EXPECT_EQ(last_line(r.output),
            "myriad: launch: rank 2 exited with code 3 (runtime fault): injected fault at comm_check: rank 2 failed; "
            "logs in fail/logs");
  EXPECT_TRUE(processes_of_job(j).empty());
}

TEST_F(Launch, KilledWorkerStopsTheOthers) {
  // Rank 1 dies before it reaches the store; ranks 0 and 2 wait for it there until stopped.
  const std::string j = job("killed");
  const double t0 = now_s();
  Result r = run(dir_, cat("launch --nproc-per-node 3 --job ", j, " -- comm-check --run-dir killed"),
                 "MYRIAD_INJECT_FAULT=comm_check:kill@rank=1");
  EXPECT_LT(now_s() - t0, 8.0) << "the others should go at the stop signal, not wait for the grace period";
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_EQ(last_line(r.output),
            "myriad: launch: rank 1 was killed by SIGKILL (runtime fault); logs in killed/logs");
  EXPECT_TRUE(processes_of_job(j).empty());
  for (int rank : {0, 2})
    EXPECT_TRUE(contains(log_of(dir_ / "killed", rank), "was stopped by the launcher"))
        << log_of(dir_ / "killed", rank);
}

TEST_F(Launch, SigtermToTheLauncherStopsTheWorkers) {
  const std::string j = job("term");
  Background b(dir_, cat("launch --nproc-per-node 3 --job ", j, " -- comm-check --run-dir term"),
               "MYRIAD_INJECT_FAULT=comm_check:sleep", dir_ / "term.out");
  ASSERT_TRUE(eventually([&] { return processes_of_job(j).size() == 3; }, 20)) << b.output();
  for (int rank : {0, 1, 2})
    ASSERT_TRUE(eventually([&] { return contains(log_of(dir_ / "term", rank), "sleeps"); }, 20));
  // SIGTERM is a preemption: passed on as SIGTERM, which a trainer answers by saving; these
  // workers are not trainers and end by it, unsaved, and the launch says so (exit 6: preempted).
  kill(b.pid(), SIGTERM);
  EXPECT_EQ(b.wait(20), 6) << b.output();
  EXPECT_TRUE(processes_of_job(j).empty()) << b.output();
  EXPECT_TRUE(std::regex_match(last_line(b.output()),
                               std::regex("myriad: launch: preempted \\(SIGTERM\\): rank [012] was killed by SIGTERM "
                                          "\\(runtime fault\\) without saving; logs in term/logs")))
      << b.output();
  EXPECT_TRUE(contains(log_of(dir_ / "term", 1), "stopped by the launcher (killed by SIGTERM)"));
}

TEST_F(Launch, WorkersThatIgnoreTheSignalAreKilledAfterTheGracePeriod) {
  const std::string j = job("deaf");
  Background b(dir_, cat("launch --nproc-per-node 2 --grace-period 1 --job ", j,
                         " -- comm-check --run-dir deaf"),
               "MYRIAD_INJECT_FAULT=comm_check:sleep_ignore_term", dir_ / "deaf.out");
  for (int rank : {0, 1})
    ASSERT_TRUE(eventually([&] { return contains(log_of(dir_ / "deaf", rank), "sleeps"); }, 20))
        << b.output();
  const double t0 = now_s();
  kill(b.pid(), SIGINT);
  EXPECT_EQ(b.wait(20), 3) << b.output();
  EXPECT_GE(now_s() - t0, 0.9);
  EXPECT_TRUE(processes_of_job(j).empty());
  EXPECT_TRUE(contains(b.output(), "SIGINT received")) << b.output();
  EXPECT_TRUE(contains(log_of(dir_ / "deaf", 0), "stopped by the launcher (killed by SIGKILL)"));
}

TEST_F(Launch, KilledLauncherLeavesNoOrphans) {
  const std::string j = job("orphans");
  Background b(dir_, cat("launch --nproc-per-node 2 --job ", j, " -- comm-check --run-dir orphans"),
               "MYRIAD_INJECT_FAULT=comm_check:sleep_ignore_term", dir_ / "orphans.out");
  ASSERT_TRUE(eventually([&] { return processes_of_job(j).size() == 2; }, 20)) << b.output();
  kill(b.pid(), SIGKILL);
  EXPECT_EQ(b.wait(20), 128 + SIGKILL);
  EXPECT_TRUE(eventually([&] { return processes_of_job(j).empty(); }, 10))
      << "workers outlived their launcher";
}

TEST_F(Launch, TwoLaunchersActAsTwoNodes) {
  // Node 0 is placed by flags, node 1 by Slurm's variables; they meet in a file store.
  const std::string j = job("nodes");
  const std::string url = cat("file://", (dir_ / "store" / j).string());
  Background n0(dir_, cat("launch --nproc-per-node 2 --nnodes 2 --node-rank 0 --rdzv ", url,
                          " -- comm-check --run-dir nodes"),
                "", dir_ / "node0.out");
  Background n1(dir_, "launch --nproc-per-node 2 -- comm-check --run-dir nodes",
                cat("SLURM_JOB_ID=4242 SLURM_STEP_ID=0 SLURM_NODEID=1 SLURM_NNODES=3 "
                    "SLURM_STEP_NUM_NODES=2 SLURM_STEP_NUM_TASKS=2 MYRIAD_RDZV=", url),
                dir_ / "node1.out");
  ASSERT_EQ(n0.wait(25), 0) << n0.output();
  ASSERT_EQ(n1.wait(25), 0) << n1.output();
  EXPECT_TRUE(contains(n0.output(), "[rank 0] comm-check ok: rank 0 of 4")) << n0.output();
  EXPECT_TRUE(contains(n1.output(), "node 1 of 2 (from SLURM_NODEID, SLURM_STEP_NUM_NODES)"))
      << n1.output();
  EXPECT_FALSE(contains(n1.output(), "[rank ")) << n1.output();
  for (int rank = 0; rank < 4; ++rank) {
    const std::string log = log_of(dir_ / "nodes", rank);
    EXPECT_TRUE(contains(log, cat("\ncomm-check ok: rank ", rank, " of 4\n"))) << log;
    EXPECT_TRUE(contains(log, cat(" MYRIAD_NODE_RANK=", rank / 2, " "))) << log;
    EXPECT_TRUE(contains(log, cat(" MYRIAD_LOCAL_RANK=", rank % 2, " "))) << log;
  }
}

// Each bad launch: exit code 2 and one line naming the culprit.
void expect_one_line_error(const Result& r, const std::string& needle) {
  EXPECT_EQ(r.code, 2) << r.output;
  std::string out = r.output;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  EXPECT_EQ(out.find('\n'), std::string::npos) << "more than one line:\n" << r.output;
  EXPECT_EQ(out.rfind("myriad: input error: ", 0), 0u) << r.output;
  EXPECT_NE(out.find(needle), std::string::npos) << "expected '" << needle << "' in: " << out;
}

TEST_F(Launch, BadArguments) {
  const fs::path d = dir_;
  expect_one_line_error(run(d, "launch --nproc-per-node 0 -- comm-check"), "--nproc-per-node must be 1..4096, got 0");
  expect_one_line_error(run(d, "launch --nproc-per-node two -- comm-check"), "--nproc-per-node must be an integer");
  expect_one_line_error(run(d, "launch -- comm-check"), "--nproc-per-node is required");
  expect_one_line_error(run(d, "launch --nproc-per-node 2 comm-check"), "expected '--'");
  expect_one_line_error(run(d, "launch --nproc-per-node 2 --"), "nothing to run after '--'");
  expect_one_line_error(run(d, "launch --nproc-per-nodes 2 -- comm-check"), "did you mean 'nproc-per-node'");
  expect_one_line_error(run(d, "launch --nproc-per-node 1 -- launch --nproc-per-node 1 -- comm-check"),
                     "cannot be launch itself");
  expect_one_line_error(run(d, "launch --nproc-per-node 2 --grace-period -1 -- comm-check"),
                     "--grace-period must be");
  expect_one_line_error(run(d, "launch --nproc-per-node 2 --nnodes 2 --node-rank 2 --rdzv file:///tmp/x/j -- comm-check"),
                     "node rank 2 (--node-rank) is out of range for 2 node(s) (--nnodes)");
  expect_one_line_error(run(d, "launch --nproc-per-node 2 --nnodes 2 --node-rank 1 -- comm-check"),
                     "2 nodes need a rendezvous store");
  expect_one_line_error(run(d, "launch --nproc-per-node 2 --nnodes 0 -- comm-check"), "node count (--nnodes) must be");
  expect_one_line_error(run(d, "launch --nproc-per-node 1 --nnodes 2 --node-rank 0 --rdzv redis://127.0.0.1:6379 -- comm-check"),
                     "names no job");
  expect_one_line_error(run(d, "launch --nproc-per-node 1 --rdzv http://host/j -- comm-check"), "unknown scheme");
  expect_one_line_error(run(d, "launch --nproc-per-node 1 --job 'a b' -- comm-check"), "the job name 'a b'");
  expect_one_line_error(run(d, "launch --nproc-per-node 1 --job x --rdzv file:///tmp/s/y -- comm-check"),
                     "--job x disagrees with the job 'y'");
  // Placement from the environment: flags win, and bad values are named.
  expect_one_line_error(run(d, "launch --nproc-per-node 1 --rdzv file:///tmp/x/j -- comm-check",
                         "SLURM_JOB_ID=7 SLURM_NODEID=2 SLURM_NNODES=2"),
                     "node rank 2 (SLURM_NODEID) is out of range for 2 node(s) (SLURM_NNODES)");
  expect_one_line_error(run(d, "launch --nproc-per-node 1 --rdzv file:///tmp/x/j -- comm-check",
                         "SLURM_JOB_ID=7 SLURM_NODEID=0 SLURM_NNODES=2 SLURM_STEP_NUM_TASKS=16"),
                     "srun started 16 tasks on 2 node(s)");
  expect_one_line_error(run(d, "launch --nproc-per-node 1 --nnodes 4 --rdzv file:///tmp/x/j -- comm-check",
                         "JOB_COMPLETION_INDEX=4"),
                     "node rank 4 (JOB_COMPLETION_INDEX) is out of range for 4 node(s) (--nnodes)");
  expect_one_line_error(run(d, "launch --nproc-per-node 1 -- comm-check", "MYRIAD_NNODES=x"),
                     "MYRIAD_NNODES must be an integer, got 'x'");
  // comm-check outside a launch.
  expect_one_line_error(run(d, "comm-check"), "MYRIAD_RANK is not set");
}

}  // namespace
