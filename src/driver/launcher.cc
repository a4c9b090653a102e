#include "driver/launcher.h"

#include "driver/policy.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <iomanip>
#include <sstream>

#include "core/clock.h"
#include "core/log.h"

extern char** environ;

namespace myriad::driver {
namespace {

constexpr size_t kMaxLine = 1 << 20;  // a longer line without newline is cut here

// The write end of the live Launcher's signal pipe (-1: none).
volatile sig_atomic_t g_signal_pipe = -1;

void on_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  if (g_signal_pipe >= 0) {
    ssize_t ignored = ::write(g_signal_pipe, &b, 1);  // a full pipe drops it: nothing pending is lost
    (void)ignored;                                    // that reap() would not find anyway
  }
  errno = saved;
}

// The signals whose handlers a Launcher replaces (SIGPIPE: ignored).
constexpr int kCaught[] = {SIGINT, SIGTERM, SIGCHLD};

// "2025-01-31 12:34:56", local time.
std::string timestamp() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

// Writes everything, retrying on EINTR; gives up silently on other errors (a full disk must not
// stop the launcher from watching its workers).
void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w, n -= static_cast<size_t>(w);
  }
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

std::string errno_text(int e) { return std::strerror(e); }

// The environment of a worker: the launcher's, with `env` set over it.
std::vector<std::string> worker_environment(
    const std::vector<std::pair<std::string, std::string>>& env) {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string s = *e;
    const std::string key = s.substr(0, s.find('='));
    bool replaced = false;
    for (const auto& kv : env) replaced = replaced || kv.first == key;
    if (!replaced) out.push_back(s);
  }
  for (const auto& kv : env) out.push_back(kv.first + "=" + kv.second);
  return out;
}

std::string seconds_text(double s) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(s < 10 ? 2 : 1) << s;
  return os.str();
}

}  // namespace

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGSYS: return "SIGSYS";
    default: return cat("signal ", sig);
  }
}

std::string without_password(const std::string& url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return url;
  const size_t host_end = url.find('/', scheme + 3);
  const size_t at = url.rfind('@', host_end == std::string::npos ? std::string::npos : host_end);
  if (at == std::string::npos || at < scheme + 3) return url;
  const size_t colon = url.find(':', scheme + 3);
  if (colon == std::string::npos || colon > at) return url;  // a user name, no password
  return url.substr(0, colon + 1) + "***" + url.substr(at);
}

ErrorClass WorkerExit::error_class() const {
  if (signal != 0) return ErrorClass::kRuntime;
  if (code >= 1 && code <= 6) return static_cast<ErrorClass>(code);
  return ErrorClass::kInternal;
}

std::string WorkerExit::describe() const {
  if (signal != 0)
    return cat("was killed by ", signal_name(signal), " (", class_name(error_class()), ")");
  if (code == 0) return "exited with code 0";
  return cat("exited with code ", code, " (", class_name(error_class()), ")");
}

int RunResult::exit_code() const {
  if (failure) return ::myriad::exit_code(failure->error_class());
  if (preempted) return ::myriad::exit_code(ErrorClass::kPreempted);
  if (signal != 0) return ::myriad::exit_code(ErrorClass::kRuntime);
  return 0;
}

Launcher::Launcher(Options options) : options_(options) {
  if (!(options_.grace_s >= 0) || !std::isfinite(options_.grace_s))
    throw_input("launch: the grace period must be a number of seconds >= 0, got ", options_.grace_s);
  MYRIAD_CHECK(g_signal_pipe < 0, "one Launcher per process at a time");
  // Descriptors 0-2 must be open, or a pipe could land on one and be lost at a worker's dup2.
  for (int fd = 0; fd <= 2; ++fd)
    if (::fcntl(fd, F_GETFD) < 0) {
      int nul = ::open("/dev/null", O_RDWR);
      if (nul >= 0 && nul != fd) ::dup2(nul, fd), ::close(nul);
    }
  devnull_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull_ < 0) throw_runtime("launch: cannot open /dev/null: ", errno_text(errno));
  if (::pipe2(signal_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    const int e = errno;
    close_fd(devnull_);
    throw_runtime("launch: cannot create a pipe: ", errno_text(e));
  }
  g_signal_pipe = signal_pipe_[1];
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, &old_int_);
  ::sigaction(SIGTERM, &sa, &old_term_);
  if (options_.preempt_signal > 0) ::sigaction(options_.preempt_signal, &sa, &old_preempt_);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  ::sigaction(SIGCHLD, &sa, &old_chld_);
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  ::sigaction(SIGPIPE, &ign, &old_pipe_);
}

