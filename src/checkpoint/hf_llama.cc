// Hugging Face's Llama-block decoders in Myriad's terms (checkpoint/hf_family.h): LlamaForCausalLM,
// Qwen3ForCausalLM, Qwen3MoeForCausalLM and MixtralForCausalLM, which differ from Llama only where
// a Dialect says: Qwen3's RMSNorm of each head's queries and keys, and the MoE blocks' names.
// Which models each expresses, its config.json both ways, and its tensors both ways.
//
// The tensors differ from Myriad's layout (model/params.h) only in order, never within a head:
// both rotate by halves (transformers' rotate_half), so q and k need no permutation inside a head.
//   q_proj (H D, C), k_proj and v_proj (Hkv D, C)  <->  attn.qkv ((H + 2 Hkv) D, C), rows by
//                                                      key/value head: its G query heads, k, v
//   q_norm and k_norm (D), Qwen3's                  <->  attn.q_norm, attn.k_norm (model.qk_norm "head")
//   gate_proj and up_proj (F, C)                   <->  mlp.fc (2F, C), rows (F, 2): gate, up
//   an MoE layer's router, gate (E, C)              <->  mlp.router
//   expert e's gate_proj / w1, up_proj / w3 (Fe, C) <->  mlp.experts.fc (E 2Fe, C), rows (E, Fe, 2)
//   expert e's down_proj / w2 (C, Fe)              <->  mlp.experts.proj (E C, Fe), rows (E, C)
//   o_proj, down_proj, the norms, the embedding     <->  attn.proj, mlp.proj, ln1/ln2/lnf, wte
//   lm_head (untied only)                           <->  lm_head
// Biases (Llama's attention_bias and mlp_bias, both or neither: Myriad's model.bias) follow their
// weights; the other three have none Myriad can hold.
#include "checkpoint/hf_family.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <set>
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

// Where a family departs from Llama's block.
enum class Experts { kNone, kQwen, kMixtral };  // dense; mlp.gate + mlp.experts.E.*_proj; block_sparse_moe + w1/w3/w2
struct Dialect {
  const char* architecture;
  const char* model_type;
  bool qk_norm;     // Qwen3's RMSNorm of each head's q and k (q_norm, k_norm)
  Experts experts;  // how MoE layers are named, kNone for a dense family
  const char* transformers_version;  // the config's generation (transformers 4's field names)
};
constexpr Dialect kLlama{"LlamaForCausalLM", "llama", false, Experts::kNone, "4.45.0"};
constexpr Dialect kQwen3{"Qwen3ForCausalLM", "qwen3", true, Experts::kNone, "4.51.0"};
constexpr Dialect kQwen3Moe{"Qwen3MoeForCausalLM", "qwen3_moe", true, Experts::kQwen, "4.51.0"};
constexpr Dialect kMixtral{"MixtralForCausalLM", "mixtral", false, Experts::kMixtral, "4.45.0"};

// An MoE layer's prefix and its experts' three tensors (gate, up, down) as the family names them.
std::string moe_prefix(const Dialect& d) { return d.experts == Experts::kMixtral ? "block_sparse_moe." : "mlp."; }
std::string expert_name(const Dialect& d, int64_t e, int which) {
  static const char* const qwen[] = {"gate_proj", "up_proj", "down_proj"}, *const mixtral[] = {"w1", "w3", "w2"};
  return cat(moe_prefix(d), "experts.", e, ".", (d.experts == Experts::kMixtral ? mixtral : qwen)[which], ".weight");
}

// Each family claims the models only it can express; Llama takes the rest of its block's.
template <const Dialect& D>
bool claims(const ModelConfig& m) {
  if (&D != &kLlama) return (D.experts != Experts::kNone) == m.moe() && D.qk_norm == !m.qk_norm.empty();
  return m.rmsnorm() || m.rope() || m.swiglu() || m.kv() != m.heads || !m.tied_embeddings ||
         m.ffn() != 4 * m.d_model;
}

