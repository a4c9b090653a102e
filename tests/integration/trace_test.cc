// The event timeline (observe.trace): a tp 2 x pp 2 x dp 2 run of 8 processes through the
// launcher, merged by `myriad trace` into one Chrome trace. One rank's clock is moved 50 ms
// ahead on purpose (MYRIAD_TRACE_CLOCK_SKEW): the start-up measurement must find it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "test_util.h"

namespace fs = std::filesystem;
using myriad::cat;

namespace {

using myriad::test::Result;
Result run(const std::string& args, const std::string& env = "") { return myriad::test::run_myriad(args, env); }

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in, nullptr, false);
}

// A fresh folder with a small corpus prepared in it: its prefix.
std::string corpus_in(const fs::path& dir) {
  fs::create_directories(dir);
  const std::string data = (dir / "corpus").string();
  EXPECT_EQ(run(cat("prepare --input /usr/share/games/fortunes/computers --tokenizer byte --output ", data,
                    " --doc-separator %")).code, 0);
  return data;
}

TEST(Trace, EightRanksMergeIntoOneAlignedTimeline) {
  const fs::path dir = fs::temp_directory_path() / cat("myriad_trace_", getpid());
  const std::string data = corpus_in(dir);
  const fs::path rd = dir / "run";
  // 4 steps; each data-parallel rank takes 4 rows a step in 2 micro-batches of 2.
  Result r = run(cat("launch --nproc-per-node 8 -- train --config ", MYRIAD_SOURCE_DIR, "/configs/demo.toml --run-dir ",
                     rd.string(), " --set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2 --set model.layers=4",
                     " --set model.d_model=32 --set model.seq_len=16 --set train.global_batch=8 --set train.micro_batch=2",
                     " --set train.steps=4 --set train.eval_every=0 --set data.train=", data,
                     " --set data.valid= --set observe.trace=true"),
                 "MYRIAD_TRACE_CLOCK_SKEW=3:50000");
  ASSERT_EQ(r.code, 0) << r.output;
  // The clocks: rank 3's measured 50 ms ahead, the others with rank 0's, each within 1 ms.
  for (int rank = 0; rank < 8; ++rank) {
    std::ifstream in(rd / "traces" / cat("rank_", rank, ".jsonl"));
    std::string header;
    ASSERT_TRUE(std::getline(in, header)) << rank;
    const int64_t offset = nlohmann::json::parse(header)["clock_offset_us"];
    EXPECT_NEAR(double(offset), rank == 3 ? 50000.0 : 0.0, 1000.0) << "rank " << rank;
  }
  Result m = run(cat("trace ", rd.string()));
  ASSERT_EQ(m.code, 0) << m.output;
  const nlohmann::json t = read_json(rd / "traces" / "timeline.json");
  ASSERT_TRUE(t.is_object()) << "the merged trace parses as JSON";
  std::map<int, std::map<std::string, int>> spans;                 // rank -> name -> count
  std::map<int, std::vector<std::pair<int64_t, int64_t>>> compute;  // rank -> forward/backward [ts, end)
  std::map<std::string, std::pair<int, int>> flows;                 // id -> (starts, ends)
  std::set<int> named;
  int sends = 0, recvs = 0;
  for (const nlohmann::json& e : t["traceEvents"]) {
    const std::string ph = e["ph"];
    if (ph == "M" && e["name"] == "process_name") named.insert(e["pid"].get<int>());
    if (ph == "s") ++flows[e["id"]].first;
    if (ph == "f") ++flows[e["id"]].second;
    if (ph != "X") continue;
    const int pid = e["pid"];
    const std::string name = e["name"];
    ++spans[pid][name];
    sends += name.rfind("send ", 0) == 0, recvs += name.rfind("recv ", 0) == 0;
    if (name == "forward" || name == "backward")
      compute[pid].push_back({e["ts"].get<int64_t>(), e["ts"].get<int64_t>() + e["dur"].get<int64_t>()});
  }
  EXPECT_EQ(named.size(), 8u);
  ASSERT_EQ(spans.size(), 8u) << "spans from all 8 ranks";
  for (auto& [rank, count] : spans) {
    // 1F1B over 2 stages: every micro-batch's forward and backward once a step on every stage.
    EXPECT_EQ(count["forward"], 8) << "rank " << rank;
    EXPECT_EQ(count["backward"], 8) << "rank " << rank;
    EXPECT_EQ(count["data"], 4) << "rank " << rank;
    EXPECT_EQ(count["optimizer"], 4) << "rank " << rank;
    // One rank's forward and backward passes run one after another.
    std::vector<std::pair<int64_t, int64_t>>& c = compute[rank];
    std::sort(c.begin(), c.end());
    for (size_t i = 1; i < c.size(); ++i) EXPECT_LE(c[i - 1].second, c[i].first) << "rank " << rank << " span " << i;
  }
  // Every send has its receive, tied by one flow; every collective's start on its first member
  // is tied to each other member's.
  EXPECT_GT(sends, 0);
  EXPECT_EQ(sends, recvs);
  EXPECT_FALSE(flows.empty());
  for (const auto& [id, se] : flows) EXPECT_EQ(se, std::make_pair(1, 1)) << "flow " << id;
  // --steps keeps those steps only.
  Result part = run(cat("trace ", rd.string(), " --steps 2:3 --output ", (dir / "part.json").string()));
  ASSERT_EQ(part.code, 0) << part.output;
  int forwards_of_rank0 = 0;
  const nlohmann::json kept = read_json(dir / "part.json");
  for (const nlohmann::json& e : kept["traceEvents"]) {
    if (e["ph"] == "M") continue;
    EXPECT_GE(e["args"]["step"].get<int>(), 2);
    EXPECT_LE(e["args"]["step"].get<int>(), 3);
    forwards_of_rank0 += e["ph"] == "X" && e["pid"].get<int>() == 0 && e["name"] == "forward";
  }
  EXPECT_EQ(forwards_of_rank0, 4);
  // A run without traces, and a bad range, are input errors.
  EXPECT_EQ(run(cat("trace ", dir.string())).code, 2);
  EXPECT_EQ(run(cat("trace ", rd.string(), " --steps 3:2")).code, 2);
  fs::remove_all(dir);
}

