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
#include <tuple>
#include <vector>

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
  const int steps = 4, global_batch = 8, micro_batch = 2, dp = 2, pp = 2, tp = 2;
  Result r = run(cat("launch --nproc-per-node 8 -- train --config ", MYRIAD_SOURCE_DIR, "/configs/demo.toml --run-dir ",
                     rd.string(), " --set parallel.tp=", tp, " --set parallel.pp=", pp, " --set parallel.dp=", dp,
                     " --set model.layers=4 --set model.d_model=32 --set model.seq_len=16 --set train.global_batch=",
                     global_batch, " --set train.micro_batch=", micro_batch, " --set train.steps=", steps,
                     " --set train.eval_every=2 --set train.eval_steps=1 --set checkpoint.every=2 --set data.train=", data,
                     " --set data.valid=", data, " --set observe.trace=true"),
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
  struct Span {
    int pid;
    int64_t ts, end;
    std::string name;
    nlohmann::json args;
  };
  struct Flow {
    int starts = 0, ends = 0, from = -1, to = -1;
    int64_t at = 0, until = 0;
  };
  std::map<int, std::map<std::string, int>> spans;  // rank -> name -> count
  std::map<int, std::vector<Span>> work;             // rank -> its lane-0 spans of the step's work
  std::vector<Span> sends, recvs;
  std::map<std::string, Flow> flows;
  std::set<std::tuple<int, int, int>> coordinates;
  for (const nlohmann::json& e : t["traceEvents"]) {
    const std::string ph = e["ph"];
    if (ph == "M" && e["name"] == "process_name") {
      int rank, node, tpr, ppr, dpr;
      const std::string name = e["args"]["name"];
      ASSERT_EQ(std::sscanf(name.c_str(), "rank %d (node %d, tp %d, pp %d, dp %d)", &rank, &node, &tpr, &ppr, &dpr), 5) << name;
      EXPECT_EQ(rank, e["pid"].get<int>());
      coordinates.insert({tpr, ppr, dpr});
    }
    if (ph == "s") ++flows[e["id"]].starts, flows[e["id"]].from = e["pid"], flows[e["id"]].at = e["ts"];
    if (ph == "f") ++flows[e["id"]].ends, flows[e["id"]].to = e["pid"], flows[e["id"]].until = e["ts"];
    if (ph != "X") continue;
    const Span sp{e["pid"], e["ts"], e["ts"].get<int64_t>() + e["dur"].get<int64_t>(), e["name"], e["args"]};
    ++spans[sp.pid][sp.name];
    if (sp.name.rfind("send ", 0) == 0) sends.push_back(sp);
    if (sp.name.rfind("recv ", 0) == 0) recvs.push_back(sp);
    if (e["tid"] == 0 && sp.name != "checkpoint_snapshot") work[sp.pid].push_back(sp);  // (inside "checkpoint")
  }
  EXPECT_EQ(coordinates.size(), 8u) << "each rank named by its own tp/pp/dp coordinates";
  ASSERT_EQ(spans.size(), 8u) << "spans from all 8 ranks";
  // What the schedule says: every micro-batch's forward and backward once a step on every stage.
  const int micro_batches = global_batch / (micro_batch * dp);
  for (auto& [rank, count] : spans) {
    EXPECT_EQ(count["forward"], steps * micro_batches) << "rank " << rank;
    EXPECT_EQ(count["backward"], steps * micro_batches) << "rank " << rank;
    EXPECT_EQ(count["data"], steps) << "rank " << rank;
    EXPECT_EQ(count["optimizer"], steps) << "rank " << rank;
    EXPECT_EQ(count["eval"], steps / 2) << "rank " << rank;
    EXPECT_EQ(count["checkpoint"], steps / 2) << "rank " << rank;
    EXPECT_EQ(count["checkpoint_snapshot"], steps / 2) << "rank " << rank;
    EXPECT_EQ(count["checkpoint_write"], steps / 2) << "rank " << rank << ": the background writes, on their lane";
    // One rank's work (data, forward, backward, optimizer, evaluation, checkpoint) runs in sequence.
    std::vector<Span>& w = work[rank];
    std::sort(w.begin(), w.end(), [](const Span& a, const Span& b) { return a.ts < b.ts; });
    for (size_t i = 1; i < w.size(); ++i)
      EXPECT_LE(w[i - 1].end, w[i].ts) << "rank " << rank << ": " << w[i - 1].name << " overlaps " << w[i].name;
  }
  // Every send has its receive, tied by one flow from the send's start to the receive's end on
  // the peer; on the aligned clocks, no receive ends before its send starts (rank 3's 50 ms
  // skew, uncorrected, would put its sends after their receives).
  ASSERT_GT(sends.size(), 0u);
  EXPECT_EQ(sends.size(), recvs.size());
  int sends_tied = 0;
  for (const Span& s : sends) {
    const int peer = s.args["peer"];
    for (const auto& [id, f] : flows) {
      if (f.from != s.pid || f.at != s.ts || f.to != peer) continue;
      bool received = false;
      for (const Span& r : recvs) received |= r.pid == peer && r.end == f.until && r.args["peer"] == s.pid;
      EXPECT_TRUE(received) << s.name << " of rank " << s.pid << " to " << peer << ": its flow ends on no receive";
      EXPECT_GE(f.until, s.ts - 1000) << s.name << " of rank " << s.pid << " to " << peer;
      ++sends_tied;
      break;
    }
  }
  EXPECT_EQ(sends_tied, int(sends.size()));
  for (const auto& [id, se] : flows) EXPECT_EQ(std::make_pair(se.starts, se.ends), std::make_pair(1, 1)) << "flow " << id;
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
  EXPECT_EQ(forwards_of_rank0, 2 * micro_batches);
  // A run without traces, and a bad range, are input errors.
  EXPECT_EQ(run(cat("trace ", dir.string())).code, 2);
  EXPECT_EQ(run(cat("trace ", rd.string(), " --steps 3:2")).code, 2);
  // observe.trace_every = 2: only the even steps are traced.
  const fs::path every = dir / "every";
  ASSERT_EQ(run(cat("train --config ", MYRIAD_SOURCE_DIR, "/configs/demo.toml --run-dir ", every.string(),
                    " --set model.layers=1 --set model.d_model=32 --set model.seq_len=16 --set train.steps=5",
                    " --set train.eval_every=0 --set data.train=", data, " --set data.valid= --set observe.trace=true",
                    " --set observe.trace_every=2")).code, 0);
  std::set<int> traced;
  std::ifstream in(every / "traces" / "rank_0.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json e = nlohmann::json::parse(line);
    if (e.contains("args")) traced.insert(e["args"]["step"].get<int>());
  }
  EXPECT_EQ(traced, (std::set<int>{2, 4}));
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
  for (const char* png : {"heatmap.png", "curves.png"}) {
    // A PNG: its signature, then the IHDR chunk with the picture's width and height (big-endian).
    const std::string bytes = myriad::test::read_file(rd / "report" / png);
    ASSERT_GT(bytes.size(), 1000u) << png;
    EXPECT_EQ(bytes.substr(0, 8), "\x89PNG\r\n\x1a\n") << png;
    EXPECT_EQ(bytes.substr(12, 4), "IHDR") << png;
    auto be32 = [&](size_t at) {
      return (uint32_t(uint8_t(bytes[at])) << 24) | (uint32_t(uint8_t(bytes[at + 1])) << 16) |
             (uint32_t(uint8_t(bytes[at + 2])) << 8) | uint32_t(uint8_t(bytes[at + 3]));
    };
    EXPECT_GE(be32(16), 400u) << png << ": width";
    EXPECT_GE(be32(20), 200u) << png << ": height";
  }
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
