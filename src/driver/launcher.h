// The process side of a node's launcher: starts this node's worker processes, carries their
// output to one log per rank and to the console, watches them, and stops them.
//
// Each worker runs in its own process group (a signal reaches whatever the worker starts), with
// stdin from /dev/null and stdout/stderr through pipes that the launcher reads, and with
// PR_SET_PDEATHSIG(SIGKILL): a launcher that dies, even by SIGKILL, takes its workers with it, so
// a launch never leaves orphans behind.
//
// Output: every complete line of a worker goes to its log (appended; the launcher adds a header
// line when the worker starts and a footer line when it ends, both starting with "== "). The
// console (the launcher's own stdout and stderr, matching the worker's stream) shows every line
// of the worker whose rank is Options::echo_rank, prefixed "[rank R] ", and the error lines
// (those starting with "myriad: ") of every other worker, prefixed the same way.
//
// Signals: while a Launcher exists, SIGINT, SIGTERM and SIGCHLD are caught by a handler that
// writes to a pipe the launcher polls (whichever thread of the process receives them); wait()
// reports SIGINT and SIGTERM as events. SIGPIPE is ignored (a closed console must not kill the
// launcher). The destructor restores all four. One Launcher per process at a time.
//
// Stopping: stop(sig) sends `sig` to every running worker; those still running grace_s later get
// SIGKILL (from wait(), which must keep being called). A second stop() sends SIGKILL at once. A
// stop ends when no worker is left running; workers spawned after that start afresh. The
// launcher's own stops (the healthy peers of a failed worker, a hang) send kStopSignal, which
// ends a worker at once; SIGTERM is left to mean a preemption, which a trainer answers by saving
// first (core/preemption.h).
//
// This class is the mechanism; the policy of `myriad launch` (the first failure stops the rest,
// signals are forwarded) is run(). A communication fault waits driver/policy.h's kEchoWait_s
// before it stops the rest: it may be the echo of a peer that failed on its own, which then is
// the failure. A supervised launch's agent (driver/agent.h) runs it once per attempt.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace myriad::driver {

// What the launcher stops its workers with (its own decision, not a preemption): SIGINT, whose
// default action ends a worker at once, as Ctrl-C does a trainer run by hand.
constexpr int kStopSignal = SIGINT;

// What one worker process runs.
struct WorkerSpec {
  int rank = 0;        // global rank: names the worker in logs and messages
  int local_rank = 0;  // its index on this node
  std::string exe;     // the program to execute, e.g. "/proc/self/exe"
  std::vector<std::string> argv;  // argv[0] included
  // Variables set (or replaced) over the launcher's own environment, in this order.
  std::vector<std::pair<std::string, std::string>> env;
  std::string log_path;  // stdout and stderr are appended here; the directory must exist
};

// How a worker ended.
struct WorkerExit {
  int index = -1;  // in spawn order
  int rank = 0;
  pid_t pid = 0;
  int code = 0;          // the exit status, when it exited
  int signal = 0;        // the signal that killed it; 0 when it exited
  bool stopped = false;  // the launcher had asked it to stop (stop()) before it ended
  double seconds = 0;    // from spawn to exit

  bool ok() const { return signal == 0 && code == 0; }
  // The class of a failure: a signal is a runtime fault; codes 1..5 are their class
  // (core/error.h); any other nonzero code is an internal error (Myriad never exits with one).
  ErrorClass error_class() const;
  // "exited with code 2 (input error)", "was killed by SIGKILL (runtime fault)",
  // "exited with code 0".
  std::string describe() const;
};

// "SIGTERM", "SIGKILL", ... or "signal N".
std::string signal_name(int sig);

// `url` with the password of "scheme://[user]:password@host..." replaced by "***" (for logs).
std::string without_password(const std::string& url);

// What ended a run().
struct RunResult {
  std::optional<WorkerExit> failure;  // the first worker observed to fail on its own
  int signal = 0;                     // the signal (SIGINT, SIGTERM) that stopped the launch
  std::vector<WorkerExit> exits;      // every worker's, in spawn order
  double seconds = 0;

  // A preemption reached the job: a preemption signal to the launcher, or a worker that exited
  // preempted (ErrorClass::kPreempted) because the batch system signalled it directly.
  bool preempted = false;

  bool ok() const { return !failure && signal == 0 && !preempted; }
  // 0; the first failure's class; preempted; a runtime fault when the launch was stopped by a
  // signal.
  int exit_code() const;
};

