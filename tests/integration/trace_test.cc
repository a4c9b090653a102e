// The event timeline (observe.trace): a tp 2 x pp 2 x dp 2 run of 8 processes through the
// launcher, merged by `myriad trace` into one Chrome trace. One rank's clock is moved 50 ms
// ahead on purpose (MYRIAD_TRACE_CLOCK_SKEW): the start-up measurement must find it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "observe/trace.h"
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
                     " --set train.eval_every=4 --set train.eval_steps=1 --set data.train=", data,
                     " --set 'data.valid=[{name = \"first\", path = \"", data, "\"}, {name = \"again\", path = \"",
                     data, "\"}]' --set observe.trace=true"),
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
  // The validation curves: the mean and each source's.
  EXPECT_NE(page.find("validation loss (val_loss, val_loss/again, val_loss/first)"), std::string::npos) << page;
  // A run that was not traced is an input error naming the folder.
  Result none = run(cat("report ", dir.string()));
  EXPECT_EQ(none.code, 2) << none.output;
  EXPECT_NE(none.output.find("holds no traced steps"), std::string::npos) << none.output;
  fs::remove_all(dir);
}

// A shell command line (a pipeline, a `cd` first), run to its end: its stdout and stderr.
Result shell(const std::string& command) {
  Result r;
  FILE* p = popen(cat("(", command, ") 2>&1").c_str(), "r");
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::string last_line(std::string s) {
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s.substr(s.rfind('\n') == std::string::npos ? 0 : s.rfind('\n') + 1);
}

// A rank's trace as observe/trace.cc writes one: its header, and one step's own time.
const std::string kHeader = R"j({"rank": 0, "name": "rank 0 (node 0, tp 0, pp 0, dp 0)", "clock_offset_us": 0})j";
std::string step_event(int step) {
  return cat(R"({"ph": "X", "name": "step", "cat": "step", "ts": )", 1000 * step,
             R"(, "dur": 900, "tid": 2, "pid": 0, "args": {"step": )", step, R"(, "own_ms": 0.9}})");
}

// Files under traces/ that are not a rank's trace (damaged, or another program's): `trace` and
// `report` refuse them in one line naming the file, the line and the field, exit 2, rather than
// passing them into the timeline (trace) or failing with a traceback (report). A line cut by a
// crash is still passed over.
TEST(Trace, GarbageTracesAreInputErrorsNamingTheFile) {
  const fs::path dir = fs::temp_directory_path() / cat("myriad_trace_garbage_", getpid());
  std::string other_pid = step_event(1);
  other_pid.replace(other_pid.find("\"pid\": 0"), 8, "\"pid\": 7");
  struct Case {
    const char* name;
    std::string text;
    const char* what;
  };
  const std::vector<Case> cases = {
      {"not_json", "hello\nworld\n", "line 1 is not a JSON object"},
      {"no_header", step_event(1) + "\n", "line 1: an event before the file's header"},
      {"bad_ts", kHeader + "\n" + R"({"ph": "X", "name": "step", "ts": "soon", "dur": 1, "tid": 2, "pid": 0})" + "\n",
       "line 2: ts must be an integer (microseconds), got \"soon\""},
      {"foreign_event", kHeader + "\n{\"foo\": 1}\n" + step_event(1) + "\n", "line 2: ph must be an event phase"},
      {"other_pid", kHeader + "\n" + other_pid + "\n",
       "line 2: pid must be the header's rank, 0, got 7"},
      {"garbage_between_events", kHeader + "\n" + step_event(1) + "\n}}}\n" + step_event(2) + "\n",
       "line 3 is not a JSON object"},
      {"renamed", R"({"rank": 3, "name": "rank 3", "clock_offset_us": 0})" "\n" + step_event(1) + "\n",
       "line 1: the header says rank 3"},
  };
  for (const Case& c : cases) {
    const fs::path rd = dir / c.name, file = rd / "traces" / "rank_0.jsonl";
    fs::create_directories(rd / "traces");
    std::ofstream(file) << c.text;
    for (const char* command : {"trace", "report"}) {
      Result r = run(cat(command, " ", rd.string()));
      EXPECT_EQ(r.code, 2) << c.name << ": " << command << "\n" << r.output;
      const std::string line = last_line(r.output);
      EXPECT_EQ(line.rfind(cat("myriad: input error: ", command, ": ", file.string()), 0), 0u) << c.name << ": " << r.output;
      EXPECT_NE(line.find(c.what), std::string::npos) << c.name << ": " << command << ": " << c.what << " in: " << line;
      EXPECT_EQ(r.output.find("Traceback"), std::string::npos) << r.output;
    }
    EXPECT_FALSE(fs::exists(rd / "traces" / "timeline.json")) << c.name;
  }
  // A line cut by a crash, then the next start's header (trace::open ends the cut line first):
  // both steps are merged, and the report reads them.
  const fs::path cut = dir / "cut";
  fs::create_directories(cut / "traces");
  std::ofstream(cut / "traces" / "rank_0.jsonl") << kHeader << "\n" << step_event(1) << "\n" << R"({"ph": "X", "na)";
  myriad::trace::open((cut / "traces").string(), 0, "rank 0 (node 0, tp 0, pp 0, dp 0)", 1, 0);
  myriad::trace::set_step(2);
  myriad::trace::complete("step", "step", 2000, 2900, 2, {{"own_ms", 0.9}});
  myriad::trace::close();
  Result merged = run(cat("trace ", cut.string()));
  ASSERT_EQ(merged.code, 0) << merged.output;
  int steps = 0;
  const nlohmann::json timeline = read_json(cut / "traces" / "timeline.json");
  for (const nlohmann::json& e : timeline["traceEvents"]) steps += e["name"] == "step";
  EXPECT_EQ(steps, 2);
  Result rep = run(cat("report ", cut.string()));
  EXPECT_EQ(rep.code, 0) << rep.output;
  EXPECT_NE(rep.output.find("report: 1 ranks, steps 1..2"), std::string::npos) << rep.output;
  // metrics.jsonl that is not Myriad's: the report names it and the line.
  std::ofstream(cut / "metrics.jsonl") << R"({"step": 1, "loss": 2.5})" << "\nnot json\n" << R"({"step": 2, "loss": 2.4})" << "\n";
  Result bad = run(cat("report ", cut.string()));
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_EQ(last_line(bad.output).rfind(cat("myriad: input error: report: ", (cut / "metrics.jsonl").string(), ", line 2"), 0),
            0u) << bad.output;
  fs::remove_all(dir);
}

