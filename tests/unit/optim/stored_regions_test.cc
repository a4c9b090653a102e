// ParamLayout::stored_regions: any range of a local shard, as pieces of the stored canonical
// tensor, reassembles exactly that range's elements at their canonical indices, for row- and
// column-split TP shards, replicated tensors and the embedding with its padding rows.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "model/params.h"

namespace myriad {
namespace {

Config tp_config(int tp) {
  // vocab 300 pads to 512 at tp 4: rank 2's wte shard ends in padding, rank 3's is all padding.
  return parse_config("", "stored regions test",
                      {"model.layers=1", "model.d_model=64", "model.heads=4", "model.seq_len=16",
                       "model.vocab_size=300", "model.bias=true", cat("parallel.tp=", tp)});
}

// Checks the regions of [begin, end) of p: each element of a region is local element
// local_begin + (its row-major index in the region) and sits at that element's canonical index;
// together they hit each stored element of the range once and nothing else.
void check_range(const ParamLayout& l, const ParamSpec& p, int64_t begin, int64_t end) {
  SCOPED_TRACE(testing::Message() << p.name << " tp rank " << l.tp_rank() << " [" << begin << ", "
                                  << end << ")");
  const std::vector<ParamLayout::StoredRegion> regions = l.stored_regions(p, begin, end);
  EXPECT_LE(regions.size(), p.shape.size() == 1 ? 1u : 3u);
  const int64_t stored_rows = p.name == "wte" ? l.vocab_size() : p.global_shape[0];
  std::map<int64_t, int> hits;  // local index -> times covered
  for (const auto& r : regions) {
    ASSERT_EQ(r.global_shape.size(), p.shape.size());
    EXPECT_EQ(r.global_shape[0], stored_rows);
    int64_t n = 1;
    for (size_t d = 0; d < r.shape.size(); ++d) {
      EXPECT_GT(r.shape[d], 0);
      EXPECT_LE(r.offset[d] + r.shape[d], r.global_shape[d]);
      n *= r.shape[d];
    }
    const int64_t cols = r.shape.size() == 2 ? r.shape[1] : 1;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t local = r.local_begin + j;
      const int64_t canonical = r.shape.size() == 2
                                    ? (r.offset[0] + j / cols) * r.global_shape[1] + r.offset[1] + j % cols
                                    : r.offset[0] + j;
      ASSERT_EQ(canonical, p.global_index(local)) << "region element " << j;
      ++hits[local];
    }
  }
  for (int64_t i = begin; i < end; ++i) {
    const bool stored = p.shape.size() == 1 || p.global_index(i) / p.global_shape[1] < stored_rows;
    ASSERT_EQ(hits.count(i) ? hits[i] : 0, stored ? 1 : 0) << "local element " << i;
  }
  EXPECT_LE(static_cast<int64_t>(hits.size()), end - begin);
}

TEST(StoredRegions, ReassembleRanges) {
  for (int tp : {1, 4}) {
    const Config cfg = tp_config(tp);
    for (int rank = 0; rank < tp; ++rank) {
      const ParamLayout l(cfg, rank, tp);
      for (const char* name : {"wte", "wpe", "h.0.ln1.w", "h.0.attn.qkv.w", "h.0.attn.qkv.b",
                               "h.0.attn.proj.w", "h.0.mlp.proj.w", "h.0.mlp.fc.b"}) {
        const ParamSpec& p = l.find(name);
        const int64_t row = p.shape.size() == 2 ? p.shape[1] : 1, n = p.numel;
        // Whole shard, empty, inside one row, row-aligned, partial-whole-partial, tails.
        const std::vector<std::pair<int64_t, int64_t>> ranges = {
            {0, n}, {5, 5}, {1, row - 1}, {row, 3 * row}, {3, 2 * row + 7}, {row + 1, n},
            {0, n - 1}, {n / 2 + 3, n}, {n - 1, n}};
        for (auto [b, e] : ranges)
          if (0 <= b && b <= e && e <= n) check_range(l, p, b, e);
      }
    }
  }
}

TEST(StoredRegions, WholeShardIsStored) {
  const Config cfg = tp_config(4);
  for (int rank = 0; rank < 4; ++rank) {
    const ParamLayout l(cfg, rank, 4);
    for (const ParamSpec& p : l.tensors()) {
      const ParamLayout::Stored s = l.stored(p);
      const auto r = l.stored_regions(p, 0, p.numel);
      if (s.empty()) {
        EXPECT_TRUE(r.empty()) << p.name;
        EXPECT_EQ(p.name, "wte");
        EXPECT_EQ(rank, 3);
        continue;
      }
      ASSERT_EQ(r.size(), 1u) << p.name;
      EXPECT_EQ(r[0].global_shape, s.global_shape) << p.name;
      EXPECT_EQ(r[0].offset, s.offset) << p.name;
      EXPECT_EQ(r[0].shape, s.shape) << p.name;
      EXPECT_EQ(r[0].local_begin, 0) << p.name;
    }
  }
  // Rank 2's wte: rows [256, 384) of which 44 are real.
  const ParamLayout l(cfg, 2, 4);
  EXPECT_EQ(l.stored(l.find("wte")).shape, (std::vector<int64_t>{44, 64}));
}

TEST(StoredRegions, ColumnShardRows) {
  // proj.w (64, 64) at tp 4, rank 1: local (64, 16) at global columns [16, 32). Local elements
  // [10, 50): row 0 columns 10..15, rows 1..2 whole, row 3 column 0..1.
  const ParamLayout l(tp_config(4), 1, 4);
  const ParamSpec& p = l.find("h.0.attn.proj.w");
  const auto r = l.stored_regions(p, 10, 50);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].offset, (std::vector<int64_t>{0, 26}));
  EXPECT_EQ(r[0].shape, (std::vector<int64_t>{1, 6}));
  EXPECT_EQ(r[1].offset, (std::vector<int64_t>{1, 16}));
  EXPECT_EQ(r[1].shape, (std::vector<int64_t>{2, 16}));
  EXPECT_EQ(r[1].local_begin, 16);
  EXPECT_EQ(r[2].offset, (std::vector<int64_t>{3, 16}));
  EXPECT_EQ(r[2].shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(r[2].local_begin, 48);
}

}  // namespace
}  // namespace myriad
