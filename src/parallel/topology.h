// How the ranks of a job are laid out over tensor (tp), context (cp), data (dp) and pipeline (pp)
// parallelism.
//
// world = tp x cp x dp x pp. parallel.order names the dimensions from the fastest-varying to the
// slowest (core/parallel_layout.h's parallel_order: cp right after tp unless named): with the
// default "tp-dp-pp" and cp = 1, rank = tp_coord + tp * (dp_coord + dp * pp_coord), so the ranks
// of one tensor-parallel group are neighbours (one host), then data parallelism, then the
// pipeline stages.
//
// A group of one dimension is the set of ranks whose other coordinates are equal; its members
// are listed in the order of that dimension's coordinate, which is each member's rank in the
// group. Groups of one dimension are numbered by the other coordinates, the faster ones varying
// faster ("tp0", "tp1", ... in rank order of their first members). Under cp the gradients are
// reduced over a group of two dimensions, dp x cp (`dcp`): the ranks of one tensor rank of one
// stage, listed dp-major (member i = dp_coord cp + cp_coord).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "comm/rendezvous.h"
#include "core/config.h"

namespace myriad::parallel {

enum class Dim { kTp = 0, kDp = 1, kPp = 2, kCp = 3 };
const char* dim_name(Dim d);  // "tp", "dp", "pp", "cp"

struct Coord {
  int tp = 0, dp = 0, pp = 0, cp = 0;
  int operator[](Dim d) const { return d == Dim::kTp ? tp : d == Dim::kDp ? dp : d == Dim::kPp ? pp : cp; }
  bool operator==(const Coord&) const = default;
};

class Topology {
 public:
  // dp = 0 means world / (tp x pp x cp). Throws an input error that spells out the arithmetic
  // when the sizes do not multiply to world, or when order is not a permutation of tp, dp, pp
  // (and cp).
  Topology(int world, int tp, int pp, int dp = 0, const std::string& order = "tp-dp-pp", int cp = 1);

  int world() const { return world_; }
  int size(Dim d) const { return sizes_[static_cast<int>(d)]; }
  int tp() const { return size(Dim::kTp); }
  int dp() const { return size(Dim::kDp); }
  int pp() const { return size(Dim::kPp); }
  int cp() const { return size(Dim::kCp); }
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
  // The dp x cp group of `rank` (the ranks holding the same weights under cp), dp-major, and its
  // spec ("dcp3", numbered by tp + tp_size x pp).
  std::vector<int> dcp_group(int rank) const;
  comm::GroupSpec dcp_spec(int rank) const;

  // Expert parallelism folded into a pipeline stage's tensor x context x data ranks
  // (core/parallel_layout.h): the stage's ranks in (dp, cp, tp) order, tp fastest (index
  // i = (dp cp_size + cp) tp_size + tp); `rank`'s expert group, the ep consecutive ones of them
  // holding every expert once between them, and its experts' data-parallel group, those at the
  // same place of every expert group (they hold the same experts). Members in group-rank order;
  // ep must divide tp x cp x dp.
  std::vector<int> expert_group(int rank, int ep) const;
  std::vector<int> expert_dp_group(int rank, int ep) const;
  // Their specs ("stage0.ep1", "stage0.edp0"), in that order; none when ep = 1.
  std::vector<comm::GroupSpec> expert_group_specs(int rank, int ep) const;

  // What make_groups needs to create `rank`'s communicators, in the one global order every rank
  // uses: world, tp, pp, dp, and under cp (cp > 1) cp and dcp.
  std::vector<comm::GroupSpec> group_specs(int rank) const;

 private:
  void check_rank(int rank) const;
  int world_;
  std::array<int, 4> sizes_;    // by Dim
  std::array<int, 4> strides_;  // by Dim: rank = sum coord * stride
  std::array<Dim, 4> fastest_;  // the dimensions from fastest to slowest
  std::string order_;
};

}  // namespace myriad::parallel
