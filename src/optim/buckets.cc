#include "optim/buckets.h"

#include <algorithm>

#include "core/error.h"

namespace myriad {

FlatRange GradBuckets::piece(int bucket, int dp_rank) const {
  MYRIAD_CHECK(bucket >= 0 && bucket < static_cast<int>(buckets.size()) && dp_rank >= 0 &&
                   dp_rank < dp,
               "bucket ", bucket, " of ", buckets.size(), ", dp rank ", dp_rank, " of ", dp);
  const FlatRange& b = buckets[bucket];
  const int64_t n = b.size() / dp;
  return {b.begin + dp_rank * n, b.begin + (dp_rank + 1) * n};
}

std::vector<FlatRange> GradBuckets::owned(int dp_rank) const {
  std::vector<FlatRange> out;
  for (int b = static_cast<int>(buckets.size()) - 1; b >= 0; --b) {  // ascending offsets
    FlatRange r = piece(b, dp_rank);
    r.end = std::min(r.end, total);
    if (r.size() <= 0) continue;
    if (!out.empty() && out.back().end == r.begin)
      out.back().end = r.end;
    else
      out.push_back(r);
  }
  // An empty list would mean the whole buffer to make_optimizer.
  if (out.empty()) out.push_back({0, 0});
  return out;
}

GradBuckets plan_buckets(int64_t total, int dp, int64_t bucket_elems) {
  MYRIAD_CHECK(dp >= 1 && total >= 0, "plan_buckets: total ", total, ", dp ", dp);
  GradBuckets g;
  g.dp = dp;
  g.total = total;
  g.padded_total = (total + dp - 1) / dp * dp;
  const int64_t size =
      bucket_elems <= 0 ? g.padded_total : (bucket_elems + dp - 1) / dp * dp;
  for (int64_t end = g.padded_total; end > 0; end -= size)
    g.buckets.push_back({std::max<int64_t>(0, end - size), end});
  return g;
}

}  // namespace myriad
