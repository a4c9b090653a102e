#include "checkpoint/hf.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/export_folder.h"
#include "checkpoint/hf_family.h"
#include "checkpoint/state.h"
#include "core/config.h"
#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "data/tokenizer.h"
#include "model/params.h"

namespace fs = std::filesystem;

namespace myriad::checkpoint {

extern const HfFamily kGpt2Family;                                                      // hf_gpt2.cc
extern const HfFamily kLlamaFamily, kQwen3Family, kQwen3MoeFamily, kMixtralFamily;  // hf_llama.cc

const std::vector<const HfFamily*>& hf_families() {
  static const std::vector<const HfFamily*> all = {&kMixtralFamily, &kQwen3MoeFamily, &kQwen3Family, &kLlamaFamily,
                                                   &kGpt2Family};
  return all;
}

nlohmann::json hf_special_tokens(const std::string& tokenizer) {
  if (tokenizer == "byte") return {{"bos_token_id", nullptr}, {"eos_token_id", nullptr}};
  if (tokenizer == "gpt2") return {{"bos_token_id", 50256}, {"eos_token_id", 50256}};
  if (tokenizer == "llama3") return {{"bos_token_id", 128000}, {"eos_token_id", 128001}};
  // Qwen3's and a Hugging Face file's: the document end Myriad's data ends each document with;
  // no beginning of text (Qwen's tokenizer sets none).
  return {{"bos_token_id", nullptr}, {"eos_token_id", data::make_tokenizer(tokenizer)->eot()}};
}

// The files transformers' AutoTokenizer reads for `tokenizer`, into `into`, whatever the model's
// family (a GPT-2 layout may train on Llama 3's ids): their names. The byte tokenizer has none.
namespace {

std::vector<std::string> write_tokenizer(const fs::path& into, const std::string& tokenizer, int64_t max_length) {
  if (const fs::path src = data::hf_tokenizer_dir(tokenizer); !src.empty()) {
    // transformers' fast tokenizer reads tokenizer.json: the one Myriad encodes with, and its
    // tokenizer_config.json where there is one (Qwen's, an imported model's), else the least
    // that names its class and ends.
    const std::string bytes = read_file((src / "tokenizer.json").string());
    if (bytes.empty()) throw_input("export: ", (src / "tokenizer.json").string(), " is missing: ",
                                   tokenizer.starts_with("hf:") ? "restore it" : "run scripts/setup.sh");
    write_file_durably((into / "tokenizer.json").string(), {bytes});
    // Its eos_token is the document end Myriad's data ends documents with, which config.json's
    // eos_token_id names too (Qwen's own file says <|im_end|>, its chat turns' end).
    const auto tok = data::make_tokenizer(tokenizer);
    std::string config = fs::exists(src / "tokenizer_config.json") ? read_file((src / "tokenizer_config.json").string())
                                                                   : std::string();
    nlohmann::json c = nlohmann::json::parse(config, nullptr, false);
    if (!c.is_object()) {
      c = {{"tokenizer_class", "PreTrainedTokenizerFast"}, {"model_max_length", max_length}};
      if (tokenizer == "llama3") c["bos_token"] = "<|begin_of_text|>";
    }
    c["eos_token"] = tok->decode({tok->eot()});
    config = c.dump(2) + "\n";
    write_file_durably((into / "tokenizer_config.json").string(), {config});
    return {"tokenizer.json", "tokenizer_config.json"};
  }
  if (tokenizer == "gpt2") {  // transformers' GPT2Tokenizer reads vocab.json and merges.txt: the same BPE files
    const fs::path src = data::gpt2_dir();
    for (const auto& [from, to] : {std::pair<const char*, const char*>{"encoder.json", "vocab.json"}, {"vocab.bpe", "merges.txt"}}) {
      const std::string bytes = read_file((src / from).string());
      if (bytes.empty()) throw_input("export: ", (src / from).string(), " is missing: run scripts/setup.sh");
      write_file_durably((into / to).string(), {bytes});
    }
    write_file_durably((into / "tokenizer_config.json").string(),
                       {nlohmann::json({{"tokenizer_class", "GPT2Tokenizer"}, {"model_max_length", max_length}}).dump(2) + "\n"});
    return {"vocab.json", "merges.txt", "tokenizer_config.json"};
  }
  return {};
}

// The family that exports `m`: the first that claims it; what it cannot express is an input
// error naming the key. A GPT-2 block with a Llama key (fewer key/value heads, an untied head,
// another MLP width) fits neither format: named first is what GPT-2 lacks.
const HfFamily& family_of(const ModelConfig& m, const std::string& dir) {
  const HfFamily& f = **std::find_if(hf_families().begin(), hf_families().end(),
                                     [&](const HfFamily* f) { return f->claims(m); });
  const std::string why = f.unfit(m);
  if (why.empty()) return f;
  if (&f == &kLlamaFamily && !m.rmsnorm() && !m.rope() && !m.swiglu()) {
    const std::string key = m.kv() != m.heads    ? cat("model.kv_heads = ", m.kv())
                            : !m.tied_embeddings ? std::string("model.tied_embeddings = false")
                                                 : cat("model.mlp_hidden = ", m.ffn());
    throw_input("export: ", dir, " has ", key, ", which GPT-2 cannot express, and ", why, ": neither Hugging "
                "Face GPT-2 nor LlamaForCausalLM can express it");
  }
  throw_input("export: ", dir, " has ", why, ": a Hugging Face ", f.architecture, " cannot express it");
}

// A non-finite weight would import and then sample garbage, or stop a run as a numerics fault
// (exit 5, which a supervisor retries): it is the file's fault.
void refuse_non_finite(const std::map<std::string, HostTensor>& st, const std::string& from) {
  for (const auto& [name, t] : st)
    for (size_t i = 0; i < t.data.size(); ++i)
      if (!std::isfinite(t.data[i]))
        throw_input("import: ", from, ": tensor ", name, " element ", i, " is ",
                    std::isnan(t.data[i]) ? "nan" : t.data[i] > 0 ? "inf" : "-inf",
                    " (a flat index): the model holds non-finite weights; import a sound copy of it");
}

// A model must have an embedding row for every id of its tokenizer (`ids` of them), or `sample`
// and training read past the table (`train` refuses such a model; so does an import).
void refuse_small_vocabulary(const Config& cfg, int64_t ids, const std::string& where, const char* vocab_key) {
  if (cfg.model.vocab_size < ids)
    throw_input(where, vocab_key, " = ", cfg.model.vocab_size, " is below the ", cfg.data.tokenizer, " tokenizer's ", ids,
                " ids, which the model's embedding must cover: import a model whose vocabulary covers its tokenizer's");
}

// The tokenizer of an import. A built-in one stays: what `export` recorded (myriad.tokenizer),
// or the family's reading of the vocabulary (Llama 3's, GPT-2's). Otherwise the directory's own
// tokenizer.json, where Myriad reads it (Qwen's, Llama 3's form), is kept in the checkpoint `out`
// with its tokenizer_config.json, and the run names it "hf:OUT": `prepare --tokenizer hf:OUT`
// gives continued pre-training the model's own ids. A tokenizer.json of another form is said and
// left (the byte tokenizer then stands in). Sets cfg.data.tokenizer; returns the files to keep
// and the tokenizer's vocabulary.
std::pair<std::map<std::string, std::string>, int64_t> import_tokenizer(const fs::path& hf_dir, const fs::path& out,
                                                                        Config& cfg) {
  std::string& name = cfg.data.tokenizer;
  const fs::path json = hf_dir / "tokenizer.json";
  if (name.starts_with("hf:") && !fs::is_regular_file(json)) {  // an export's, made elsewhere
    log::warn("import: config.json names the tokenizer ", name, " but ", json.string(),
              " is missing; the checkpoint's tokenizer is byte");
    name = "byte";
  }
  if ((name == "byte" || name.starts_with("hf:")) && fs::is_regular_file(json)) {
    // The file of a built-in tokenizer, byte for byte (Qwen's own, as setup.sh fetched it): that
    // tokenizer, by name, so that its presets and data go with the import.
    const std::string bytes = read_file(json.string());
    for (const std::string& builtin : {std::string("qwen3"), std::string("llama3")}) {
      const fs::path own = fs::path(data::hf_tokenizer_dir(builtin)) / "tokenizer.json";
      if (fs::is_regular_file(own) && read_file(own.string()) == bytes) {
        name = builtin;
        return {{}, data::tokenizer_vocab_size(name)};
      }
    }
    try {
      const auto tok = data::make_hf_bpe_tokenizer(hf_dir.string(), "", "");
      std::map<std::string, std::string> files = {{"tokenizer.json", bytes}};
      if (fs::is_regular_file(hf_dir / "tokenizer_config.json"))
        files["tokenizer_config.json"] = read_file((hf_dir / "tokenizer_config.json").string());
      name = canonical_tokenizer("hf:" + out.string());
      return {files, tok->vocab_size()};
    } catch (const Error& e) {
      if (e.cls() != ErrorClass::kInput) throw;
      log::warn("import: ", json.string(), " is not kept (", e.what(), "); the checkpoint's tokenizer is ",
                name.starts_with("hf:") ? "byte" : name);
      if (name.starts_with("hf:")) name = "byte";
    }
  }
  return {{}, data::tokenizer_vocab_size(name)};
}

// `model` (Myriad's stored tensors by name) as the committed checkpoint `out` of step 0, with a
// fresh optimizer: zero moments, no step taken.
void save_imported(const fs::path& out, const Config& cfg, std::map<std::string, HostTensor>& model,
                   const std::map<std::string, std::string>& files, const std::string& hf_dir, const char* kind) {
  std::vector<Shard> shards;
  size_t largest = 0;
  for (const auto& [tensor, t] : model) largest = std::max(largest, t.data.size());
  const std::vector<float> zeros(largest, 0.0f);  // every tensor's moments: read, never written
  for (auto& [tensor, t] : model) {
    const std::vector<int64_t> at(t.shape.size(), 0);
    shards.push_back({param_name(tensor), t.shape, at, t.shape, t.data.data()});
    for (int moment : {1, 2})
      shards.push_back({moment_name(moment, tensor), t.shape, at, t.shape, const_cast<float*>(zeros.data())});
  }
  // The state of a run at its step 0: the data at its start, no optimizer step taken.
  Meta meta;
  meta.config = to_toml(cfg), meta.tokenizer = cfg.data.tokenizer;
  meta.data.consumed = 0, meta.data.seed = cfg.train.seed;
  meta.optimizer = {cfg.optim.name, 0};
  meta.rng = {cfg.model.seed, cfg.train.seed};
  meta.imported_from = fs::absolute(hf_dir).lexically_normal().string();
  save_as(out.string(), 0, encode(meta), shards, files);
  const ModelConfig& m = cfg.model;
  log::info("import: ", hf_dir, " -> ", out.string(), " (", kind, ", ", m.layers, " layers, d_model ", m.d_model,
            ", vocab ", m.vocab_size, ", tokenizer ", cfg.data.tokenizer, ")");
}

}  // namespace

void export_hf(const std::string& dir, const std::string& out_arg, const ExportOptions& opt) {
  const nlohmann::json meta = read_meta(dir);
  const Config cfg = parse_config(config_of(meta, dir), dir + "/meta.json");
  const ModelConfig& m = cfg.model;
  const HfFamily& family = family_of(m, dir);
  // bf16 for Llama models, as Meta's and Hugging Face's releases are; GPT-2 stays fp32.
  const std::string dtype = opt.dtype.empty() ? family.default_dtype
                            : opt.dtype == "bf16" ? "BF16"
                            : opt.dtype == "fp32" ? "F32"
                                                  : "";
  if (dtype.empty()) throw_input("export: --dtype ", opt.dtype, " is not one of: bf16, fp32");
  if (opt.max_shard_bytes < 1) throw_input("export: --max-shard-size must be at least 1 byte");
  const fs::path out = check_export_output(out_arg, dir, opt.overwrite);
  // Every stored tensor of the model, whole, in the family's names and layouts.
  std::map<std::string, HostTensor> own;
  const ParamLayout layout(cfg);
  for (const ParamSpec& p : layout.tensors()) {
    const ParamLayout::Stored st = layout.stored(p);
    HostTensor& t = own[p.name];
    t.shape = st.global_shape;
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    t.data.resize(static_cast<size_t>(n));
    load(dir, meta, {{param_name(p.name), t.shape, std::vector<int64_t>(t.shape.size(), 0), t.shape, t.data.data()}});
  }
  const std::map<std::string, HostTensor> tensors = family.to_hf(std::move(own), m);
  const int64_t step = meta.value("step", 0);
  // The export's files (not the manifest) into the folder `into`, each on the disk: their names.
  auto write_files = [&](const fs::path& into) {
    std::vector<std::string> files = write_model(into, tensors, dtype, opt.max_shard_bytes);
    for (const std::string& f : write_tokenizer(into, cfg.data.tokenizer, cfg.positions())) files.push_back(f);
    write_file_durably((into / "config.json").string(),
                       {family.hf_config(cfg, dtype == "BF16" ? "bfloat16" : "float32", step).dump(2) + "\n"});
    files.push_back("config.json");
    std::sort(files.begin(), files.end());
    return files;
  };
  auto manifest = [&](const std::vector<std::string>& files) {
    return nlohmann::json({{"format", "myriad-hf-export"},
                           {"version", 1},
                           {"checkpoint", normalized(dir).string()},
                           {"step", step},
                           {"files", files}})
               .dump(2) +
           "\n";
  };
  write_export(out, opt.overwrite, write_files, manifest);
  log::info("export: ", dir, " -> ", out.string(), " (", family.architecture, ", ", tensors.size(), " tensors in ",
            dtype, ", ", m.layers, " layers, d_model ", m.d_model, ", vocab ", m.vocab_size, ")");
}

void import_hf(const std::string& hf_dir, const std::string& out_arg) {
  // The checkpoint goes to a new directory only (save_as never replaces one): said here, before
  // the model is read, and judged on the path the save will write.
  const fs::path out = normalized(out_arg);
  std::error_code ec;
  if (fs::exists(fs::symlink_status(out, ec)))
    throw_input("import: --output ", out_arg, " exists (", out.string(), "): give a new directory; an import never "
                "replaces one");
  const fs::path cfg_path = fs::path(hf_dir) / "config.json";
  // Where the weights are, for messages: model.safetensors, or the index of its shards.
  const fs::path st_path = fs::exists(fs::path(hf_dir) / "model.safetensors") || !fs::exists(fs::path(hf_dir) / kIndex)
                               ? fs::path(hf_dir) / "model.safetensors"
                               : fs::path(hf_dir) / kIndex;
  if (!fs::exists(cfg_path)) throw_input("import: ", cfg_path.string(), " is missing: give a Hugging Face model directory (GPT-2, Llama, Qwen3, Qwen3-MoE, Mixtral)");
  if (!fs::is_regular_file(cfg_path)) throw_input("import: ", cfg_path.string(), " is not a file: give a Hugging Face model directory (GPT-2, Llama, Qwen3, Qwen3-MoE, Mixtral)");
  const nlohmann::json hf = nlohmann::json::parse(read_file(cfg_path.string()), nullptr, false);
  if (!hf.is_object()) throw_input("import: ", cfg_path.string(), " is not valid JSON");
  const std::string where = cat("import: ", cfg_path.string(), ": ");
  if (hf.contains("model_type") && !hf["model_type"].is_string())
    throw_input(where, "model_type is ", hf["model_type"].dump(), ", not a string such as \"gpt2\"");
  const std::string type = hf.value("model_type", "");
  const auto found = std::find_if(hf_families().begin(), hf_families().end(),
                                  [&](const HfFamily* f) { return type == f->model_type; });
  if (found == hf_families().end()) {
    std::string known;
    for (const HfFamily* f : hf_families()) known += cat(known.empty() ? "" : ", ", f->model_type);
    throw_input(where, "model_type is '", type, "': Myriad imports ", known);
  }
  const HfFamily& family = **found;
  Config cfg = family.from_hf_config(hf, where);
  cfg = parse_config(to_toml(cfg), cfg_path.string());  // the config's own checks (heads divide d_model, ...)
  const auto [tokenizer_files, tokenizer_ids] = import_tokenizer(hf_dir, out, cfg);
  refuse_small_vocabulary(cfg, tokenizer_ids, where, "vocab_size");
  std::map<std::string, HostTensor> st = read_model(hf_dir, family.skip ? family.skip : std::function<bool(const std::string&)>());
  refuse_non_finite(st, st_path.string());
  std::map<std::string, HostTensor> model = family.from_hf(st, cfg.model, cat("import: ", st_path.string(), ": "));
  save_imported(out, cfg, model, tokenizer_files, hf_dir, family.architecture);
}

}  // namespace myriad::checkpoint