Launcher::~Launcher() {
  try {
    if (running() > 0) {
      stop(kStopSignal);
      while (running() > 0) wait(0.5);
    }
  } catch (...) {
  }
  for (Worker& w : workers_) {
    close_fd(w.out.fd);
    close_fd(w.err.fd);
    close_fd(w.log_fd);
  }
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
  if (options_.preempt_signal > 0) ::sigaction(options_.preempt_signal, &old_preempt_, nullptr);
  ::sigaction(SIGCHLD, &old_chld_, nullptr);
  ::sigaction(SIGPIPE, &old_pipe_, nullptr);
  g_signal_pipe = -1;
  close_fd(signal_pipe_[0]);
  close_fd(signal_pipe_[1]);
  close_fd(devnull_);
}

int Launcher::running() const {
  return static_cast<int>(
      std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; }));
}

bool Launcher::running(int index) const { return workers_.at(static_cast<size_t>(index)).running; }

pid_t Launcher::pid(int index) const { return workers_.at(static_cast<size_t>(index)).pid; }

const WorkerSpec& Launcher::spec(int index) const {
  return workers_.at(static_cast<size_t>(index)).spec;
}

int Launcher::spawn(const WorkerSpec& spec) {
  MYRIAD_CHECK(!spec.argv.empty() && !spec.exe.empty(), "a worker needs a program and argv[0]");
  Worker w;
  w.spec = spec;
  w.out.is_err = false;
  w.err.is_err = true;
  w.log_fd = ::open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (w.log_fd < 0)
    throw_runtime("launch: cannot open the log ", spec.log_path, ": ", errno_text(errno));

  int out[2] = {-1, -1}, err[2] = {-1, -1}, status[2] = {-1, -1};
  auto close_all = [&] {
    for (int* p : {out, err, status}) close_fd(p[0]), close_fd(p[1]);
    close_fd(w.log_fd);
  };
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 ||
      ::pipe2(status, O_CLOEXEC) != 0) {
    const int e = errno;
    close_all();
    throw_runtime("launch: cannot create pipes for rank ", spec.rank, ": ", errno_text(e));
  }

  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  const std::vector<std::string> env_strings = worker_environment(spec.env);
  std::vector<char*> argv_p, env_p;
  for (const std::string& a : spec.argv) argv_p.push_back(const_cast<char*>(a.c_str()));
  argv_p.push_back(nullptr);
  for (const std::string& e : env_strings) env_p.push_back(const_cast<char*>(e.c_str()));
  env_p.push_back(nullptr);
  const char* exe = spec.exe.c_str();
  const pid_t parent = ::getpid();
  const int devnull = devnull_;

  // The caught signals stay blocked across fork until the child has put back their defaults, so
  // that our handler never runs in it.
  sigset_t caught, before;
  sigemptyset(&caught);
  for (int sig : kCaught) sigaddset(&caught, sig);
  const int preempt_signal = options_.preempt_signal;
  if (preempt_signal > 0) sigaddset(&caught, preempt_signal);
  ::pthread_sigmask(SIG_BLOCK, &caught, &before);
  const pid_t pid = ::fork();
  if (pid != 0) ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  if (pid < 0) {
    const int e = errno;
    close_all();
    throw_runtime("launch: cannot start rank ", spec.rank, ": fork: ", errno_text(e));
  }
  if (pid == 0) {  // the worker, until exec
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the launcher died before prctl
    const int from[3] = {devnull, out[1], err[1]};
    for (int fd = 0; fd < 3; ++fd) {
      if (from[fd] == fd)
        ::fcntl(fd, F_SETFD, 0);  // keep it across exec
      else
        ::dup2(from[fd], fd);
    }
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGCHLD, preempt_signal})
      if (sig > 0) ::sigaction(sig, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(exe, argv_p.data(), env_p.data());
    const int e = errno;
    ssize_t ignored = ::write(status[1], &e, sizeof e);
    (void)ignored;
    ::_exit(127);
  }

  ::setpgid(pid, pid);  // also here, so that a signal to the group cannot precede the child's own
  close_fd(out[1]);
  close_fd(err[1]);
  close_fd(status[1]);
  int exec_errno = 0;
  ssize_t n;
  do {
    n = ::read(status[0], &exec_errno, sizeof exec_errno);
  } while (n < 0 && errno == EINTR);
  close_fd(status[0]);
  if (n == static_cast<ssize_t>(sizeof exec_errno)) {
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    close_all();
    throw_runtime("launch: cannot start rank ", spec.rank, ": ", spec.exe, ": ",
                  errno_text(exec_errno));
  }
  for (int fd : {out[0], err[0]}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  w.out.fd = out[0];
  w.err.fd = err[0];
  w.pid = pid;
  w.started = now_s();
  w.running = true;

  std::ostringstream head;
  head << "== " << timestamp() << " launch: rank " << spec.rank << " (local rank "
       << spec.local_rank << ") started, pid " << pid << ":";
  for (const std::string& a : spec.argv) head << ' ' << a;
  head << "\n== environment:";
  for (const auto& kv : spec.env) head << ' ' << kv.first << '=' << without_password(kv.second);
  head << '\n';
  write_all(w.log_fd, head.str().data(), head.str().size());

  workers_.push_back(std::move(w));
  return static_cast<int>(workers_.size()) - 1;
}

