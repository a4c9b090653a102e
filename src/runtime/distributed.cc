#include "runtime/distributed.h"

#include <cstdlib>
#include <string>

#include "core/error.h"
#include "core/log.h"

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

}  // namespace

std::unique_ptr<Distributed> Distributed::from_env(const Config& cfg) {
  const int world = env_int("MYRIAD_WORLD_SIZE", 1), rank = env_int("MYRIAD_RANK", 0);
  if (world <= 1) return nullptr;
  return std::unique_ptr<Distributed>(new Distributed(cfg, rank, world));
}

Distributed::Distributed(const Config& cfg, int rank, int world)
    : rank_(rank), topo_(parallel::Topology::from_config(cfg.parallel, world)) {
  if (topo_.pp() > 1 || topo_.dp() > 1)
    throw_input("config: this build runs tensor parallelism only across processes (parallel.tp = ",
                world, " for a world of ", world, "); pipeline and data parallelism come next");
  const char* url = std::getenv("MYRIAD_RDZV");
  if (!url) throw_input("environment: MYRIAD_RDZV is not set: start multi-process runs with myriad launch");
  const char* attempt = std::getenv("MYRIAD_ATTEMPT");
  store_ = comm::make_store(url, attempt ? attempt : "0", cfg.comm.timeout_s);
  std::vector<comm::GroupSpec> specs = topo_.group_specs(rank);
  groups_ = comm::make_groups(store_, specs, comm::comm_options(cfg.comm));
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].name == "world") world_ = groups_[i].get();
    if (specs[i].name.rfind("tp", 0) == 0) ctx_.tp = groups_[i].get();
  }
  MYRIAD_CHECK(world_ != nullptr, "no world group among the group specs");
  log::info("distributed: rank ", rank, " of ", world, ", tp ", topo_.tp(), " (", groups_.size(),
            " groups through ", url, ")");
}

bool Distributed::writes_metrics() const {
  const parallel::Coord c = topo_.coord(rank_);
  return c.tp == 0 && c.dp == 0 && c.pp == topo_.pp() - 1;
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
  const std::string name = cat("/myriad-", job ? job : "job", "-", attempt ? attempt : "0", "-",
                               topo_.group_name(Dim::kTp, rank_), "-batch");
  return std::make_unique<data::SharedBatch>(name, tp_rank() == 0, static_cast<int>(members.size()),
                                             ints, timeout_s);
}

}  // namespace myriad
