// A worker's heartbeat to its launcher: a small file (MYRIAD_HEARTBEAT, set by `myriad launch`)
// rewritten every second by a thread of its own with the worker's progress:
//
//   "<beat> <step> <phase> <allowance_s> <own_ms>\n"
//
// beat counts up each second, step is the last completed step, phase what the worker is doing
// (start, train, eval, checkpoint) and allowance_s how long the launcher may see step stand
// still before it calls the run hung. own_ms is the median of the worker's recent steps' own
// time: each step's wall time (from the end of the one before) less the time it sat blocked on
// its peers; 0 until known. Ranks that wait for a straggler show the wait as blocked time, the
// straggler shows it as its own, so the launcher can tell which rank is slow. A process that is frozen (stopped, or gone) stops beating;
// one whose training is stuck (a hung collective, a stuck kernel) beats on with a step that
// does not move: the launcher tells the two apart by that. Without MYRIAD_HEARTBEAT it does
// nothing.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

namespace myriad {

class Heartbeat {
 public:
  // Reads MYRIAD_HEARTBEAT; until set() the beats allow `startup_s` before the first step.
  explicit Heartbeat(double startup_s);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // What the next beats say. phase is a string literal.
  void set(int64_t step, const char* phase, double allowance_s);
  void set_own_ms(double ms) { own_ms_ = ms; }

 private:
  void beat();
  std::string path_;
  std::atomic<int64_t> step_{0}, beats_{0};
  std::atomic<const char*> phase_{"start"};
  std::atomic<double> allowance_s_{0}, own_ms_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace myriad
