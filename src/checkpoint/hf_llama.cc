// Hugging Face's LlamaForCausalLM in Myriad's terms (checkpoint/hf_family.h): which models it expresses,
// its config.json both ways, and its tensors both ways.
//
// The tensors differ from Myriad's layout (model/params.h) only in order, never within a head:
// both rotate by halves (transformers' rotate_half), so q and k need no permutation inside a head.
//   q_proj (H D, C), k_proj and v_proj (Hkv D, C)  <->  attn.qkv ((H + 2 Hkv) D, C), rows by
//                                                      key/value head: its G query heads, k, v
//   gate_proj and up_proj (F, C)                   <->  mlp.fc (2F, C), rows (F, 2): gate, up
//   o_proj, down_proj, the norms, the embedding     <->  attn.proj, mlp.proj, ln1/ln2/lnf, wte
//   lm_head (untied only)                           <->  lm_head
// Biases (attention_bias and mlp_bias, both or neither: Myriad's model.bias) follow their weights.
#include "checkpoint/hf_family.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include "core/error.h"

namespace myriad::checkpoint {
namespace {

// The rows row_of(0 .. n-1) of `t` (a matrix, or a vector: one element per row).
HostTensor take_rows(const HostTensor& t, int64_t n, const std::function<int64_t(int64_t)>& row_of) {
  const int64_t width = t.shape.size() > 1 ? t.shape[1] : 1;
  HostTensor out{t.shape, std::vector<float>(static_cast<size_t>(n * width))};
  out.shape[0] = n;
  for (int64_t r = 0; r < n; ++r)
    std::memcpy(&out.data[r * width], &t.data[row_of(r) * width], width * sizeof(float));
  return out;
}

// Writes the rows of `part` (n rows) to rows row_of(0 .. n-1) of `t`.
void put_rows(HostTensor& t, const HostTensor& part, const std::function<int64_t(int64_t)>& row_of) {
  const int64_t width = t.shape.size() > 1 ? t.shape[1] : 1, n = part.shape[0];
  for (int64_t r = 0; r < n; ++r)
    std::memcpy(&t.data[row_of(r) * width], &part.data[r * width], width * sizeof(float));
}

// Row offsets, in Myriad's fused QKV, of query head h and of key/value head g's key and value.
struct QkvRows {
  int64_t H, Hkv, G, D;
  explicit QkvRows(const ModelConfig& m) : H(m.heads), Hkv(m.kv()), G(m.heads / m.kv()), D(m.head_dim()) {}
  int64_t q(int64_t row) const { const int64_t h = row / D; return ((h / G) * (G + 2) + h % G) * D + row % D; }
  int64_t k(int64_t row) const { return ((row / D) * (G + 2) + G) * D + row % D; }
  int64_t v(int64_t row) const { return ((row / D) * (G + 2) + G + 1) * D + row % D; }
};

// One layer's tensors: transformers' name suffix, Myriad's, and the bias flag.
std::string hf_layer(int64_t l) { return cat("model.layers.", l, "."); }
std::string my_layer(int64_t l) { return cat("h.", l, "."); }

bool claims(const ModelConfig& m) {
  return m.rmsnorm() || m.rope() || m.swiglu() || m.kv() != m.heads || !m.tied_embeddings ||
         m.ffn() != 4 * m.d_model;
}

std::string unfit(const ModelConfig& m) {
  if (m.moe())
    return cat("model.experts = ", m.experts, " (a mixture of experts; LlamaForCausalLM's MLP is dense, and Myriad does "
               "not write Mixtral or Qwen3-MoE yet)");
  if (m.head_dim() * m.heads != m.d_model)
    return cat("model.head_dim = ", m.head_dim(), " apart from d_model / heads (Myriad does not write it yet)");
  if (!m.qk_norm.empty())
    return cat("model.qk_norm = \"", m.qk_norm, "\" (LlamaForCausalLM has no query and key norms; Myriad does not "
               "write Qwen3 or OLMoE yet)");
  if (!m.rmsnorm()) return cat("model.norm = \"", m.norm, "\" (LlamaForCausalLM's norm is RMSNorm)");
  if (!m.rope())
    return cat("model.position_encoding = \"", m.position_encoding, "\" (LlamaForCausalLM's positions are rotary)");
  if (!m.swiglu()) return cat("model.mlp = \"", m.mlp, "\" (LlamaForCausalLM's MLP is SwiGLU)");
  if (m.parallel_block) return "model.parallel_block = true (LlamaForCausalLM's blocks are sequential)";
  if (m.window > 0) return cat("model.window = ", m.window, " (LlamaForCausalLM's attention is full causal)");
  return "";
}

nlohmann::json hf_config(const Config& cfg, const std::string& torch_dtype, int64_t step) {
  const ModelConfig& m = cfg.model;
  nlohmann::json scaling = nullptr;
  if (m.rope_scaling == "llama3")
    scaling = {{"rope_type", "llama3"},
               {"factor", m.rope_factor},
               {"low_freq_factor", m.rope_low_freq_factor},
               {"high_freq_factor", m.rope_high_freq_factor},
               {"original_max_position_embeddings", m.rope_original_positions}};
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", m.vocab_size},
          {"hidden_size", m.d_model},
          {"intermediate_size", m.ffn()},
          {"num_hidden_layers", m.layers},
          {"num_attention_heads", m.heads},
          {"num_key_value_heads", m.kv()},
          {"head_dim", m.head_dim()},
          {"hidden_act", "silu"},
          {"max_position_embeddings", cfg.positions()},
          {"rms_norm_eps", m.norm_eps},
          {"rope_theta", m.rope_theta},
          {"rope_scaling", scaling},
          {"attention_bias", m.bias},
          {"mlp_bias", m.bias},
          {"attention_dropout", 0.0},
          {"tie_word_embeddings", m.tied_embeddings},
          {"initializer_range", m.init_std},
          {"torch_dtype", torch_dtype},
          // The LlamaConfig whose fields these are (head_dim and rope_scaling of type llama3 as
          // Llama 3.2's release writes them). Without a version, transformers 5 takes a local
          // directory's >100k-token tokenizer for one of Mistral's and warns that it splits
          // wrongly (it does not: gpu_hf_check.sh compares the ids).
          {"transformers_version", "4.45.0"},
          {"bos_token_id", hf_special_tokens(cfg.data.tokenizer)["bos_token_id"]},
          {"eos_token_id", hf_special_tokens(cfg.data.tokenizer)["eos_token_id"]},
          {"myriad", {{"tokenizer", cfg.data.tokenizer}, {"step", step}}}};
}

std::map<std::string, HostTensor> to_hf(std::map<std::string, HostTensor> my, const ModelConfig& m) {
  const QkvRows x(m);
  const int64_t F = m.ffn();
  std::map<std::string, HostTensor> out;
  // Tensors that go over whole are moved; the fused ones are read once by rows, then dropped.
  auto get = [&](const std::string& name) -> HostTensor& {
    auto it = my.find(name);
    MYRIAD_CHECK(it != my.end(), "the checkpoint's model has no tensor ", name);
    return it->second;
  };
  auto take = [&](const std::string& name) {
    HostTensor t = std::move(get(name));
    my.erase(name);
    return t;
  };
  out["model.embed_tokens.weight"] = take("wte");
  out["model.norm.weight"] = take("lnf.w");
  if (!m.tied_embeddings) out["lm_head.weight"] = take("lm_head");
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string h = hf_layer(l), y = my_layer(l);
    out[h + "input_layernorm.weight"] = take(y + "ln1.w");
    out[h + "post_attention_layernorm.weight"] = take(y + "ln2.w");
    for (const char* kind : {"weight", "bias"}) {
      const std::string s = kind == std::string("weight") ? "w" : "b";
      if (s == "b" && !m.bias) continue;
      const HostTensor& qkv = get(y + "attn.qkv." + s);
      out[h + "self_attn.q_proj." + kind] = take_rows(qkv, x.H * x.D, [&](int64_t r) { return x.q(r); });
      out[h + "self_attn.k_proj." + kind] = take_rows(qkv, x.Hkv * x.D, [&](int64_t r) { return x.k(r); });
      out[h + "self_attn.v_proj." + kind] = take_rows(qkv, x.Hkv * x.D, [&](int64_t r) { return x.v(r); });
      my.erase(y + "attn.qkv." + s);
      out[h + "self_attn.o_proj." + kind] = take(y + "attn.proj." + s);
      const HostTensor& fc = get(y + "mlp.fc." + s);
      out[h + "mlp.gate_proj." + kind] = take_rows(fc, F, [](int64_t f) { return 2 * f; });
      out[h + "mlp.up_proj." + kind] = take_rows(fc, F, [](int64_t f) { return 2 * f + 1; });
      my.erase(y + "mlp.fc." + s);
      out[h + "mlp.down_proj." + kind] = take(y + "mlp.proj." + s);
    }
  }
  return out;
}

