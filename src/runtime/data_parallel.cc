#include "runtime/data_parallel.h"

#include <algorithm>

#include "core/error.h"

namespace myriad {

std::vector<DataParallel::Region> DataParallel::regions_of(const ParamLayout& layout, comm::Communicator* dp,
                                                           comm::Communicator* edp) {
  std::vector<Region> out = {{{0, layout.dense_total()}, dp}};
  if (layout.expert_region().size() > 0) out.push_back({layout.expert_region(), edp});
  return out;
}

int64_t DataParallel::flat_size(const std::vector<Region>& regions) {
  const Region& last = regions.back();
  const int n = last.group ? last.group->size() : 1;
  return last.range.begin + plan_buckets(last.range.size(), n, 0).padded_total;
}

DataParallel::DataParallel(std::vector<Region> regions, int64_t bucket_elems,
                           std::vector<std::vector<FlatRange>> chunk_ranges,
                           std::vector<std::vector<FlatRange>> chunk_reads, FlatRange held_back, bool overlap,
                           comm::Stream stream)
    : regions_(std::move(regions)),
      chunk_ranges_(std::move(chunk_ranges)),
      chunk_reads_(std::move(chunk_reads)),
      held_back_(held_back),
      overlap_(overlap),
      stream_(stream),
      chunk_final_(chunk_ranges_.size(), false) {
  for (size_t r = 0; r < regions_.size(); ++r) {
    Region& g = regions_[r];
    if (g.group && g.group->size() <= 1) g.group = nullptr;
    Part p;
    p.group = g.group, p.rank = g.group ? g.group->rank() : 0, p.base = g.range.begin;
    p.plan = plan_buckets(g.range.size(), g.group ? g.group->size() : 1, bucket_elems);
    // The padding stays inside the region: the layout starts the next one after it.
    MYRIAD_CHECK(r + 1 == regions_.size() || p.base + p.plan.padded_total <= regions_[r + 1].range.begin,
                 "data-parallel region ", r, " pads past the next one's start");
    p.reduce.resize(p.plan.buckets.size()), p.gather.resize(p.plan.buckets.size());
    parts_.push_back(std::move(p));
  }
  flat_size_ = flat_size(regions_);
}

std::vector<FlatRange> DataParallel::owned_by(int r, int rank) const {
  const Part& p = parts_[r];
  std::vector<FlatRange> out;
  for (const FlatRange& o : p.plan.owned(rank))
    if (o.size() > 0) out.push_back({p.base + o.begin, p.base + o.end});
  return out;
}

std::vector<FlatRange> DataParallel::owned() const {
  std::vector<FlatRange> out;
  for (int r = 0; r < regions(); ++r)
    for (const FlatRange& o : owned_by(r, parts_[r].rank)) out.push_back(o);
  // An empty list would mean the whole buffer to make_optimizer.
  if (out.empty()) out.push_back({0, 0});
  return out;
}

int DataParallel::buckets() const {
  int n = 0;
  for (const Part& p : parts_) n += static_cast<int>(p.plan.buckets.size());
  return n;
}

void DataParallel::wait(comm::WorkPtr& work) {
  waited_s_ += comm::wait_blocked_s(*work);
  work.reset();
}

void DataParallel::start_reduce(Part& p, int k, float* grads) {
  if (p.reduce[k] || !p.group) return;
  const FlatRange b = bucket(p, k);
  const int64_t piece = b.size() / p.group->size();
  // In place: this rank's piece of the sum lands where its piece was.
  p.reduce[k] = p.group->reduce_scatter(grads + b.begin, grads + b.begin + p.rank * piece, piece, stream_);
}

void DataParallel::chunk_done(int c, float* grads) {
  chunk_final_[c] = true;
  if (!overlap_) return;
  // Per region in readiness order; stop at the first bucket that is not complete, so that the
  // buckets go out in the same order on every rank of the region's group.
  for (Part& p : parts_) {
    if (!p.group) continue;
    for (size_t k = 0; k < p.plan.buckets.size(); ++k) {
      if (p.reduce[k]) continue;
      const FlatRange b = bucket(p, static_cast<int>(k));
      bool ready = !overlaps(b, held_back_);
      for (size_t i = 0; i < chunk_ranges_.size() && ready; ++i)
        if (!chunk_final_[i])
          for (const FlatRange& r : chunk_ranges_[i]) ready = ready && !overlaps(b, r);
      if (!ready) break;
      start_reduce(p, static_cast<int>(k), grads);
    }
  }
}

void DataParallel::finish_reduce(float* grads) {
  std::fill(chunk_final_.begin(), chunk_final_.end(), false);
  for (Part& p : parts_)
    for (size_t k = 0; k < p.plan.buckets.size(); ++k) start_reduce(p, static_cast<int>(k), grads);
  for (Part& p : parts_)
    for (auto& w : p.reduce)
      if (w) wait(w);
}

void DataParallel::gather_params(void* params, int64_t elem_bytes) {
  auto* at = static_cast<uint8_t*>(params);
  for (Part& p : parts_) {
    if (!p.group) continue;
    // The next forward starts at the embedding: the last bucket of the readiness order first.
    for (int k = static_cast<int>(p.plan.buckets.size()) - 1; k >= 0; --k) {
      const FlatRange b = bucket(p, k);
      const int64_t piece = b.size() / p.group->size();
      p.gather[k] = p.group->all_gather_bytes(at + (b.begin + p.rank * piece) * elem_bytes, at + b.begin * elem_bytes,
                                              piece * elem_bytes, stream_);
    }
  }
  if (!overlap_) wait_all_params();
}

void DataParallel::wait_params(int c) {
  for (Part& p : parts_)
    for (size_t k = 0; k < p.gather.size(); ++k) {
      if (!p.gather[k]) continue;
      const FlatRange b = bucket(p, static_cast<int>(k));
      for (const FlatRange& r : chunk_reads_[c])
        if (overlaps(b, r)) {
          wait(p.gather[k]);
          break;
        }
    }
}

void DataParallel::wait_all_params() {
  for (Part& p : parts_)
    for (auto& w : p.gather)
      if (w) wait(w);
}

}  // namespace myriad
