// The hang report: a job of 8 processes (tp 2 x pp 2 x dp 2) in which one rank stops (SIGSTOP)
// or stalls (its training thread stuck) at a chosen point. The launcher finds the hang from the
// heartbeats (or, in one case, a collective times out first), asks every live rank for its
// flight record, and writes RUN_DIR/hang_report.json, which must name that rank alone;
// `myriad hang-report RUN_DIR` says the same.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "test_util.h"

namespace fs = std::filesystem;
using myriad::cat;

namespace {

using myriad::test::Result;
Result run(const std::string& args, const std::string& env = "") { return myriad::test::run_myriad(args, env); }

struct Case {
  const char* name;
  const char* layout;
  const char* fault;
  int rank;
  const char* extra = "";  // more --set flags (the last one of a key wins)
  int code = 3;            // the launch's exit code
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class HangReport : public ::testing::TestWithParam<Case> {
 protected:
  static fs::path dir_;
  static std::string data_;
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / cat("myriad_hang_", getpid());
    fs::create_directories(dir_);
    data_ = (dir_ / "corpus").string();
    ASSERT_EQ(run(cat("prepare --input /usr/share/games/fortunes/computers --tokenizer byte --output ", data_,
                      " --doc-separator %")).code, 0);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
};
fs::path HangReport::dir_;
std::string HangReport::data_;

const char* k3d = "--nproc-per-node 8 -- train --set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2";
const char* kTpDp = "--nproc-per-node 4 -- train --set parallel.tp=2 --set parallel.dp=2";

TEST_P(HangReport, NamesTheRankThatHoldsTheJobUpAlone) {
  const Case& c = GetParam();
  const fs::path rd = dir_ / c.name;
  Result r = run(cat("launch ", c.layout, " --config ", MYRIAD_SOURCE_DIR, "/configs/demo.toml --run-dir ", rd.string(),
                     " --set model.layers=4 --set model.d_model=32 --set model.seq_len=16 --set train.global_batch=8",
                     " --set train.micro_batch=2 --set train.steps=12 --set train.eval_every=0 --set data.train=", data_,
                     " --set data.valid= --set comm.timeout_s=300 --set fault.step_timeout_s=4 ", c.extra),
                 // Every rank's steps take 250 ms: a stopped rank's last heartbeat (one a second)
                 // then tells of the step it stopped in.
                 cat("MYRIAD_INJECT_FAULT=", c.fault, ",step:1:slow:250"));
  EXPECT_EQ(r.code, c.code) << r.output;
  std::ifstream in(rd / "hang_report.json");
  const nlohmann::json report = nlohmann::json::parse(in, nullptr, false);
  ASSERT_TRUE(report.is_object()) << r.output;
  EXPECT_EQ(report["culprits"], nlohmann::json::array({c.rank})) << report.dump(2) << r.output;
  EXPECT_TRUE(report["mismatches"].empty()) << report.dump(2);
  // Where the culprit is: its step, phase and last finished operation, from its flight record
  // or, when it is stopped and wrote none, from its last heartbeat.
  const std::string finding = report["findings"][0];
  for (const char* what : {"step ", ", phase ", ", its last finished operation "})
    EXPECT_NE(finding.find(what), std::string::npos) << what << " in: " << finding;
  // The launcher's last line names it too, and the command reads the same records again.
  EXPECT_NE(r.output.find(cat("hang report: rank ", c.rank, " (")), std::string::npos) << r.output;
  Result again = run(cat("hang-report ", rd.string()));
  EXPECT_EQ(again.code, 0) << again.output;
  EXPECT_EQ(again.output, myriad::test::read_file(rd / "hang_report.txt"));
  EXPECT_NE(again.output.find(cat("hang report: rank ", c.rank, " (")), std::string::npos) << again.output;
}

INSTANTIATE_TEST_SUITE_P(
    Points, HangReport,
    ::testing::Values(Case{"stopped_in_forward", k3d, "fwd:6:hang@rank=5", 5},
                      Case{"stopped_in_backward", k3d, "bwd:6:hang@rank=6", 6},
                      Case{"stopped_before_the_all_gather", k3d, "dp_gather:6:hang@rank=3", 3},
                      Case{"stalled_in_forward", k3d, "fwd:6:stall@rank=1", 1},
                      Case{"stopped_in_a_pipeline_receive", k3d, "pp_recv:6:hang@rank=6", 6},
                      // A collective times out first (comm.timeout_s 3, the hang allowance 60 s):
                      // the launcher collects the others' records before it stops them.
                      Case{"stalled_until_a_collective_times_out", k3d, "fwd:6:stall@rank=1", 1,
                           "--set comm.timeout_s=3 --set fault.step_timeout_s=60", 4},
                      // Rank 3 waits for rank 2 in the node-shared batch, not in a collective.
                      Case{"stalled_with_a_shared_batch", kTpDp, "step:6:stall@rank=2", 2}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(HangReportCommand, ARunWithoutFlightRecordsIsAnInputError) {
  const fs::path rd = fs::temp_directory_path() / cat("myriad_nohang_", getpid());
  fs::create_directories(rd);
  Result r = run(cat("hang-report ", rd.string()));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("holds no flight records"), std::string::npos) << r.output;
  fs::remove_all(rd);
}

// Flight records and heartbeats that are not what a rank writes (damaged, or another program's):
// one line naming the file and the field, exit 2; never an internal error, never skipped.
TEST(HangReportCommand, GarbageRecordsAreInputErrorsNamingTheFileAndField) {
  const fs::path rd = fs::temp_directory_path() / cat("myriad_garbage_hang_", getpid());
  // Rank 0 waits in dp0's all_reduce #1 for rank 1, which left no record.
  const std::string waits = R"({"rank": 0, "step": 5, "phase": "backward", "groups": [{"group": "dp0", "members": [0, 1],
      "records": [{"seq": 1, "match": 1, "op": "all_reduce", "bytes": 4, "state": "running"}]}]})";
  struct Garbage {
    const char* file;
    std::string text;
    const char* field;  // what the error names besides the file
  };
  const std::vector<Garbage> cases = {
      {"flight_rank_0.json", "this is not JSON", "is not JSON"},
      {"flight_rank_0.json", R"([1, 2, 3])", "the file must be an object"},
      {"flight_rank_0.json", R"({"rank": "zero", "groups": []})", "rank must be a non-negative integer, got \"zero\""},
      {"flight_rank_0.json", R"({"groups": []})", "rank is missing"},
      {"flight_rank_0.json", R"({"rank": 0, "groups": 5})", "groups must be an array"},
      {"flight_rank_0.json", R"({"rank": 0, "groups": [7]})", "groups[0] must be an object"},
      {"flight_rank_0.json", R"({"rank": 0, "groups": [{"group": "dp0", "records": [{"seq": "x"}]}]})",
       "groups[0].records[0].seq must be a non-negative integer"},
      {"flight_rank_0.json", R"({"rank": 0, "groups": [{"group": "dp0", "members": ["a"], "records": []}]})",
       "groups[0].members[0] must be a rank"},
      {"heartbeat_rank_1", R"({"step": "five", "phase": "forward"})", "step must be an integer"},
      {"heartbeat_rank_1", R"({"step": 5, "finished": {"group": "dp0", "op": "all_reduce", "match": -1}})",
       "finished.match must be a non-negative integer"},
  };
  for (const Garbage& g : cases) {
    fs::remove_all(rd);
    fs::create_directories(rd / "driver");
    if (std::string(g.file).rfind("heartbeat", 0) == 0) std::ofstream(rd / "driver" / "flight_rank_0.json") << waits;
    std::ofstream(rd / "driver" / g.file) << g.text;
    Result r = run(cat("hang-report ", rd.string()));
    EXPECT_EQ(r.code, 2) << g.text << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << "one line: " << r.output;
    EXPECT_EQ(r.output.rfind(cat("myriad: input error: hang-report: ", (rd / "driver" / g.file).string()), 0), 0u)
        << r.output;
    EXPECT_NE(r.output.find(g.field), std::string::npos) << g.field << " in: " << r.output;
  }
  // The same records, well formed: the report names rank 1, with its last heartbeat.
  fs::remove_all(rd);
  fs::create_directories(rd / "driver");
  std::ofstream(rd / "driver" / "flight_rank_0.json") << waits;
  std::ofstream(rd / "driver" / "heartbeat_rank_1") << R"({"beat": 9, "step": 5, "phase": "forward",
      "finished": {"group": "dp0", "op": "all_reduce", "seq": 0, "match": 0}})";
  std::ofstream(rd / "driver" / "heartbeat_rank_1.tmp") << R"({"step": )";  // a beat being written
  Result ok = run(cat("hang-report ", rd.string()));
  EXPECT_EQ(ok.code, 0) << ok.output;
  EXPECT_NE(ok.output.find("hang report: rank 1 (it left no record"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("step 5, phase forward"), std::string::npos) << ok.output;
  fs::remove_all(rd);
}

}  // namespace
