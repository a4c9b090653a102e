#include "data/blend.h"

#include <algorithm>

#include "core/error.h"

namespace myriad::data {

Blend::Blend(const DataSources& sources, std::vector<int64_t> samples) : samples_(std::move(samples)) {
  MYRIAD_CHECK(!sources.empty() && sources.size() == samples_.size(), "a blend of ", sources.size(), " sources with ",
               samples_.size(), " sample counts");
  for (const DataSource& d : sources) {
    names_.push_back(d.name);
    configured_.push_back(d.weight);
    caps_.push_back(d.epochs);
  }
  for (int64_t n : samples_) MYRIAD_CHECK(n > 0, "a source of ", n, " samples");
  start();
}

namespace {
// The orders of a position saved before they were kept: a lone source's was the run's seed.
std::vector<SourceOrder> orders_of(const BlendPosition& p) {
  if (!p.orders.empty()) return p.orders;
  return std::vector<SourceOrder>(p.names.size(), p.names.size() == 1 ? SourceOrder::kRunSeed : SourceOrder::kNamed);
}
}  // namespace

void Blend::start() {
  const size_t n = names_.size();
  pos_ = BlendPosition{0, 0, names_, configured_, caps_, std::vector<int64_t>(n, 0), std::vector<int64_t>(n, 0),
                       std::vector<SourceOrder>(n, n == 1 ? SourceOrder::kRunSeed : SourceOrder::kNamed)};
  rebalance();
}

int64_t Blend::capacity() const {
  int64_t all = 0;
  for (int s = 0; s < size(); ++s) {
    if (caps_[s] == 0) return -1;
    all += caps_[s] * samples_[s];
  }
  return all;
}

void Blend::rebalance() {
  pos_.since = pos_.consumed;
  pos_.base = pos_.taken;
  reshare();
}

void Blend::reshare() {
  double total = 0;
  share_.assign(names_.size(), 0.0);
  for (int s = 0; s < size(); ++s)
    if (active(s)) total += configured_[s];
  for (int s = 0; s < size(); ++s)
    if (active(s)) share_[s] = configured_[s] / total;
}

std::string Blend::resume(const BlendPosition& saved) {
  const std::vector<SourceOrder> saved_orders = orders_of(saved);
  if (saved.names == names_ && saved.weights == configured_ && saved.epochs == caps_ &&
      saved.base.size() == names_.size() && saved.taken.size() == names_.size() &&
      saved_orders.size() == names_.size()) {
    pos_ = saved;  // the same blend, where it stood, balanced as it was
    pos_.orders = saved_orders;
    reshare();
    return "";
  }
  std::string changed;
  std::vector<int64_t> taken(names_.size(), 0);
  std::vector<SourceOrder> orders(names_.size(), SourceOrder::kNamed);
  for (int s = 0; s < size(); ++s) {
    const auto at = std::find(saved.names.begin(), saved.names.end(), names_[s]);
    if (at == saved.names.end()) {
      changed += cat(changed.empty() ? "" : "; ", "source '", names_[s], "' is new");
      continue;
    }
    const size_t i = static_cast<size_t>(at - saved.names.begin());
    if (i < saved.taken.size()) taken[s] = saved.taken[i];
    if (i < saved_orders.size()) orders[s] = saved_orders[i];
    if (i >= saved.weights.size() || saved.weights[i] != configured_[s])
      changed += cat(changed.empty() ? "" : "; ", "source '", names_[s], "' weighs ", configured_[s],
                     i < saved.weights.size() ? cat(", was ", saved.weights[i]) : std::string());
    if (i < saved.epochs.size() && saved.epochs[i] != caps_[s])
      changed += cat(changed.empty() ? "" : "; ", "source '", names_[s], "' has an epoch cap of ", caps_[s], ", was ",
                     saved.epochs[i]);
  }
  for (const std::string& old : saved.names)
    if (std::find(names_.begin(), names_.end(), old) == names_.end())
      changed += cat(changed.empty() ? "" : "; ", "source '", old, "' left the blend");
  if (changed.empty()) changed = "the blend's sources were reordered";
  pos_ = BlendPosition{saved.consumed, saved.consumed, names_, configured_, caps_, taken, taken, orders};
  rebalance();
  return changed;
}

void Blend::advance_to(const BlendPosition& after) {
  MYRIAD_CHECK(after.names == names_ && after.taken.size() == names_.size() && after.consumed >= pos_.consumed,
               "a blend position of another blend, or from before this one's");
  pos_ = after;
  reshare();
}

Blend::Pick Blend::next() {
  const double r = double(pos_.consumed - pos_.since + 1);
  int best = -1;
  double most = 0;
  for (int s = 0; s < size(); ++s) {
    if (share_[s] == 0) continue;
    const double behind = share_[s] * r - double(pos_.taken[s] - pos_.base[s]);
    if (best < 0 || behind > most) best = s, most = behind;
  }
  if (best < 0)
    throw_input("data.train: every source reached its epoch cap after ", pos_.consumed,
                " samples: raise a source's epochs (or set 0: no cap), or lower train.steps");
  const Pick p{best, pos_.taken[best]};
  ++pos_.taken[best];
  ++pos_.consumed;
  if (!active(best)) rebalance();  // it reached its cap: the others share its place from here
  return p;
}

}  // namespace myriad::data
