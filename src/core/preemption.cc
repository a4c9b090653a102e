#include "core/preemption.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace myriad::preemption {
namespace {

// 0: running; 1: asked to stop, the save not started; 2: saving.
volatile sig_atomic_t g_state = 0;
unsigned g_grace_s = 0;

void say(const char* text) {
  ssize_t n = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)n;  // nothing to do about a closed stderr in a signal handler
}

void on_signal(int) {
  const int saved_errno = errno;  // the interrupted code may be about to read it
  if (g_state == 2) {
    say("myriad: preempted: signalled again while saving: exiting at once (committed checkpoints are untouched)\n");
    ::_exit(exit_code(ErrorClass::kPreempted));
  }
  if (g_state == 0) {
    g_state = 1;
    ::alarm(g_grace_s);
    say("myriad: preemption signal received: finishing this step, then saving and exiting\n");
  }
  errno = saved_errno;
}

void on_alarm(int) {
  say("myriad: preempted: fault.preempt_grace_s ran out before the save committed: exiting at once (committed "
      "checkpoints are untouched)\n");
  ::_exit(exit_code(ErrorClass::kPreempted));
}

}  // namespace

int signal_number(const std::string& name) {
  if (name.empty()) return 0;
  if (name == "SIGUSR2") return SIGUSR2;
  if (name == "SIGHUP") return SIGHUP;
  if (name == "SIGQUIT") return SIGQUIT;
  if (name == "SIGXCPU") return SIGXCPU;
  throw_input("config: fault.preempt_signal = \"", name, "\" is not one of SIGUSR2, SIGHUP, SIGQUIT, SIGXCPU");
}

void install(int extra, double grace_s) {
  g_grace_s = static_cast<unsigned>(std::ceil(grace_s));
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, &sa, nullptr);
  if (extra > 0) ::sigaction(extra, &sa, nullptr);
  sa.sa_handler = on_alarm;
  ::sigaction(SIGALRM, &sa, nullptr);
}

bool requested() { return g_state != 0; }

void begin_save() { g_state = 2; }

}  // namespace myriad::preemption
