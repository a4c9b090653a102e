// Hugging Face's GPT2LMHeadModel in Myriad's terms (checkpoint/hf_family.h).
//
// GPT-2 stores its linear layers as Conv1D, weights (in, out): Myriad's are (out, in). Its c_attn
// columns are ordered (q/k/v, head, dim), Myriad's fused QKV rows (head, q/k/v, dim). The LM head
// is the token embedding (tied) and is not stored twice.
#include <cmath>
#include <cstring>
#include <optional>

#include "checkpoint/hf_family.h"
#include "core/error.h"

namespace myriad::checkpoint {
namespace {

// (rows, cols) -> (cols, rows)
HostTensor transposed(const HostTensor& t) {
  const int64_t R = t.shape[0], C = t.shape[1];
  HostTensor out{{C, R}, std::vector<float>(t.data.size())};
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) out.data[c * R + r] = t.data[r * C + c];
  return out;
}

// The position in GPT-2's c_attn output (q/k/v, head, dim) of Myriad's fused QKV row (head,
// q/k/v, dim).
int64_t gpt2_qkv_index(int64_t myriad_row, int64_t heads, int64_t head_dim) {
  const int64_t h = myriad_row / (3 * head_dim), j = myriad_row / head_dim % 3, d = myriad_row % head_dim;
  return j * heads * head_dim + h * head_dim + d;
}

// The GPT-2 tensors of a model: name -> (its Myriad tensor, shape in GPT-2).
struct Names {
  std::string gpt2, myriad;
  enum Kind { kCopy, kLinear, kQkvWeight, kQkvBias } kind;
};
std::vector<Names> gpt2_names(const ModelConfig& m) {
  std::vector<Names> out = {{"wte.weight", "wte", Names::kCopy}, {"wpe.weight", "wpe", Names::kCopy}};
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string g = cat("h.", l, "."), y = cat("h.", l, ".");
    for (const auto& [a, b] : {std::pair<const char*, const char*>{"ln_1", "ln1"}, {"ln_2", "ln2"}}) {
      out.push_back({g + a + ".weight", y + b + ".w", Names::kCopy});
      out.push_back({g + a + ".bias", y + b + ".b", Names::kCopy});
    }
    out.push_back({g + "attn.c_attn.weight", y + "attn.qkv.w", Names::kQkvWeight});
    out.push_back({g + "attn.c_attn.bias", y + "attn.qkv.b", Names::kQkvBias});
    for (const auto& [a, b] : {std::pair<const char*, const char*>{"attn.c_proj", "attn.proj"}, {"mlp.c_fc", "mlp.fc"},
                               {"mlp.c_proj", "mlp.proj"}}) {
      out.push_back({g + a + ".weight", y + b + ".w", Names::kLinear});
      out.push_back({g + a + ".bias", y + b + ".b", Names::kCopy});
    }
  }
  out.push_back({"ln_f.weight", "lnf.w", Names::kCopy});
  out.push_back({"ln_f.bias", "lnf.b", Names::kCopy});
  return out;
}

// Myriad -> GPT-2 (`to_gpt2`) or back, one tensor.
HostTensor convert(const Names& n, const HostTensor& t, const ModelConfig& m, bool to_gpt2) {
  const int64_t H = m.heads, D = m.d_model / m.heads, C = m.d_model;
  switch (n.kind) {
    case Names::kCopy:
      return t;
    case Names::kLinear:
      return transposed(t);
    case Names::kQkvBias: {
      HostTensor out{t.shape, std::vector<float>(t.data.size())};
      for (int64_t r = 0; r < 3 * C; ++r) {
        const int64_t g = gpt2_qkv_index(r, H, D);
        if (to_gpt2) out.data[g] = t.data[r];
        else out.data[r] = t.data[g];
      }
      return out;
    }
    case Names::kQkvWeight: {
      if (!to_gpt2) {  // (C, 3C) GPT-2 -> (3C, C): columns back to rows
        const HostTensor rows = transposed(t);
        HostTensor out{rows.shape, std::vector<float>(rows.data.size())};
        for (int64_t r = 0; r < 3 * C; ++r)
          std::memcpy(&out.data[r * C], &rows.data[gpt2_qkv_index(r, H, D) * C], C * sizeof(float));
        return out;
      }
      HostTensor rows{t.shape, std::vector<float>(t.data.size())};
      for (int64_t r = 0; r < 3 * C; ++r)
        std::memcpy(&rows.data[gpt2_qkv_index(r, H, D) * C], &t.data[r * C], C * sizeof(float));
      return transposed(rows);
    }
  }
  return t;
}

