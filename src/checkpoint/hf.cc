#include "checkpoint/hf.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "core/config.h"
#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "data/tokenizer.h"

namespace fs = std::filesystem;

namespace myriad::checkpoint {
namespace {

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

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

// Myriad's global shape of each stored model tensor (wte unpadded: the checkpoint's).
std::map<std::string, std::vector<int64_t>> myriad_shapes(const ModelConfig& m, int64_t positions) {
  const int64_t C = m.d_model;
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

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
  if (!out) throw_runtime("export: cannot write ", p.string());
}

}  // namespace

void write_safetensors(const std::string& path, const std::map<std::string, HostTensor>& tensors) {
  nlohmann::json header = {{"__metadata__", {{"format", "pt"}}}};  // transformers asks for "pt"
  int64_t at = 0;
  for (const auto& [name, t] : tensors) {  // std::map: sorted names, so the data order is fixed
    const int64_t bytes = static_cast<int64_t>(t.data.size() * sizeof(float));
    header[name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text = header.dump();  // nlohmann's objects are sorted by key
  text.append((8 - text.size() % 8) % 8, ' ');  // the data 8-byte aligned, as the format advises
  std::ofstream out(path, std::ios::binary);
  uint64_t n = text.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& [name, t] : tensors)
    out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size() * sizeof(float)));
  out.close();
  if (!out) throw_runtime("export: cannot write ", path);
}

std::map<std::string, HostTensor> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_input("import: cannot open ", path);
  in.seekg(0, std::ios::end);
  const int64_t size = in.tellg();
  in.seekg(0);
  unsigned char len[8] = {};
  if (size < 8 || !in.read(reinterpret_cast<char*>(len), 8))
    throw_input("import: ", path, ": truncated header (", size, " bytes): not a safetensors file");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | len[i];
  if (n > uint64_t(size - 8) || n > (100u << 20))
    throw_input("import: ", path, ": truncated header (it says ", n, " bytes, the file has ", size - 8,
                " after the length): not a whole safetensors file");
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  const nlohmann::json header = nlohmann::json::parse(text, nullptr, false);
  if (!header.is_object()) throw_input("import: ", path, ": the header is not a JSON object: not a safetensors file");
  const int64_t data_start = 8 + static_cast<int64_t>(n);
  std::map<std::string, HostTensor> out;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") continue;
    if (!e.is_object()) throw_input("import: ", path, ": tensor ", name, "'s header entry is not a JSON object");
    const std::string dtype = e.value("dtype", "");
    if (dtype != "F32")
      throw_input("import: ", path, ": tensor ", name, " has dtype ", dtype.empty() ? "(none)" : dtype,
                  "; only F32 is read: convert the model to float32 first");
    if (!e.contains("shape") || !e.contains("data_offsets") || !e["shape"].is_array() || e["data_offsets"].size() != 2)
      throw_input("import: ", path, ": tensor ", name, " has no shape or data_offsets");
    HostTensor t;
    t.shape = e["shape"].get<std::vector<int64_t>>();
    const auto off = e["data_offsets"].get<std::vector<int64_t>>();
    if (off[0] < 0 || off[1] - off[0] != numel(t.shape) * 4 || data_start + off[1] > size)
      throw_input("import: ", path, ": tensor ", name, " (shape ", shape_str(t.shape), ") has data_offsets [", off[0],
                  ", ", off[1], "] that do not fit its shape or the file");
    t.data.resize(static_cast<size_t>(numel(t.shape)));
    in.seekg(data_start + off[0]);
    in.read(reinterpret_cast<char*>(t.data.data()), off[1] - off[0]);
    out[name] = std::move(t);
  }
  return out;
}

