// `myriad launch`: parses its flags and hands the launch to this node's agent (driver/agent.h),
// which runs the workers and carries out the fault-tolerance policy (driver/policy.h); and
// `myriad comm-check`, a hidden worker that checks the rank environment and the world group.
//
//   myriad launch --nproc-per-node N [--nnodes M --node-rank R] [--rdzv URL] [--job NAME]
//                 [--grace-period S] [--max-restarts N] -- <subcommand> [its arguments...]
//   myriad comm-check [--size-kb K] [--timeout S] [--run-dir DIR]      (under myriad launch)
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli/args.h"
#include "comm/communicator.h"
#include "comm/rendezvous.h"
#include "comm/store.h"
#include "core/config.h"
#include "core/dir_lock.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/log.h"
#include "driver/agent.h"
#include "driver/launcher.h"
#include "driver/plan.h"

namespace myriad::cli {
namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v)
    throw_input("comm-check: ", name, " is not set: run it under myriad launch, e.g. "
                "myriad launch --nproc-per-node 2 -- comm-check");
  try {
    size_t used = 0;
    const long long x = std::stoll(v, &used);
    if (used == std::string(v).size() && x >= 0 && x <= (1 << 24)) return static_cast<int>(x);
  } catch (...) {
  }
  throw_input("comm-check: ", name, " must be an integer 0..", 1 << 24, ", got '", v, "'");
}

// The fault point "comm_check" (core/fault.h's grammar, e.g. comm_check:fail@rank=1), reached
// before the store is opened. Besides kill: fail (or throw) names the rank; sleep sleeps until a
// signal ends it; sleep_ignore_term ignores SIGTERM and SIGINT (only SIGKILL ends it).
void comm_check_fault(int rank) {
  const std::string a = fault::action("comm_check");
  if (a.empty()) return;
  if (a == "fail" || a == "throw") throw_runtime("injected fault at comm_check: rank ", rank, " failed");
  if (a == "sleep" || a == "sleep_ignore_term") {
    if (a == "sleep_ignore_term") signal(SIGTERM, SIG_IGN), signal(SIGINT, SIG_IGN);
    log::info("comm-check: rank ", rank, " sleeps (injected fault ", a, ")");
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  fault::trigger("comm_check");  // kill
  throw_input("comm-check: unknown fault '", a, "' in MYRIAD_INJECT_FAULT (comm_check:kill|fail|sleep|"
              "sleep_ignore_term, with @rank=R, @node=N, @attempt=A)");
}

}  // namespace

int cmd_launch(int argc, char** argv) {
  int sep = -1;
  for (int i = 0; i < argc && sep < 0; ++i)
    if (std::string(argv[i]) == "--") sep = i;
  if (sep < 0)
    throw_input("launch: expected '--' and then the subcommand to run, e.g. "
                "myriad launch --nproc-per-node 4 -- train --config FILE");
  Args args("launch", sep, argv,
            {"nproc-per-node", "nnodes", "node-rank", "rdzv", "job", "grace-period", "max-restarts", "node-name"},
            {"spare"});
  driver::LaunchFlags flags;
  args.required("nproc-per-node");
  flags.nproc_per_node = args.get_int("nproc-per-node", 0);
  if (args.has("nnodes")) flags.nnodes = args.get_int("nnodes", 1);
  if (args.has("node-rank")) flags.node_rank = args.get_int("node-rank", 0);
  flags.rdzv = args.get("rdzv");
  flags.job = args.get("job");
  if (args.has("job") && flags.job.empty()) throw_input("launch: --job must not be empty");
  for (int i = sep + 1; i < argc; ++i) flags.command.push_back(argv[i]);
  driver::Launcher::Options options;
  options.grace_s = args.get_double("grace-period", 10);
  if (!(options.grace_s >= 0 && options.grace_s <= 3600))
    throw_input("launch: --grace-period must be 0..3600 seconds, got ", args.get("grace-period"));

  const long long max_restarts = args.get_int("max-restarts", 0);
  if (max_restarts < 0 || max_restarts > 1000)
    throw_input("launch: --max-restarts must be 0..1000, got ", max_restarts);
  const bool spare = args.has("spare");
  if (spare && max_restarts == 0)
    throw_input("launch: --spare waits to replace a node of a supervised job: give --max-restarts too");
  if (spare && args.has("node-rank"))
    throw_input("launch: a --spare has no node rank until it takes one over: drop --node-rank");
  if (spare) flags.node_rank = 0;  // until it takes a node over

  driver::LaunchPlan plan = driver::plan_launch(flags, driver::process_env());
  // What the logs and the job's heartbeats call this node (its node rank is its identity).
  const std::string node_name = args.has("node-name") ? args.get("node-name") : driver::host_name();
  if (node_name.empty() || node_name.find_first_of(" \t\n") != std::string::npos)
    throw_input("launch: --node-name must be a non-empty word, got '", node_name, "'");
  if (spare && plan.default_store)
    throw_input("launch: --spare needs the job's store (--rdzv URL), shared with the nodes it may replace");
  const bool temporary_run_dir = plan.run_dir.empty();
  // One run per directory (core/dir_lock.h): node 0's launcher holds the run's lock across its
  // restarts, and its workers do not take it. Taken before the run directory is touched (its own
  // store is emptied next).
  std::vector<std::unique_ptr<DirLock>> locks;
  if (!spare && plan.node_rank == 0 && !temporary_run_dir) {
    const std::optional<Config> cfg = driver::worker_config(plan.command);
    locks = lock_run(plan.run_dir, (cfg ? *cfg : Config{}).checkpoint_root(plan.run_dir));
  }
  driver::prepare_run_dir(plan);
  driver::AgentSettings settings;
  settings.node_name = node_name;
  settings.max_restarts = max_restarts;
  settings.spare = spare;
  settings.temporary_run_dir = temporary_run_dir;
  settings.launcher = options;
  settings.plan = std::move(plan);
  return driver::run_agent(std::move(settings));
}