// `myriad report` on a traced run in which rank 5 sleeps 50 ms a step (a slow device): pipeline
// and data-parallel peers wait for it, which their own time leaves out, so rank 5 comes first.
TEST(Report, TheSlowRankComesFirstAndThePicturesAreImages) {
  const fs::path dir = fs::temp_directory_path() / cat("myriad_report_", getpid());
  const std::string data = corpus_in(dir);
  const fs::path rd = dir / "run";
  Result r = run(cat("launch --nproc-per-node 8 -- train --config ", MYRIAD_SOURCE_DIR, "/configs/demo.toml --run-dir ",
                     rd.string(), " --set parallel.pp=2 --set parallel.dp=4 --set model.layers=2 --set model.d_model=32",
                     " --set model.seq_len=16 --set train.global_batch=8 --set train.micro_batch=1 --set train.steps=8",
                     " --set train.eval_every=0 --set data.train=", data, " --set data.valid= --set observe.trace=true"),
                 "MYRIAD_INJECT_FAULT=step:1:slow:50@rank=5");
  ASSERT_EQ(r.code, 0) << r.output;
  Result rep = run(cat("report ", rd.string()));
  ASSERT_EQ(rep.code, 0) << rep.output;
  EXPECT_NE(rep.output.find("slowest ranks: 5 (rank 5 (node 0, tp 0, pp 1, dp 1)"), std::string::npos) << rep.output;
  for (const char* png : {"heatmap.png", "curves.png"})
    EXPECT_EQ(myriad::test::read_file(rd / "report" / png).substr(0, 8), "\x89PNG\r\n\x1a\n") << png;
  const std::string page = myriad::test::read_file(rd / "report" / "index.html");
  EXPECT_NE(page.find("<img src=heatmap.png>"), std::string::npos);
  EXPECT_NE(page.find("<tr><td>5</td>"), std::string::npos) << page;
  // A run that was not traced is an input error naming the folder.
  Result none = run(cat("report ", dir.string()));
  EXPECT_EQ(none.code, 2) << none.output;
  EXPECT_NE(none.output.find("holds no traced steps"), std::string::npos) << none.output;
  fs::remove_all(dir);
}

}  // namespace
