// A Hugging Face model family in Myriad's terms: which of Myriad's models it expresses, its
// config.json both ways, and its tensors' names and layouts both ways. One file each
// (hf_gpt2.cc, hf_llama.cc); checkpoint/hf.h's export and import pick one (by the model's keys,
// or config.json's model_type) and do the rest: the checkpoint's tensors, safetensors, the
// tokenizer's files, the folder. A new family is one new file and a row of hf_families().
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/config.h"

namespace myriad::checkpoint {

struct HfFamily {
  const char* architecture;   // transformers' class: "GPT2LMHeadModel", "LlamaForCausalLM"
  const char* model_type;     // config.json's: "gpt2", "llama"
  const char* default_dtype;  // what the export writes unless asked: "F32" or "BF16"
  // Whether `m` belongs to this family (the first family in hf_families() that claims a model
  // exports it).
  bool (*claims)(const ModelConfig& m);
  // Why the family cannot express `m`, naming the key and its value; "" when it can.
  std::string (*unfit)(const ModelConfig& m);
  // config.json of `cfg`'s model, its weights stored as `torch_dtype` ("bfloat16", "float32").
  nlohmann::json (*hf_config)(const Config& cfg, const std::string& torch_dtype, int64_t step);
  // Myriad's stored tensors (by name, "wte", "h.0.attn.qkv.w", ..., in the checkpoint's shapes)
  // as transformers' (by its names); `myriad` is consumed (a model's weights are held once).
  std::map<std::string, HostTensor> (*to_hf)(std::map<std::string, HostTensor> myriad, const ModelConfig& m);
  // The Myriad config of a config.json (`where` prefixes errors: "import: FILE: "); what Myriad
  // cannot express is an input error naming the field and its value as written.
  Config (*from_hf_config)(const nlohmann::json& hf, const std::string& where);
  // The tensors a file may carry that are dropped unread (GPT-2's attention masks); null: none.
  bool (*skip)(const std::string& tensor);
  // transformers' tensors as Myriad's, each checked against the config's shape; a tensor left
  // over is an error naming it. `hf` is consumed.
  std::map<std::string, HostTensor> (*from_hf)(std::map<std::string, HostTensor>& hf, const ModelConfig& m,
                                               const std::string& where);
};

// The families, the most specific first (Mixtral, Qwen3-MoE and Qwen3 claim models by their
// experts and query-key norms; Llama by any of its block's keys; GPT-2 takes the rest).
const std::vector<const HfFamily*>& hf_families();

// A tokenizer's special ids in a config.json: {"bos_token_id", "eos_token_id"} (gpt2: 50256
// both; llama3: 128000 and 128001; byte: none, null), whatever the family.
nlohmann::json hf_special_tokens(const std::string& tokenizer);

}  // namespace myriad::checkpoint
