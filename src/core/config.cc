#include "core/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <cctype>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/parallel_layout.h"
#include "core/text.h"

namespace myriad {
namespace {

// Where each key's value came from, for error messages: the file, or the --set override.
struct Origins {
  std::string file;
  std::map<std::string, std::string> overridden;  // "section.key" -> "--set section.key=value"
  std::string of(const std::string& dotted) const {
    for (const auto& [k, v] : overridden)
      if (dotted == k || dotted.rfind(k + ".", 0) == 0 || k.rfind(dotted + ".", 0) == 0) return v;
    return file;
  }
};

std::string type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date or time";
  }
}

// Binds one TOML value to a field of the matching C++ type.
struct Binder {
  const Origins& origins;
  std::string dotted;
  const toml::node& node;

  [[noreturn]] void wrong(const char* expected) const {
    throw_input(origins.of(dotted), ": ", dotted, " must be ", expected, ", got ", type_name(node));
  }
  void operator()(int64_t& v) const {
    if (auto x = node.value_exact<int64_t>()) v = *x; else wrong("an integer");
  }
  void operator()(double& v) const {
    if (auto x = node.value<double>(); x && (node.is_integer() || node.is_floating_point())) v = *x;
    else wrong("a number");
  }
  void operator()(bool& v) const {
    if (auto x = node.value_exact<bool>()) v = *x; else wrong("true or false");
  }
  void operator()(std::string& v) const {
    if (auto x = node.value_exact<std::string>()) v = *x; else wrong("a string");
  }
  void operator()(std::vector<int64_t>& v) const {
    const toml::array* a = node.as_array();
    if (!a) wrong("an array of integers");
    v.clear();
    for (const auto& e : *a) {
      auto x = e.value_exact<int64_t>();
      if (!x) wrong("an array of integers");
      v.push_back(*x);
    }
  }
  // A prefix (one source; "" none), Megatron-LM's blend string "W1 PREFIX1 W2 PREFIX2 ..." (for
  // data.train), or an array of tables with name, path, weight, epochs.
  void operator()(DataSources& v) const {
    v.clear();
    if (auto s = node.value_exact<std::string>()) {
      std::istringstream in(*s);
      std::vector<std::string> words{std::istream_iterator<std::string>(in), std::istream_iterator<std::string>()};
      char* end = nullptr;
      // A first word that is a number opens a blend string; anything else is one prefix.
      if (words.size() < 2 || (std::strtod(words[0].c_str(), &end), *end != '\0')) {
        if (!s->empty()) v.push_back(source_of_prefix(*s));
        return;
      }
      if (dotted != "data.train")
        throw_input(origins.of(dotted), ": ", dotted, " = \"", *s, "\" reads as Megatron-LM's blend of weight and prefix "
                    "pairs, but validation sources are not blended: each is evaluated on its own (val_loss/<name>); give "
                    "one prefix, or an array of sources [{name = ..., path = ...}, ...]");
      for (size_t i = 0; i < words.size(); i += 2) {
        const double w = std::strtod(words[i].c_str(), &end);
        if (*end != '\0' || i + 1 == words.size())
          throw_input(origins.of(dotted), ": ", dotted, " = \"", *s, "\" reads as Megatron-LM's blend, weight and prefix ",
                      "pairs, but ", i + 1 == words.size() ? cat("weight ", words[i], " has no prefix")
                                                          : cat("'", words[i], "' in a weight's place is not a number"),
                      ": write pairs, or an array of sources ({name = ..., path = ..., weight = ...})");
        DataSource d = source_of_prefix(words[i + 1]);
        d.weight = w;
        v.push_back(d);
      }
      // The string cannot name its sources: two of one file name (a/train, b/train) are named by
      // their paths as written, so that each keeps a name, an order and a curve of its own.
      std::map<std::string, int> uses;  // sources per file name
      for (const DataSource& d : v) ++uses[d.name];
      for (DataSource& d : v)
        if (uses[d.name] > 1) d.name = std::filesystem::path(d.path).lexically_normal().string();
      return;
    }
    const toml::array* a = node.as_array();
    if (!a) wrong("a prefix (a string) or an array of sources ({name = ..., path = ..., weight = ...})");
    const bool train = dotted == "data.train";
    for (size_t i = 0; i < a->size(); ++i) {
      const toml::table* t = (*a)[i].as_table();
      const std::string at = cat(dotted, "[", i, "]");
      if (!t) throw_input(origins.of(dotted), ": ", at, " must be a table {name = ..., path = ...", train ? ", weight = ...}" : "}",
                          ", got ", type_name((*a)[i]));
      DataSource d;
      for (const auto& [key, e] : *t) {
        const std::string k(key.str());
        auto bad = [&](const char* what) {
          throw_input(origins.of(dotted), ": ", at, ".", k, " must be ", what, ", got ", type_name(e));
        };
        if (k == "name") {
          if (auto x = e.value_exact<std::string>()) d.name = *x; else bad("a string");
        } else if (k == "path") {
          if (auto x = e.value_exact<std::string>()) d.path = *x; else bad("a string");
        } else if (k == "weight" && train) {
          if (auto x = e.value<double>(); x && (e.is_integer() || e.is_floating_point())) d.weight = *x; else bad("a number");
        } else if (k == "epochs" && train) {
          if (auto x = e.value_exact<int64_t>()) d.epochs = *x; else bad("an integer");
        } else {
          throw_input(origins.of(dotted), ": ", at, " has an unknown key ", k, train ? " (name, path, weight, epochs)"
                                                                                     : " (name, path: validation sources are not weighted)");
        }
      }
      if (d.path.empty()) throw_input(origins.of(dotted), ": ", at, " has no path: give the prefix of its .bin/.idx");
      if (d.name.empty()) d.name = source_of_prefix(d.path).name;
      v.push_back(d);
    }
  }
  void operator()(std::map<std::string, std::string>& v) const {
    const toml::table* t = node.as_table();
    if (!t) wrong("a table");
    v.clear();
    for (const auto& [k, e] : *t) {
      if (auto s = e.value_exact<std::string>()) v[std::string(k.str())] = *s;
      else if (auto i = e.value_exact<int64_t>()) v[std::string(k.str())] = std::to_string(*i);
      else throw_input(origins.of(dotted), ": ", dotted, ".", k.str(), " must be a string or an integer");
    }
  }
};