Config from_hf_config(const nlohmann::json& hf, const std::string& where) {
  // Sizes are positive integers, named in transformers' words with the value as the file writes
  // it: Myriad's own config check would speak of model.d_model where the file says hidden_size.
  auto integer = [&](const nlohmann::json& j, const std::string& key, std::optional<int64_t> fallback,
                     const std::string& prefix = "") -> int64_t {
    if (!j.contains(key) || j[key].is_null()) {
      if (fallback) return *fallback;
      throw_input(where, prefix, key, " is missing", prefix.empty() ? ": not a LlamaForCausalLM config" : "");
    }
    if (!j[key].is_number_integer()) throw_input(where, prefix, key, " is ", j[key].dump(), ", not an integer");
    if (j[key].is_number_unsigned() && j[key].get<uint64_t>() > uint64_t(std::numeric_limits<int32_t>::max()))
      throw_input(where, prefix, key, " = ", j[key].dump(), " is past the largest size Myriad takes (2^31 - 1)");
    const int64_t v = j[key].get<int64_t>();
    if (v < 1) throw_input(where, prefix, key, " = ", j[key].dump(), ": it must be a positive integer");
    return v;
  };
  auto number = [&](const nlohmann::json& j, const std::string& key, double fallback, const std::string& prefix = "") -> double {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_number()) throw_input(where, prefix, key, " is ", j[key].dump(), ", not a number");
    return j[key].get<double>();
  };
  auto flag = [&](const char* key, bool fallback) -> bool {
    if (!hf.contains(key) || hf[key].is_null()) return fallback;
    if (!hf[key].is_boolean()) throw_input(where, key, " is ", hf[key].dump(), ", not true or false");
    return hf[key].get<bool>();
  };
  if (hf.contains("hidden_act") && hf["hidden_act"] != "silu")
    throw_input(where, "hidden_act = ", hf["hidden_act"].dump(), ": Myriad's SwiGLU gates with silu");
  const bool attention_bias = flag("attention_bias", false), mlp_bias = flag("mlp_bias", false);
  if (attention_bias != mlp_bias)
    throw_input(where, "attention_bias = ", attention_bias ? "true" : "false", " but mlp_bias = ", mlp_bias ? "true" : "false",
                ": Myriad's model.bias gives the attention's and the MLP's linear layers biases together");
  Config cfg;
  ModelConfig& m = cfg.model;
  m.norm = "rmsnorm", m.position_encoding = "rope", m.mlp = "swiglu", m.bias = attention_bias;
  m.layers = integer(hf, "num_hidden_layers", {}), m.d_model = integer(hf, "hidden_size", {});
  m.heads = integer(hf, "num_attention_heads", {});
  m.kv_heads = integer(hf, "num_key_value_heads", m.heads);
  m.mlp_hidden = integer(hf, "intermediate_size", {});
  m.vocab_size = integer(hf, "vocab_size", {});
  m.positions = integer(hf, "max_position_embeddings", 2048);
  m.seq_len = std::min<int64_t>(m.positions, 8192);
  m.norm_eps = number(hf, "rms_norm_eps", 1e-6);
  m.tied_embeddings = flag("tie_word_embeddings", false);
  m.init_std = number(hf, "initializer_range", 0.02);
  // The head size: Myriad's is hidden_size / num_attention_heads, so a head_dim of its own (a
  // decoupled head size, as Qwen3 and Gemma have) is named first.
  if (hf.contains("head_dim") && !hf["head_dim"].is_null()) {
    const int64_t d = integer(hf, "head_dim", {});
    if (m.d_model % m.heads != 0 || d != m.d_model / m.heads)
      throw_input(where, "head_dim = ", hf["head_dim"].dump(), " but hidden_size / num_attention_heads = ", m.d_model, " / ",
                  m.heads, m.d_model % m.heads == 0 ? cat(" = ", m.d_model / m.heads) : std::string(),
                  ": Myriad imports LlamaForCausalLM with a head size of hidden_size / num_attention_heads only (a "
                  "head_dim of its own, as Qwen3's, is not imported yet)");
  }
  if (m.d_model % m.heads != 0)
    throw_input(where, "hidden_size = ", m.d_model, " is not a multiple of num_attention_heads = ", m.heads);
  if (m.heads % m.kv_heads != 0)
    throw_input(where, "num_key_value_heads = ", m.kv_heads, " does not divide num_attention_heads = ", m.heads,
                ": each key/value head serves an equal group of query heads");

  // Rotary positions, in either form transformers writes: before version 5, rope_theta and
  // rope_scaling ({rope_type or type, and the type's fields}, null for none) at the top; from
  // version 5, rope_parameters ({rope_theta, rope_type, and the type's fields}). Both are read;
  // where a file has both, they must agree. Nothing the file does not say is filled in, except
  // transformers' own default theta (10000) when neither form gives one.
  const nlohmann::json params = hf.contains("rope_parameters") ? hf["rope_parameters"] : nlohmann::json();
  if (!params.is_null() && !params.is_object())
    throw_input(where, "rope_parameters is ", params.dump().substr(0, 80), ", not an object or null");
  if (params.is_object())
    for (const auto& [key, value] : params.items())
      if (value.is_object())
        throw_input(where, "rope_parameters.", key, " is an object: rotary parameters per layer type are not "
                    "supported (Myriad's layers share one rotary embedding)");
  const nlohmann::json scaling = hf.contains("rope_scaling") ? hf["rope_scaling"] : nlohmann::json();
  if (!scaling.is_null() && !scaling.is_object())
    throw_input(where, "rope_scaling is ", scaling.dump().substr(0, 80), ", not an object or null");
  const bool top_theta = hf.contains("rope_theta") && !hf["rope_theta"].is_null();
  const bool inner_theta = params.is_object() && params.contains("rope_theta") && !params["rope_theta"].is_null();
  m.rope_theta = number(hf, "rope_theta", 10000);
  if (inner_theta) {
    const double t = number(params, "rope_theta", 0, "rope_parameters.");
    if (top_theta && t != m.rope_theta)
      throw_input(where, "rope_theta = ", hf["rope_theta"].dump(), " but rope_parameters.rope_theta = ",
                  params["rope_theta"].dump(), ": the two forms disagree; keep one");
    m.rope_theta = t;
  }
  // A scaling as one form writes it: its type (transformers' "default" is none) and the fields
  // Llama 3.1's needs, each required, the positions an integer.
  struct Scaling {
    std::string type = "default";
    double factor = 0, low = 0, high = 0;
    int64_t positions = 0;
    bool operator==(const Scaling&) const = default;
  };
  auto scaling_of = [&](const nlohmann::json& j, const std::string& prefix) {
    Scaling s;
    const nlohmann::json type = j.contains("rope_type") ? j["rope_type"] : j.contains("type") ? j["type"] : nlohmann::json();
    if (type.is_null()) return s;
    if (type != "default" && type != "llama3")
      throw_input(where, prefix, "rope_type = ", type.dump(), ": Myriad's rotary scaling is Llama 3.1's (\"llama3\") or none");
    s.type = type.get<std::string>();
    if (s.type == "default") return s;
    for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
      if (!j.contains(key) || j[key].is_null())
        throw_input(where, prefix, key, " is missing: Llama 3.1's rotary scaling (rope_type \"llama3\") needs factor, "
                    "low_freq_factor, high_freq_factor and original_max_position_embeddings");
    s.factor = number(j, "factor", 0, prefix), s.low = number(j, "low_freq_factor", 0, prefix);
    s.high = number(j, "high_freq_factor", 0, prefix);
    s.positions = integer(j, "original_max_position_embeddings", {}, prefix);
    return s;
  };
  const std::optional<Scaling> old_form = scaling.is_object() ? std::optional(scaling_of(scaling, "rope_scaling."))
                                                                : std::nullopt;
  const std::optional<Scaling> new_form = params.is_object() ? std::optional(scaling_of(params, "rope_parameters."))
                                                               : std::nullopt;
  if (old_form && new_form && !(*old_form == *new_form))
    throw_input(where, "rope_scaling (", scaling.dump(), ") and rope_parameters (", params.dump(),
                ") describe different rotary scalings: the two forms disagree; keep one");
  const Scaling s = new_form ? *new_form : old_form ? *old_form : Scaling{};
  if (s.type == "llama3") {
    m.rope_scaling = "llama3";
    m.rope_factor = s.factor, m.rope_low_freq_factor = s.low, m.rope_high_freq_factor = s.high;
    m.rope_original_positions = s.positions;
  }
  // The tokenizer the model was trained with: what `export` wrote, else Llama 3's for its
  // vocabulary, else bytes (the ids then are not the model's own tokenizer's).
  cfg.data.tokenizer = m.vocab_size >= 128256 ? "llama3" : "byte";
  if (hf.contains("myriad") && hf["myriad"].is_object() && hf["myriad"].contains("tokenizer") &&
      hf["myriad"]["tokenizer"].is_string())
    cfg.data.tokenizer = hf["myriad"]["tokenizer"].get<std::string>();
  return cfg;
}