template <const Dialect& D>
std::string unfit(const ModelConfig& m) {
  const char* arch = D.architecture;
  if (m.moe() && D.experts == Experts::kNone)
    return cat("model.experts = ", m.experts, " (a mixture of experts; ", arch, "'s MLP is dense)");
  if (D.qk_norm && m.qk_norm != "head")
    return cat("model.qk_norm = \"", m.qk_norm, "\" (", arch, "'s query and key norms are per head, \"head\"; OLMoE's "
               "whole-vector norm is not written)");
  if (!D.qk_norm && !m.qk_norm.empty())
    return cat("model.qk_norm = \"", m.qk_norm, "\" (", arch, " has no query and key norms)");
  if (!m.rmsnorm()) return cat("model.norm = \"", m.norm, "\" (", arch, "'s norm is RMSNorm)");
  if (!m.rope()) return cat("model.position_encoding = \"", m.position_encoding, "\" (", arch, "'s positions are rotary)");
  if (!m.swiglu()) return cat("model.mlp = \"", m.mlp, "\" (", arch, "'s MLP is SwiGLU)");
  if (m.parallel_block) return cat("model.parallel_block = true (", arch, "'s blocks are sequential)");
  if (m.window > 0) return cat("model.window = ", m.window, " (", arch, "'s attention is full causal)");
  if (m.bias && &D != &kLlama)
    return cat("model.bias = true (", arch, " has no MLP biases; Myriad's biases are the attention's and the MLP's together)");
  if (!m.moe()) return "";
  if (m.shared_experts > 0)
    return cat("model.shared_experts = ", m.shared_experts, " (", arch, " has no shared experts)");
  if (m.router_score != "softmax") return cat("model.router_score = \"", m.router_score, "\" (", arch, "'s router is a softmax)");
  if (m.router_bias) return cat("model.router_bias = true (", arch, "'s router has no expert bias)");
  if (m.router_groups > 1) return cat("model.router_groups = ", m.router_groups, " (", arch, " routes over all experts)");
  if (m.router_scale != 1) return cat("model.router_scale = ", m.router_scale, " (", arch, "'s weights are not scaled)");
  if (&D == &kMixtral) {
    if (!m.router_norm_topk) return "model.router_norm_topk = false (Mixtral renormalizes its top-k weights)";
    if (m.dense_layers > 0 || m.moe_every != 1)
      return cat("model.dense_layers = ", m.dense_layers, " and model.moe_every = ", m.moe_every,
                 " (every Mixtral layer is a mixture of experts)");
  }
  return "";
}

template <const Dialect& D>
nlohmann::json hf_config(const Config& cfg, const std::string& torch_dtype, int64_t step) {
  const ModelConfig& m = cfg.model;
  nlohmann::json scaling = nullptr;
  if (m.rope_scaling == "llama3")
    scaling = {{"rope_type", "llama3"},
               {"factor", m.rope_factor},
               {"low_freq_factor", m.rope_low_freq_factor},
               {"high_freq_factor", m.rope_high_freq_factor},
               {"original_max_position_embeddings", m.rope_original_positions}};
  nlohmann::json j = {{"architectures", {D.architecture}},
                      {"model_type", D.model_type},
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
                      {"attention_dropout", 0.0},
                      {"tie_word_embeddings", m.tied_embeddings},
                      {"initializer_range", m.init_std},
                      {"torch_dtype", torch_dtype},
                      // The generation whose field names these are (head_dim and rope_scaling of
                      // type llama3 as Llama 3.2's release writes them). Without a version,
                      // transformers 5 takes a local directory's >100k-token tokenizer for one of
                      // Mistral's and warns that it splits wrongly (it does not: gpu_hf_check.sh
                      // compares the ids).
                      {"transformers_version", D.transformers_version},
                      {"bos_token_id", hf_special_tokens(cfg.data.tokenizer)["bos_token_id"]},
                      {"eos_token_id", hf_special_tokens(cfg.data.tokenizer)["eos_token_id"]},
                      {"myriad", {{"tokenizer", cfg.data.tokenizer}, {"step", step}}}};
  if (&D == &kLlama) j["attention_bias"] = m.bias, j["mlp_bias"] = m.bias;
  if (D.qk_norm) j["attention_bias"] = false, j["use_sliding_window"] = false, j["sliding_window"] = nullptr;
  if (D.experts == Experts::kQwen) {
    std::vector<int64_t> dense(static_cast<size_t>(m.dense_layers));
    for (int64_t l = 0; l < m.dense_layers; ++l) dense[l] = l;
    j["num_experts"] = m.experts, j["num_experts_per_tok"] = m.experts_per_token;
    j["moe_intermediate_size"] = m.expert_ffn(), j["norm_topk_prob"] = m.router_norm_topk;
    j["decoder_sparse_step"] = m.moe_every, j["mlp_only_layers"] = dense;
    j["router_aux_loss_coef"] = cfg.moe.aux_loss, j["output_router_logits"] = false;
  }
  if (D.experts == Experts::kMixtral) {
    j["num_local_experts"] = m.experts, j["num_experts_per_tok"] = m.experts_per_token;
    j["intermediate_size"] = m.expert_ffn(), j["sliding_window"] = nullptr;
    j["router_aux_loss_coef"] = cfg.moe.aux_loss, j["output_router_logits"] = false;
  }
  return j;
}

