// What a node's launch consists of: this node's place in the job (node rank, node count), the
// rendezvous store and job name, the run directory and logs, and each worker's command line and
// environment. Resolved from the launcher's flags, the MYRIAD_* environment and the batch system
// (Slurm, Kubernetes), in this order of precedence (the first one found wins):
//
//   nodes      --nnodes, MYRIAD_NNODES, SLURM_STEP_NUM_NODES (else SLURM_NNODES) when
//              SLURM_JOB_ID and SLURM_NODEID are set, else 1
//   node rank  --node-rank, MYRIAD_NODE_RANK, SLURM_NODEID (with SLURM_JOB_ID),
//              JOB_COMPLETION_INDEX (Kubernetes Indexed Job / JobSet pod), else 0
//   store      --rdzv, MYRIAD_RDZV, else (one node only) file://<RUN_DIR>/rdzv/<job>, which the
//              launcher empties before starting the workers
//   job        the job named by the store URL (the last part of its path); --job, when given as
//              well, must equal it. For a store URL without a job (redis://host:port) and for the
//              default store: --job, MYRIAD_JOB, slurm-<SLURM_JOB_ID>[.<SLURM_STEP_ID>], else
//              (default store only) the name of the run directory
//
// Under Slurm the launcher runs once per node (srun --ntasks-per-node=1); when SLURM_NODEID gives
// the node rank, SLURM_STEP_NUM_TASKS (when set) must equal the node count. Kubernetes has no
// standard variable for the node count: pass --nnodes or set MYRIAD_NNODES. Every node runs the
// same --nproc-per-node, so global rank = node rank x nproc-per-node + local rank.
//
// The run directory is the worker command's --run-dir, else runs/<stem of its --config> (as
// `myriad train` does), else a fresh temporary directory; logs go to RUN_DIR/logs/rank_<5 digits>.log.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "driver/launcher.h"

namespace myriad::driver {

// What the command line said; unset values are resolved by plan_launch().
struct LaunchFlags {
  long long nproc_per_node = 0;
  std::optional<long long> nnodes, node_rank;
  std::string rdzv, job;                // empty: not given
  std::vector<std::string> command;     // the worker's subcommand and its arguments
};

struct LaunchPlan {
  int nproc_per_node = 1, nnodes = 1, node_rank = 0, world_size = 1;
  std::string rdzv;            // the store URL given to the workers (names the job)
  std::string job;             // the job name (MYRIAD_JOB)
  std::string attempt = "0";   // MYRIAD_ATTEMPT; the fault-tolerant driver counts restarts here
  bool default_store = false;  // rdzv is the launcher's own file store under run_dir/rdzv
  std::string run_dir;         // empty until prepare_run_dir() when the command names none
  std::string log_dir;         // run_dir/logs
  int omp_threads = 0;         // OMP_NUM_THREADS for the workers; 0: the launcher's is kept
  std::vector<std::string> command;
  std::string origin;          // where the node rank and count came from, for the start line
};

// Reads a variable of the launcher's environment (nullopt: unset). Tests pass their own.
using Getenv = std::function<std::optional<std::string>(const std::string&)>;
Getenv process_env();

// Resolves the plan; throws an input error (one line) for a bad flag or environment value: nproc
// < 1, a node rank out of range, several nodes without a store URL, a bad job name, a store URL
// of an unknown scheme, or a launch command of "launch" itself.
LaunchPlan plan_launch(const LaunchFlags& flags, const Getenv& getenv);

// Creates the run directory (a temporary one when the command names none) and its logs/, and
// empties the launcher's own store directory. Throws Error(kRuntime) when it cannot.
void prepare_run_dir(LaunchPlan& plan);

// The workers of this node: `exe` is what they execute, argv0 their argv[0].
std::vector<WorkerSpec> worker_specs(const LaunchPlan& plan, const std::string& exe,
                                     const std::string& argv0);

// The workers' config (a train command's --config and --set), whose fault section the agent acts
// on and whose layout it shrinks; nullopt when the command is not a train or its config does not
// load (the workers then report why).
std::optional<Config> worker_config(const std::vector<std::string>& command);

// This machine's host name ("localhost" when it has none).
std::string host_name();

// Whether `name` may be a job name (and store key part): letters, digits, '.', '_', '-'.
bool valid_job_name(const std::string& name);

}  // namespace myriad::driver
