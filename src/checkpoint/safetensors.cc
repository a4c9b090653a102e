#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "core/error.h"
#include "core/files.h"
#include "core/log.h"

namespace fs = std::filesystem;

namespace myriad::checkpoint {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

namespace {

// Bytes of one element of a dtype Myriad writes or reads (F32; BF16, F16).
int64_t dtype_bytes(const std::string& dtype) { return dtype == "F32" ? 4 : 2; }

// fp32 <-> bfloat16 (its upper half; rounded to nearest even, NaN kept a NaN) and IEEE half.
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float from_f16(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, biased = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  uint32_t u;
  if (biased == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);  // inf, nan
  } else if (biased != 0) {
    u = sign | ((biased + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalized into fp32's range
    int e = -1;
    uint32_t m = man;
    do ++e, m <<= 1;
    while (!(m & 0x400u));
    u = sign | (uint32_t(112 - e) << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The tensors, by name in ascending order (the data order is then fixed), without copying them.
using TensorRefs = std::vector<std::pair<std::string, const HostTensor*>>;

void write_refs(const std::string& path, const TensorRefs& tensors, const std::string& dtype) {
  MYRIAD_CHECK(dtype == "F32" || dtype == "BF16", "safetensors dtype ", dtype);
  nlohmann::json header = {{"__metadata__", {{"format", "pt"}}}};  // transformers asks for "pt"
  int64_t at = 0;
  for (const auto& [name, tp] : tensors) {
    const HostTensor& t = *tp;
    const int64_t bytes = static_cast<int64_t>(t.data.size()) * dtype_bytes(dtype);
    header[name] = {{"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text = header.dump();  // nlohmann's objects are sorted by key
  text.append((8 - text.size() % 8) % 8, ' ');  // the data 8-byte aligned, as the format advises
  uint64_t n = text.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>(n >> (8 * i));
  std::vector<std::string_view> pieces = {{len, 8}, text};
  std::vector<std::vector<uint16_t>> narrowed;  // BF16: each tensor rounded, to nearest even
  narrowed.reserve(tensors.size());
  for (const auto& [name, tp] : tensors) {
    const HostTensor& t = *tp;
    if (dtype == "F32") {
      pieces.emplace_back(reinterpret_cast<const char*>(t.data.data()), t.data.size() * sizeof(float));
      continue;
    }
    std::vector<uint16_t>& b = narrowed.emplace_back(t.data.size());
    for (size_t i = 0; i < t.data.size(); ++i) b[i] = to_bf16(t.data[i]);
    pieces.emplace_back(reinterpret_cast<const char*>(b.data()), b.size() * sizeof(uint16_t));
  }
  write_file_durably(path, pieces);
}


}  // namespace

void write_safetensors(const std::string& path, const std::map<std::string, HostTensor>& tensors,
                       const std::string& dtype) {
  TensorRefs refs;
  for (const auto& [name, t] : tensors) refs.emplace_back(name, &t);
  write_refs(path, refs, dtype);
}

std::map<std::string, HostTensor> read_safetensors(const std::string& path,
                                                   const std::function<bool(const std::string&)>& skip) {
  std::error_code ec;
  if (const auto st = fs::status(path, ec); fs::exists(st) && !fs::is_regular_file(st))
    throw_input("import: ", path, " is not a file", fs::is_directory(st) ? " (it is a directory)" : "",
                ": give the model's safetensors file");
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
  const uint64_t data_bytes = static_cast<uint64_t>(size - data_start);
  // As the reference library requires: the tensors' bytes tile the data section exactly, with no
  // overlap, no gap and nothing after the last (a file that breaks this is damaged or crafted,
  // and other readers refuse it). Every entry counts, those skipped included.
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__" || !e.is_object() || !e.contains("data_offsets")) continue;
    const nlohmann::json& o = e["data_offsets"];
    if (o.is_array() && o.size() == 2 && o[0].is_number_unsigned() && o[1].is_number_unsigned())
      spans.emplace_back(o[0].get<uint64_t>(), o[1].get<uint64_t>());
  }
  // Each entry read is checked first, then the whole (its message names the entry), then read.
  struct Planned {
    std::string name, dtype;
    HostTensor t;
    uint64_t begin, end;
  };
  std::vector<Planned> planned;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__" || (skip && skip(name))) continue;
    const std::string where = cat("import: ", path, ": tensor ", name);
    if (!e.is_object()) throw_input(where, "'s header entry is not a JSON object");
    auto field = [&](const char* key) { return e.contains(key) ? e[key].dump() : std::string("(none)"); };
    if (!e.contains("dtype") || !e["dtype"].is_string())
      throw_input(where, ": dtype ", field("dtype"), " is not a dtype name such as \"F32\": not a safetensors file");
    const std::string dtype = e["dtype"];
    if (dtype != "F32" && dtype != "BF16" && dtype != "F16")
      throw_input(where, " has dtype ", dtype, "; F32, BF16 and F16 are read: convert the model to one of them first");
    const uint64_t esize = static_cast<uint64_t>(dtype_bytes(dtype));
    // Sizes are checked against the file before anything is allocated: a crafted shape would
    // otherwise overflow the element count or ask for exabytes.
    const nlohmann::json& shape = e.contains("shape") ? e["shape"] : nlohmann::json();
    if (!shape.is_array() || !std::all_of(shape.begin(), shape.end(), [](const auto& d) { return d.is_number_unsigned(); }))
      throw_input(where, ": shape ", field("shape"), " is not a list of sizes >= 0: not a safetensors file");
    HostTensor t;
    uint64_t elements = 1;
    for (const auto& d : shape) {
      const uint64_t v = d.get<uint64_t>();
      elements = v == 0 || elements == 0 ? 0 : elements > data_bytes / esize / v ? data_bytes / esize + 1 : elements * v;
      t.shape.push_back(v > uint64_t(std::numeric_limits<int64_t>::max()) ? -1 : static_cast<int64_t>(v));
    }
    if (elements > data_bytes / esize)
      throw_input(where, ": shape ", shape.dump(), " holds more elements than the file holds bytes: not a whole "
                  "safetensors file");
    const nlohmann::json& off = e.contains("data_offsets") ? e["data_offsets"] : nlohmann::json();
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw_input(where, ": data_offsets ", field("data_offsets"), " is not two integers [begin, end] (bytes after "
                  "the header): not a safetensors file");
    const uint64_t begin = off[0], end = off[1];
    if (begin > end || end - begin != elements * esize || end > data_bytes)
      throw_input(where, " (shape ", shape_str(t.shape), ") has data_offsets [", begin, ", ", end,
                  "] that do not fit its shape or the file");
    t.data.resize(static_cast<size_t>(elements));
    planned.push_back({name, dtype, std::move(t), begin, end});
  }
  std::sort(spans.begin(), spans.end());
  uint64_t covered = 0;
  for (const auto& [b, e] : spans) {
    if (b != covered)
      throw_input("import: ", path, ": the tensors' data_offsets ", b < covered ? "overlap" : "leave a gap", " at byte ",
                  std::min(b, covered), " of the data: not a valid safetensors file");
    covered = std::max(covered, e);
  }
  if (covered < data_bytes)
    throw_input("import: ", path, ": ", data_bytes - covered, " bytes follow the last tensor's data: not a valid "
                "safetensors file (it may be damaged, or two files joined)");
  std::map<std::string, HostTensor> out;
  for (Planned& p : planned) {
    in.seekg(data_start + static_cast<int64_t>(p.begin));
    if (p.dtype == "F32") {
      in.read(reinterpret_cast<char*>(p.t.data.data()), static_cast<std::streamsize>(p.end - p.begin));
    } else {  // widened to fp32, exactly
      std::vector<uint16_t> half(p.t.data.size());
      in.read(reinterpret_cast<char*>(half.data()), static_cast<std::streamsize>(p.end - p.begin));
      for (size_t i = 0; i < half.size(); ++i) p.t.data[i] = p.dtype == "BF16" ? from_bf16(half[i]) : from_f16(half[i]);
    }
    if (!in) throw_runtime("import: cannot read ", path, ": ", std::strerror(errno));
    out[p.name] = std::move(p.t);
  }
  return out;
}

// The weights as model.safetensors, or, when they hold more than max_shard_bytes, as shards
// model-0000i-of-0000n.safetensors (tensors in name order, each shard filled up to the limit, a
// larger tensor alone in one) with model.safetensors.index.json mapping each tensor to its
// shard, as transformers writes them. The files' names.
std::vector<std::string> write_model(const fs::path& into, const std::map<std::string, HostTensor>& tensors,
                                            const std::string& dtype, int64_t max_shard_bytes) {
  std::vector<TensorRefs> shards(1);
  int64_t in_shard = 0, total = 0;
  for (const auto& [name, t] : tensors) {
    const int64_t bytes = static_cast<int64_t>(t.data.size()) * dtype_bytes(dtype);
    if (in_shard > 0 && in_shard + bytes > max_shard_bytes) shards.emplace_back(), in_shard = 0;
    shards.back().emplace_back(name, &t);
    in_shard += bytes, total += bytes;
  }
  if (shards.size() == 1) {
    write_refs((into / "model.safetensors").string(), shards[0], dtype);
    return {"model.safetensors"};
  }
  std::vector<std::string> files;
  nlohmann::json map = nlohmann::json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    write_refs((into / name).string(), shards[i], dtype);
    for (const auto& ref : shards[i]) map[ref.first] = name;
    files.push_back(name);
  }
  const std::string index = nlohmann::json({{"metadata", {{"total_size", total}}}, {"weight_map", map}}).dump(2) + "\n";
  write_file_durably((into / kIndex).string(), {index});
  files.push_back(kIndex);
  return files;
}

// The weights of a model directory: model.safetensors, or the shards model.safetensors.index.json
// maps them to (plain file names in the directory, each tensor in the file its entry names).
std::map<std::string, HostTensor> read_model(const std::string& hf_dir,
                                             const std::function<bool(const std::string&)>& skip) {
  const fs::path index = fs::path(hf_dir) / kIndex, single = fs::path(hf_dir) / "model.safetensors";
  // model.safetensors first, as transformers loads a directory that holds both.
  if (fs::exists(single)) {
    if (fs::exists(index))
      log::warn("import: ", hf_dir, " holds both model.safetensors and ", kIndex, ": reading model.safetensors, as "
                "transformers does (the index and its shards are ignored)");
    return read_safetensors(single.string(), skip);
  }
  if (!fs::exists(index))
    throw_input("import: ", hf_dir, " has neither model.safetensors nor ", kIndex, ": not a Hugging Face model directory");
  const nlohmann::json j = nlohmann::json::parse(read_file(index.string()), nullptr, false);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw_input("import: ", index.string(), ": weight_map is missing or not an object");
  std::map<std::string, std::string> where;  // tensor -> its file
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    if (!file.is_string()) throw_input("import: ", index.string(), ": weight_map.", tensor, " is not a file name");
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
      throw_input("import: ", index.string(), ": weight_map.", tensor, " = \"", f, "\" is not a file of the directory");
    where[tensor] = f;
  }
  std::map<std::string, HostTensor> out;
  std::set<std::string> files;
  for (const auto& [tensor, f] : where) files.insert(f);
  for (const std::string& f : files) {
    for (auto& [name, t] : read_safetensors((fs::path(hf_dir) / f).string(), skip)) {
      auto it = where.find(name);
      if (it == where.end() || it->second != f)
        throw_input("import: ", (fs::path(hf_dir) / f).string(), ": tensor ", name, " is not mapped to this file by ", kIndex);
      out[name] = std::move(t);
    }
  }
  for (const auto& [tensor, f] : where)
    if (!out.count(tensor) && !(skip && skip(tensor))) throw_input("import: ", (fs::path(hf_dir) / f).string(), ": tensor ", tensor, " is missing (", kIndex, " maps it there)");
  return out;
}

}  // namespace myriad::checkpoint