// "a.b.c=value": the value is read as TOML when it parses as TOML, else as a bare string, so
// that --set data.train=data/x works without quotes.
void apply_override(toml::table& root, const std::string& text, Origins& origins) {
  size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw_input("--set ", text, ": expected section.key=value");
  std::string path = text.substr(0, eq), value = text.substr(eq + 1);
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  if (parts.size() < 2 || std::any_of(parts.begin(), parts.end(), [](auto& p) { return p.empty(); }))
    throw_input("--set ", text, ": expected section.key=value");

  toml::table* t = &root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    toml::node* n = t->get(parts[i]);
    if (!n) n = t->insert(parts[i], toml::table{}).first->second.as_table();
    if (!n->is_table()) throw_input("--set ", text, ": ", parts[i], " is not a section");
    t = n->as_table();
  }
  try {
    toml::table parsed = toml::parse("v = " + value);
    t->insert_or_assign(parts.back(), *parsed.get("v"));
  } catch (const toml::parse_error&) {
    t->insert_or_assign(parts.back(), value);
  }
  origins.overridden[path] = "--set " + text;
}

// Where `key` first appears in `text` from `from` on as a whole key: not a part of a longer one
// (optim.decay in "optim.decay_steps", model.mlp in "model.mlp_hidden"). npos when it does not.
size_t find_whole_key(const std::string& text, const std::string& key, size_t from) {
  auto word = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  for (size_t at = text.find(key, from); at != std::string::npos; at = text.find(key, at + 1)) {
    const size_t end = at + key.size();
    if ((at == 0 || (!word(text[at - 1]) && text[at - 1] != '.')) && (end == text.size() || !word(text[end])))
      return at;
  }
  return std::string::npos;
}

std::vector<std::string> known_keys(const Config& c) {
  std::vector<std::string> keys;
  c.visit([&](const char* s, const char* k, const auto&) { keys.push_back(std::string(s) + "." + k); });
  return keys;
}

