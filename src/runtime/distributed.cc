#include "runtime/distributed.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include <cstdlib>
#include <chrono>
#include <exception>

#include <unistd.h>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "observe/trace.h"
#include "runtime/engine.h"

namespace myriad {
namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  try {
    return std::stoi(v);
  } catch (...) {
    throw_input("environment: ", name, "=", v, " is not an integer");
  }
}

// The communication backend for this rank. NCCL moves device memory between GPUs and refuses
// two ranks on one GPU; Gloo moves host memory (and device memory through staging copies). So
// "auto" is NCCL only for a GPU engine whose node's ranks each have a GPU of their own.
std::string resolve_backend(const Config& cfg, int rank) {
  const std::string& asked = cfg.comm.backend;
  const bool gpu = cfg.train.device == "cuda" || (cfg.train.device == "auto" && cuda_available());
  const int gpus = gpu ? cuda_device_count_or_zero() : 0;
  if (gpu && gpus == 0)  // the engine's own message, before any rendezvous
    throw_input("config: train.device = \"cuda\" but no GPU is visible; use cpu or auto");
  if (asked == "gloo") return asked;
  const int local = env_int("MYRIAD_LOCAL_WORLD_SIZE", 1), local_rank = env_int("MYRIAD_LOCAL_RANK", 0);
  const bool shared = gpu && local > gpus;
  if (asked == "nccl") {
    if (!gpu)
      throw_input("config: comm.backend = \"nccl\" moves GPU memory, but train.device = \"",
                  cfg.train.device, "\" trains on the CPU here: use comm.backend = \"gloo\" or \"auto\"");
    if (shared) {
      const int first = rank - local_rank, dev = local_rank % gpus;
      throw_input("config: comm.backend = \"nccl\" but the ", local, " ranks of this node (", first,
                  "..", first + local - 1, ") share ", gpus, " GPU(s): rank ", rank,
                  " and rank ", first + (local_rank + gpus) % local, " both use cuda:", dev,
                  ", and NCCL refuses two ranks on one device; use comm.backend = \"auto\" (Gloo "
                  "with host staging) or one rank per GPU");
    }
    return asked;
  }
  if (!gpu) return "gloo";
  if (shared) {
    if (local_rank == 0)
      log::info("comm: ", local, " ranks share ", gpus, " GPU(s) on this node: Gloo with host "
                "staging (NCCL refuses two ranks on one device)");
    return "gloo";
  }
  return "nccl";
}

}  // namespace

std::unique_ptr<Distributed> Distributed::from_env(const Config& cfg) {
  const int world = env_int("MYRIAD_WORLD_SIZE", 1), rank = env_int("MYRIAD_RANK", 0);
  if (world <= 1) return nullptr;
  return std::unique_ptr<Distributed>(new Distributed(cfg, rank, world));
}

Distributed::Distributed(const Config& cfg, int rank, int world)
    // A layout that does not fit the world (a batch that does not split over dp, ...) fails
    // here, before any rendezvous.
    : rank_(rank),
      layout_(ParallelLayout::for_world(cfg, world)),
      topo_(world, static_cast<int>(layout_.tp), static_cast<int>(layout_.pp), static_cast<int>(layout_.dp),
            cfg.parallel.order, static_cast<int>(layout_.cp)) {
  const std::string backend = resolve_backend(cfg, rank);  // a bad choice fails here too
  if (cfg.train.device == "cuda" || (cfg.train.device == "auto" && cuda_available()))
    use_local_gpu();  // before the communicators: NCCL binds to the current device
  const char* url = std::getenv("MYRIAD_RDZV");
  if (!url) throw_input("environment: MYRIAD_RDZV is not set: start multi-process runs with myriad launch");
  const char* attempt = std::getenv("MYRIAD_ATTEMPT");
  store_ = comm::make_store(url, attempt ? attempt : "0", cfg.comm.timeout_s);
  std::vector<comm::GroupSpec> specs = topo_.group_specs(rank);
  const int ep = static_cast<int>(layout_.ep);
  const std::vector<comm::GroupSpec> expert_specs = topo_.expert_group_specs(rank, ep);
  specs.insert(specs.end(), expert_specs.begin(), expert_specs.end());
  const std::vector<Link> links = pipeline_links(specs);
  CommConfig comm = cfg.comm;
  comm.backend = backend;
  groups_ = comm::make_groups(store_, specs, comm::comm_options(comm));
  bind_groups(specs, expert_specs, links);
  MYRIAD_CHECK(world_ != nullptr, "no world group among the group specs");
  // Names of node-local resources must differ between two starts of the same job: a segment a
  // killed start left behind (never unlinked) would otherwise be found by the next start's
  // followers before its reader replaces it.
  start_id_ = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) ^
              (static_cast<uint64_t>(getpid()) << 32);
  world_->broadcast_bytes(&start_id_, sizeof start_id_, 0)->wait();
  start_id_ %= 1000000007;
  log::info("distributed: rank ", rank, " of ", world, ", tp ", topo_.tp(), " x pp ", topo_.pp(),
            topo_.cp() > 1 ? cat(" x cp ", topo_.cp()) : std::string(), " x dp ", topo_.dp(),
            ep > 1 ? cat(" (ep ", ep, " x edp ", topo_.tp() * topo_.cp() * topo_.dp() / ep, ")") : std::string(),
            " (coordinates ",
            coordinates(), "; ", groups_.size(), " groups through ", store_->url(), ")");
}