template <const Dialect& D>
std::map<std::string, HostTensor> to_hf(std::map<std::string, HostTensor> my, const ModelConfig& m) {
  const QkvRows x(m);
  const int64_t F = m.ffn(), Fe = m.expert_ffn(), C = m.d_model;
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
    if (D.qk_norm) {
      out[h + "self_attn.q_norm.weight"] = take(y + "attn.q_norm.w");
      out[h + "self_attn.k_norm.weight"] = take(y + "attn.k_norm.w");
    }
    for (const char* kind : {"weight", "bias"}) {
      const std::string s = kind == std::string("weight") ? "w" : "b";
      if (s == "b" && !m.bias) continue;
      const HostTensor& qkv = get(y + "attn.qkv." + s);
      out[h + "self_attn.q_proj." + kind] = take_rows(qkv, x.H * x.D, [&](int64_t r) { return x.q(r); });
      out[h + "self_attn.k_proj." + kind] = take_rows(qkv, x.Hkv * x.D, [&](int64_t r) { return x.k(r); });
      out[h + "self_attn.v_proj." + kind] = take_rows(qkv, x.Hkv * x.D, [&](int64_t r) { return x.v(r); });
      my.erase(y + "attn.qkv." + s);
      out[h + "self_attn.o_proj." + kind] = take(y + "attn.proj." + s);
      if (m.layer_is_moe(l)) continue;  // (biases: a dense family's only)
      const HostTensor& fc = get(y + "mlp.fc." + s);
      out[h + "mlp.gate_proj." + kind] = take_rows(fc, F, [](int64_t f) { return 2 * f; });
      out[h + "mlp.up_proj." + kind] = take_rows(fc, F, [](int64_t f) { return 2 * f + 1; });
      my.erase(y + "mlp.fc." + s);
      out[h + "mlp.down_proj." + kind] = take(y + "mlp.proj." + s);
    }
    if (!m.layer_is_moe(l)) continue;
    out[h + moe_prefix(D) + "gate.weight"] = take(y + "mlp.router.w");
    const HostTensor& fc = get(y + "mlp.experts.fc.w");
    const HostTensor& proj = get(y + "mlp.experts.proj.w");
    for (int64_t e = 0; e < m.experts; ++e) {
      out[h + expert_name(D, e, 0)] = take_rows(fc, Fe, [&](int64_t f) { return e * 2 * Fe + 2 * f; });
      out[h + expert_name(D, e, 1)] = take_rows(fc, Fe, [&](int64_t f) { return e * 2 * Fe + 2 * f + 1; });
      out[h + expert_name(D, e, 2)] = take_rows(proj, C, [&](int64_t c) { return e * C + c; });
    }
    my.erase(y + "mlp.experts.fc.w"), my.erase(y + "mlp.experts.proj.w");
  }
  return out;
}

// config.json's fields, read in transformers' words with the value as the file writes it:
// Myriad's own config check would speak of model.d_model where the file says hidden_size. Sizes
// are positive integers; a null is an absent field.
struct Fields {
  const nlohmann::json& hf;
  const std::string& where;
  const char* architecture;
  int64_t integer(const nlohmann::json& j, const std::string& key, std::optional<int64_t> fallback,
                  const std::string& prefix = "") const {
    if (!j.contains(key) || j[key].is_null()) {
      if (fallback) return *fallback;
      throw_input(where, prefix, key, " is missing", prefix.empty() ? cat(": not a ", architecture, " config") : "");
    }
    if (!j[key].is_number_integer()) throw_input(where, prefix, key, " is ", j[key].dump(), ", not an integer");
    if (j[key].is_number_unsigned() && j[key].get<uint64_t>() > uint64_t(std::numeric_limits<int32_t>::max()))
      throw_input(where, prefix, key, " = ", j[key].dump(), " is past the largest size Myriad takes (2^31 - 1)");
    const int64_t v = j[key].get<int64_t>();
    if (v < 1) throw_input(where, prefix, key, " = ", j[key].dump(), ": it must be a positive integer");
    return v;
  }
  double number(const nlohmann::json& j, const std::string& key, double fallback, const std::string& prefix = "") const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_number()) throw_input(where, prefix, key, " is ", j[key].dump(), ", not a number");
    return j[key].get<double>();
  }
  bool flag(const char* key, bool fallback) const {
    if (!hf.contains(key) || hf[key].is_null()) return fallback;
    if (!hf[key].is_boolean()) throw_input(where, key, " is ", hf[key].dump(), ", not true or false");
    return hf[key].get<bool>();
  }
};

