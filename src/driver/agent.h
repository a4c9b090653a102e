// A node's agent: runs this node's workers of a launch, attempt after attempt, and carries out
// what the policy (driver/policy.h) decides about each fault. `myriad launch` (cli/launch.cc)
// parses the flags and hands over here.
//
// Its phases, per attempt (docs/ARCHITECTURE.md draws them; agent.cc has a method for each):
//
//   claim -> train -> [finished | preempted | signalled]                        end
//                 \-> record: the fault (the first node's record stands for the job), decided
//                      -> stop ---------------------------------------------------> end
//                      -> check: self-check every node; the nodes that leave (evict, lost,
//                         failed check)
//                      -> settle: the leader fills their places: spares | shrink | stop
//                      -> restart (skip a step, rerun a check) -> claim the next attempt
//
// Unsupervised (--max-restarts 0), the first failure ends the launch. Supervised, the agents of
// a job share its state through the store (driver/job_board.h): their heartbeats, why each
// attempt stopped, each node's self-check, spares and evictions. Faults arrive as typed records
// (core/worker_report.h): the workers' own, and the agent's findings (a hang, a stall, a
// straggler, a lost node); no decision reads a worker's log text.
#pragma once

#include <cstdint>
#include <string>

#include "driver/launcher.h"
#include "driver/plan.h"

namespace myriad::driver {

struct AgentSettings {
  LaunchPlan plan;                // prepared: its run directory and logs exist
  std::string node_name;          // --node-name: what the job's records call this node
  int64_t max_restarts = 0;       // 0: unsupervised
  bool spare = false;             // --spare: wait to take over a node of the job
  bool temporary_run_dir = false;  // the launch made the run directory (removed after success)
  Launcher::Options launcher;     // grace periods; the agent sets the rest
};

// Runs the launch to its end; returns the process's exit code (core/error.h's classes).
int run_agent(AgentSettings settings);

}  // namespace myriad::driver