// `trace --output FILE` replaces a file only when it is a timeline `myriad trace` wrote (its
// otherData.producer says so), or with --overwrite (issue 26's rule for paths the user names):
// a user's file is refused in one line naming it, and left as it was. The default output is
// replaced while it is Myriad's.
TEST(Trace, AnOutputThatIsNotAMergedTimelineIsNeverReplaced) {
  const fs::path rd = fs::temp_directory_path() / cat("myriad_trace_output_", getpid());
  fs::create_directories(rd / "traces");
  std::ofstream(rd / "traces" / "rank_0.jsonl") << kHeader << "\n" << step_event(1) << "\n";
  const fs::path timeline = rd / "traces" / "timeline.json", mine = rd / "notes.json";
  for (int i = 0; i < 2; ++i) {  // the second time over its own timeline
    Result r = run(cat("trace ", rd.string()));
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_EQ(read_json(timeline)["otherData"]["producer"], "myriad trace");
  }
  std::ofstream(mine) << "{\"mine\": true}\n";
  Result r = run(cat("trace ", rd.string(), " --output ", mine.string()));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(last_line(r.output).rfind(cat("myriad: input error: trace: ", mine.string(), " exists"), 0), 0u) << r.output;
  EXPECT_NE(r.output.find("--overwrite"), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_EQ(read_json(mine), nlohmann::json({{"mine", true}}));
  r = run(cat("trace ", rd.string(), " --output ", mine.string(), " --overwrite"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(read_json(mine)["traceEvents"].size(), read_json(timeline)["traceEvents"].size());
  r = run(cat("trace ", rd.string(), " --output ", mine.string(), " --steps 1:1"));  // Myriad's now
  EXPECT_EQ(r.code, 0) << r.output;
  // The default output too, once it is not Myriad's.
  std::ofstream(timeline) << "mine\n";
  r = run(cat("trace ", rd.string()));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(timeline.string()), std::string::npos) << r.output;
  EXPECT_EQ(myriad::test::read_file(timeline), "mine\n");
  fs::remove_all(rd);
}

// An installed myriad (`cmake --install BUILD --prefix P`, which `make install PREFIX=P` runs):
// P/bin/myriad beside P/share/myriad/{tools,configs}. It finds its report tool relative to
// itself, run from another directory, with neither MYRIAD_TOOLS nor a source tree around it.
TEST(Install, AnInstalledMyriadReportsFromAnywhere) {
  const fs::path dir = fs::temp_directory_path() / cat("myriad_install_", getpid());
  const fs::path prefix = dir / "prefix", elsewhere = dir / "elsewhere", rd = dir / "run";
  const std::string data = corpus_in(dir);
  fs::create_directories(elsewhere);
  Result inst = shell(cat("cmake --install ", MYRIAD_BINARY_DIR, " --prefix ", prefix.string()));
  ASSERT_EQ(inst.code, 0) << inst.output;
  const fs::path myriad = prefix / "bin" / "myriad";
  ASSERT_TRUE(fs::exists(myriad)) << inst.output;
  for (const char* f : {"tools/report.py", "configs/demo.toml", "configs/gpt2-124m.toml", "configs/clusters/h200.toml"})
    EXPECT_TRUE(fs::exists(prefix / "share" / "myriad" / f)) << f << "\n" << inst.output;
  // A small traced run, by the installed myriad from its installed preset.
  const std::string env = cat("cd ", elsewhere.string(), " && env -u MYRIAD_TOOLS -u MYRIAD_RDZV -u MYRIAD_JOB ",
                              "-u MYRIAD_INJECT_FAULT OMP_NUM_THREADS=1 ", myriad.string());
  Result train = shell(cat(env, " train --config ", (prefix / "share/myriad/configs/demo.toml").string(), " --run-dir ",
                           rd.string(), " --set model.layers=1 --set model.d_model=32 --set model.seq_len=16",
                           " --set train.steps=3 --set train.eval_every=0 --set data.train=", data,
                           " --set data.valid= --set observe.trace=true"));
  ASSERT_EQ(train.code, 0) << train.output;
  Result rep = shell(cat(env, " report ", rd.string()));
  ASSERT_EQ(rep.code, 0) << rep.output;
  EXPECT_NE(rep.output.find("report: 1 ranks, steps "), std::string::npos) << rep.output;
  EXPECT_TRUE(fs::exists(rd / "report" / "index.html"));
  // It was the installed tool: without it the installed myriad says where it looked.
  fs::remove_all(prefix / "share" / "myriad" / "tools");
  Result gone = shell(cat(env, " report ", rd.string()));
  EXPECT_EQ(gone.code, 2) << gone.output;
  EXPECT_NE(gone.output.find("is not there"), std::string::npos) << gone.output;
  fs::remove_all(dir);
}

}  // namespace