void export_hf(const std::string& dir, const std::string& out) {
  const nlohmann::json meta = read_meta(dir);
  const Config cfg = parse_config(meta.at("config").get<std::string>(), dir + "/meta.json");
  const ModelConfig& m = cfg.model;
  if (m.parallel_block)
    throw_input("export: ", dir, " has model.parallel_block = true, which GPT-2 cannot express (its blocks are sequential)");
  if (m.window > 0)
    throw_input("export: ", dir, " has model.window = ", m.window, ", which GPT-2 cannot express (its attention is full causal)");
  if (!m.bias) throw_input("export: ", dir, " has model.bias = false, which GPT-2 cannot express (it has biases)");
  std::map<std::string, HostTensor> tensors;
  const auto shapes = myriad_shapes(m, cfg.positions());
  for (const Names& n : gpt2_names(m)) {
    HostTensor t{shapes.at(n.myriad), {}};
    t.data.resize(static_cast<size_t>(numel(t.shape)));
    load(dir, meta, {{"model/" + n.myriad, t.shape, std::vector<int64_t>(t.shape.size(), 0), t.shape, t.data.data()}});
    tensors[n.gpt2] = convert(n, t, m, /*to_gpt2=*/true);
  }
  fs::create_directories(out);
  write_safetensors((fs::path(out) / "model.safetensors").string(), tensors);
  const bool gpt2 = cfg.data.tokenizer == "gpt2";
  nlohmann::json config = {{"architectures", {"GPT2LMHeadModel"}},
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
                           {"bos_token_id", gpt2 ? nlohmann::json(50256) : nlohmann::json(nullptr)},
                           {"eos_token_id", gpt2 ? nlohmann::json(50256) : nlohmann::json(nullptr)},
                           {"myriad", {{"tokenizer", cfg.data.tokenizer}, {"step", meta.value("step", 0)}}}};
  write_text(fs::path(out) / "config.json", config.dump(2) + "\n");
  if (gpt2) {  // transformers' GPT2Tokenizer reads vocab.json and merges.txt: the same BPE files
    const fs::path src = data::gpt2_dir();
    for (const auto& [from, to] : {std::pair<const char*, const char*>{"encoder.json", "vocab.json"}, {"vocab.bpe", "merges.txt"}}) {
      if (!fs::exists(src / from)) throw_input("export: ", (src / from).string(), " is missing: run scripts/setup.sh");
      fs::copy_file(src / from, fs::path(out) / to, fs::copy_options::overwrite_existing);
    }
    write_text(fs::path(out) / "tokenizer_config.json",
               nlohmann::json({{"tokenizer_class", "GPT2Tokenizer"}, {"model_max_length", cfg.positions()}}).dump(2) + "\n");
  }
  log::info("export: ", dir, " -> ", out, " (GPT-2, ", tensors.size(), " tensors, ", m.layers, " layers, d_model ",
            m.d_model, ", vocab ", m.vocab_size, ")");
}