Config bind(const toml::table& root, const Origins& origins) {
  Config c;
  std::vector<std::string> keys = known_keys(c);
  std::set<std::string> sections;
  for (const auto& k : keys) sections.insert(k.substr(0, k.find('.')));
  std::vector<std::string> section_list(sections.begin(), sections.end());

  // Unknown sections and keys first: a typo must not silently leave a default in place.
  for (const auto& [sec, node] : root) {
    std::string s(sec.str());
    if (!sections.count(s))
      throw_input(origins.of(s), ": unknown section [", s, "]", did_you_mean(s, section_list));
    if (!node.is_table())
      throw_input(origins.of(s), ": ", s, " must be a section ([", s, "]), got ", type_name(node));
    for (const auto& [key, value] : *node.as_table()) {
      std::string dotted = s + "." + std::string(key.str());
      if (std::find(keys.begin(), keys.end(), dotted) == keys.end())
        throw_input(origins.of(dotted), ": unknown key ", dotted, did_you_mean(dotted, keys));
    }
  }
  c.visit([&](const char* s, const char* k, auto& field) {
    const toml::node* n = root.at_path(std::string(s) + "." + k).node();
    if (n) Binder{origins, std::string(s) + "." + k, *n}(field);
  });
  return c;
}

template <class T>
void require(bool ok, const T& message) {
  if (!ok) throw_input(message);
}

}  // namespace

void require_one_of(const std::string& key, const std::string& value, const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return;
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
  throw_input("config: ", key, " = \"", value, "\" is not one of: ", list,
              did_you_mean(value, allowed));
}

