#include "runtime/state.h"

#include <algorithm>

#include "core/log.h"
#include "optim/optimizer.h"

namespace myriad {

// A save writes the owned pieces (their owners' master weights and moments); a load reads every
// weight of the layout and the owned pieces' moments.
std::vector<checkpoint::Shard> ParamsState::shards(bool for_save) {
  std::vector<checkpoint::Shard> out;
  Engine::HostState st = engine_.host_state();
  const ParamLayout& layout = engine_.layout();
  if (!for_save) {
    for (const ParamSpec& p : layout.tensors())
      for (const auto& r : layout.stored_regions(p, 0, p.numel))
        out.push_back({checkpoint::param_name(p.name), r.global_shape, r.offset, r.shape, st.params + p.offset + r.local_begin});
    return out;
  }
  for (const OwnedPiece& piece : owned_pieces(layout, st.owned)) {
    if (!engine_.writes_to_checkpoint(*piece.tensor)) continue;
    for (const auto& r : layout.stored_regions(*piece.tensor, piece.local_begin, piece.local_end))
      out.push_back({checkpoint::param_name(piece.tensor->name), r.global_shape, r.offset, r.shape,
                     st.params + piece.tensor->offset + r.local_begin});
  }
  return out;
}

std::vector<checkpoint::Shard> OptimizerState::shards(bool for_save) {
  std::vector<checkpoint::Shard> out;
  Engine::HostState st = engine_.host_state();
  const ParamLayout& layout = engine_.layout();
  for (const OwnedPiece& piece : owned_pieces(layout, st.owned)) {
    if (for_save && !engine_.writes_to_checkpoint(*piece.tensor)) continue;
    for (const auto& r : layout.stored_regions(*piece.tensor, piece.local_begin, piece.local_end)) {
      const int64_t at = piece.packed + (r.local_begin - piece.local_begin);
      out.push_back({checkpoint::moment_name(1, piece.tensor->name), r.global_shape, r.offset, r.shape, st.m + at});
      out.push_back({checkpoint::moment_name(2, piece.tensor->name), r.global_shape, r.offset, r.shape, st.v + at});
    }
  }
  return out;
}

void OptimizerState::save(checkpoint::Meta& meta) const {
  meta.optimizer = {name_, *engine_.host_state().steps_taken};
}

void OptimizerState::load(const checkpoint::Meta& meta) { *engine_.host_state().steps_taken = meta.optimizer.steps_taken; }

void SkipList::save(checkpoint::Meta& meta) const {
  meta.skipped_steps.clear();
  for (int64_t s : steps_)
    if (s <= step_) meta.skipped_steps.push_back(s);
  std::sort(meta.skipped_steps.begin(), meta.skipped_steps.end());
  meta.skipped_steps.erase(std::unique(meta.skipped_steps.begin(), meta.skipped_steps.end()), meta.skipped_steps.end());
}

void SkipList::load(const checkpoint::Meta& meta) {
  for (int64_t s : meta.skipped_steps)
    if (std::find(steps_.begin(), steps_.end(), s) == steps_.end()) steps_.push_back(s);
}

void DataPosition::save(checkpoint::Meta& meta) const {
  const data::BlendPosition& p = blend_.position();
  meta.data = {p.consumed, seed_, p.since, {}};
  for (size_t s = 0; s < p.names.size(); ++s)
    meta.data.sources.push_back({p.names[s], p.weights[s], p.epochs[s], p.base[s], p.taken[s],
                                 p.orders[s] == data::SourceOrder::kRunSeed ? "run_seed" : "named"});
}

void DataPosition::load(const checkpoint::Meta& meta) {
  data::BlendPosition saved{meta.data.consumed, meta.data.since, {}, {}, {}, {}, {}, {}};
  bool orders = true;  // every source's order recorded (else the blend derives them: data/blend.h)
  for (const checkpoint::Meta::Data::Source& s : meta.data.sources) {
    saved.names.push_back(s.name), saved.weights.push_back(s.weight), saved.epochs.push_back(s.epochs);
    saved.base.push_back(s.base), saved.taken.push_back(s.taken);
    saved.orders.push_back(s.order == "run_seed" ? data::SourceOrder::kRunSeed : data::SourceOrder::kNamed);
    orders = orders && !s.order.empty();
  }
  if (!orders) saved.orders.clear();
  if (meta.data.sources.empty() && blend_.size() == 1) {  // from before blends: one file, all consumed from it
    const data::BlendPosition& now = blend_.position();
    saved = {meta.data.consumed, 0, now.names, now.weights, now.epochs, {0}, {meta.data.consumed}, {}};
  }
  const std::string changed = blend_.resume(saved);
  if (!changed.empty())
    log::info("data: the blend changed since the checkpoint (", changed, "): each source keeps its place and its order, and the "
              "balancing starts afresh at sample ", saved.consumed);
}

checkpoint::Components run_state(Engine& engine, const Config& cfg, int64_t& step, data::Blend& blend,
                                 std::vector<double>& recent_losses, std::vector<int64_t>& skip_steps) {
  checkpoint::Components state;
  state.push_back(std::make_unique<Progress>(step));
  state.push_back(std::make_unique<ParamsState>(engine));
  state.push_back(std::make_unique<OptimizerState>(engine, cfg.optim.name));
  state.push_back(std::make_unique<DataPosition>(blend, cfg.train.seed));
  state.push_back(std::make_unique<RngState>(cfg.model.seed, cfg.train.seed));
  state.push_back(std::make_unique<LossHistory>(recent_losses));
  state.push_back(std::make_unique<SkipList>(skip_steps, step));
  return state;
}

}  // namespace myriad
