#include "checkpoint/state.h"

namespace myriad::checkpoint {

std::string param_name(const std::string& tensor) { return "model/" + tensor; }

std::string moment_name(int moment, const std::string& tensor) {
  MYRIAD_CHECK(moment == 1 || moment == 2, "moment ", moment);
  return (moment == 1 ? "optim/m/" : "optim/v/") + tensor;
}

bool is_param(const std::string& stored_name) { return stored_name.rfind("model/", 0) == 0; }

nlohmann::json encode(const Meta& m) {
  nlohmann::json j = {{"step", m.step},
                      {"config", m.config},
                      {"tokenizer", m.tokenizer},
                      {"data", {{"consumed", m.data.consumed}, {"seed", m.data.seed}}},
                      {"optimizer", {{"name", m.optimizer.name}, {"steps_taken", m.optimizer.steps_taken}}},
                      {"rng", {{"model_seed", m.rng.model_seed}, {"data_seed", m.rng.data_seed}}},
                      {"fault", {{"recent_losses", m.recent_losses}}},
                      {"skipped_steps", m.skipped_steps}};
  if (!m.imported_from.empty()) j["imported_from"] = m.imported_from;
  if (!m.data.sources.empty()) {
    j["data"]["since"] = m.data.since;
    nlohmann::json& sources = j["data"]["sources"] = nlohmann::json::array();
    for (const Meta::Data::Source& s : m.data.sources)
      sources.push_back({{"name", s.name}, {"weight", s.weight}, {"epochs", s.epochs}, {"base", s.base}, {"taken", s.taken},
                         {"order", s.order}});
  }
  return j;
}

namespace {

// meta[path...] of the type T, or Corrupt naming the field; `fallback` when absent and optional.
template <class T>
T field(const nlohmann::json& j, const std::string& dir, std::initializer_list<const char*> path, const T* fallback) {
  const nlohmann::json* at = &j;
  std::string name;
  for (const char* key : path) {
    name += (name.empty() ? "" : ".") + std::string(key);
    if (!at->is_object() || !at->contains(key)) {
      if (fallback) return *fallback;
      throw Corrupt(cat("checkpoint ", dir, ": meta.json has no ", name, ": not a checkpoint this Myriad wrote"));
    }
    at = &(*at)[key];
  }
  try {
    return at->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Corrupt(cat("checkpoint ", dir, ": meta.json's ", name, " is ", at->dump().substr(0, 40),
                      ", not of its type: not a checkpoint this Myriad wrote"));
  }
}

}  // namespace

Meta decode_meta(const nlohmann::json& j, const std::string& dir) {
  Meta m;
  const int64_t none = 0;
  const std::string empty;
  const std::vector<double> no_losses;
  const std::vector<int64_t> no_steps;
  m.step = field<int64_t>(j, dir, {"step"}, nullptr);
  m.config = field<std::string>(j, dir, {"config"}, nullptr);
  m.tokenizer = field<std::string>(j, dir, {"tokenizer"}, &empty);
  m.data.consumed = field<int64_t>(j, dir, {"data", "consumed"}, nullptr);
  m.data.seed = field<int64_t>(j, dir, {"data", "seed"}, &none);
  m.optimizer.name = field<std::string>(j, dir, {"optimizer", "name"}, &empty);
  m.optimizer.steps_taken = field<int64_t>(j, dir, {"optimizer", "steps_taken"}, nullptr);
  m.rng.model_seed = field<int64_t>(j, dir, {"rng", "model_seed"}, &none);
  m.rng.data_seed = field<int64_t>(j, dir, {"rng", "data_seed"}, &none);
  m.recent_losses = field<std::vector<double>>(j, dir, {"fault", "recent_losses"}, &no_losses);
  m.skipped_steps = field<std::vector<int64_t>>(j, dir, {"skipped_steps"}, &no_steps);
  m.imported_from = field<std::string>(j, dir, {"imported_from"}, &empty);
  m.data.since = field<int64_t>(j, dir, {"data", "since"}, &none);
  const nlohmann::json no_sources = nlohmann::json::array();
  const nlohmann::json sources = field<nlohmann::json>(j, dir, {"data", "sources"}, &no_sources);
  if (!sources.is_array()) throw Corrupt(cat("checkpoint ", dir, ": meta.json's data.sources is not an array"));
  for (size_t i = 0; i < sources.size(); ++i) {
    const nlohmann::json& s = sources[i];
    const std::string at = cat("data.sources[", i, "]");
    try {
      m.data.sources.push_back({s.at("name").get<std::string>(), s.at("weight").get<double>(), s.at("epochs").get<int64_t>(),
                                s.at("base").get<int64_t>(), s.at("taken").get<int64_t>(),
                                s.contains("order") ? s.at("order").get<std::string>() : std::string()});
      if (const std::string& o = m.data.sources.back().order; !o.empty() && o != "run_seed" && o != "named")
        throw Corrupt(cat("checkpoint ", dir, ": meta.json's ", at, ".order is \"", o, "\", not run_seed or named"));
    } catch (const nlohmann::json::exception&) {
      throw Corrupt(cat("checkpoint ", dir, ": meta.json's ", at, " is ", s.dump().substr(0, 60),
                        ": each source needs name, weight, epochs, base and taken"));
    }
  }
  return m;
}

std::string config_of(const nlohmann::json& j, const std::string& dir) {
  return field<std::string>(j, dir, {"config"}, nullptr);
}

std::vector<Shard> shards_of(const Components& state, bool for_save) {
  std::vector<Shard> out;
  for (const auto& c : state)
    for (Shard& s : c->shards(for_save)) out.push_back(std::move(s));
  return out;
}

Meta meta_of(const Components& state, const std::string& config_toml, const std::string& tokenizer) {
  Meta m;
  m.config = config_toml, m.tokenizer = tokenizer;
  for (const auto& c : state) c->save(m);
  return m;
}

void restore(const Components& state, const Meta& meta) {
  for (const auto& c : state) c->load(meta);
}

}  // namespace myriad::checkpoint