// Myriad's global shape of each stored model tensor (wte unpadded: the checkpoint's).
std::map<std::string, std::vector<int64_t>> myriad_shapes(const ModelConfig& m) {
  const int64_t C = m.d_model, positions = m.positions > 0 ? m.positions : m.seq_len;
  std::map<std::string, std::vector<int64_t>> s = {{"wte", {m.vocab_size, C}}, {"wpe", {positions, C}},
                                                   {"lnf.w", {C}}, {"lnf.b", {C}}};
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string y = cat("h.", l, ".");
    for (const char* n : {"ln1.w", "ln1.b", "ln2.w", "ln2.b", "attn.proj.b", "mlp.proj.b"}) s[y + n] = {C};
    s[y + "attn.qkv.w"] = {3 * C, C}, s[y + "attn.qkv.b"] = {3 * C};
    s[y + "attn.proj.w"] = {C, C};
    s[y + "mlp.fc.w"] = {4 * C, C}, s[y + "mlp.fc.b"] = {4 * C};
    s[y + "mlp.proj.w"] = {C, 4 * C};
  }
  return s;
}

// Released GPT-2 checkpoints store the attention's mask buffers (h.N.attn.bias, in F32, BOOL or
// U8, and h.N.attn.masked_bias): constants Myriad does not load, dropped unread.
bool mask_buffer(const std::string& name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
}


bool claims(const ModelConfig&) { return true; }  // whatever the Llama family does not

std::string unfit(const ModelConfig& m) {
  if (m.head_dim() * m.heads != m.d_model)
    return cat("model.head_dim = ", m.head_dim(), " (GPT-2's head size is n_embd / n_head)");
  if (!m.qk_norm.empty()) return cat("model.qk_norm = \"", m.qk_norm, "\" (GPT-2 has no query and key norms)");
  if (m.parallel_block) return "model.parallel_block = true (GPT-2's blocks are sequential)";
  if (m.window > 0) return cat("model.window = ", m.window, " (GPT-2's attention is full causal)");
  if (!m.bias) return "model.bias = false (GPT-2's linears have biases)";
  return "";
}

nlohmann::json hf_config(const Config& cfg, const std::string& torch_dtype, int64_t step) {
  const ModelConfig& m = cfg.model;
  const nlohmann::json special = hf_special_tokens(cfg.data.tokenizer);
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", m.vocab_size},
          {"n_positions", cfg.positions()},
          {"n_ctx", cfg.positions()},
          {"n_embd", m.d_model},
          {"n_layer", m.layers},
          {"n_head", m.heads},
          {"n_inner", nullptr},
          {"activation_function", "gelu_new"},  // the tanh approximation, as Myriad's
          {"layer_norm_epsilon", 1e-5},
          {"initializer_range", m.init_std},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"scale_attn_weights", true},
          {"tie_word_embeddings", true},
          {"bos_token_id", special["bos_token_id"]},
          {"eos_token_id", special["eos_token_id"]},
          {"myriad", {{"tokenizer", cfg.data.tokenizer}, {"step", step}}}};
}

std::map<std::string, HostTensor> to_hf(std::map<std::string, HostTensor> my, const ModelConfig& m) {
  std::map<std::string, HostTensor> out;
  for (const Names& n : gpt2_names(m)) {
    auto it = my.find(n.myriad);
    MYRIAD_CHECK(it != my.end(), "the checkpoint's model has no tensor ", n.myriad);
    out[n.gpt2] = convert(n, it->second, m, /*to_gpt2=*/true);
    my.erase(it);
  }
  return out;
}

