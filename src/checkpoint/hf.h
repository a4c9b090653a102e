// Hugging Face interchange: a Myriad checkpoint's model as GPT-2 in safetensors (the layout
// transformers' GPT2LMHeadModel loads), and back.
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
#include <string>
#include <vector>

namespace myriad::checkpoint {

// A float tensor, row-major.
struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// safetensors in F32, header keys sorted and no timestamps: the same tensors give the same bytes.
void write_safetensors(const std::string& path, const std::map<std::string, HostTensor>& tensors);
// Every tensor of a safetensors file but those `skip` names (unread, whatever their dtype); input
// errors name the file, the tensor and the field that is wrong (a truncated header, a dtype
// other than F32, a shape or data_offsets that is not a list of sizes or does not fit the file).
std::map<std::string, HostTensor> read_safetensors(const std::string& path,
                                                   const std::function<bool(const std::string&)>& skip = {});

// Writes OUT/model.safetensors and OUT/config.json (and, for the gpt2 tokenizer, its vocab.json,
// merges.txt and tokenizer_config.json) from the committed checkpoint `dir`, and the manifest
// OUT/myriad_export.json that lists them. A model GPT-2 cannot express (parallel block, a
// window, no biases) is an input error naming the option. The files are written into a new
// folder beside OUT and renamed into place, so a failure leaves OUT as it was, and OUT holds
// that export's files only. An existing OUT is replaced only when it is empty or holds an
// earlier export's files only (by its manifest), or with `overwrite` (the whole folder, never
// one that holds `dir`, even through a symbolic link); else an input error names the first file
// export did not write. Where OUT exists but cannot be replaced whole (a mount point, a parent
// this user cannot write), the files are staged in OUT/.myriad-tmp-PID and renamed into OUT one
// by one, the earlier export's other files removed after, the manifest last: not atomic, but a
// crash leaves a folder the next export replaces (with `overwrite`, files no export wrote stay).
void export_hf(const std::string& dir, const std::string& out, bool overwrite = false);

// Reads a GPT-2 model directory (config.json, model.safetensors) into `out`, a committed
// checkpoint of step 0 with a fresh optimizer state, which --resume, checkpoint.init_from,
// `export --checkpoint` and `sample` take. `out` must not exist (judged on the normalized path:
// `nonexist/../victim` is victim); non-finite weights are an input error naming the tensor and
// the element.
void import_hf(const std::string& hf_dir, const std::string& out);

}  // namespace myriad::checkpoint