std::vector<Distributed::Link> Distributed::pipeline_links(std::vector<comm::GroupSpec>& specs) {
  const parallel::Coord me = topo_.coord(rank_);
  const int p = topo_.pp();
  const std::string pp_name = topo_.group_name(parallel::Dim::kPp, rank_);
  std::vector<Link> links;
  if (p > 1)
    for (const char* kind : {"act", "grad"})
      for (int from = 0; from < p; ++from) {
        const int to = std::string(kind) == "act" ? (from + 1) % p : (from + p - 1) % p;
        const std::string name = cat(pp_name, ".", kind, ".", from, "to", to);
        const bool act = std::string(kind) == "act";
        if (me.pp == from)
          links.push_back({name, 0, act ? &ctx_.act_to_next : &ctx_.grad_to_prev});
        else if (me.pp == to)
          links.push_back({name, 1, act ? &ctx_.act_from_prev : &ctx_.grad_from_next});
        else
          continue;
        // p = 2: a rank is both ends of different links only; never both of one.
        specs.push_back({name, links.back().rank, 2});
      }
  return links;
}

void Distributed::bind_groups(const std::vector<comm::GroupSpec>& specs,
                              const std::vector<comm::GroupSpec>& expert_specs, const std::vector<Link>& links) {
  const int ep = static_cast<int>(layout_.ep);
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string& n = specs[i].name;
    comm::Communicator* g = groups_[i].get();
    std::vector<int> members;
    if (n == "world") {
      world_ = g;
      for (int r = 0; r < topo_.world(); ++r) members.push_back(r);
    } else if (n == topo_.group_name(parallel::Dim::kTp, rank_)) {
      ctx_.tp = g, members = topo_.group(parallel::Dim::kTp, rank_);
    } else if (n == topo_.group_name(parallel::Dim::kPp, rank_)) {
      ctx_.pp = g, members = topo_.group(parallel::Dim::kPp, rank_);
    } else if (n == topo_.group_name(parallel::Dim::kDp, rank_)) {
      ctx_.dp = g, members = topo_.group(parallel::Dim::kDp, rank_);
    } else if (topo_.cp() > 1 && n == topo_.group_name(parallel::Dim::kCp, rank_)) {
      ctx_.cp = g, members = topo_.group(parallel::Dim::kCp, rank_);
    } else if (topo_.cp() > 1 && n == topo_.dcp_spec(rank_).name) {
      ctx_.dcp = g, members = topo_.dcp_group(rank_);
    } else if (!expert_specs.empty() && n == expert_specs[0].name) {
      ctx_.ep = g, members = topo_.expert_group(rank_, ep);
    } else if (!expert_specs.empty() && n == expert_specs[1].name) {
      ctx_.edp = g, members = topo_.expert_dp_group(rank_, ep);
    }
    for (const Link& l : links)
      if (l.name == n) {
        *l.slot = g;
        const std::vector<int> stages = topo_.group(parallel::Dim::kPp, rank_);
        const int from = std::stoi(n.substr(n.rfind('.') + 1)), to = std::stoi(n.substr(n.rfind("to") + 2));
        members = {stages[from], stages[to]};
      }
    g->set_members(members);
  }
}