void import_hf(const std::string& hf_dir, const std::string& out) {
  const fs::path cfg_path = fs::path(hf_dir) / "config.json", st_path = fs::path(hf_dir) / "model.safetensors";
  if (!fs::exists(cfg_path)) throw_input("import: ", cfg_path.string(), " is missing: give a Hugging Face GPT-2 model directory");
  const nlohmann::json hf = nlohmann::json::parse(read_file(cfg_path.string()), nullptr, false);
  if (!hf.is_object()) throw_input("import: ", cfg_path.string(), " is not valid JSON");
  if (hf.value("model_type", "") != "gpt2")
    throw_input("import: ", cfg_path.string(), ": model_type is '", hf.value("model_type", ""), "', not gpt2");
  auto get = [&](const char* key) -> int64_t {
    if (!hf.contains(key) || !hf[key].is_number_integer())
      throw_input("import: ", cfg_path.string(), ": ", key, " is missing or not an integer");
    return hf[key].get<int64_t>();
  };
  if (hf.contains("n_inner") && !hf["n_inner"].is_null() && hf["n_inner"] != 4 * get("n_embd"))
    throw_input("import: ", cfg_path.string(), ": n_inner = ", hf["n_inner"].dump(), "; Myriad's MLP is 4 x n_embd");
  if (const std::string act = hf.value("activation_function", "gelu_new"); act != "gelu_new")
    throw_input("import: ", cfg_path.string(), ": activation_function = ", act, "; Myriad's GELU is gelu_new (tanh)");
  // Options of transformers' GPT-2 that change its arithmetic away from Myriad's.
  if (hf.value("scale_attn_weights", true) != true || hf.value("scale_attn_by_inverse_layer_idx", false) != false)
    throw_input("import: ", cfg_path.string(), ": scale_attn_weights must be true and scale_attn_by_inverse_layer_idx "
                "false: Myriad scales attention by 1/sqrt(head size) only");
  if (const double eps = hf.value("layer_norm_epsilon", 1e-5); std::abs(eps - 1e-5) > 1e-12)
    throw_input("import: ", cfg_path.string(), ": layer_norm_epsilon = ", eps, "; Myriad's LayerNorm uses 1e-5");
  Config cfg;
  cfg.model.layers = get("n_layer"), cfg.model.d_model = get("n_embd"), cfg.model.heads = get("n_head");
  cfg.model.vocab_size = get("vocab_size");
  cfg.model.positions = cfg.model.seq_len = get("n_positions");
  cfg.data.tokenizer = hf.contains("myriad") ? hf["myriad"].value("tokenizer", "gpt2")
                       : cfg.model.vocab_size == 256 ? "byte" : "gpt2";
  // The config's own checks (heads divide d_model, ...), through its TOML text.
  cfg = parse_config(to_toml(cfg), cfg_path.string());
  const ModelConfig& m = cfg.model;
  std::map<std::string, HostTensor> st = read_safetensors(st_path.string());
  // Released checkpoints carry the attention mask buffers, and some a copy of the tied head.
  std::map<std::string, HostTensor> byname;
  for (auto& [name, t] : st) {
    std::string n = name.rfind("transformer.", 0) == 0 ? name.substr(12) : name;
    if (n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias")) continue;
    byname[n] = std::move(t);
  }
  if (auto head = byname.find("lm_head.weight"); head != byname.end()) {
    if (!byname.count("wte.weight") || head->second.data != byname["wte.weight"].data)
      throw_input("import: ", st_path.string(), ": lm_head.weight differs from wte.weight: Myriad ties the head to the embedding");
    byname.erase(head);
  }
  const auto shapes = myriad_shapes(m, cfg.positions());
  std::map<std::string, HostTensor> model;  // Myriad's name -> tensor
  for (const Names& n : gpt2_names(m)) {
    auto it = byname.find(n.gpt2);
    if (it == byname.end()) throw_input("import: ", st_path.string(), ": tensor ", n.gpt2, " is missing");
    std::vector<int64_t> want = shapes.at(n.myriad);
    if (n.kind == Names::kLinear || n.kind == Names::kQkvWeight) std::swap(want[0], want[1]);
    if (it->second.shape != want)
      throw_input("import: ", st_path.string(), ": tensor ", n.gpt2, " has shape ", shape_str(it->second.shape),
                  " but ", cfg_path.filename().string(), " (n_layer ", m.layers, ", n_embd ", m.d_model, ", vocab_size ",
                  m.vocab_size, ", n_positions ", cfg.positions(), ") makes it ", shape_str(want));
    model["model/" + n.myriad] = convert(n, it->second, m, /*to_gpt2=*/false);
    byname.erase(it);
  }
  if (!byname.empty())
    throw_input("import: ", st_path.string(), ": tensor ", byname.begin()->first, " is not part of a GPT-2 model");
  // A fresh optimizer: zero moments, no step taken.
  std::vector<Shard> shards;
  std::map<std::string, std::vector<float>> zeros;
  for (auto& [name, t] : model) {
    const std::vector<int64_t> at(t.shape.size(), 0);
    shards.push_back({name, t.shape, at, t.shape, t.data.data()});
    const std::string tensor = name.substr(6);
    zeros[tensor].assign(t.data.size(), 0.0f);
    shards.push_back({"optim/m/" + tensor, t.shape, at, t.shape, zeros[tensor].data()});
    shards.push_back({"optim/v/" + tensor, t.shape, at, t.shape, zeros[tensor].data()});
  }
  nlohmann::json meta = {{"config", to_toml(cfg)},
                         {"data", {{"consumed", 0}, {"seed", cfg.train.seed}}},
                         {"optimizer", {{"name", cfg.optim.name}, {"steps_taken", 0}}},
                         {"tokenizer", cfg.data.tokenizer},
                         {"rng", {{"model_seed", cfg.model.seed}, {"data_seed", cfg.train.seed}}},
                         {"imported_from", fs::absolute(hf_dir).lexically_normal().string()}};
  save_as(out, 0, meta, shards);
  log::info("import: ", hf_dir, " -> ", out, " (GPT-2, ", m.layers, " layers, d_model ", m.d_model, ", vocab ",
            m.vocab_size, ", tokenizer ", cfg.data.tokenizer, ")");
}

}  // namespace myriad::checkpoint
