// Fault injection for the fault tests (the leveldb Env idea, as one environment knob):
// MYRIAD_INJECT_FAULT holds comma-separated items POINT:ACTION[:ARG][@rank=R][@node=N][@attempt=A]
//   POINT    where it fires: step:S (after step S completes), fwd:S (before step S's first
//            forward), bwd:S (when step S's backward of the first chunk it finishes is done,
//            before the gradients' reduction), dp_gather:S (before step S's parameter
//            all-gather), pp_recv:S (before each wait for another stage's activation or
//            gradient in step S), checkpoint_write (halfway through a save), shared_batch_created,
//            comm_check (the launcher's communication check), diag (a node's self-check)
//   ACTION   kill     the process is killed (SIGKILL)
//            hang     the process stops itself (SIGSTOP): frozen, heartbeat included
//            stall    the training thread sleeps forever; the rest of the process runs on
//            throw    a runtime fault (fail: the same)
//            nan      that step's loss is not finite (step:S only)
//            spike    that step's loss is 1000 x what it was (step:S only; fault.spike_factor finds it)
//            flip     one bit of this rank's parameters is flipped (step:S only)
//            slow:MS  the rank sleeps MS milliseconds every step from then on (step:S only)
//            slow:xK[:MS]  every step of the rank from then on takes K times its own time (it
//                     sleeps K - 1 times what the step took, and at least MS ms): a slower device,
//                     whatever the machine's load, where a fixed sleep stops being a straggler once
//                     a loaded machine slows every step (step:S only)
//            pause:MS the thread that reaches the point sleeps MS milliseconds there (e.g. a
//                     slow disk: checkpoint_write:pause:500)
//   @rank=R  only the process whose MYRIAD_RANK is R; @node=N only on node N (MYRIAD_NODE_RANK)
//   @attempt=A  in attempt A of the launch (MYRIAD_ATTEMPT); default 0, so that the restart a
//            fault causes runs clean
// e.g. step:20:kill@rank=1, step:5:slow:200@rank=3, checkpoint_write:fail. Unset in normal runs;
// reading it costs one getenv per check.
//
// Live injection (a chaos run's, scripts/chaos.sh): MYRIAD_INJECT_LIVE names a file (the launcher
// gives each worker RUN_DIR/driver/inject_rank_<R>, each node's self-check inject_node<N>) that
// another process writes while this one runs: items of the grammar above without qualifiers,
// `step:next` standing for the next step (e.g. step:next:nan, checkpoint_write:fail, diag:fail).
// poll_live() takes the file (removing it) and arms its items; each fires once, where its point
// is next reached, as if MYRIAD_INJECT_FAULT had held it.
#pragma once

#include <string>

namespace myriad::fault {

// The action injected at `point` for this process and attempt ("" when none), its argument
// included: action("step:5") == "slow:200". A live item it returns is taken (fires once).
std::string action(const std::string& point);

// Carries out what the process itself can: kill, hang, stall, throw/fail, pause, and slow (remembered:
// see delay_ms). Returns the action for the caller to carry out otherwise (nan, flip), "" when
// none.
std::string trigger(const std::string& point);
// trigger() for an action taken already (action(point) takes a live item: ask once per point).
std::string carry_out(const std::string& action, const std::string& point);

// The delay a slow fault set for a step whose own time was `step_ms` (0 when none): slow:MS's
// milliseconds, and slow:xK:MS's (K - 1) x step_ms, at least MS.
int delay_ms(double step_ms = 0);

// Arms the items of the live injection file, if one is there (see above); `next_step` replaces
// `next`. Returns the items armed ("" when none); an item off the grammar is dropped with a
// warning (the run goes on).
std::string poll_live(long long next_step);

// Checks every item of MYRIAD_INJECT_FAULT against the grammar above (points, actions, where
// each action applies, qualifiers): an input error naming the item, so that a misspelt fault is
// refused instead of silently never firing.
void check_injection();

}  // namespace myriad::fault
