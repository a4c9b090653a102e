// The components of a run's checkpoint (checkpoint/state.h's Component), each over the state it
// owns or borrows. The Trainer builds them once (run_state) and asks them on every save and
// resume; `myriad sample` loads the parameters alone through ParamsState.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/state.h"
#include "core/config.h"
#include "data/blend.h"
#include "model/engine.h"

namespace myriad {

// The parameters: every tensor of the engine's layout, as the regions this rank stores. A save
// writes the pieces this rank owns (its fp32 master weights, ZeRO-sharded like the moments) of
// the tensors the engine says it writes (replicas over tensor parallelism come from one rank);
// a load reads every region the rank holds.
class ParamsState : public checkpoint::Component {
 public:
  explicit ParamsState(Engine& engine) : engine_(engine) {}
  std::vector<checkpoint::Shard> shards(bool for_save) override;

 private:
  Engine& engine_;
};

// The optimizer: its moments over the ranges this rank owns (ZeRO), and its step count.
class OptimizerState : public checkpoint::Component {
 public:
  OptimizerState(Engine& engine, std::string name) : engine_(engine), name_(std::move(name)) {}
  std::vector<checkpoint::Shard> shards(bool for_save) override;
  void save(checkpoint::Meta& meta) const override;
  void load(const checkpoint::Meta& meta) override;

 private:
  Engine& engine_;
  std::string name_;
};

// Where the data stream stands: the blend's position (data/blend.h: the samples consumed, and
// each source's), and the order's seed. A load into a blend that changed since the save keeps
// each source's place and starts the balancing afresh (logged).
class DataPosition : public checkpoint::Component {
 public:
  DataPosition(data::Blend& blend, int64_t seed) : blend_(blend), seed_(seed) {}
  void save(checkpoint::Meta& meta) const override;
  void load(const checkpoint::Meta& meta) override;

 private:
  data::Blend& blend_;
  int64_t seed_;
};

// The random state: every draw is counter-based, so the seeds are all there is. Recorded; a
// resume draws from its own config's seeds (the data position carries the stream's place).
class RngState : public checkpoint::Component {
 public:
  RngState(int64_t model_seed, int64_t data_seed) : rng_{model_seed, data_seed} {}
  void save(checkpoint::Meta& meta) const override { meta.rng = rng_; }

 private:
  checkpoint::Meta::Rng rng_;
};

// The recent losses the spike check (fault.spike_factor) compares with, so that a replay checks
// each step as the run that reached it did.
class LossHistory : public checkpoint::Component {
 public:
  explicit LossHistory(std::vector<double>& recent) : recent_(recent) {}
  void save(checkpoint::Meta& meta) const override { meta.recent_losses = recent_; }
  void load(const checkpoint::Meta& meta) override { recent_ = meta.recent_losses; }

 private:
  std::vector<double>& recent_;
};

// The steps whose batches are dropped (train.skip_steps): those up to the saved step are
// recorded, and a resume keeps skipping them on a replay whatever its own list says.
class SkipList : public checkpoint::Component {
 public:
  SkipList(std::vector<int64_t>& steps, const int64_t& step) : steps_(steps), step_(step) {}
  void save(checkpoint::Meta& meta) const override;
  void load(const checkpoint::Meta& meta) override;

 private:
  std::vector<int64_t>& steps_;
  const int64_t& step_;
};

// The step: optimizer steps completed.
class Progress : public checkpoint::Component {
 public:
  explicit Progress(int64_t& step) : step_(step) {}
  void save(checkpoint::Meta& meta) const override { meta.step = step_; }
  void load(const checkpoint::Meta& meta) override { step_ = meta.step; }

 private:
  int64_t& step_;
};

// What a training run's checkpoint holds, in order: the step, the parameters, the optimizer, the
// data position, the RNG, the loss history, the skip list, over the engine and the run's
// counters (which must outlive the components).
checkpoint::Components run_state(Engine& engine, const Config& cfg, int64_t& step, data::Blend& blend,
                                 std::vector<double>& recent_losses, std::vector<int64_t>& skip_steps);

}  // namespace myriad
