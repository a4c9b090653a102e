#include "driver/plan.h"

#include <unistd.h>

#include <sched.h>
#include <stdlib.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "core/error.h"
#include "core/log.h"

namespace fs = std::filesystem;

namespace myriad::driver {
namespace {

constexpr int kMaxProcPerNode = 4096;
constexpr long long kMaxWorld = 1 << 24;

// A value and where it came from ("--nnodes", "SLURM_NODEID", ...).
struct Sourced {
  long long value = 0;
  std::string from;
};

long long parse_int(const std::string& text, const std::string& from) {
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used == text.size()) return v;
  } catch (...) {
  }
  throw_input("launch: ", from, " must be an integer, got '", text, "'");
}

// The first of `names` set in the environment.
std::optional<Sourced> from_env(const Getenv& getenv, const std::vector<std::string>& names) {
  for (const std::string& name : names)
    if (std::optional<std::string> v = getenv(name); v && !v->empty())
      return Sourced{parse_int(*v, name), name};
  return std::nullopt;
}

// The value of --name in a subcommand's arguments (the last one, as Args takes it).
std::string command_flag(const std::vector<std::string>& cmd, const std::string& name) {
  std::string value;
  const std::string flag = "--" + name;
  for (size_t i = 1; i < cmd.size(); ++i) {
    if (cmd[i] == flag && i + 1 < cmd.size())
      value = cmd[++i];
    else if (cmd[i].rfind(flag + "=", 0) == 0)
      value = cmd[i].substr(flag.size() + 1);
  }
  return value;
}

// The job a store URL names (the last part of its path), or nullopt when it names none
// (redis://host:port). A file URL or plain path always names one.
std::optional<std::string> url_job(std::string url) {
  while (url.size() > 1 && url.back() == '/') url.pop_back();
  if (url.rfind("redis://", 0) == 0) {
    const size_t slash = url.find('/', 8);
    if (slash == std::string::npos || slash + 1 >= url.size()) return std::nullopt;
    return url.substr(slash + 1);
  }
  const std::string path = url.rfind("file://", 0) == 0 ? url.substr(7) : url;
  return path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1);
}

std::string sanitized_job(const std::string& name) {
  std::string out = name;
  for (char& c : out)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) c = '_';
  return valid_job_name(out) ? out : "job";
}

