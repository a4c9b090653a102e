// Gradient buckets for data-parallel reduce-scatter (ZeRO-1/2).
//
// The flat gradient buffer (layout order: embeddings, layer 0, ..., layer L-1, final norm) is cut
// into buckets. Backward produces gradients from the END of the buffer towards the start, so the
// buckets are numbered in that order: buckets[0] is the last range of the buffer (ready first).
// Each bucket's size is a multiple of dp; its reduce-scatter gives rank r the r-th of dp equal
// pieces, which rank r owns: it alone keeps optimizer state for them and updates those
// parameters. The buffer is padded at its end to padded_total (a multiple of dp) so that every
// piece of a bucket has the same size; the padding is never a parameter.
#pragma once

#include <cstdint>
#include <vector>

#include "model/params.h"  // FlatRange

namespace myriad {

struct GradBuckets {
  int dp = 1;
  int64_t total = 0, padded_total = 0;
  std::vector<FlatRange> buckets;  // readiness order (descending offsets), covering [0, padded_total)
  // The part of buckets[bucket] that rank dp_rank owns (may extend into the padding).
  FlatRange piece(int bucket, int dp_rank) const;
  // The rank's pieces clipped to [0, total), empty ones dropped, adjacent ones merged (dp = 1:
  // one range), ascending offsets: what make_optimizer takes as `owned`. A rank whose pieces
  // all fall in the padding (total < dp^2 or so) gets {{0, 0}}: it owns nothing.
  std::vector<FlatRange> owned(int dp_rank) const;
};

// bucket_elems: target elements per bucket, rounded up to a multiple of dp (<= 0: one bucket);
// the bucket holding offset 0 takes the remainder. total = 0 gives no buckets.
GradBuckets plan_buckets(int64_t total, int dp, int64_t bucket_elems);

}  // namespace myriad
