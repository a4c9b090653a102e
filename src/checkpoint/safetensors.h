// safetensors (https://huggingface.co/docs/safetensors), and the model folder transformers
// writes with it.
//
// A file: 8 bytes, the little-endian length N of a JSON header; N bytes of header, {"name":
// {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}; then the raw data,
// offsets relative to the header's end. As the reference library requires, the tensors tile the
// data exactly: no overlap, no gap, nothing after the last.
// A model folder: model.safetensors, or shards model-0000i-of-0000n.safetensors with
// model.safetensors.index.json mapping each tensor to its shard.
#pragma once

#include <cstdint>
#include <filesystem>
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

// "[2, 3]", for messages.
std::string shape_str(const std::vector<int64_t>& s);

// The index of a sharded model (transformers' name).
inline constexpr const char* kIndex = "model.safetensors.index.json";

// safetensors in `dtype` (F32, or BF16 rounded to nearest even), header keys sorted and no
// timestamps: the same tensors give the same bytes. On the disk when it returns.
void write_safetensors(const std::string& path, const std::map<std::string, HostTensor>& tensors,
                       const std::string& dtype = "F32");
// Every tensor of a safetensors file but those `skip` names (unread, whatever their dtype),
// widened to fp32 from F32, BF16 or F16; input errors name the file, the tensor and the field
// that is wrong (a truncated header, another dtype, a shape or data_offsets that is not a list of
// sizes or does not fit the file, offsets that overlap or leave bytes unaccounted for).
std::map<std::string, HostTensor> read_safetensors(const std::string& path,
                                                   const std::function<bool(const std::string&)>& skip = {});

// The tensors as a model folder in `into`: model.safetensors, or, when they hold more than
// max_shard_bytes, shards (tensors in name order, each shard filled up to the limit, a larger
// tensor alone in one) and the index, as transformers writes them. The files' names.
std::vector<std::string> write_model(const std::filesystem::path& into, const std::map<std::string, HostTensor>& tensors,
                                     const std::string& dtype, int64_t max_shard_bytes);
// The tensors of a model folder: model.safetensors, read first (as transformers reads a folder
// that holds both, and said), else the shards its index maps them to (plain file names in the
// folder, each tensor in the file its entry names).
std::map<std::string, HostTensor> read_model(const std::string& hf_dir,
                                             const std::function<bool(const std::string&)>& skip = {});

}  // namespace myriad::checkpoint
