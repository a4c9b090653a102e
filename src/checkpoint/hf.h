// Hugging Face interchange: a Myriad checkpoint's model as GPT-2, Llama, Qwen3, Qwen3-MoE or
// Mixtral in safetensors (the layouts transformers' GPT2LMHeadModel, LlamaForCausalLM,
// Qwen3ForCausalLM, Qwen3MoeForCausalLM and MixtralForCausalLM load), and back. In parts:
//   checkpoint/safetensors.h    the file format and the model folder (shards, index);
//   checkpoint/hf_family.h      a family's names and config.json both ways, one file each
//                               (hf_gpt2.cc; hf_llama.cc: Llama and its descendants);
//   checkpoint/export_folder.h  where an export's files go, replaced whole or not at all;
//   here                        the two commands, which read the checkpoint and pick the family.
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint/safetensors.h"

namespace myriad::checkpoint {

struct ExportOptions {
  std::string dtype;                        // "bf16", "fp32"; "" = bf16 for a Llama model, fp32 for GPT-2
  int64_t max_shard_bytes = 5'000'000'000;  // more than this is written in shards with an index
  bool overwrite = false;                   // replace a folder that holds files no export wrote
};

// The model of the committed checkpoint `dir` as a Hugging Face model directory: a mixture of
// experts as MixtralForCausalLM (no query-key norm) or Qwen3MoeForCausalLM (Qwen3's per-head
// norm); a dense model with that norm as Qwen3ForCausalLM; another Llama-block model as
// LlamaForCausalLM (checkpoint/hf_llama.cc), all in bf16 unless asked for fp32; any other as
// GPT-2 (GPT2LMHeadModel, fp32). Either family gets its tokenizer's files: tokenizer.json
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

// Reads a GPT-2, Llama, Qwen3, Qwen3-MoE or Mixtral model directory (config.json, and model.safetensors or the
// shards model.safetensors.index.json lists; F32, BF16 or F16) into `out`, a committed
// checkpoint of step 0 with a fresh optimizer state, which --resume, checkpoint.init_from,
// `export --checkpoint` and `sample` take. `out` must not exist (judged on the normalized path:
// `nonexist/../victim` is victim); non-finite weights are an input error naming the tensor and
// the element.
void import_hf(const std::string& hf_dir, const std::string& out);

}  // namespace myriad::checkpoint
