#include "runtime/data_parallel.h"

#include "core/error.h"

namespace myriad {

DataParallel::DataParallel(comm::Communicator* dp, int64_t total, int64_t bucket_elems,
                           std::vector<FlatRange> chunk_ranges,
                           std::vector<std::vector<FlatRange>> chunk_reads, FlatRange held_back,
                           bool overlap, comm::Stream stream)
    : dp_(dp && dp->size() > 1 ? dp : nullptr),
      rank_(dp_ ? dp_->rank() : 0),
      plan_(plan_buckets(total, dp_ ? dp_->size() : 1, bucket_elems)),
      chunk_ranges_(std::move(chunk_ranges)),
      chunk_reads_(std::move(chunk_reads)),
      held_back_(held_back),
      overlap_(overlap),
      stream_(stream),
      chunk_final_(chunk_ranges_.size(), false),
      reduce_(plan_.buckets.size()),
      gather_(plan_.buckets.size()) {}

bool DataParallel::overlaps(int bucket, const FlatRange& r) const {
  const FlatRange& b = plan_.buckets[bucket];
  return r.begin < b.end && b.begin < r.end;
}

void DataParallel::wait(comm::WorkPtr& work) {
  waited_s_ += comm::wait_blocked_s(*work);
  work.reset();
}

void DataParallel::start_reduce(int bucket, float* grads) {
  if (reduce_[bucket] || !dp_) return;
  const FlatRange& b = plan_.buckets[bucket];
  const int64_t piece = b.size() / dp_->size();
  // In place: this rank's piece of the sum lands where its piece was.
  reduce_[bucket] = dp_->reduce_scatter(grads + b.begin, grads + b.begin + rank_ * piece, piece, stream_);
}

void DataParallel::chunk_done(int c, float* grads) {
  chunk_final_[c] = true;
  if (!dp_ || !overlap_) return;
  // In readiness order; stop at the first bucket that is not complete, so that the buckets go
  // out in the same order on every rank (each rank's collectives must match).
  for (size_t k = 0; k < plan_.buckets.size(); ++k) {
    if (reduce_[k]) continue;
    bool ready = !overlaps(static_cast<int>(k), held_back_);
    for (size_t i = 0; i < chunk_ranges_.size() && ready; ++i)
      if (!chunk_final_[i] && overlaps(static_cast<int>(k), chunk_ranges_[i])) ready = false;
    if (!ready) break;
    start_reduce(static_cast<int>(k), grads);
  }
}

void DataParallel::finish_reduce(float* grads) {
  std::fill(chunk_final_.begin(), chunk_final_.end(), false);
  if (!dp_) return;
  for (size_t k = 0; k < plan_.buckets.size(); ++k) start_reduce(static_cast<int>(k), grads);
  for (auto& w : reduce_) wait(w);
}

void DataParallel::gather_params(float* params) {
  if (!dp_) return;
  // The next forward starts at the embedding: the last bucket of the readiness order first.
  for (int k = static_cast<int>(plan_.buckets.size()) - 1; k >= 0; --k) {
    const FlatRange& b = plan_.buckets[k];
    const int64_t piece = b.size() / dp_->size();
    gather_[k] = dp_->all_gather(params + b.begin + rank_ * piece, params + b.begin, piece, stream_);
  }
  if (!overlap_) wait_all_params();
}

void DataParallel::wait_params(int c) {
  for (size_t k = 0; k < gather_.size(); ++k) {
    if (!gather_[k]) continue;
    for (const FlatRange& r : chunk_reads_[c])
      if (overlaps(static_cast<int>(k), r)) {
        wait(gather_[k]);
        break;
      }
  }
}

void DataParallel::wait_all_params() {
  for (auto& w : gather_)
    if (w) wait(w);
}

}  // namespace myriad
