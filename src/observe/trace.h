// The per-rank event timeline (observe.trace = true): RUN_DIR/traces/rank_<R>.jsonl, one Chrome
// trace event per line, appended by a background thread each second from a buffer the training
// thread fills; `myriad trace RUN_DIR` merges the ranks into one Chrome trace (Perfetto,
// chrome://tracing).
//
// The file's first line is its header: {"rank", "name" (the rank's tp/pp/dp coordinates),
// "clock_offset_us"}: how far this rank's clock runs ahead of rank 0's, measured at start (see
// Distributed::clock_offset_us); the merge subtracts it. Then events:
//   {"ph": "X", "name", "cat", "ts" (µs, this rank's system clock), "dur", "tid", "args"}
//   tid 0: the step's work: data, checkpoint and evaluation in host times; forward and backward
//          of each micro-batch and chunk, and the optimizer, from the op set's marks (CUDA events
//          on a GPU), placed on the host clock after the step from the update's last mark, which
//          the step already waits for (no extra synchronization);
//   tid 1: communication, each operation from its start to its end (comm/communicator.h records);
//   tid 2: each step, from the end of the one before, with args.own_ms: its time less its waits
//          on peers (pipeline receives, data-parallel collectives), what `myriad report` maps;
//   tid 3: each checkpoint's background write (stage 2), under the step it saves; its stage 1
//          (the snapshot, in the step) is on tid 0;
//   {"ph": "s" / "f", "id", ...}: flow arrows, from a pipeline send to its receive and from a
//          collective's start on its group's first rank to its start on each other member.
// Only steps that are multiples of observe.trace_every are traced. Off (no file, no buffer) by
// default. One process traces at a time (a process-wide buffer of at most 2^18 events between
// flushes: if the writes fall behind, the oldest are dropped and a "trace events dropped" event
// says how many).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace myriad::trace {

// Every event's args carry the step it belongs to ("step"), for `myriad trace --steps`.
// Starts tracing to DIR/rank_<rank>.jsonl (DIR created; a file of an earlier start is appended
// to, its header repeated).
void open(const std::string& dir, int rank, const std::string& name, int64_t every, int64_t clock_offset_us);
// Flushes and stops (the destructor of a training process's Trainer).
void close();

// The merged timeline of RUN_DIR/traces/rank_*.jsonl, as a Chrome trace: one process per rank
// named by its coordinates, the clocks aligned to rank 0's, only the steps in [first, last].
// An input error naming the directory when it holds no trace, and naming the file, line and
// field when a file there is not a trace Myriad wrote (a line cut by a crash is passed over).
// Its otherData.producer is "myriad trace": the mark of a timeline Myriad wrote.
nlohmann::json merge(const std::string& run_dir, int64_t first, int64_t last);
// Whether the file `path` is a merged timeline as `myriad trace` writes it (merge()'s compact
// dump), which the command may replace; false for any other file, or one it cannot read.
bool is_merged_timeline(const std::string& path);
// The step about to run: whether its events are kept.
void set_step(int64_t step);
bool active();
// Microseconds on this process's trace clock (the system clock; MYRIAD_TRACE_CLOCK_SKEW =
// "R:US" adds US on rank R, a test knob for the alignment).
int64_t now_us();
// A time of the system clock (a communicator's record) on the trace clock.
int64_t from_system_us(int64_t us);
// A complete event [t0, t1) on lane `tid`.
void complete(const std::string& name, const char* cat, int64_t t0_us, int64_t t1_us, int tid,
              nlohmann::json args = nlohmann::json::object());
// The same for a given step, traced or not as that step is (work that ends after its step, as
// a checkpoint's background write). Called by the training thread.
void complete_for(int64_t step, const std::string& name, const char* cat, int64_t t0_us, int64_t t1_us, int tid,
                  nlohmann::json args = nlohmann::json::object());
// A flow arrow's start ("s") or end ("f") at `ts` on lane `tid`.
void flow(bool start, uint64_t id, int64_t ts_us, int tid);

// A span on lane 0 from construction to destruction, when the step is traced.
class Span {
 public:
  Span(const char* name, nlohmann::json args = nlohmann::json::object());
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  const char* name_;
  nlohmann::json args_;
  int64_t t0_ = -1;
};

}  // namespace myriad::trace
