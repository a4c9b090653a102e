// This process's place in a multi-process job started by `myriad launch`: the rank environment
// (MYRIAD_RANK, MYRIAD_WORLD_SIZE, MYRIAD_RDZV, MYRIAD_ATTEMPT), the topology from [parallel],
// and the communicators of the groups this rank belongs to (set up through the store in one
// batched rendezvous).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/store.h"
#include "core/config.h"
#include "data/shared_batch.h"
#include "parallel/mappings.h"
#include "core/parallel_layout.h"
#include "parallel/topology.h"

namespace myriad {

class Distributed {
 public:
  // Null when the process was not started by the launcher (or the world is one process).
  static std::unique_ptr<Distributed> from_env(const Config& cfg);
  // Leaving on an error, the peers may never reach the groups' closing barriers (or a receive
  // may be waiting for a message that never comes): the groups are aborted instead.
  ~Distributed();

  int rank() const { return rank_; }
  int world() const { return topo_.world(); }
  // The same on every rank, new at each start of the job.
  uint64_t start_id() const { return start_id_; }
  const parallel::Topology& topology() const { return topo_; }
  // The run's parallel layout on this world (core/parallel_layout.h), validated at start.
  const ParallelLayout& layout() const { return layout_; }
  const parallel::ParallelContext* context() const { return &ctx_; }
  comm::Communicator& world_comm() { return *world_; }
  // Every group of this rank (world, tp, pp, dp, the pipeline links), for its heartbeat.
  std::vector<comm::Communicator*> groups() const;
  // How far this rank's trace clock (trace::now_us) runs ahead of rank 0's, in µs, measured with
  // NTP's four timestamps against rank 0 (wrong by at most half a round trip). Collective.
  int64_t clock_offset_us();
  // "tp 0, pp 1, dp 0" ("tp 0, pp 1, cp 1, dp 0" under cp)
  std::string coordinates() const;
  int tp_rank() const { return topo_.coord(rank_).tp; }
  int dp_rank() const { return topo_.coord(rank_).dp; }
  // The rank that holds the final loss (last pipeline stage, tp 0, cp 0, dp 0) writes metrics.jsonl.
  bool writes_metrics() const;
  void barrier();
  // The node-shared batch of this rank's tensor-parallel group (its members train on the same
  // batch): tp rank 0 reads, the others take it from shared memory. Null when the group spans
  // nodes or has one member. `ints` = tokens per global batch.
  std::unique_ptr<data::SharedBatch> shared_batch(int64_t ints, double timeout_s) const;

 private:
  Distributed(const Config& cfg, int rank, int world);
  // A pipeline link: a two-rank group (sender first), this rank's place in it, and the context's
  // slot its communicator goes to.
  struct Link {
    std::string name;
    int rank;
    comm::Communicator** slot;
  };
  // This rank's pipeline links, each added to specs: per direction and kind, in one global order
  // every rank lists alike (kind, then the sending stage; runtime/pipeline.h).
  std::vector<Link> pipeline_links(std::vector<comm::GroupSpec>& specs);
  // The communicators made for specs into the context's slots (and world_), with their members.
  void bind_groups(const std::vector<comm::GroupSpec>& specs, const std::vector<comm::GroupSpec>& expert_specs,
                   const std::vector<Link>& links);
  int rank_;
  ParallelLayout layout_;
  parallel::Topology topo_;
  std::shared_ptr<comm::Store> store_;
  std::vector<std::unique_ptr<comm::Communicator>> groups_;
  comm::Communicator* world_ = nullptr;
  parallel::ParallelContext ctx_;
  uint64_t start_id_ = 0;  // the same on every rank, new at each start (node-local names)
};

}  // namespace myriad
