// Data parallelism with a sharded optimizer (ZeRO-1/2), its communication overlapped with
// compute (MegaScale section 3.2).
//
// The flat gradient buffer is cut into buckets (optim/buckets.h), numbered in the order backward
// completes them. A bucket's reduce-scatter starts as soon as every chunk whose gradients fall
// in it has run its last backward of the step, while backward goes on with the chunks below;
// each data-parallel rank receives the sum of its own piece of every bucket, which it alone
// updates (it alone keeps optimizer state for it). After the update every bucket's parameters
// are all-gathered, issued in the order the next forward needs them (the embedding's bucket
// first) and waited for chunk by chunk just before each chunk's first forward, so the gathers
// overlap the start of the next step.
//
// With overlap off (parallel.overlap_dp = false, for measuring what the overlap buys), every
// reduce-scatter waits for finish_reduce() and every all-gather is waited for at once: the same
// collectives on the same buffers, so the same bits, only serialized.
//
// The buffers are in the op set's memory: host floats on the CPU, device memory on a GPU. The
// gradients are fp32; the all-gather carries the weights the forward reads (the op set's
// compute copy: bf16 on a GPU, half fp32's traffic), while the fp32 master weights stay sharded
// with the optimizer state (each rank keeps its owned pieces only: ZeRO's sharded master).
//
// The rank's copy of the tied embedding (when the pipeline puts the embedding and the LM head on
// different stages) becomes final only once the two stages have exchanged their gradients, at
// the end of backward: the buckets holding it wait for finish_reduce().
//
// Regions: the buffer is one region reduced over the data-parallel group, or, for an MoE model,
// two: every other tensor over dp, then the routed experts (params.h's expert region) over the
// experts' data-parallel group, the ranks that hold the same experts (core/parallel_layout.h).
// Each region has its own buckets, planned and padded within it (the layout leaves the gap),
// and its own order of readiness; the same on every rank of each group, so each group's
// collectives match.
#pragma once

#include <vector>

#include "comm/communicator.h"
#include "model/params.h"
#include "optim/buckets.h"

namespace myriad {

class DataParallel {
 public:
  // A range of the flat buffer and the group its gradients are reduced over (null = one rank:
  // nothing to communicate, the rank owns all of it).
  struct Region {
    FlatRange range;
    comm::Communicator* group = nullptr;
  };
  // The regions of `layout`: [0, dense_total) over dp, and the expert region over edp when it
  // is not empty.
  static std::vector<Region> regions_of(const ParamLayout& layout, comm::Communicator* dp, comm::Communicator* edp);
  // The flat buffer the regions' buckets need (the last region's padding included).
  static int64_t flat_size(const std::vector<Region>& regions);

  // chunk_ranges[c]: the flat ranges whose gradients are final after chunk c's last backward;
  // chunk_reads[c]: the ranges chunk c's forward reads. held_back: a range final only at
  // finish_reduce (the tied embedding), may be empty.
  // stream: the op set's (comm::Stream; null on the CPU): the buffers are its memory.
  DataParallel(std::vector<Region> regions, int64_t bucket_elems, std::vector<std::vector<FlatRange>> chunk_ranges,
               std::vector<std::vector<FlatRange>> chunk_reads, FlatRange held_back, bool overlap = true,
               comm::Stream stream = nullptr);

  int64_t flat_size() const { return flat_size_; }  // params and grads buffers
  // What this rank updates: its pieces of every region, ascending ({{0, 0}} when nothing).
  std::vector<FlatRange> owned() const;
  // The regions, and the pieces group rank `rank` of region r's group owns (ascending).
  int regions() const { return static_cast<int>(regions_.size()); }
  comm::Communicator* group(int r) const { return regions_[r].group; }
  std::vector<FlatRange> owned_by(int r, int rank) const;
  int buckets() const;

  // Chunk c ran its last backward of the step: starts the reduce-scatters it completes.
  void chunk_done(int c, float* grads);
  // After backward (and the tied-embedding exchange): starts the rest and waits for all. The
  // owned ranges of grads then hold the sums over their groups; the rest is stale.
  void finish_reduce(float* grads);
  // After the update of the owned ranges: all-gathers every bucket of the weights the forward
  // reads (the compute copy: elem_bytes per element, bf16 on a GPU), asynchronously.
  void gather_params(void* params, int64_t elem_bytes);
  // Before chunk c's forward: waits for the gathers of the buckets it reads.
  void wait_params(int c);
  void wait_all_params();

  // Seconds spent blocked on this object's collectives since it was made (take differences).
  double waited_s() const { return waited_s_; }

 private:
  // A region's state: its group (null: one rank), this rank's place in it, its buckets (offsets
  // in the flat buffer) and their pending collectives.
  struct Part {
    comm::Communicator* group = nullptr;
    int rank = 0;
    int64_t base = 0;
    GradBuckets plan;  // of the region's range, offsets relative to base
    std::vector<comm::WorkPtr> reduce, gather;  // per bucket, null = not started / done
  };
  FlatRange bucket(const Part& p, int k) const { return {p.base + p.plan.buckets[k].begin, p.base + p.plan.buckets[k].end}; }
  void start_reduce(Part& p, int k, float* grads);
  void wait(comm::WorkPtr& work);  // and reset it
  static bool overlaps(const FlatRange& a, const FlatRange& b) { return a.begin < b.end && b.begin < a.end; }

  std::vector<Region> regions_;
  std::vector<Part> parts_;
  int64_t flat_size_ = 0;
  std::vector<std::vector<FlatRange>> chunk_ranges_;
  std::vector<std::vector<FlatRange>> chunk_reads_;
  FlatRange held_back_;
  bool overlap_;
  comm::Stream stream_;
  double waited_s_ = 0;
  std::vector<bool> chunk_final_;
};

}  // namespace myriad