void Config::validate() const {
  const auto& m = model;
  auto positive = [](const char* key, auto v) {
    if (!(v > 0)) throw_input("config: ", key, " must be positive, got ", v);
  };
  auto non_negative = [](const char* key, auto v) {
    if (v < 0) throw_input("config: ", key, " must be 0 or more, got ", v);
  };
  positive("model.layers", m.layers);
  positive("model.d_model", m.d_model);
  positive("model.heads", m.heads);
  positive("model.seq_len", m.seq_len);
  positive("model.init_std", m.init_std);
  if (m.vocab_size < 2) throw_input("config: model.vocab_size must be at least 2, got ", m.vocab_size);
  non_negative("model.head_dim", m.head_size);
  if (m.head_size == 0 && m.d_model % m.heads != 0)
    throw_input("config: model.d_model (", m.d_model, ") must be divisible by model.heads (",
                m.heads, "): head size = d_model / heads, unless model.head_dim gives it");
  non_negative("model.positions", m.positions);
  if (m.positions > 0 && m.seq_len > m.positions)
    throw_input("config: model.seq_len (", m.seq_len, ") exceeds model.positions (", m.positions,
                "): the model has no position embedding past ", m.positions,
                "; lower seq_len or raise positions");
  if (m.window < 0)
    throw_input("config: model.window must be 0 (full causal) or a positive number of tokens, got ",
                m.window);

  require_one_of("model.norm", m.norm, {"layernorm", "rmsnorm"});
  positive("model.norm_eps", m.norm_eps);
  if (!m.rmsnorm() && m.norm_eps != 1e-5)
    throw_input("config: model.norm_eps (", m.norm_eps, ") applies to model.norm = \"rmsnorm\"; LayerNorm's "
                "epsilon is fixed at 1e-5 (GPT-2's)");
  require_one_of("model.position_encoding", m.position_encoding, {"learned", "rope"});
  if (m.rope()) {
    positive("model.rope_theta", m.rope_theta);
    if (m.head_dim() % 2 != 0)
      throw_input("config: model.position_encoding = \"rope\" rotates pairs of a head's features, but the head "
                  "size ", m.head_size > 0 ? "model.head_dim" : "d_model / heads", " = ", m.head_dim(), " is odd");
    require_one_of("model.rope_scaling", m.rope_scaling, {"", "llama3"});
    if (m.rope_scaling == "llama3") {
      positive("model.rope_factor", m.rope_factor);
      positive("model.rope_low_freq_factor", m.rope_low_freq_factor);
      positive("model.rope_original_positions", m.rope_original_positions);
      if (!(m.rope_high_freq_factor > m.rope_low_freq_factor))
        throw_input("config: model.rope_high_freq_factor (", m.rope_high_freq_factor,
                    ") must exceed model.rope_low_freq_factor (", m.rope_low_freq_factor, ")");
    }
  }
  if (m.qk_norm != "" && m.qk_norm != "head" && m.qk_norm != "all")
    throw_input("config: model.qk_norm = \"", m.qk_norm, "\" is not one of: \"\" (none), head (each head, Qwen3's), "
                "all (a token's queries and keys, OLMoE's)");
  require_one_of("model.mlp", m.mlp, {"gelu", "swiglu"});
  non_negative("model.mlp_hidden", m.mlp_hidden);
  non_negative("model.kv_heads", m.kv_heads);
  if (m.heads % m.kv() != 0)
    throw_input("config: model.kv_heads (", m.kv(), ") must divide model.heads (", m.heads,
                "): each key/value head serves an equal group of query heads");

  non_negative("model.experts", m.experts);
  if (m.moe()) {
    if (!m.swiglu())
      throw_input("config: model.experts = ", m.experts, " makes SwiGLU experts: set model.mlp = \"swiglu\"");
    if (m.experts_per_token < 1 || m.experts_per_token > m.experts)
      throw_input("config: model.experts_per_token (", m.experts_per_token, ") must be in [1, model.experts = ",
                  m.experts, "]");
    non_negative("model.expert_hidden", m.expert_hidden);
    non_negative("model.shared_experts", m.shared_experts);
    non_negative("model.shared_expert_hidden", m.shared_expert_hidden);
    non_negative("model.dense_layers", m.dense_layers);
    positive("model.moe_every", m.moe_every);
    if (m.moe_layers() == 0)
      throw_input("config: model.experts = ", m.experts, " but no layer is MoE (model.dense_layers = ", m.dense_layers,
                  ", model.moe_every = ", m.moe_every, ", model.layers = ", m.layers,
                  "): lower dense_layers or moe_every, or set experts = 0");
    require_one_of("model.router_score", m.router_score, {"softmax", "sigmoid"});
    positive("model.router_scale", m.router_scale);
    positive("model.router_groups", m.router_groups);
    if (m.experts % m.router_groups != 0)
      throw_input("config: model.router_groups (", m.router_groups, ") must divide model.experts (", m.experts, ")");
    if (m.router_top_groups < 1 || m.router_top_groups > m.router_groups)
      throw_input("config: model.router_top_groups (", m.router_top_groups, ") must be in [1, model.router_groups = ",
                  m.router_groups, "]");
    if (m.experts_per_token > m.router_top_groups * (m.experts / m.router_groups))
      throw_input("config: model.experts_per_token (", m.experts_per_token, ") exceeds the experts of ",
                  m.router_top_groups, " groups of ", m.experts / m.router_groups,
                  " (model.router_top_groups x experts / router_groups): raise router_top_groups");
    non_negative("moe.aux_loss", moe.aux_loss);
    non_negative("moe.z_loss", moe.z_loss);
    non_negative("moe.capacity_factor", moe.capacity_factor);
    non_negative("moe.bias_rate", moe.bias_rate);
  } else {
    const ModelConfig dense;
    if (m.shared_experts != dense.shared_experts || m.expert_hidden != dense.expert_hidden ||
        m.dense_layers != dense.dense_layers || m.moe_every != dense.moe_every ||
        m.router_groups != dense.router_groups || m.router_top_groups != dense.router_top_groups ||
        m.router_bias != dense.router_bias)
      throw_input("config: model.expert_hidden, shared_experts, dense_layers, moe_every, router_groups and router_bias "
                  "shape a mixture of experts; set model.experts (routed experts per MoE layer) too, or leave them out");
  }

  if (!data.tokenizer.starts_with("hf:"))
    require_one_of("data.tokenizer (or hf:DIR for DIR/tokenizer.json)", data.tokenizer, {"byte", "gpt2", "llama3", "qwen3"});
  for (const auto& [key, list] : {std::pair<const char*, const DataSources&>{"data.train", data.train}, {"data.valid", data.valid}})
    for (size_t i = 0; i < list.size(); ++i) {
      const DataSource& d = list[i];
      for (size_t j = 0; j < i; ++j)
        if (list[j].name == d.name)
          throw_input("config: ", key, " names two sources '", d.name, "' (", list[j].path, " and ", d.path,
                      "): give each a name of its own");
      if (!(d.weight > 0) || !std::isfinite(d.weight))
        throw_input("config: ", key, "'s source '", d.name, "' has weight ", d.weight,
                    ": a weight is a positive number (its share of the samples, normalized over the sources)");
      if (d.epochs < 0)
        throw_input("config: ", key, "'s source '", d.name, "' has epochs ", d.epochs, ": 0 (no cap) or a positive cap");
    }
  double weights = 0;  // normalized by their sum, which must be a number
  for (const DataSource& d : data.train) weights += d.weight;
  if (!std::isfinite(weights))
    throw_input("config: data.train's weights sum to ", weights, ", which cannot be normalized: scale them down (only "
                "their ratios matter)");

  require_one_of("optim.name", optim.name, {"adamw", "lamb"});
  require_one_of("optim.decay", optim.decay, {"cosine", "linear", "constant", "wsd"});
  require_one_of("optim.decay_shape", optim.decay_shape, {"linear", "cosine", "1-sqrt"});
  non_negative("optim.decay_steps", optim.decay_steps);
  if (!(optim.decay_fraction > 0 && optim.decay_fraction <= 1))
    throw_input("config: optim.decay_fraction (", optim.decay_fraction, ") must be in (0, 1]: the share of train.steps "
                "the WSD schedule's decay takes");
  const OptimConfig plain;
  if (optim.decay != "wsd" && (optim.decay_steps != plain.decay_steps || optim.decay_fraction != plain.decay_fraction ||
                               optim.decay_shape != plain.decay_shape))
    throw_input("config: optim.decay_steps, optim.decay_fraction and optim.decay_shape shape the WSD schedule's decay, "
                "but optim.decay = \"", optim.decay, "\": set optim.decay = \"wsd\", or leave them at their defaults");
  positive("optim.lr", optim.lr);
  non_negative("optim.min_lr", optim.min_lr);
  if (optim.min_lr > optim.lr)
    throw_input("config: optim.min_lr (", optim.min_lr, ") must not exceed optim.lr (", optim.lr, ")");
  non_negative("optim.warmup_steps", optim.warmup_steps);
  non_negative("optim.weight_decay", optim.weight_decay);
  if (optim.beta1 < 0 || optim.beta1 >= 1) throw_input("config: optim.beta1 must be in [0, 1), got ", optim.beta1);
  if (optim.beta2 < 0 || optim.beta2 >= 1) throw_input("config: optim.beta2 must be in [0, 1), got ", optim.beta2);
  positive("optim.eps", optim.eps);
  non_negative("optim.grad_clip", optim.grad_clip);

  positive("train.steps", train.steps);
  // WSD's decay of a fixed length must fit after the warmup, or it would be cut short without a
  // word (its fraction form is clamped, and the run says so: Trainer::run).
  if (optim.decay == "wsd" && optim.decay_steps > std::max<int64_t>(0, train.steps - optim.warmup_steps))
    throw_input("config: optim.decay_steps = ", optim.decay_steps, " is longer than the steps after warmup (train.steps ",
                train.steps, " - optim.warmup_steps ", optim.warmup_steps, " = ",
                std::max<int64_t>(0, train.steps - optim.warmup_steps), "): lower optim.decay_steps (or use "
                "optim.decay_fraction), or raise train.steps");
  positive("train.global_batch", train.global_batch);
  positive("train.micro_batch", train.micro_batch);
  positive("train.logits_mib", train.logits_mib);
  require_one_of("train.device", train.device, {"auto", "cpu", "cuda"});
  require_one_of("checkpoint.async_policy", checkpoint.async_policy, {"wait", "skip"});
  require_one_of("checkpoint.load", checkpoint.load, {"broadcast", "all"});
  positive("train.log_every", train.log_every);
  non_negative("train.eval_every", train.eval_every);
  positive("train.eval_steps", train.eval_steps);
  require_one_of("train.recompute", train.recompute, {"none", "norms", "selective", "full"});
  require_one_of("train.attention", train.attention, {"auto", "cudnn", "myriad"});
  if (!data.document_end_loss && !data.document_mask)
    throw_input("config: data.document_end_loss = false leaves out the positions whose target begins a document, "
                "which the rows know with data.document_mask = true: set it too, or document_end_loss = true");
  require_one_of("train.precision", train.precision, {"bf16", "fp8"});
  require_one_of("train.fp8_gradients", train.fp8_gradients, {"e5m2", "e4m3"});
  if (train.fp8_lm_head && train.precision != "fp8")
    throw_input("config: train.fp8_lm_head = true puts the LM head in FP8 beside the block's linears: set "
                "train.precision = \"fp8\" too, or train.fp8_lm_head = false");
  require_one_of("train.fp8_scaling", train.fp8_scaling, {"tensor", "block"});
  if (train.precision != "fp8" && (train.fp8_gradients != "e5m2" || train.fp8_fast_accum || train.fp8_scaling != "tensor"))
    throw_input("config: train.fp8_gradients, train.fp8_fast_accum and train.fp8_scaling shape the FP8 recipe, but "
                "train.precision = \"", train.precision, "\": set train.precision = \"fp8\", or leave them at their defaults");
  if (train.fp8_scaling == "block" && train.fp8_fast_accum)
    throw_input("config: train.fp8_fast_accum = true with train.fp8_scaling = \"block\": cuBLASLt's block-scaled GEMMs "
                "accumulate in full only; set train.fp8_fast_accum = false, or train.fp8_scaling = \"tensor\"");
  if (train.precision == "fp8" && train.device == "cpu")
    throw_input("config: train.precision = \"fp8\" runs on Hopper GPUs (train.device = \"cuda\" or \"auto\"); "
                "the CPU engine computes in fp32: use train.precision = \"bf16\"");
  for (int64_t s : train.skip_steps)
    if (s < 1 || s > train.steps) throw_input("config: train.skip_steps lists step ", s, ", not one of 1..train.steps (", train.steps, ")");

  positive("parallel.bucket_mb", parallel.bucket_mb);

  positive("comm.timeout_s", comm.timeout_s);
  require_one_of("comm.backend", comm.backend, {"auto", "gloo", "nccl"});

  non_negative("fault.step_timeout_s", fault.step_timeout_s);
  positive("fault.startup_timeout_s", fault.startup_timeout_s);
  non_negative("fault.spike_factor", fault.spike_factor);
  non_negative("fault.sdc_check_every", fault.sdc_check_every);
  if (!(fault.heartbeat_s >= 0.1 && fault.heartbeat_s <= 60))
    throw_input("config: fault.heartbeat_s (", fault.heartbeat_s, ") must be 0.1..60 seconds");
  non_negative("fault.diag_min_bus_gbps", fault.diag_min_bus_gbps);
  if (!(fault.preempt_grace_s >= 1 && fault.preempt_grace_s <= 86400))
    throw_input("config: fault.preempt_grace_s (", fault.preempt_grace_s, ") must be 1..86400 seconds");
  require_one_of("fault.preempt_signal", fault.preempt_signal, {"", "SIGUSR2", "SIGHUP", "SIGQUIT", "SIGXCPU"});
  if (observe.trace_every < 1) throw_input("config: observe.trace_every (", observe.trace_every, ") must be at least 1");
  non_negative("fault.straggler_margin_ms", fault.straggler_margin_ms);
  if (!(fault.stall_factor >= 1)) throw_input("config: fault.stall_factor (", fault.stall_factor, ") must be at least 1");
  if (!(fault.stall_floor_s > 0)) throw_input("config: fault.stall_floor_s (", fault.stall_floor_s, ") must be above 0");
  if (!(fault.straggler_factor > 1))
    throw_input("config: fault.straggler_factor (", fault.straggler_factor, ") must be above 1");
  if (fault.evict_after < 1) throw_input("config: fault.evict_after (", fault.evict_after, ") must be at least 1");
  if (fault.spike_factor > 0 && fault.spike_factor <= 1)
    throw_input("config: fault.spike_factor (", fault.spike_factor, ") must be above 1 (or 0: off)");
  non_negative("checkpoint.every", checkpoint.every);
  non_negative("checkpoint.keep_last", checkpoint.keep_last);
  non_negative("checkpoint.keep_every", checkpoint.keep_every);
  // The parallel layout's rules: tp against the heads and the MLP, the pipeline's chunks, the
  // batch's split, FP8's multiples of 16 (core/parallel_layout.h).
  ParallelLayout::of(*this);
}

