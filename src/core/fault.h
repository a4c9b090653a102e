// Fault injection for the fault tests (the leveldb Env idea, as one environment knob):
// MYRIAD_INJECT_FAULT holds comma-separated "point:action" items, e.g.
//   checkpoint_write:fail    a save fails halfway, as on a full disk (runtime fault)
//   checkpoint_write:kill    the process is killed halfway through a save
//   step:7:kill              the process is killed after step 7 completes (and its save, if any)
//   step:2:rank=1:stop       rank 1 (MYRIAD_RANK) stops itself (SIGSTOP) after step 2: a hang
//   step:2:rank=1:stall      rank 1's training thread sleeps forever, its heartbeat beats on
// An action fires in the launch's first attempt (MYRIAD_ATTEMPT 0) only, or in attempt A when
// written ACTION@attempt=A (step:5:kill@attempt=1): a restarted attempt runs clean.
// Unset in normal runs; reading it costs one getenv per check.
#pragma once

#include <string>

namespace myriad::fault {

// The action injected at `point` ("" when none), e.g. action("checkpoint_write") == "fail".
std::string action(const std::string& point);

// Carries out an action: "kill" raises SIGKILL, "fail" throws a runtime fault naming the point.
void trigger(const std::string& point);

}  // namespace myriad::fault
