#include "observe/trace.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

namespace myriad::trace {
namespace {

struct Tracer {
  std::string path;
  int rank = 0;
  int64_t every = 1;
  std::atomic<bool> keep{false};  // the current step is traced
  std::atomic<int64_t> step{0};
  std::mutex mu;
  // Events not yet written, at most kRing: when the writes fall behind (a stalled disk) the
  // oldest are dropped, and counted, rather than the process's memory growing.
  static constexpr size_t kRing = size_t(1) << 18;
  std::deque<nlohmann::json> buffer;
  int64_t dropped = 0;
  std::atomic<bool> stop{false};
  std::thread flusher;

  // The JSON text is made here, on the flushing thread, not on the training thread.
  void flush() {
    std::deque<nlohmann::json> events;
    int64_t lost = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      events.swap(buffer);
      std::swap(lost, dropped);
    }
    if (events.empty() && lost == 0) return;
    if (std::FILE* f = std::fopen(path.c_str(), "a")) {
      if (lost > 0) {
        const nlohmann::json note = {{"ph", "i"}, {"name", "trace events dropped"}, {"s", "p"}, {"pid", rank}, {"tid", 0},
                                     {"ts", events.empty() ? 0 : events.front().value("ts", int64_t(0))},
                                     {"args", {{"dropped", lost}, {"step", events.empty() ? 0 : events.front()["args"].value("step", int64_t(0))}}}};
        std::fputs(note.dump().c_str(), f), std::fputc('\n', f);
      }
      for (const nlohmann::json& e : events) std::fputs(e.dump().c_str(), f), std::fputc('\n', f);
      std::fclose(f);
    }
  }
  void add(nlohmann::json e) {
    e["pid"] = rank;
    std::lock_guard<std::mutex> lock(mu);
    if (buffer.size() == kRing) buffer.pop_front(), ++dropped;
    buffer.push_back(std::move(e));
  }
};

std::unique_ptr<Tracer> g_tracer;

// The test knob: MYRIAD_TRACE_CLOCK_SKEW = "R:US" moves rank R's trace clock US ahead.
int64_t clock_skew_us() {
  static const int64_t skew = [] {
    const char* s = std::getenv("MYRIAD_TRACE_CLOCK_SKEW");
    const char* me = std::getenv("MYRIAD_RANK");
    int r = -1;
    long long us = 0;
    if (s && me && std::sscanf(s, "%d:%lld", &r, &us) == 2 && r == std::atoi(me)) return static_cast<int64_t>(us);
    return int64_t(0);
  }();
  return skew;
}

}  // namespace

