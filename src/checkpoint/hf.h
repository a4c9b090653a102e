// Hugging Face interchange: a Myriad checkpoint's model as GPT-2 or Llama in safetensors (the
// layouts transformers' GPT2LMHeadModel and LlamaForCausalLM load), and back.
//
// safetensors (https://huggingface.co/docs/safetensors): 8 bytes, the little-endian length N
// of a JSON header; N bytes of header, {"name": {"dtype", "shape", "data_offsets": [begin,
// end]}, "__metadata__": {...}}; then the raw data, offsets relative to the header's end.
//
// GPT-2 stores its linear layers as Conv1D, weights (in, out): Myriad's are (out, in). Its
// c_attn columns are ordered (q/k/v, head, dim), Myriad's fused QKV rows (head, q/k/v, dim).
// The LM head is the token embedding (tied) and is not stored twice.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace myriad::checkpoint {

// A float tensor, row-major.
struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// safetensors in `dtype` (F32, or BF16 rounded to nearest even), header keys sorted and no
// timestamps: the same tensors give the same bytes.
void write_safetensors(const std::string& path, const std::map<std::string, HostTensor>& tensors,
                       const std::string& dtype = "F32");
// Every tensor of a safetensors file but those `skip` names (unread, whatever their dtype),
// widened to fp32 from F32, BF16 or F16; input errors name the file, the tensor and the field
// that is wrong (a truncated header, another dtype, a shape or data_offsets that is not a list of
// sizes or does not fit the file).
std::map<std::string, HostTensor> read_safetensors(const std::string& path,
                                                   const std::function<bool(const std::string&)>& skip = {});

// A tokenizer's special ids in a Hugging Face config.json: {"bos_token_id", "eos_token_id"}
// (gpt2: 50256 both; llama3: 128000 and 128001; byte: none, null), whatever the model family.
nlohmann::json hf_special_tokens(const std::string& tokenizer);

struct ExportOptions {
  std::string dtype;                        // "bf16", "fp32"; "" = bf16 for a Llama model, fp32 for GPT-2
  int64_t max_shard_bytes = 5'000'000'000;  // more than this is written in shards with an index
  bool overwrite = false;                   // replace a folder that holds files no export wrote
};

// The model of the committed checkpoint `dir` as a Hugging Face model directory: a Llama-family
// model (checkpoint/hf_llama.h) as LlamaForCausalLM, in bf16 unless asked for fp32; any other
// as GPT-2 (GPT2LMHeadModel, fp32). Either family gets its tokenizer's files: tokenizer.json
// and tokenizer_config.json for llama3, vocab.json, merges.txt and tokenizer_config.json for
// gpt2 (none for byte), and its special ids in config.json. The weights are OUT/model.safetensors, or shards of at most max_shard_bytes with
// OUT/model.safetensors.index.json; then OUT/config.json, and the manifest OUT/myriad_export.json
// that lists the files. What the format cannot express (GPT-2: a parallel block, a window, no
// biases; Llama: LayerNorm, learned positions, GELU, the parallel block, a window) is an input
// error naming the key. The files are written into a new
// folder beside OUT and renamed into place, so a failure leaves OUT as it was, and OUT holds
// that export's files only. An existing OUT is replaced only when it is empty or holds an
// earlier export's files only (by its manifest), or with `overwrite` (the whole folder, never
// one that holds `dir`, even through a symbolic link); else an input error names the first file
// export did not write. Where OUT exists but cannot be replaced whole (a mount point, a parent
// this user cannot write), the files are staged in OUT/.myriad-tmp-PID and renamed into OUT one
// by one, the earlier export's other files removed after, the manifest last: not atomic, but a
// crash leaves a folder the next export replaces (with `overwrite`, files no export wrote stay).
void export_hf(const std::string& dir, const std::string& out, const ExportOptions& options = {});

// Reads a GPT-2 or LlamaForCausalLM model directory (config.json, and model.safetensors or the
// shards model.safetensors.index.json lists; F32, BF16 or F16) into `out`, a committed
// checkpoint of step 0 with a fresh optimizer state, which --resume, checkpoint.init_from,
// `export --checkpoint` and `sample` take. `out` must not exist (judged on the normalized path:
// `nonexist/../victim` is victim); non-finite weights are an input error naming the tensor and
// the element.
void import_hf(const std::string& hf_dir, const std::string& out);

}  // namespace myriad::checkpoint