void Launcher::emit(Worker& w, Stream& s, const char* data, size_t n) {
  s.partial.append(data, n);
  std::string log_text, console;
  const std::string prefix = cat("[rank ", w.spec.rank, "] ");
  const bool echo_all = w.spec.rank == options_.echo_rank;
  size_t start = 0;
  for (size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    const char* line = s.partial.data() + start;
    const size_t len = nl - start;
    log_text.append(line, len + 1);
    const bool error_line = len >= 8 && std::memcmp(line, "myriad: ", 8) == 0;
    if (echo_all || (options_.echo_errors && error_line))
      console.append(prefix).append(line, len + 1);
    if (options_.on_line) options_.on_line(w.spec.rank, std::string_view(line, len));
  }
  s.partial.erase(0, start);
  if (s.partial.size() >= kMaxLine) {  // no newline in sight: pass it on as a line
    s.partial.push_back('\n');
    std::string rest;
    rest.swap(s.partial);
    log_text += rest;
    if (echo_all) console.append(prefix).append(rest);
  }
  if (!log_text.empty()) write_all(w.log_fd, log_text.data(), log_text.size());
  if (!console.empty()) {
    FILE* f = s.is_err ? stderr : stdout;
    std::fwrite(console.data(), 1, console.size(), f);
    std::fflush(f);
  }
}

void Launcher::flush_partial(Worker& w, Stream& s) {
  if (s.partial.empty()) return;
  const char nl = '\n';
  emit(w, s, &nl, 1);
}