std::map<std::string, HostTensor> from_hf(std::map<std::string, HostTensor>& hf, const ModelConfig& m,
                                          const std::string& where) {
  const QkvRows x(m);
  const int64_t C = m.d_model, F = m.ffn(), V = m.vocab_size, Q = (x.H + 2 * x.Hkv) * x.D;
  std::map<std::string, HostTensor> out;
  // The tensor `name`, of `shape`, taken out of hf.
  auto take = [&](const std::string& name, std::vector<int64_t> shape) {
    auto it = hf.find(name);
    if (it == hf.end()) throw_input(where, "tensor ", name, " is missing");
    if (it->second.shape != shape)
      throw_input(where, "tensor ", name, " has shape ", shape_str(it->second.shape), " but the config makes it ",
                  shape_str(shape));
    HostTensor t = std::move(it->second);
    hf.erase(it);
    return t;
  };
  out["wte"] = take("model.embed_tokens.weight", {V, C});
  out["lnf.w"] = take("model.norm.weight", {C});
  if (!m.tied_embeddings) {
    out["lm_head"] = take("lm_head.weight", {V, C});
  } else if (auto head = hf.find("lm_head.weight"); head != hf.end()) {  // some files carry the tied copy
    if (head->second.data != out["wte"].data)
      throw_input(where, "lm_head.weight differs from model.embed_tokens.weight but tie_word_embeddings is true");
    hf.erase(head);
  }
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string h = hf_layer(l), y = my_layer(l);
    out[y + "ln1.w"] = take(h + "input_layernorm.weight", {C});
    out[y + "ln2.w"] = take(h + "post_attention_layernorm.weight", {C});
    for (const char* kind : {"weight", "bias"}) {
      const bool w = kind == std::string("weight");
      if (!w && !m.bias) continue;
      auto shape = [&](int64_t rows, int64_t cols) { return w ? std::vector<int64_t>{rows, cols} : std::vector<int64_t>{rows}; };
      const std::string s = w ? "w" : "b";
      HostTensor qkv{shape(Q, C), std::vector<float>(static_cast<size_t>(w ? Q * C : Q))};
      put_rows(qkv, take(h + "self_attn.q_proj." + kind, shape(x.H * x.D, C)), [&](int64_t r) { return x.q(r); });
      put_rows(qkv, take(h + "self_attn.k_proj." + kind, shape(x.Hkv * x.D, C)), [&](int64_t r) { return x.k(r); });
      put_rows(qkv, take(h + "self_attn.v_proj." + kind, shape(x.Hkv * x.D, C)), [&](int64_t r) { return x.v(r); });
      out[y + "attn.qkv." + s] = std::move(qkv);
      out[y + "attn.proj." + s] = take(h + "self_attn.o_proj." + kind, w ? std::vector<int64_t>{C, x.H * x.D}
                                                                         : std::vector<int64_t>{C});
      HostTensor fc{shape(2 * F, C), std::vector<float>(static_cast<size_t>(w ? 2 * F * C : 2 * F))};
      put_rows(fc, take(h + "mlp.gate_proj." + kind, shape(F, C)), [](int64_t f) { return 2 * f; });
      put_rows(fc, take(h + "mlp.up_proj." + kind, shape(F, C)), [](int64_t f) { return 2 * f + 1; });
      out[y + "mlp.fc." + s] = std::move(fc);
      out[y + "mlp.proj." + s] = take(h + "mlp.down_proj." + kind, w ? std::vector<int64_t>{C, F} : std::vector<int64_t>{C});
    }
  }
  // Rotary tables some files carry are recomputed from the config, not read.
  for (auto it = hf.begin(); it != hf.end();)
    it = it->first.ends_with("rotary_emb.inv_freq") ? hf.erase(it) : std::next(it);
  if (!hf.empty()) throw_input(where, "tensor ", hf.begin()->first, " is not part of a LlamaForCausalLM of this config");
  return out;
}

}  // namespace

extern const HfFamily kLlamaFamily = {"LlamaForCausalLM", "llama", "BF16", claims, unfit, hf_config, to_hf,
                                      from_hf_config, nullptr, from_hf};

}  // namespace myriad::checkpoint
