// Preemption: a batch system (Slurm, Kubernetes) ends a job with SIGTERM, then SIGKILL after a
// grace period (Slurm can also send a chosen signal earlier: --signal). A trainer that receives
// one finishes its step, saves, lets the save commit, and exits with ErrorClass::kPreempted.
//
// The signal handlers only record: the first signal marks the run as asked to stop and arms an
// alarm for the grace period (fault.preempt_grace_s). Copies that arrive before the save starts
// (Slurm signals every process of the step, a launcher forwards, `timeout` signals the child and
// its group) count once. Once begin_save() has been called, a further signal ends the process at
// once, as does the alarm: a save killed half way leaves a .partial directory and never touches a
// committed checkpoint (checkpoint/checkpoint.h), so exiting at once is always safe.
//
// Signal handlers can reach nothing but process-wide state, hence this module's globals; one
// install per process.
#pragma once

#include <string>

namespace myriad::preemption {

// The signal number of a fault.preempt_signal name ("SIGUSR2", ...; 0 for "").
int signal_number(const std::string& name);

// Handles SIGTERM and `extra` (0: none) from now on; `grace_s` bounds the time from the first
// signal to the exit.
void install(int extra, double grace_s);

// Whether a preemption signal has arrived.
bool requested();

// The preemption's save starts: from now on a further signal exits at once.
void begin_save();

}  // namespace myriad::preemption