void open(const std::string& dir, int rank, const std::string& name, int64_t every, int64_t clock_offset_us) {
  close();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  auto t = std::make_unique<Tracer>();
  t->path = (std::filesystem::path(dir) / cat("rank_", rank, ".jsonl")).string();
  t->rank = rank, t->every = every > 0 ? every : 1;
  std::FILE* f = std::fopen(t->path.c_str(), "a");
  if (!f) throw_runtime("trace: cannot write ", t->path, ": choose a writable --run-dir (or observe.trace = false)");
  const nlohmann::json header = {{"rank", rank}, {"name", name}, {"clock_offset_us", clock_offset_us}};
  // A line an earlier start's crash cut stays a line of its own, which the merge passes over,
  // rather than swallowing this header.
  bool cut = false;
  if (std::FILE* r = std::fopen(t->path.c_str(), "r")) {
    cut = std::fseek(r, -1, SEEK_END) == 0 && std::fgetc(r) != '\n';
    std::fclose(r);
  }
  std::fprintf(f, "%s%s\n", cut ? "\n" : "", header.dump().c_str());
  std::fclose(f);
  Tracer* raw = t.get();
  t->flusher = std::thread([raw] {
    while (!raw->stop.load()) {
      for (int i = 0; i < 10 && !raw->stop.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      raw->flush();
    }
  });
  g_tracer = std::move(t);
}

void close() {
  if (!g_tracer) return;
  g_tracer->stop = true;
  if (g_tracer->flusher.joinable()) g_tracer->flusher.join();
  g_tracer->flush();
  g_tracer.reset();
}

void set_step(int64_t step) {
  if (g_tracer) g_tracer->keep = step % g_tracer->every == 0, g_tracer->step = step;
}

bool active() { return g_tracer && g_tracer->keep.load(); }

int64_t from_system_us(int64_t us) { return us + clock_skew_us(); }

int64_t now_us() {
  return from_system_us(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

void complete(const std::string& name, const char* cat, int64_t t0_us, int64_t t1_us, int tid, nlohmann::json args) {
  if (!active()) return;
  complete_for(g_tracer->step.load(), name, cat, t0_us, t1_us, tid, std::move(args));
}

void complete_for(int64_t step, const std::string& name, const char* cat, int64_t t0_us, int64_t t1_us, int tid,
                  nlohmann::json args) {
  if (!g_tracer || step % g_tracer->every != 0) return;
  args["step"] = step;
  g_tracer->add({{"ph", "X"}, {"name", name}, {"cat", cat}, {"ts", t0_us}, {"dur", std::max<int64_t>(0, t1_us - t0_us)},
                 {"tid", tid}, {"args", std::move(args)}});
}

void flow(bool start, uint64_t id, int64_t ts_us, int tid) {
  if (!active()) return;
  char hex[24];
  std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(id));
  nlohmann::json e = {{"ph", start ? "s" : "f"}, {"name", "flow"}, {"cat", "flow"}, {"id", hex}, {"ts", ts_us},
                      {"tid", tid}, {"args", {{"step", g_tracer->step.load()}}}};
  if (!start) e["bp"] = "e";  // bound to the enclosing slice
  g_tracer->add(std::move(e));
}

Span::Span(const char* name, nlohmann::json args) : name_(name), args_(std::move(args)) {
  if (active()) t0_ = now_us();
}

Span::~Span() {
  if (t0_ >= 0) complete(name_, "step", t0_, now_us(), 0, std::move(args_));
}

namespace {

// A value of a trace line, short enough for a one-line error.
std::string shown(const nlohmann::json& v) {
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

// A line of a rank's file has the fields the merge reads, of the types open() and complete()
// write: a damaged or foreign file is refused by name rather than copied into the timeline.
// `rank`: the header's (-1 for a header).
void check_line(const nlohmann::json& e, const std::string& where, int rank) {
  auto fail = [&](const char* field, const std::string& want) {
    throw_input("trace: ", where, ": ", field, " must be ", want,
                e.contains(field) ? cat(", got ", shown(e[field])) : std::string(" (missing)"),
                ": not a trace Myriad wrote; move the file out of traces/ or trace the run again");
  };
  auto is = [&](const char* field, bool (nlohmann::json::*type)() const noexcept) {
    return e.contains(field) && (e[field].*type)();
  };
  if (rank < 0) {
    if (!is("rank", &nlohmann::json::is_number_unsigned) || e["rank"].get<uint64_t>() > (1u << 30))
      fail("rank", "a rank number");
    if (!is("clock_offset_us", &nlohmann::json::is_number_integer)) fail("clock_offset_us", "an integer");
    if (e.contains("name") && !e["name"].is_string()) fail("name", "a string");
    return;
  }
  if (!is("ph", &nlohmann::json::is_string)) fail("ph", "an event phase (\"X\", \"s\", ...)");
  if (!is("ts", &nlohmann::json::is_number_integer)) fail("ts", "an integer (microseconds)");
  if (!is("pid", &nlohmann::json::is_number_integer) || e["pid"].get<int64_t>() != rank)
    fail("pid", cat("the header's rank, ", rank));
  if (e.contains("args") && !(e["args"].is_object() && (!e["args"].contains("step") || e["args"]["step"].is_number_integer())))
    fail("args", "an object whose step is an integer");
}

// The fields of a merged timeline besides its events; otherData is the trace format's place for
// metadata, and says who wrote the file.
nlohmann::json timeline_head() {
  return {{"displayTimeUnit", "ms"}, {"otherData", {{"producer", "myriad trace"}}}};
}

}  // namespace

bool is_merged_timeline(const std::string& path) {
  // nlohmann's objects sort their keys, so the head comes before "traceEvents" in the compact
  // text: its first bytes tell, without reading a timeline of any size.
  std::string head = timeline_head().dump();
  head.back() = ',';
  std::ifstream in(path, std::ios::binary);
  std::string start(head.size(), '\0');
  return in.read(start.data(), static_cast<std::streamsize>(start.size())) && start == head;
}

nlohmann::json merge(const std::string& run_dir, int64_t first, int64_t last) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(run_dir) / "traces";
  nlohmann::json events = nlohmann::json::array();
  int files = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("rank_", 0) != 0 || entry.path().extension() != ".jsonl") continue;
    ++files;
    std::ifstream in(entry.path());
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(std::move(line));
    int64_t offset = 0;
    int rank = -1;
    bool headed = false;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string where = cat(entry.path().string(), ", line ", i + 1);
      nlohmann::json e = nlohmann::json::parse(lines[i], nullptr, false);
      if (!e.is_object()) {
        // A crash cuts at most the last line a start wrote: the file's last, or the one before
        // the next start's header (open() ends a cut line first). Anything else is not a trace.
        const bool cut = i + 1 == lines.size() ||
                         nlohmann::json::parse(lines[i + 1], nullptr, false).contains("clock_offset_us");
        if (cut && headed) continue;
        throw_input("trace: ", where, " is not a JSON object: not a trace Myriad wrote; move the file out of traces/ "
                    "or trace the run again");
      }
      if (e.contains("clock_offset_us")) {  // a header (one per start of the rank)
        check_line(e, where, -1);
        rank = e["rank"].get<int>();
        if (name != cat("rank_", rank, ".jsonl"))
          throw_input("trace: ", where, ": the header says rank ", rank, ": the file was renamed or copied; move it "
                      "out of traces/");
        offset = e["clock_offset_us"].get<int64_t>();
        headed = true;
        events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"args", {{"name", e.value("name", "")}}}});
        events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rank}, {"args", {{"sort_index", rank}}}});
        for (const auto& [tid, lane] : {std::pair<int, const char*>{0, "work"}, {1, "communication"}, {2, "steps"},
                                        {3, "checkpoint writer"}})
          events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", tid}, {"args", {{"name", lane}}}});
        continue;
      }
      if (!headed)
        throw_input("trace: ", where, ": an event before the file's header {rank, name, clock_offset_us}: not a trace "
                    "Myriad wrote; move the file out of traces/ or trace the run again");
      check_line(e, where, rank);
      const int64_t step = e.contains("args") ? e["args"].value("step", int64_t(0)) : 0;
      if (step < first || step > last) continue;
      e["ts"] = e["ts"].get<int64_t>() - offset;
      events.push_back(std::move(e));
    }
    if (!headed)
      throw_input("trace: ", entry.path().string(), " has no header {rank, name, clock_offset_us}: not a trace Myriad "
                  "wrote; move the file out of traces/ or trace the run again");
  }
  if (files == 0)
    throw_input("trace: ", dir.string(), " holds no traces (rank_*.jsonl): train with --set observe.trace=true");
  nlohmann::json timeline = timeline_head();
  timeline["traceEvents"] = std::move(events);
  return timeline;
}

}  // namespace myriad::trace