int cmd_comm_check(int argc, char** argv) {
  Args args("comm-check", argc, argv, {"size-kb", "timeout", "run-dir"});
  const long long size_kb = args.get_int("size-kb", 64);
  if (size_kb < 1 || size_kb > (1 << 20)) throw_input("comm-check: --size-kb must be 1..1048576");
  const double timeout_s = args.get_double("timeout", 60);
  if (!(timeout_s > 0)) throw_input("comm-check: --timeout must be > 0 seconds");
  const int rank = env_int("MYRIAD_RANK"), size = env_int("MYRIAD_WORLD_SIZE");
  if (size < 1 || rank >= size)
    throw_input("comm-check: MYRIAD_RANK ", rank, " is not below MYRIAD_WORLD_SIZE ", size);
  const std::string url = env_or("MYRIAD_RDZV", "");
  if (url.empty()) throw_input("comm-check: MYRIAD_RDZV is not set: run it under myriad launch");
  const std::string attempt = env_or("MYRIAD_ATTEMPT", "0");
  log::info("comm-check: rank ", rank, " of ", size, " (local rank ",
            env_or("MYRIAD_LOCAL_RANK", "?"), " of ", env_or("MYRIAD_LOCAL_WORLD_SIZE", "?"),
            ", node ", env_or("MYRIAD_NODE_RANK", "?"), " of ", env_or("MYRIAD_NNODES", "?"),
            "), job ", env_or("MYRIAD_JOB", "?"), ", attempt ", attempt, ", store ",
            driver::without_password(url));
  comm_check_fault(rank);

  const auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<comm::Store> store = comm::make_store(url, attempt, timeout_s);
  comm::CommOptions options;
  options.backend = "gloo";
  options.timeout_s = timeout_s;
  comm::GroupSpec world_spec;
  world_spec.name = "world", world_spec.rank = rank, world_spec.size = size;
  std::vector<std::unique_ptr<comm::Communicator>> groups =
      comm::make_groups(store, {world_spec}, options);
  comm::Communicator& world = *groups.at(0);
  const auto t1 = std::chrono::steady_clock::now();

  const int64_t count = size_kb * 1024 / static_cast<int64_t>(sizeof(float));
  std::vector<float> buf(static_cast<size_t>(count), static_cast<float>(rank + 1));
  world.all_reduce(buf.data(), count)->wait();
  world.barrier()->wait();  // nobody leaves while a peer may still be reading from it
  const auto t2 = std::chrono::steady_clock::now();
  // Sums of integers are exact in float32 up to 2^24 (N <= 5792 ranks).
  const double expected = 0.5 * size * (size + 1.0);
  for (int64_t i = 0; i < count; ++i)
    if (buf[static_cast<size_t>(i)] != static_cast<float>(expected))
      throw Error(ErrorClass::kComm,
                  cat("comm-check: rank ", rank, ": all_reduce gave ", buf[static_cast<size_t>(i)],
                      " at element ", i, ", expected ", expected));
  using ms = std::chrono::duration<double, std::milli>;
  log::info("comm-check: set-up ", static_cast<int64_t>(ms(t1 - t0).count()), " ms, all_reduce of ",
            size_kb, " KiB and a barrier ", static_cast<int64_t>(ms(t2 - t1).count()), " ms");
  std::cout << "comm-check ok: rank " << rank << " of " << size << std::endl;
  return 0;
}

}  // namespace myriad::cli