Config from_hf_config(const nlohmann::json& hf, const std::string& where) {
  // Keys of config.json in the JSON type transformers gives them; another type (null included)
  // is the file's error, named, rather than a JSON library's exception.
  auto get = [&](const char* key) -> int64_t {
    if (!hf.contains(key) || !hf[key].is_number_integer())
      throw_input(where, key, " is missing or not an integer", hf.contains(key) ? cat(" (", hf[key].dump(), ")") : "");
    if (hf[key].is_number_unsigned() && hf[key].get<uint64_t>() > uint64_t(std::numeric_limits<int32_t>::max()))
      throw_input(where, key, " = ", hf[key].dump(), " is past the largest size Myriad takes (2^31 - 1)");
    if (hf[key].get<int64_t>() < 1) throw_input(where, key, " = ", hf[key].dump(), ": it must be a positive integer");
    return hf[key].get<int64_t>();
  };
  auto text = [&](const char* key, const std::string& fallback, const char* example) -> std::string {
    if (!hf.contains(key)) return fallback;
    if (!hf[key].is_string()) throw_input(where, key, " is ", hf[key].dump(), ", not a string such as \"", example, "\"");
    return hf[key].get<std::string>();
  };
  auto flag = [&](const char* key, bool fallback) -> bool {
    if (!hf.contains(key)) return fallback;
    if (!hf[key].is_boolean()) throw_input(where, key, " is ", hf[key].dump(), ", not true or false");
    return hf[key].get<bool>();
  };
  auto number = [&](const char* key, double fallback) -> double {
    if (!hf.contains(key)) return fallback;
    if (!hf[key].is_number()) throw_input(where, key, " is ", hf[key].dump(), ", not a number");
    return hf[key].get<double>();
  };
  if (hf.contains("n_inner") && !hf["n_inner"].is_null() && hf["n_inner"] != 4 * get("n_embd"))
    throw_input(where, "n_inner = ", hf["n_inner"].dump(), "; Myriad's MLP is 4 x n_embd");
  if (const std::string act = text("activation_function", "gelu_new", "gelu_new"); act != "gelu_new")
    throw_input(where, "activation_function = ", act, "; Myriad's GELU is gelu_new (tanh)");
  // Options of transformers' GPT-2 that change its arithmetic away from Myriad's.
  if (flag("scale_attn_weights", true) != true || flag("scale_attn_by_inverse_layer_idx", false) != false)
    throw_input(where, "scale_attn_weights must be true and scale_attn_by_inverse_layer_idx "
                "false: Myriad scales attention by 1/sqrt(head size) only");
  if (const double eps = number("layer_norm_epsilon", 1e-5); std::abs(eps - 1e-5) > 1e-12)
    throw_input(where, "layer_norm_epsilon = ", eps, "; Myriad's LayerNorm uses 1e-5");
  Config cfg;
  cfg.model.layers = get("n_layer"), cfg.model.d_model = get("n_embd"), cfg.model.heads = get("n_head");
  if (cfg.model.d_model % cfg.model.heads != 0)
    throw_input(where, "n_embd = ", cfg.model.d_model, " is not a multiple of n_head = ", cfg.model.heads);
  cfg.model.vocab_size = get("vocab_size");
  cfg.model.positions = cfg.model.seq_len = get("n_positions");
  cfg.data.tokenizer = cfg.model.vocab_size == 256 ? "byte" : "gpt2";
  if (hf.contains("myriad")) {  // what `export` writes: the tokenizer the model was trained with
    const nlohmann::json& own = hf["myriad"];
    if (!own.is_object())
      throw_input(where, "myriad is ", own.dump(), ", not an object: it is the entry `myriad export` writes, "
                  "{\"tokenizer\": \"byte\" or \"gpt2\"}; remove it to take the tokenizer from vocab_size");
    cfg.data.tokenizer = "gpt2";
    if (own.contains("tokenizer")) {
      if (!own["tokenizer"].is_string())
        throw_input(where, "myriad.tokenizer is ", own["tokenizer"].dump(), ", not a string such as \"gpt2\"");
      cfg.data.tokenizer = own["tokenizer"].get<std::string>();
    }
  }
  return cfg;
}

std::map<std::string, HostTensor> from_hf(std::map<std::string, HostTensor>& st, const ModelConfig& m,
                                          const std::string& where) {
  // Some released checkpoints name the tensors transformer.*, and carry a copy of the tied head.
  std::map<std::string, HostTensor> byname;
  for (auto& [name, t] : st) byname[name.rfind("transformer.", 0) == 0 ? name.substr(12) : name] = std::move(t);
  st.clear();
  if (auto head = byname.find("lm_head.weight"); head != byname.end()) {
    if (!byname.count("wte.weight") || head->second.data != byname["wte.weight"].data)
      throw_input(where, "lm_head.weight differs from wte.weight: Myriad ties the head to the embedding");
    byname.erase(head);
  }
  const auto shapes = myriad_shapes(m);
  std::map<std::string, HostTensor> model;  // Myriad's name -> tensor
  for (const Names& n : gpt2_names(m)) {
    auto it = byname.find(n.gpt2);
    if (it == byname.end()) throw_input(where, "tensor ", n.gpt2, " is missing");
    std::vector<int64_t> want = shapes.at(n.myriad);
    if (n.kind == Names::kLinear || n.kind == Names::kQkvWeight) std::swap(want[0], want[1]);
    if (it->second.shape != want)
      throw_input(where, "tensor ", n.gpt2, " has shape ", shape_str(it->second.shape), " but config.json (n_layer ",
                  m.layers, ", n_embd ", m.d_model, ", vocab_size ", m.vocab_size, ", n_positions ",
                  m.positions > 0 ? m.positions : m.seq_len, ") makes it ", shape_str(want));
    model[n.myriad] = convert(n, it->second, m, /*to_gpt2=*/false);
    byname.erase(it);
  }
  if (!byname.empty()) throw_input(where, "tensor ", byname.begin()->first, " is not part of a GPT-2 model");
  return model;
}

}  // namespace

extern const HfFamily kGpt2Family = {"GPT2LMHeadModel", "gpt2", "F32", claims, unfit, hf_config, to_hf,
                                     from_hf_config, mask_buffer, from_hf};

}  // namespace myriad::checkpoint