// Rotary positions, in either form transformers writes: before version 5, rope_theta and
// rope_scaling ({rope_type or type, and the type's fields}, null for none) at the top; from
// version 5, rope_parameters ({rope_theta, rope_type, and the type's fields}). Both are read;
// where a file has both, they must agree. Nothing the file does not say is filled in, except
// transformers' own default theta (10000) when neither form gives one.
void read_rope(const Fields& f, ModelConfig& m) {
  const nlohmann::json& hf = f.hf;
  const std::string& where = f.where;
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
  m.rope_theta = f.number(hf, "rope_theta", 10000);
  if (inner_theta) {
    const double t = f.number(params, "rope_theta", 0, "rope_parameters.");
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
    s.factor = f.number(j, "factor", 0, prefix), s.low = f.number(j, "low_freq_factor", 0, prefix);
    s.high = f.number(j, "high_freq_factor", 0, prefix);
    s.positions = f.integer(j, "original_max_position_embeddings", {}, prefix);
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
}

// A mixture of experts' fields into cfg, as either generation writes them: Qwen3-MoE's
// num_experts (transformers 4) or num_local_experts (5), moe_intermediate_size, norm_topk_prob,
// decoder_sparse_step and mlp_only_layers (the first layers only: Myriad's dense_layers);
// Mixtral's num_local_experts, its intermediate_size the experts', every layer MoE.
template <const Dialect& D>
void read_experts(const Fields& f, Config& cfg) {
  const nlohmann::json& hf = f.hf;
  const std::string& where = f.where;
  ModelConfig& m = cfg.model;
  const bool qwen = D.experts == Experts::kQwen;
  const bool old_name = hf.contains("num_experts") && !hf["num_experts"].is_null();
  const bool new_name = hf.contains("num_local_experts") && !hf["num_local_experts"].is_null();
  if (qwen && old_name && new_name && hf["num_experts"] != hf["num_local_experts"])
    throw_input(where, "num_experts = ", hf["num_experts"].dump(), " but num_local_experts = ",
                hf["num_local_experts"].dump(), ": the two generations' names disagree; keep one");
  m.experts = f.integer(hf, qwen && old_name ? "num_experts" : "num_local_experts", {});
  m.experts_per_token = f.integer(hf, "num_experts_per_tok", qwen ? std::optional<int64_t>{} : std::optional<int64_t>{2});
  m.router_score = "softmax", m.router_scale = 1, m.router_groups = 1, m.router_top_groups = 1;
  cfg.moe.aux_loss = f.number(hf, "router_aux_loss_coef", qwen ? 0.001 : 0.02);
  if (!qwen) {  // Mixtral: intermediate_size is the experts'; the weights always renormalized
    m.expert_hidden = m.mlp_hidden, m.router_norm_topk = true;
    return;
  }
  m.expert_hidden = f.integer(hf, "moe_intermediate_size", {});
  m.router_norm_topk = f.flag("norm_topk_prob", false);
  m.moe_every = f.integer(hf, "decoder_sparse_step", 1);
  if (hf.contains("mlp_only_layers") && !hf["mlp_only_layers"].is_null()) {
    const nlohmann::json& dense = hf["mlp_only_layers"];
    if (!dense.is_array()) throw_input(where, "mlp_only_layers is ", dense.dump(), ", not a list of layer indices");
    for (size_t i = 0; i < dense.size(); ++i)
      if (!dense[i].is_number_integer() || dense[i].get<int64_t>() != int64_t(i))
        throw_input(where, "mlp_only_layers = ", dense.dump().substr(0, 80), ": Myriad's dense layers are the first ",
                    "ones (model.dense_layers), so this list must be 0, 1, ..., k-1");
    m.dense_layers = static_cast<int64_t>(dense.size());
  }
}

template <const Dialect& D>
Config from_hf_config(const nlohmann::json& hf, const std::string& where) {
  const Fields f{hf, where, D.architecture};
  if (hf.contains("hidden_act") && hf["hidden_act"] != "silu")
    throw_input(where, "hidden_act = ", hf["hidden_act"].dump(), ": Myriad's SwiGLU gates with silu");
  const bool attention_bias = f.flag("attention_bias", false), mlp_bias = f.flag("mlp_bias", false);
  if (&D != &kLlama && attention_bias)
    throw_input(where, "attention_bias = true: ", D.architecture, "'s attention biases without MLP biases, a shape Myriad "
                "lacks (its model.bias gives the attention's and the MLP's linear layers biases together)");
  if (attention_bias != mlp_bias)
    throw_input(where, "attention_bias = ", attention_bias ? "true" : "false", " but mlp_bias = ", mlp_bias ? "true" : "false",
                ": Myriad's model.bias gives the attention's and the MLP's linear layers biases together");
  Config cfg;
  ModelConfig& m = cfg.model;
  m.norm = "rmsnorm", m.position_encoding = "rope", m.mlp = "swiglu", m.bias = attention_bias;
  m.layers = f.integer(hf, "num_hidden_layers", {}), m.d_model = f.integer(hf, "hidden_size", {});
  m.heads = f.integer(hf, "num_attention_heads", {});
  m.kv_heads = f.integer(hf, "num_key_value_heads", m.heads);
  m.mlp_hidden = f.integer(hf, "intermediate_size", {});
  m.vocab_size = f.integer(hf, "vocab_size", {});
  m.positions = f.integer(hf, "max_position_embeddings", 2048);
  m.seq_len = std::min<int64_t>(m.positions, 8192);
  m.norm_eps = f.number(hf, "rms_norm_eps", 1e-6);
  m.tied_embeddings = f.flag("tie_word_embeddings", false);
  m.init_std = f.number(hf, "initializer_range", 0.02);
  // The head size: hidden_size / num_attention_heads unless head_dim says otherwise (Qwen3's
  // 128 at hidden_size 1024 and 16 heads); kept in model.head_dim only where it differs.
  if (hf.contains("head_dim") && !hf["head_dim"].is_null()) {
    const int64_t d = f.integer(hf, "head_dim", {});
    if (m.d_model % m.heads != 0 || d != m.d_model / m.heads) m.head_size = d;
  } else if (m.d_model % m.heads != 0) {
    throw_input(where, "hidden_size = ", m.d_model, " is not a multiple of num_attention_heads = ", m.heads,
                " and head_dim is not given");
  }
  if (m.heads % m.kv_heads != 0)
    throw_input(where, "num_key_value_heads = ", m.kv_heads, " does not divide num_attention_heads = ", m.heads,
                ": each key/value head serves an equal group of query heads");

  read_rope(f, m);
  if (D.qk_norm) {
    m.qk_norm = "head";
    if (f.flag("use_sliding_window", false))
      throw_input(where, "use_sliding_window = true: sliding-window layers (max_window_layers) are not imported; "
                  "Myriad's window is one for every layer");
  }
  if (&D == &kMixtral && hf.contains("sliding_window") && !hf["sliding_window"].is_null())
    throw_input(where, "sliding_window = ", hf["sliding_window"].dump(), ": a sliding window is not imported (Myriad "
                "exports and imports Mixtral with full causal attention)");
  if (D.experts != Experts::kNone) read_experts<D>(f, cfg);
  // The tokenizer the model was trained with: what `export` wrote, else Llama 3's for a Llama
  // of its vocabulary, else bytes, which import_hf replaces with the directory's own
  // tokenizer.json where Myriad reads it (Qwen's; Mistral's is of another form).
  cfg.data.tokenizer = &D == &kLlama && m.vocab_size >= 128256 ? "llama3" : "byte";
  if (hf.contains("myriad") && hf["myriad"].is_object() && hf["myriad"].contains("tokenizer") &&
      hf["myriad"]["tokenizer"].is_string())
    cfg.data.tokenizer = hf["myriad"]["tokenizer"].get<std::string>();
  return cfg;
}

// The experts a file holds against config.json's count, said before any tensor is taken:
// "tensor ... is missing" or "not part of" would name one tensor of the difference.
template <const Dialect& D>
void check_expert_count(const std::map<std::string, HostTensor>& hf, const ModelConfig& m, const std::string& where) {
  for (int64_t l = 0; l < m.layers; ++l) {
    if (!m.layer_is_moe(l)) continue;
    const std::string prefix = hf_layer(l) + moe_prefix(D) + "experts.";
    std::set<int64_t> held;  // the expert indices the file names in this layer
    for (const auto& [name, t] : hf)
      if (name.starts_with(prefix)) {
        const std::string rest = name.substr(prefix.size());
        const size_t dot = rest.find('.');
        const std::string digits = rest.substr(0, dot);
        if (digits.empty() || digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), ::isdigit))
          throw_input(where, "tensor ", name, " names no expert index");
        held.insert(std::stoll(digits));
      }
    const bool whole = int64_t(held.size()) == m.experts && (held.empty() || *held.rbegin() == m.experts - 1);
    if (!whole)
      throw_input(where, "layer ", l, " holds ", held.size(), " experts",
                  held.empty() ? std::string() : cat(" (indices ", *held.begin(), " to ", *held.rbegin(), ")"),
                  " but config.json says ", D.experts == Experts::kMixtral ? "num_local_experts" : "num_experts", " = ",
                  m.experts, ": the config and the weights disagree");
  }
}