Distributed::~Distributed() {
  if (std::uncaught_exceptions() > 0)
    for (auto& g : groups_) g->abort("this rank is leaving on an error");
}

int64_t Distributed::clock_offset_us() {
  // NTP's exchange with rank 0, rank by rank: rank 0 sends its time t1; rank r notes when it
  // arrives (t2) and answers with its time t3; rank 0 notes the answer's arrival (t4). Then
  // offset = ((t2 - t1) + (t3 - t4)) / 2, wrong by at most half the round trip: of 8 rounds, the
  // shortest round trip's counts. Rank 0 then tells every rank its offset.
  constexpr int kRounds = 8;
  comm::Communicator& w = *world_;
  std::vector<int64_t> offsets(static_cast<size_t>(world()), 0);
  for (int r = 1; r < world(); ++r) {
    int64_t best_rtt = std::numeric_limits<int64_t>::max();
    for (int k = 0; k < kRounds; ++k) {
      if (rank_ == 0) {
        const int64_t t1 = trace::now_us();
        w.send_bytes(&t1, 8, r)->wait();
        int64_t t23[2];
        w.recv_bytes(t23, 16, r)->wait();
        const int64_t t4 = trace::now_us();
        if (t4 - t1 - (t23[1] - t23[0]) < best_rtt)
          best_rtt = t4 - t1 - (t23[1] - t23[0]), offsets[r] = ((t23[0] - t1) + (t23[1] - t4)) / 2;
      } else if (rank_ == r) {
        int64_t t1 = 0;
        w.recv_bytes(&t1, 8, 0)->wait();
        int64_t t23[2] = {trace::now_us(), 0};
        t23[1] = trace::now_us();
        w.send_bytes(t23, 16, 0)->wait();
      }
    }
  }
  w.broadcast_bytes(offsets.data(), static_cast<int64_t>(offsets.size() * 8), 0)->wait();
  return offsets[static_cast<size_t>(rank_)];
}

std::string Distributed::coordinates() const {
  const parallel::Coord c = topo_.coord(rank_);
  return cat("tp ", c.tp, ", pp ", c.pp, topo_.cp() > 1 ? cat(", cp ", c.cp) : std::string(), ", dp ", c.dp);
}

std::vector<comm::Communicator*> Distributed::groups() const {
  std::vector<comm::Communicator*> out;
  for (const auto& g : groups_) out.push_back(g.get());
  return out;
}

bool Distributed::writes_metrics() const {
  const parallel::Coord c = topo_.coord(rank_);
  return c.tp == 0 && c.dp == 0 && c.cp == 0 && c.pp == topo_.pp() - 1;
}

void Distributed::barrier() { world_->barrier()->wait(); }

std::unique_ptr<data::SharedBatch> Distributed::shared_batch(int64_t ints, double timeout_s) const {
  using parallel::Dim;
  const std::vector<int> members = topo_.group(Dim::kTp, rank_);
  const int local = env_int("MYRIAD_LOCAL_WORLD_SIZE", 1);
  if (members.size() < 2) return nullptr;
  for (int m : members)
    if (m / local != rank_ / local) return nullptr;  // the group spans nodes
  const char* job = std::getenv("MYRIAD_JOB");
  const char* attempt = std::getenv("MYRIAD_ATTEMPT");
  const char* store = std::getenv("MYRIAD_RDZV");
  const std::string name =
      data::node_segment_prefix(job ? job : "job", store ? store : "", attempt ? attempt : "0",
                                env_int("MYRIAD_NODE_RANK", rank_ / local)) +
      cat(start_id_, "-", topo_.group_name(Dim::kTp, rank_), "-batch");
  return std::make_unique<data::SharedBatch>(name, tp_rank() == 0, static_cast<int>(members.size()),
                                             ints, timeout_s);
}

}  // namespace myriad
