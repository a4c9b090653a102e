// Hugging Face's LlamaForCausalLM in Myriad's terms, for the export and import of checkpoint/hf.h:
// which models it expresses, its config.json, and its tensors.
//
// The tensors differ from Myriad's layout (model/params.h) only in order, never within a head:
// both rotate by halves (transformers' rotate_half), so q and k need no permutation inside a head.
//   q_proj (H D, C), k_proj and v_proj (Hkv D, C)  <->  attn.qkv ((H + 2 Hkv) D, C), rows by
//                                                      key/value head: its G query heads, k, v
//   gate_proj and up_proj (F, C)                   <->  mlp.fc (2F, C), rows (F, 2): gate, up
//   o_proj, down_proj, the norms, the embedding     <->  attn.proj, mlp.proj, ln1/ln2/lnf, wte
//   lm_head (untied only)                           <->  lm_head
// Biases (attention_bias and mlp_bias, both or neither: Myriad's model.bias) follow their weights.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/hf.h"
#include "core/config.h"

namespace myriad::checkpoint::llama {

// Whether `m` is of the Llama family: any of the block's Llama keys set (it is then exported as
// LlamaForCausalLM or refused, never as GPT-2).
bool family(const ModelConfig& m);
// Why LlamaForCausalLM cannot express `m`, naming the key and its value; "" when it can.
std::string unfit(const ModelConfig& m);

// config.json of `cfg`'s model, its weights stored as `torch_dtype` ("bfloat16" or "float32").
nlohmann::json hf_config(const Config& cfg, const std::string& torch_dtype, int64_t step);
// Myriad's stored tensors (by name: "wte", "h.0.attn.qkv.w", ...; wte and lm_head of vocab_size
// rows) as transformers' (by its names).
// `myriad` is consumed (a model's weights are held once).
std::map<std::string, HostTensor> to_hf(std::map<std::string, HostTensor> myriad, const ModelConfig& m);

// The Myriad config of a LlamaForCausalLM config.json (`where` prefixes errors: "import: FILE:
// "); what Myriad cannot express is an input error naming the field. seq_len is
// max_position_embeddings up to 8192 (a training context; set model.seq_len to train longer).
Config from_hf_config(const nlohmann::json& hf, const std::string& where);
// transformers' tensors as Myriad's, each checked against the config's shape; the file's other
// tensors are an error naming the first. `hf` is consumed.
std::map<std::string, HostTensor> from_hf(std::map<std::string, HostTensor>& hf, const ModelConfig& m,
                                          const std::string& where);

}  // namespace myriad::checkpoint::llama