std::string canonical_tokenizer(const std::string& name) {
  if (!name.starts_with("hf:")) return name;
  const std::string dir = name.substr(3);
  if (dir.empty())
    throw_input("tokenizer \"", name, "\" (data.tokenizer or --tokenizer) names no directory: give hf:DIR, DIR "
                "holding a Hugging Face tokenizer.json");
  std::filesystem::path p = std::filesystem::absolute(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "dir/"
  return "hf:" + p.string();
}

Config parse_config(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    throw_input(origin, ":", e.source().begin.line, ":", e.source().begin.column,
                ": invalid TOML: ", e.description());
  }
  Origins origins{origin, {}};
  for (const auto& o : overrides) apply_override(root, o, origins);
  Config c = bind(root, origins);
  try {
    c.data.tokenizer = canonical_tokenizer(c.data.tokenizer);
    c.validate();
  } catch (const Error& e) {
    // validate() speaks of "config: key ..."; name where the values came from instead: the
    // --set that gave one of the keys it names (the first named), else the file.
    std::string what = e.what();
    if (what.rfind("config: ", 0) == 0) {
      size_t first = std::string::npos;
      std::string from = origin;
      for (const std::string& k : known_keys(c)) {
        const size_t at = find_whole_key(what, k, 8);
        if (at != std::string::npos && at < first && origins.of(k) != origin) first = at, from = origins.of(k);
      }
      what = from + ": " + what.substr(8);
    }
    throw Error(e.cls(), what);
  }
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) throw_input("config ", path, ": cannot open file (check the path given to --config)");
  std::stringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path, overrides);
}