void check_job(const std::string& job, const std::string& from) {
  if (!valid_job_name(job))
    throw_input("launch: the job name '", job, "' (from ", from,
                ") must be letters, digits, '.', '_' or '-'");
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

bool valid_job_name(const std::string& s) {
  if (s.empty() || s == "." || s == "..") return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'))
      return false;
  return true;
}

Getenv process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

LaunchPlan plan_launch(const LaunchFlags& flags, const Getenv& getenv) {
  LaunchPlan p;
  if (flags.command.empty() || flags.command[0].empty())
    throw_input("launch: nothing to run after '--': expected a subcommand, e.g. "
                "myriad launch --nproc-per-node 4 -- train --config FILE");
  if (flags.command[0].rfind("-", 0) == 0)
    throw_input("launch: expected a subcommand after '--', got '", flags.command[0], "'");
  if (flags.command[0] == "launch")
    throw_input("launch: the command to launch cannot be launch itself");
  p.command = flags.command;

  if (flags.nproc_per_node < 1 || flags.nproc_per_node > kMaxProcPerNode)
    throw_input("launch: --nproc-per-node must be 1..", kMaxProcPerNode, ", got ",
                flags.nproc_per_node);
  p.nproc_per_node = flags.nproc_per_node;

  // Slurm: only inside a job whose step tells this task's node (srun sets SLURM_NODEID).
  const bool slurm = getenv("SLURM_JOB_ID").has_value() && getenv("SLURM_NODEID").has_value();
  Sourced nnodes{1, "the default"}, node_rank{0, "the default"};
  if (flags.nnodes)
    nnodes = {*flags.nnodes, "--nnodes"};
  else if (auto v = from_env(getenv, {"MYRIAD_NNODES"}))
    nnodes = *v;
  else if (auto s = slurm ? from_env(getenv, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES"}) : std::nullopt)
    nnodes = *s;
  if (flags.node_rank)
    node_rank = {*flags.node_rank, "--node-rank"};
  else if (auto v = from_env(getenv, {"MYRIAD_NODE_RANK"}))
    node_rank = *v;
  else if (auto s = slurm ? from_env(getenv, {"SLURM_NODEID"}) : std::nullopt)
    node_rank = *s;
  else if (auto k = from_env(getenv, {"JOB_COMPLETION_INDEX"}))
    node_rank = *k;

  if (nnodes.value < 1 || nnodes.value > kMaxWorld)
    throw_input("launch: the node count (", nnodes.from, ") must be 1..", kMaxWorld, ", got ",
                nnodes.value);
  if (node_rank.value < 0 || node_rank.value >= nnodes.value)
    throw_input("launch: node rank ", node_rank.value, " (", node_rank.from,
                ") is out of range for ", nnodes.value, " node(s) (", nnodes.from,
                "): it must be 0..", nnodes.value - 1);
  if (nnodes.value * p.nproc_per_node > kMaxWorld)
    throw_input("launch: ", nnodes.value, " nodes x ", p.nproc_per_node,
                " workers is more than ", kMaxWorld, " ranks");
  if (node_rank.from == "SLURM_NODEID")
    if (auto tasks = from_env(getenv, {"SLURM_STEP_NUM_TASKS"}); tasks && tasks->value != nnodes.value)
      throw_input("launch: srun started ", tasks->value, " tasks on ", nnodes.value,
                  " node(s); run one launcher per node (srun --ntasks-per-node=1)");
  p.nnodes = static_cast<int>(nnodes.value);
  p.node_rank = static_cast<int>(node_rank.value);
  p.world_size = p.nnodes * p.nproc_per_node;
  p.origin = cat("node ", p.node_rank, " of ", p.nnodes);
  if (node_rank.from != "the default" || nnodes.from != "the default")
    p.origin += cat(" (from ", node_rank.from, ", ", nnodes.from, ")");

  // The run directory, as the worker command will use it.
  p.run_dir = command_flag(p.command, "run-dir");
  if (p.run_dir.empty()) {
    const std::string config = command_flag(p.command, "config");
    if (!config.empty()) p.run_dir = (fs::path("runs") / fs::path(config).stem()).string();
  }

  // The store and the job.
  std::string other_job;  // for a store URL without a job, and for the default store
  std::string other_from;
  if (!flags.job.empty()) {
    other_job = flags.job, other_from = "--job";
  } else if (auto j = getenv("MYRIAD_JOB"); j && !j->empty()) {
    other_job = *j, other_from = "MYRIAD_JOB";
  } else if (slurm) {
    other_job = "slurm-" + *getenv("SLURM_JOB_ID");
    if (auto step = getenv("SLURM_STEP_ID"); step && !step->empty()) other_job += "." + *step;
    other_from = "SLURM_JOB_ID";
  }
  std::string url = flags.rdzv, url_from = "--rdzv";
  if (url.empty())
    if (auto v = getenv("MYRIAD_RDZV"); v && !v->empty()) url = *v, url_from = "MYRIAD_RDZV";
  if (!url.empty()) {
    if (url.find("://") != std::string::npos && url.rfind("redis://", 0) != 0 &&
        url.rfind("file://", 0) != 0)
      throw_input("launch: the store URL '", without_password(url), "' (", url_from,
                  ") has an unknown scheme: expected redis://HOST:PORT/JOB or file:///DIR/JOB");
    if (std::optional<std::string> job = url_job(url)) {
      check_job(*job, url_from);
      if (!flags.job.empty() && flags.job != *job)
        throw_input("launch: --job ", flags.job, " disagrees with the job '", *job,
                    "' named by the store URL (", url_from, ")");
      p.job = *job;
    } else {
      if (other_job.empty())
        throw_input("launch: the store URL '", without_password(url), "' (", url_from,
                    ") names no job: add /JOB to it, or pass --job NAME");
      check_job(other_job, other_from);
      p.job = other_job;
      while (url.size() > 1 && url.back() == '/') url.pop_back();
      url += "/" + p.job;
    }
    p.rdzv = url;
    if (p.nnodes > 1 && url.rfind("redis://", 0) != 0)
      log::warn("launch: the file store ", url, " serves several nodes only on a file system "
                "that they all share");
  } else {
    if (p.nnodes > 1)
      throw_input("launch: ", p.nnodes, " nodes need a rendezvous store: pass --rdzv "
                  "redis://HOST:PORT/JOB or set MYRIAD_RDZV");
    p.default_store = true;  // file://RUN_DIR/rdzv/JOB, made by prepare_run_dir()
    if (!other_job.empty()) {
      check_job(other_job, other_from);
      p.job = other_job;
    }
  }

  if (!getenv("OMP_NUM_THREADS").has_value())
    p.omp_threads = std::max(1, usable_cores() / p.nproc_per_node);
  return p;
}

void prepare_run_dir(LaunchPlan& plan) {
  std::error_code ec;
  if (plan.run_dir.empty()) {
    std::string tmpl = (fs::temp_directory_path(ec) / "myriad-launch-XXXXXX").string();
    if (ec || !::mkdtemp(tmpl.data()))
      throw_runtime("launch: cannot create a temporary run directory ", tmpl, ": ",
                    ec ? ec.message() : std::string(std::strerror(errno)));
    plan.run_dir = tmpl;
  }
  const fs::path logs = fs::path(plan.run_dir) / "logs";
  fs::create_directories(logs, ec);
  if (ec) throw_runtime("launch: cannot create the log directory ", logs.string(), ": ", ec.message());
  plan.log_dir = logs.string();
  if (!plan.default_store) return;

  fs::path abs = fs::absolute(plan.run_dir, ec).lexically_normal();
  if (!abs.has_filename()) abs = abs.parent_path();
  if (plan.job.empty()) plan.job = sanitized_job(abs.filename().string());
  // The launcher's own store: keys left by an earlier launch into this run directory would be
  // taken for this one's, so it starts empty.
  const fs::path store = abs / "rdzv";
  fs::remove_all(store, ec);
  if (!ec) fs::create_directories(store, ec);
  if (ec) throw_runtime("launch: cannot empty the store directory ", store.string(), ": ", ec.message());
  plan.rdzv = "file://" + (store / plan.job).string();
}

std::vector<WorkerSpec> worker_specs(const LaunchPlan& plan, const std::string& exe,
                                     const std::string& argv0) {
  std::vector<WorkerSpec> out;
  for (int local = 0; local < plan.nproc_per_node; ++local) {
    WorkerSpec w;
    w.local_rank = local;
    w.rank = plan.node_rank * plan.nproc_per_node + local;
    w.exe = exe;
    w.argv.push_back(argv0);
    w.argv.insert(w.argv.end(), plan.command.begin(), plan.command.end());
    w.env = {{"MYRIAD_RANK", std::to_string(w.rank)},
             {"MYRIAD_WORLD_SIZE", std::to_string(plan.world_size)},
             {"MYRIAD_LOCAL_RANK", std::to_string(local)},
             {"MYRIAD_LOCAL_WORLD_SIZE", std::to_string(plan.nproc_per_node)},
             {"MYRIAD_NODE_RANK", std::to_string(plan.node_rank)},
             {"MYRIAD_NNODES", std::to_string(plan.nnodes)},
             {"MYRIAD_RDZV", plan.rdzv},
             {"MYRIAD_JOB", plan.job},
             {"MYRIAD_ATTEMPT", plan.attempt}};
    if (plan.omp_threads > 0) w.env.emplace_back("OMP_NUM_THREADS", std::to_string(plan.omp_threads));
    char name[32];
    std::snprintf(name, sizeof name, "rank_%05d.log", w.rank);
    w.log_path = (fs::path(plan.log_dir) / name).string();
    out.push_back(std::move(w));
  }
  return out;
}

std::optional<Config> worker_config(const std::vector<std::string>& command) {
  if (command.empty() || command[0] != "train") return std::nullopt;
  std::string config;
  std::vector<std::string> sets;
  for (size_t i = 1; i + 1 < command.size(); ++i) {
    if (command[i] == "--config") config = command[i + 1];
    if (command[i] == "--set") sets.push_back(command[i + 1]);
  }
  if (config.empty()) return std::nullopt;
  try {
    return load_config(config, sets);
  } catch (const Error&) {
    return std::nullopt;
  }
}

std::string host_name() {
  char buf[256] = {};
  return ::gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string("localhost");
}

}  // namespace myriad::driver