template <const Dialect& D>
std::map<std::string, HostTensor> from_hf(std::map<std::string, HostTensor>& hf, const ModelConfig& m,
                                          const std::string& where) {
  const QkvRows x(m);
  const int64_t C = m.d_model, F = m.ffn(), Fe = m.expert_ffn(), V = m.vocab_size, Q = (x.H + 2 * x.Hkv) * x.D;
  if (D.experts != Experts::kNone) check_expert_count<D>(hf, m, where);
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
    if (D.qk_norm) {
      out[y + "attn.q_norm.w"] = take(h + "self_attn.q_norm.weight", {x.D});
      out[y + "attn.k_norm.w"] = take(h + "self_attn.k_norm.weight", {x.D});
    }
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
      if (m.layer_is_moe(l)) continue;  // (biases: a dense family's only)
      HostTensor fc{shape(2 * F, C), std::vector<float>(static_cast<size_t>(w ? 2 * F * C : 2 * F))};
      put_rows(fc, take(h + "mlp.gate_proj." + kind, shape(F, C)), [](int64_t f) { return 2 * f; });
      put_rows(fc, take(h + "mlp.up_proj." + kind, shape(F, C)), [](int64_t f) { return 2 * f + 1; });
      out[y + "mlp.fc." + s] = std::move(fc);
      out[y + "mlp.proj." + s] = take(h + "mlp.down_proj." + kind, w ? std::vector<int64_t>{C, F} : std::vector<int64_t>{C});
    }
    if (!m.layer_is_moe(l)) continue;
    out[y + "mlp.router.w"] = take(h + moe_prefix(D) + "gate.weight", {m.experts, C});
    HostTensor fc{{m.experts * 2 * Fe, C}, std::vector<float>(static_cast<size_t>(m.experts * 2 * Fe * C))};
    HostTensor proj{{m.experts * C, Fe}, std::vector<float>(static_cast<size_t>(m.experts * C * Fe))};
    for (int64_t e = 0; e < m.experts; ++e) {
      put_rows(fc, take(h + expert_name(D, e, 0), {Fe, C}), [&](int64_t f) { return e * 2 * Fe + 2 * f; });
      put_rows(fc, take(h + expert_name(D, e, 1), {Fe, C}), [&](int64_t f) { return e * 2 * Fe + 2 * f + 1; });
      put_rows(proj, take(h + expert_name(D, e, 2), {C, Fe}), [&](int64_t c) { return e * C + c; });
    }
    out[y + "mlp.experts.fc.w"] = std::move(fc);
    out[y + "mlp.experts.proj.w"] = std::move(proj);
  }
  // Rotary tables some files carry are recomputed from the config, not read.
  for (auto it = hf.begin(); it != hf.end();)
    it = it->first.ends_with("rotary_emb.inv_freq") ? hf.erase(it) : std::next(it);
  if (!hf.empty()) throw_input(where, "tensor ", hf.begin()->first, " is not part of a ", D.architecture, " of this config");
  return out;
}

template <const Dialect& D>
constexpr HfFamily family() {
  return {D.architecture, D.model_type, "BF16", claims<D>, unfit<D>, hf_config<D>, to_hf<D>, from_hf_config<D>, nullptr,
          from_hf<D>};
}

}  // namespace

extern const HfFamily kLlamaFamily = family<kLlama>(), kQwen3Family = family<kQwen3>(),
                      kQwen3MoeFamily = family<kQwen3Moe>(), kMixtralFamily = family<kMixtral>();

}  // namespace myriad::checkpoint