DataSource source_of_prefix(const std::string& prefix) {
  DataSource d;
  d.path = prefix;
  d.name = std::filesystem::path(prefix).filename().string();
  if (d.name.empty()) d.name = prefix;
  return d;
}

std::string to_toml(const Config& c) {
  toml::table root;
  c.visit([&](const char* s, const char* k, const auto& field) {
    if (!root.get(s)) root.insert(s, toml::table{});
    toml::table& t = *root.get(s)->as_table();
    using T = std::decay_t<decltype(field)>;
    if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      toml::array a;
      for (int64_t v : field) a.push_back(v);
      t.insert(k, a);
    } else if constexpr (std::is_same_v<T, std::map<std::string, std::string>>) {
      toml::table m;
      for (const auto& [key, v] : field) m.insert(key, v);
      t.insert(k, m);
    } else if constexpr (std::is_same_v<T, DataSources>) {
      if (field.empty()) {
        t.insert(k, "");
      } else if (field.size() == 1 && field[0] == source_of_prefix(field[0].path)) {
        t.insert(k, field[0].path);  // a lone prefix stays one
      } else {
        toml::array a;
        for (const DataSource& d : field) {
          toml::table e{{"name", d.name}, {"path", d.path}};
          if (std::string(s) + "." + k == "data.train") e.insert("weight", d.weight), e.insert("epochs", d.epochs);
          a.push_back(e);
        }
        t.insert(k, a);
      }
    } else {
      t.insert(k, field);
    }
  });
  std::ostringstream os;
  os << root << "\n";
  return os.str();
}

std::string Config::checkpoint_root(const std::string& run_dir) const {
  return checkpoint.dir.empty() ? (std::filesystem::path(run_dir) / "checkpoints").string() : checkpoint.dir;
}

}  // namespace myriad
