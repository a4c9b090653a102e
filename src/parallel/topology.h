// How the ranks of a job are laid out over tensor (tp), pipeline (pp) and data (dp) parallelism.
//
// world = tp x pp x dp. parallel.order names the dimensions from the fastest-varying to the
// slowest: with the default "tp-dp-pp", rank = tp_coord + tp * (dp_coord + dp * pp_coord), so the
// ranks of one tensor-parallel group are neighbours (one host), then data parallelism, then the
// pipeline stages.
//
// A group of one dimension is the set of ranks whose other two coordinates are equal; its
// members are listed in the order of that dimension's coordinate, which is each member's rank in
// the group. Groups of one dimension are numbered by the other two coordinates, the faster one
// of them varying fastest ("tp0", "tp1", ... in rank order of their first members).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "comm/rendezvous.h"
#include "core/config.h"

namespace myriad::parallel {

enum class Dim { kTp = 0, kDp = 1, kPp = 2 };
const char* dim_name(Dim d);  // "tp", "dp", "pp"

struct Coord {
  int tp = 0, dp = 0, pp = 0;
  int operator[](Dim d) const { return d == Dim::kTp ? tp : d == Dim::kDp ? dp : pp; }
  bool operator==(const Coord&) const = default;
};

class Topology {
 public:
  // dp = 0 means world / (tp x pp). Throws an input error that spells out the arithmetic when
  // the sizes do not multiply to world, or when order is not a permutation of tp, dp, pp.
  Topology(int world, int tp, int pp, int dp = 0, const std::string& order = "tp-dp-pp");

  int world() const { return world_; }
  int size(Dim d) const { return sizes_[static_cast<int>(d)]; }
  int tp() const { return size(Dim::kTp); }
  int dp() const { return size(Dim::kDp); }
  int pp() const { return size(Dim::kPp); }
  const std::string& order() const { return order_; }

  Coord coord(int rank) const;
  int rank_of(const Coord& c) const;

  // The members of the group of dimension d that `rank` belongs to, in group-rank order.
  std::vector<int> group(Dim d, int rank) const;
  // Which group of dimension d `rank` is in: 0 .. world / size(d) - 1.
  int group_index(Dim d, int rank) const;
  // "tp3": unique per group of the job.
  std::string group_name(Dim d, int rank) const;
  // Every group of dimension d, by group index.
  std::vector<std::vector<int>> groups(Dim d) const;

  // Expert parallelism folded into a pipeline stage's tensor x data ranks (core/parallel_layout.h):
  // the stage's ranks in (dp, tp) order, tp fastest (index i = dp tp_size + tp); `rank`'s expert
  // group, the ep consecutive ones of them holding every expert once between them, and its
  // experts' data-parallel group, those at the same place of every expert group (they hold the
  // same experts). Members in group-rank order; ep must divide tp x dp.
  std::vector<int> expert_group(int rank, int ep) const;
  std::vector<int> expert_dp_group(int rank, int ep) const;
  // Their specs ("stage0.ep1", "stage0.edp0"), in that order; none when ep = 1.
  std::vector<comm::GroupSpec> expert_group_specs(int rank, int ep) const;

  // What make_groups needs to create `rank`'s communicators, in the one global order every rank
  // uses: world, tp, pp, dp.
  std::vector<comm::GroupSpec> group_specs(int rank) const;

 private:
  void check_rank(int rank) const;
  int world_;
  std::array<int, 3> sizes_;    // by Dim
  std::array<int, 3> strides_;  // by Dim: rank = sum coord * stride
  std::array<Dim, 3> fastest_;  // the dimensions from fastest to slowest
  std::string order_;
};

}  // namespace myriad::parallel
