// What a checkpoint holds, as components. Each stateful part of a run (the parameters, the
// optimizer's moments and step count, the data position, the RNG, the loss history, the skip
// list, the step: runtime/state.h) says what it saves and loads: its tensors, with global shapes
// and the regions this rank owns, and its fields of meta.json. The Trainer only asks the
// components; training, `myriad sample` and `myriad import`/`export` meet the same names and the
// same schema, both kept here.
//
//   meta.json  {"format", "step", "tensors" (checkpoint.h writes these three),
//               "config": TOML, "tokenizer", "data": {"consumed", "seed", "since", "sources":
//               [{"name", "weight", "epochs", "base", "taken", "order"}]},
//               "optimizer": {"name", "steps_taken"}, "rng": {"model_seed", "data_seed"},
//               "fault": {"recent_losses"}, "skipped_steps", "imported_from"}
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace myriad::checkpoint {

// The stored name of a parameter tensor ("model/h.0.attn.qkv.w"), and of its optimizer moment
// (1: "optim/m/...", 2: "optim/v/...").
std::string param_name(const std::string& tensor);
std::string moment_name(int moment, const std::string& tensor);
bool is_param(const std::string& stored_name);

// meta.json's fields besides the tensor index, with their one encoder and decoder.
struct Meta {
  int64_t step = 0;
  std::string config;     // the run's config as TOML
  std::string tokenizer;  // empty: the config's data.tokenizer (checkpoints before it was recorded)
  struct Data {
    int64_t consumed = 0;  // training samples consumed by the steps saved
    int64_t seed = 0;      // the data order's seed
    // The blend's place (data/blend.h): where its balancing began, and each source's.
    int64_t since = 0;
    struct Source {
      std::string name;
      double weight = 1;
      int64_t epochs = 0;        // its cap
      int64_t base = 0, taken = 0;  // its samples taken by `since`, and by `consumed`
      std::string order;  // its order's seed: "run_seed" or "named" (data/blend.h); "" before it was kept
      bool operator==(const Source&) const = default;
    };
    std::vector<Source> sources;  // empty in checkpoints from before blends: one file, all of `consumed`
  } data;
  struct Optimizer {
    std::string name;
    int64_t steps_taken = 0;
  } optimizer;
  // Every random draw is counter-based (init: model seed, tensor, element; data order: data
  // seed, samples consumed), so the seeds and data.consumed are the whole RNG state.
  struct Rng {
    int64_t model_seed = 0, data_seed = 0;
  } rng;
  std::vector<double> recent_losses;  // what the spike check compares the next steps with
  std::vector<int64_t> skipped_steps; // the steps up to this one whose batches were dropped
  std::string imported_from;          // `myriad import`'s source; empty otherwise
};
nlohmann::json encode(const Meta& m);
// A field missing or of the wrong type is Corrupt naming `dir` and the field.
Meta decode_meta(const nlohmann::json& j, const std::string& dir);
// The config alone (TOML): all that sampling and export read, so that they take a checkpoint of
// weights whatever training state it lacks.
std::string config_of(const nlohmann::json& j, const std::string& dir);

// A stateful part of a run.
class Component {
 public:
  virtual ~Component() = default;
  // Its tensors: for a save the regions this rank writes (each region has one writer), for a
  // load every region it holds.
  virtual std::vector<Shard> shards(bool /*for_save*/) { return {}; }
  // Its fields of meta.json: set on a save, restored on a load.
  virtual void save(Meta& /*meta*/) const {}
  virtual void load(const Meta& /*meta*/) {}
};
using Components = std::vector<std::unique_ptr<Component>>;

// Every component's shards, in order.
std::vector<Shard> shards_of(const Components& state, bool for_save);
// meta.json of a save: the config and tokenizer given, then every component's fields.
Meta meta_of(const Components& state, const std::string& config_toml, const std::string& tokenizer);
// Restores every component's fields (after its tensors are loaded).
void restore(const Components& state, const Meta& meta);

}  // namespace myriad::checkpoint