class Launcher {
 public:
  struct Options {
    double grace_s = 10;  // between the stop signal and SIGKILL
    // A preemption from outside (SIGTERM, or preempt_signal when not 0) is passed on to the
    // workers as SIGTERM; they save and exit, and those still running preempt_grace_s later get
    // SIGKILL. Copies within 2 s of the first count once; a later one is passed on again (a
    // trainer already saving then exits at once).
    double preempt_grace_s = 30;
    int preempt_signal = 0;
    int echo_rank = 0;    // the rank whose every line the console shows; -1: none
    bool echo_errors = true;  // show the "myriad: " lines of every other rank
    // Called with every complete line any worker writes (after it is logged): a supervisor
    // reads progress from it (`myriad launch --max-restarts`: the first step after a restart).
    std::function<void(int rank, std::string_view line)> on_line;
    // Called when a worker's failure is about to stop the others, before the stop signal: a
    // supervisor may ask them for their state first (the flight records, after a collective
    // timed out).
    std::function<void(const WorkerExit& failure)> before_stop;
  };

  explicit Launcher(Options options);
  // Stops every worker still running (SIGTERM, then SIGKILL after the grace period), reaps them,
  // and restores the signal mask and SIGPIPE.
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  // Starts a worker; returns its index. Throws Error(kRuntime) when it cannot be started (the log
  // cannot be opened, fork or exec failed).
  int spawn(const WorkerSpec& spec);

  struct Event {
    enum class Kind { kExit, kSignal };
    Kind kind = Kind::kExit;
    WorkerExit exit;  // kExit
    int signal = 0;   // kSignal: SIGINT or SIGTERM, received by the launcher
  };
  // Waits up to timeout_s (0: only what is ready) for events, carrying output meanwhile, and
  // returns them in the order observed; escalates a stop to SIGKILL once its grace period ends.
  std::vector<Event> wait(double timeout_s);

  // Sends `sig` to every running worker; the first call starts the grace period (grace_s, or
  // Options::grace_s when negative), a later one sends SIGKILL at once, except during a
  // preemption's stop (SIGTERM): workers that are saving then keep their grace period, and only
  // its end, or an explicit SIGKILL, kills them.
  void stop(int sig = kStopSignal, double grace_s = -1);
  bool stopping() const { return stop_started_ >= 0; }

  int size() const { return static_cast<int>(workers_.size()); }
  int running() const;
  bool running(int index) const;  // whether that worker has not ended yet
  pid_t pid(int index) const;
  const WorkerSpec& spec(int index) const;

  // The policy of `myriad launch`: waits until every worker has ended. The first worker observed
  // to fail (nonzero exit or killed by a signal, not after a stop) stops the others; a worker
  // that exits preempted is no failure (its peers, which agreed on the step, save and exit too).
  // A SIGINT to the launcher is forwarded to the workers (a second one sends SIGKILL); a
  // preemption signal as Options says. `tick`, when given, runs about once a second meanwhile
  // (watching the store, say).
  RunResult run(const std::function<void()>& tick = nullptr);

 private:
  struct Stream {
    int fd = -1;
    bool is_err = false;
    std::string partial;  // bytes after the last newline
  };
  struct Worker {
    WorkerSpec spec;
    pid_t pid = 0;
    int log_fd = -1;
    Stream out, err;
    double started = 0;
    bool running = false;
    std::optional<WorkerExit> exit;
  };

  void pump(Worker& w, Stream& s, bool final);  // reads what is there; final: then closes it
  void emit(Worker& w, Stream& s, const char* data, size_t n);  // logs and echoes whole lines
  void flush_partial(Worker& w, Stream& s);                     // a last line without newline
  void read_signals(std::vector<Event>& events);
  void reap(std::vector<Event>& events);
  void signal_running(int sig);

  Options options_;
  std::vector<Worker> workers_;
  int signal_pipe_[2] = {-1, -1};  // the handler writes each signal's number, wait() reads them
  int devnull_ = -1;
  double stop_started_ = -1;  // steady seconds; -1: not stopping
  double stop_grace_s_ = 0;   // the grace period of the stop under way
  int stop_signal_ = 0;       // the signal it sent
  bool killed_ = false;       // SIGKILL sent to the stop's survivors
  struct sigaction old_int_ {}, old_term_ {}, old_chld_ {}, old_pipe_ {}, old_preempt_ {};
};

}  // namespace myriad::driver
