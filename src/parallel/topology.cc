#include "parallel/topology.h"

#include "core/error.h"
#include "core/parallel_layout.h"

namespace myriad::parallel {

const char* dim_name(Dim d) {
  switch (d) {
    case Dim::kTp: return "tp";
    case Dim::kDp: return "dp";
    case Dim::kPp: return "pp";
    case Dim::kCp: return "cp";
  }
  return "?";
}

namespace {
constexpr Dim kDims[] = {Dim::kTp, Dim::kDp, Dim::kPp, Dim::kCp};
int idx(Dim d) { return static_cast<int>(d); }

std::array<Dim, 4> parse_order(const std::string& order) {
  std::array<Dim, 4> dims{};
  const std::vector<std::string> names = parallel_order(order);  // the input error for a bad one
  for (size_t i = 0; i < names.size(); ++i)
    for (Dim d : kDims)
      if (names[i] == dim_name(d)) dims[i] = d;
  return dims;
}
}  // namespace

Topology::Topology(int world, int tp, int pp, int dp, const std::string& order, int cp)
    : world_(world), order_(order) {
  if (world < 1) throw_input("world size must be at least 1, got ", world);
  if (tp < 1) throw_input("parallel.tp must be at least 1, got ", tp);
  if (pp < 1) throw_input("parallel.pp must be at least 1, got ", pp);
  if (cp < 1) throw_input("parallel.cp must be at least 1, got ", cp);
  if (dp < 0) throw_input("parallel.dp must be 0 (world / (tp x pp)) or positive, got ", dp);
  fastest_ = parse_order(order);
  const std::string sizes = cp > 1 ? cat("tp ", tp, " x pp ", pp, " x cp ", cp) : cat("tp ", tp, " x pp ", pp);
  if (dp == 0) {
    if (world % (tp * pp * cp) != 0)
      throw_input("world ", world, " is not divisible by ", sizes, " = ", tp * pp * cp, " (dp = world / (",
                  cp > 1 ? "tp x pp x cp" : "tp x pp", "))");
    dp = world / (tp * pp * cp);
  } else if (tp * pp * cp * dp != world) {
    throw_input("world ", world, " is not ", sizes, " x dp ", dp, " = ", tp * pp * cp * dp,
                " (set parallel.dp = 0 to derive it from the world size)");
  }
  sizes_[idx(Dim::kTp)] = tp;
  sizes_[idx(Dim::kDp)] = dp;
  sizes_[idx(Dim::kPp)] = pp;
  sizes_[idx(Dim::kCp)] = cp;
  int stride = 1;
  for (Dim d : fastest_) {
    strides_[idx(d)] = stride;
    stride *= sizes_[idx(d)];
  }
}

void Topology::check_rank(int rank) const {
  MYRIAD_CHECK(rank >= 0 && rank < world_, "rank ", rank, " outside world ", world_);
}

Coord Topology::coord(int rank) const {
  check_rank(rank);
  auto at = [&](Dim d) { return rank / strides_[idx(d)] % sizes_[idx(d)]; };
  return {at(Dim::kTp), at(Dim::kDp), at(Dim::kPp), at(Dim::kCp)};
}

int Topology::rank_of(const Coord& c) const {
  int r = 0;
  for (Dim d : kDims) {
    MYRIAD_CHECK(c[d] >= 0 && c[d] < sizes_[idx(d)], dim_name(d), " coordinate ", c[d],
                 " outside ", sizes_[idx(d)]);
    r += c[d] * strides_[idx(d)];
  }
  return r;
}

std::vector<int> Topology::group(Dim d, int rank) const {
  const Coord c = coord(rank);
  const int base = rank - c[d] * strides_[idx(d)];
  std::vector<int> members(sizes_[idx(d)]);
  for (int i = 0; i < sizes_[idx(d)]; ++i) members[i] = base + i * strides_[idx(d)];
  return members;
}

int Topology::group_index(Dim d, int rank) const {
  const Coord c = coord(rank);
  int index = 0, scale = 1;
  for (Dim o : fastest_) {
    if (o == d) continue;
    index += c[o] * scale;
    scale *= sizes_[idx(o)];
  }
  return index;
}

std::string Topology::group_name(Dim d, int rank) const {
  return dim_name(d) + std::to_string(group_index(d, rank));
}

std::vector<std::vector<int>> Topology::groups(Dim d) const {
  std::vector<std::vector<int>> out(world_ / sizes_[idx(d)]);
  for (int r = 0; r < world_; ++r)
    if (coord(r)[d] == 0) out[group_index(d, r)] = group(d, r);
  return out;
}

namespace {
// `rank`'s index among its stage's tp x cp x dp ranks, (dp, cp, tp) order, tp fastest.
int stage_index(const Topology& t, int rank) {
  const Coord c = t.coord(rank);
  return (c.dp * t.cp() + c.cp) * t.tp() + c.tp;
}
// The rank of the stage's index-th rank.
int stage_rank(const Topology& t, int pp, int index) {
  const int rest = index / t.tp();
  return t.rank_of({index % t.tp(), rest / t.cp(), pp, rest % t.cp()});
}
int stage_ranks(const Topology& t) { return t.tp() * t.cp() * t.dp(); }
}  // namespace

std::vector<int> Topology::expert_group(int rank, int ep) const {
  MYRIAD_CHECK(ep >= 1 && stage_ranks(*this) % ep == 0, "ep ", ep, " must divide tp x cp x dp ", stage_ranks(*this));
  const int first = stage_index(*this, rank) / ep * ep;
  std::vector<int> out;
  for (int i = first; i < first + ep; ++i) out.push_back(stage_rank(*this, coord(rank).pp, i));
  return out;
}

std::vector<int> Topology::expert_dp_group(int rank, int ep) const {
  MYRIAD_CHECK(ep >= 1 && stage_ranks(*this) % ep == 0, "ep ", ep, " must divide tp x cp x dp ", stage_ranks(*this));
  std::vector<int> out;
  for (int i = stage_index(*this, rank) % ep; i < stage_ranks(*this); i += ep)
    out.push_back(stage_rank(*this, coord(rank).pp, i));
  return out;
}

std::vector<comm::GroupSpec> Topology::expert_group_specs(int rank, int ep) const {
  if (ep <= 1) return {};
  const int i = stage_index(*this, rank);
  const std::string stage = "stage" + std::to_string(coord(rank).pp);
  return {{stage + ".ep" + std::to_string(i / ep), i % ep, ep},
          {stage + ".edp" + std::to_string(i % ep), i / ep, stage_ranks(*this) / ep}};
}

std::vector<int> Topology::dcp_group(int rank) const {
  Coord c = coord(rank);
  std::vector<int> members;
  for (c.dp = 0; c.dp < dp(); ++c.dp)
    for (c.cp = 0; c.cp < cp(); ++c.cp) members.push_back(rank_of(c));
  return members;
}

comm::GroupSpec Topology::dcp_spec(int rank) const {
  const Coord c = coord(rank);
  return {"dcp" + std::to_string(c.tp + tp() * c.pp), c.dp * cp() + c.cp, dp() * cp()};
}

std::vector<comm::GroupSpec> Topology::group_specs(int rank) const {
  const Coord c = coord(rank);
  std::vector<comm::GroupSpec> specs{{"world", rank, world_}};
  for (Dim d : {Dim::kTp, Dim::kPp, Dim::kDp})
    specs.push_back({group_name(d, rank), c[d], sizes_[idx(d)]});
  if (cp() > 1) specs.push_back({group_name(Dim::kCp, rank), c.cp, cp()}), specs.push_back(dcp_spec(rank));
  return specs;
}

}  // namespace myriad::parallel