void Launcher::pump(Worker& w, Stream& s, bool final) {
  char buf[65536];
  for (int chunks = 0; s.fd >= 0 && (final || chunks < 16); ++chunks) {
    const ssize_t n = ::read(s.fd, buf, sizeof buf);
    if (n > 0) {
      emit(w, s, buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    flush_partial(w, s);  // end of file (or a read error): the stream is done
    close_fd(s.fd);
  }
  if (final && s.fd >= 0) {  // the worker has ended; what a child of it writes later is dropped
    flush_partial(w, s);
    close_fd(s.fd);
  }
}

void Launcher::read_signals(std::vector<Event>& events) {
  unsigned char buf[64];
  for (;;) {
    const ssize_t n = ::read(signal_pipe_[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    for (ssize_t i = 0; i < n; ++i)
      if (buf[i] == SIGINT || buf[i] == SIGTERM || (options_.preempt_signal > 0 && buf[i] == options_.preempt_signal)) {
        // (SIGCHLD only wakes us: reap() looks at all)
        Event e;
        e.kind = Event::Kind::kSignal;
        e.signal = buf[i];
        events.push_back(e);
      }
  }
}

void Launcher::reap(std::vector<Event>& events) {
  for (size_t i = 0; i < workers_.size(); ++i) {
    Worker& w = workers_[i];
    if (!w.running) continue;
    int st = 0;
    pid_t r;
    do {
      r = ::waitpid(w.pid, &st, WNOHANG);
    } while (r < 0 && errno == EINTR);
    if (r == 0) continue;
    WorkerExit x;
    x.index = static_cast<int>(i);
    x.rank = w.spec.rank;
    x.pid = w.pid;
    x.stopped = stopping();
    x.seconds = now_s() - w.started;
    if (r < 0)
      x.code = 255;  // not our child any more (cannot happen): an internal error
    else if (WIFSIGNALED(st))
      x.signal = WTERMSIG(st);
    else
      x.code = WEXITSTATUS(st);
    pump(w, w.out, true);
    pump(w, w.err, true);
    const std::string how =
        !x.stopped ? x.describe()
                   : cat("was stopped by the launcher (",
                         x.signal ? "killed by " + signal_name(x.signal) : cat("exit code ", x.code),
                         ")");
    const std::string foot = cat("== ", timestamp(), " launch: rank ", w.spec.rank, " (pid ", w.pid,
                                 ") ", how, ", ", seconds_text(x.seconds), " s after its start\n");
    write_all(w.log_fd, foot.data(), foot.size());
    close_fd(w.log_fd);
    w.running = false;
    w.exit = x;
    Event e;
    e.kind = Event::Kind::kExit;
    e.exit = x;
    events.push_back(e);
  }
  if (stopping() && running() == 0) stop_started_ = -1, killed_ = false;
}

void Launcher::signal_running(int sig) {
  for (Worker& w : workers_) {
    if (!w.running) continue;
    if (::kill(-w.pid, sig) != 0 && errno == ESRCH) ::kill(w.pid, sig);
  }
}

void Launcher::stop(int sig, double grace_s) {
  if (stopping() && stop_signal_ == SIGTERM && sig != SIGKILL) return;  // a preemption's save runs on
  if (!stopping()) {
    stop_started_ = now_s();
    stop_signal_ = sig;
    stop_grace_s_ = grace_s >= 0 ? grace_s : options_.grace_s;
    killed_ = false;
    signal_running(sig);
  } else if (!killed_) {
    killed_ = true;
    signal_running(SIGKILL);
  }
}

std::vector<Launcher::Event> Launcher::wait(double timeout_s) {
  std::vector<Event> events;
  const double deadline = now_s() + std::max(0.0, timeout_s);
  std::vector<pollfd> fds;
  std::vector<std::pair<Worker*, Stream*>> owners;
  for (;;) {
    // Sleep until output, a signal (SIGCHLD included), the end of a grace period or the deadline.
    double now = now_s(), until = deadline;
    if (stopping() && !killed_) until = std::min(until, stop_started_ + stop_grace_s_);
    fds.clear();
    owners.clear();
    fds.push_back({signal_pipe_[0], POLLIN, 0});
    owners.emplace_back(nullptr, nullptr);
    for (Worker& w : workers_)
      for (Stream* s : {&w.out, &w.err})
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          owners.emplace_back(&w, s);
        }
    const int ms = static_cast<int>(std::ceil(std::max(0.0, until - now) * 1000));
    const int n = ::poll(fds.data(), fds.size(), std::min(ms, 1000));
    if (n < 0 && errno != EINTR) throw_runtime("launch: poll failed: ", errno_text(errno));
    for (size_t i = 1; n > 0 && i < fds.size(); ++i)
      if (fds[i].revents != 0) pump(*owners[i].first, *owners[i].second, false);

    read_signals(events);
    reap(events);
    now = now_s();
    if (stopping() && !killed_ && now >= stop_started_ + stop_grace_s_) {
      killed_ = true;
      log::warn("launch: ", running(), " worker(s) still running ", stop_grace_s_,
                " s after the stop signal: SIGKILL");
      signal_running(SIGKILL);
    }
    if (!events.empty() || now >= deadline) return events;
  }
}

RunResult Launcher::run(const std::function<void()>& tick) {
  RunResult r;
  const double t0 = now_s();
  // A communication fault may be the echo of a peer that left on an error of its own (its groups
  // aborted): before stopping the rest, the cause gets kEchoWait_s to exit and be the failure
  // reported (driver/policy.h).
  double stop_at = -1;  // when a communication fault's grace ends
  auto stop_others = [&](const WorkerExit& x) {
    stop_at = -1;
    if (running() == 0) return;
    log::warn("launch: rank ", x.rank, " ", x.describe(), ": stopping the other ", running(), " worker(s)");
    if (options_.before_stop) options_.before_stop(x);
    stop(kStopSignal);
  };
  double preempted_at = -1;  // when the first preemption signal was passed on
  while (running() > 0) {
    if (tick) tick();
    if (stop_at >= 0 && now_s() >= stop_at) stop_others(*r.failure);
    for (const Event& e : wait(stop_at >= 0 ? 0.1 : 1.0)) {
      const bool preemption = e.kind == Event::Kind::kSignal &&
                              (e.signal == SIGTERM || (options_.preempt_signal > 0 && e.signal == options_.preempt_signal));
      if (preemption) {
        r.preempted = true;
        if (!r.failure && r.signal == 0) r.signal = e.signal;
        if (preempted_at < 0 && !stopping()) {
          preempted_at = now_s();
          log::warn("launch: ", signal_name(e.signal), " received: a preemption; passing SIGTERM on to ", running(),
                    " worker(s) (they save, then exit); SIGKILL to those left in ", options_.preempt_grace_s, " s");
          stop(SIGTERM, options_.preempt_grace_s);
        } else if (preempted_at >= 0 && now_s() - preempted_at > 2) {
          log::warn("launch: ", signal_name(e.signal), " received again: passing it on (a worker already saving exits "
                    "at once)");
          signal_running(SIGTERM);
        }  // else a copy of the first (or the workers are being stopped already)
      } else if (e.kind == Event::Kind::kSignal) {
        if (!stopping()) {
          if (!r.failure && r.signal == 0) r.signal = e.signal;
          log::warn("launch: ", signal_name(e.signal), " received: passing it on to ", running(),
                    " worker(s); SIGKILL to those left in ", options_.grace_s, " s");
        } else {
          log::warn("launch: ", signal_name(e.signal), " received again: SIGKILL to ",
                    running(), " worker(s)");
        }
        stop(e.signal);
      } else if (e.exit.error_class() == ErrorClass::kPreempted && !e.exit.ok()) {
        r.preempted = true;  // signalled directly; its peers save the same step and exit too
      } else if (!e.exit.ok() && !e.exit.stopped && r.signal == 0 && !stopping()) {
        const bool echo = e.exit.error_class() == ErrorClass::kComm;
        if (!r.failure) {
          r.failure = e.exit;
          if (echo) stop_at = now_s() + kEchoWait_s;
          else stop_others(e.exit);
        } else if (!echo && r.failure->error_class() == ErrorClass::kComm) {
          r.failure = e.exit;  // the cause, after its echo
          stop_others(e.exit);
        }
      }
    }
  }
  for (const Worker& w : workers_)
    if (w.exit) r.exits.push_back(*w.exit);
  // A preemption that came as the run ended: every worker finished it (exit 0, its last step
  // saved), so the job is done, not preempted.
  if (r.preempted && !r.failure && !r.exits.empty() &&
      std::all_of(r.exits.begin(), r.exits.end(), [](const WorkerExit& x) { return x.ok(); }) &&
      r.exits.size() == workers_.size()) {
    log::info("launch: the preemption came as the run ended: every worker finished (exit 0)");
    r.preempted = false, r.signal = 0;
  }
  r.seconds = now_s() - t0;
  return r;
}

}  // namespace myriad::driver
