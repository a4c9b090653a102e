#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/log.h"

namespace myriad::data {

static_assert(std::endian::native == std::endian::little,
              "MMIDIDX files are little-endian and are read in place");

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;
constexpr size_t kWriteBuffer = 1 << 20;

bool known_dtype(uint8_t code) { return code >= 1 && code <= 8; }

void write_all(std::FILE* f, const void* data, size_t n, const std::string& path) {
  if (n && std::fwrite(data, 1, n, f) != n)
    throw_runtime(path, ": write failed: ", std::strerror(errno));
}

// A new file beside `path` that this process alone made, `path`.tmp-<pid>: a file already
// there under that name (a user's own, or a killed writer's) is never truncated or removed.
std::FILE* create_temporary(const std::string& path, std::string& made) {
  for (int i = 0;; ++i) {
    made = cat(path, ".tmp-", ::getpid(), i ? cat("-", i) : std::string());
    if (std::FILE* f = std::fopen(made.c_str(), "wbx")) return f;
    if (errno != EEXIST || i >= 100) throw_runtime(made, ": cannot create: ", std::strerror(errno));
  }
}

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

template <class T>
T get(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Maps a whole file read-only; an empty file maps to nullptr. Missing files are input errors.
const unsigned char* map_file(const std::string& path, size_t& bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR || err == EACCES || err == EISDIR)
      throw_input(path, ": cannot open: ", std::strerror(err));
    throw_runtime(path, ": cannot open: ", std::strerror(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw_runtime(path, ": cannot stat: ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw_input(path, ": not a regular file");
  }
  bytes = static_cast<size_t>(st.st_size);
  void* p = nullptr;
  if (bytes > 0) {
    p = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw_runtime(path, ": mmap of ", bytes, " bytes failed: ", std::strerror(err));
    }
  }
  ::close(fd);  // the mapping keeps the file alive
  return static_cast<const unsigned char*>(p);
}

void unmap(const unsigned char* p, size_t bytes) {
  if (p) ::munmap(const_cast<unsigned char*>(p), bytes);
}

// Widens n tokens of type T at p (any alignment) to int32.
template <class T>
void widen(const unsigned char* p, int64_t n, int32_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(get<T>(p + i * sizeof(T)));
}

// Position of the first token outside [0, vocab), or -1; `bad` gets its value.
template <class T>
int64_t first_bad(const unsigned char* p, int64_t n, int64_t vocab, int64_t& bad) {
  constexpr int64_t kBlock = 1 << 16;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = std::min(n, start + kBlock);
    T lo = get<T>(p + start * sizeof(T)), hi = lo;
    for (int64_t i = start; i < end; ++i) {  // branch-free min/max so the loop vectorizes
      const T v = get<T>(p + i * sizeof(T));
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    if (static_cast<int64_t>(lo) >= 0 && static_cast<int64_t>(hi) < vocab) continue;
    for (int64_t i = start; i < end; ++i) {
      const auto v = static_cast<int64_t>(get<T>(p + i * sizeof(T)));
      if (v < 0 || v >= vocab) {
        bad = v;
        return i;
      }
    }
  }
  return -1;
}

}  // namespace

int64_t dtype_size(DType d) {
  switch (d) {
    case DType::kUInt8:
    case DType::kInt8:
      return 1;
    case DType::kInt16:
    case DType::kUInt16:
      return 2;
    case DType::kInt32:
    case DType::kFloat32:
      return 4;
    case DType::kInt64:
    case DType::kFloat64:
      return 8;
  }
  return 0;
}

const char* dtype_name(DType d) {
  switch (d) {
    case DType::kUInt8:
      return "uint8";
    case DType::kInt8:
      return "int8";
    case DType::kInt16:
      return "int16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat32:
      return "float32";
    case DType::kUInt16:
      return "uint16";
  }
  return "?";
}

DType dtype_for_vocab(int64_t vocab_size) {
  return vocab_size < 65500 ? DType::kUInt16 : DType::kInt32;
}

std::string dataset_prefix(const std::string& path) {
  for (const char* ext : {".bin", ".idx"}) {
    const size_t n = std::strlen(ext);
    if (path.size() > n && path.compare(path.size() - n, n, ext) == 0)
      return path.substr(0, path.size() - n);
  }
  return path;
}

// ---- Writer ----------------------------------------------------------------------------------

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, int64_t vocab_size,
                                           std::string tokenizer, int32_t eot)
    : prefix_(std::move(prefix)),
      vocab_size_(vocab_size),
      tokenizer_(std::move(tokenizer)),
      eot_(eot),
      dtype_(dtype_for_vocab(vocab_size)) {
  if (vocab_size <= 0 || vocab_size > INT32_MAX)
    throw_input(prefix_, ": vocab_size ", vocab_size, " is outside [1, 2^31)");
  const auto parent = std::filesystem::path(prefix_).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) throw_runtime(parent.string(), ": cannot create the directory: ", ec.message());
  }
  bin_ = create_temporary(prefix_ + ".bin", bin_tmp_);
  buffer_.reserve(kWriteBuffer + 1024);
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (!finished_) remove_temporaries();
}

void IndexedDatasetWriter::remove_temporaries() {
  if (bin_) std::fclose(bin_);
  bin_ = nullptr;
  for (const std::string* tmp : {&bin_tmp_, &idx_tmp_, &json_tmp_})
    if (!tmp->empty()) std::remove(tmp->c_str());
}

void IndexedDatasetWriter::add_document(std::span<const int32_t> tokens) {
  MYRIAD_CHECK(!finished_, "add_document after finish");
  if (tokens.empty()) return;
  if (tokens.size() > static_cast<size_t>(INT32_MAX))
    throw_input(prefix_, ": a document of ", tokens.size(),
                " tokens exceeds the format's int32 sequence length");
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    if (t < 0 || t >= vocab_size_)
      throw_input(prefix_, ": token id ", t, " of document ", lengths_.size(),
                  " is outside [0, vocab_size ", vocab_size_, ")");
    if (dtype_ == DType::kUInt16) {
      const auto v = static_cast<uint16_t>(t);
      buffer_.insert(buffer_.end(), reinterpret_cast<const char*>(&v),
                     reinterpret_cast<const char*>(&v) + 2);
    } else {
      buffer_.insert(buffer_.end(), reinterpret_cast<const char*>(&t),
                     reinterpret_cast<const char*>(&t) + 4);
    }
    if (buffer_.size() >= kWriteBuffer) flush();
  }
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  tokens_ += static_cast<int64_t>(tokens.size());
}

void IndexedDatasetWriter::flush() {
  write_all(bin_, buffer_.data(), buffer_.size(), bin_tmp_);
  buffer_.clear();
}

void IndexedDatasetWriter::finish() {
  MYRIAD_CHECK(!finished_, "finish called twice");
  flush();
  std::FILE* closing = bin_;
  bin_ = nullptr;
  if (std::fclose(closing) != 0)
    throw_runtime(bin_tmp_, ": close failed: ", std::strerror(errno));

  const auto n = static_cast<uint64_t>(lengths_.size());
  std::string idx;
  idx.reserve(kHeaderBytes + n * 20 + 8);
  idx.append(kMagic, sizeof kMagic);
  put<uint64_t>(idx, kVersion);
  put<uint8_t>(idx, static_cast<uint8_t>(dtype_));
  put<uint64_t>(idx, n);
  put<uint64_t>(idx, n + 1);
  for (const int32_t len : lengths_) put<int32_t>(idx, len);
  int64_t pointer = 0;
  for (const int32_t len : lengths_) {
    put<int64_t>(idx, pointer);
    pointer += len * dtype_size(dtype_);
  }
  for (uint64_t d = 0; d <= n; ++d) put<int64_t>(idx, static_cast<int64_t>(d));

  const auto write_file = [](const std::string& final_path, std::string& path, const std::string& data) {
    std::FILE* f = create_temporary(final_path, path);
    const bool ok = data.empty() || std::fwrite(data.data(), 1, data.size(), f) == data.size();
    const int err = errno;
    if (std::fclose(f) != 0 || !ok) throw_runtime(path, ": write failed: ", std::strerror(err));
  };
  write_file(prefix_ + ".idx", idx_tmp_, idx);
  if (!tokenizer_.empty()) {
    nlohmann::ordered_json j;
    j["format"] = "MMIDIDX";
    j["version"] = kVersion;
    j["tokenizer"] = tokenizer_;
    j["vocab_size"] = vocab_size_;
    j["eot"] = eot_;
    j["documents"] = lengths_.size();
    j["tokens"] = tokens_;
    write_file(prefix_ + ".json", json_tmp_, j.dump() + "\n");
  }
  // An old sidecar goes first and the new one last, so that a sidecar under the final name
  // always describes the .bin and .idx beside it.
  std::remove((prefix_ + ".json").c_str());
  std::vector<std::pair<const char*, std::string*>> files = {{".bin", &bin_tmp_}, {".idx", &idx_tmp_}};
  if (!tokenizer_.empty()) files.push_back({".json", &json_tmp_});
  for (const auto& [ext, from] : files) {
    const std::string to = prefix_ + ext;
    if (std::rename(from->c_str(), to.c_str()) != 0)
      throw_runtime(*from, ": cannot rename to ", to, ": ", std::strerror(errno));
    from->clear();  // under its final name now: not a temporary to remove
  }
  finished_ = true;
}

// ---- Reader ----------------------------------------------------------------------------------

IndexedDataset::IndexedDataset(const std::string& path_or_prefix, int64_t vocab_size)
    : prefix_(dataset_prefix(path_or_prefix)) {
  const std::string idx_path = prefix_ + ".idx", bin_path = prefix_ + ".bin";
  try {
    idx_ = map_file(idx_path, idx_bytes_);
    const unsigned char* p = idx_;
    const size_t n = idx_bytes_;
    if (n > 0 && std::memcmp(p, kMagic, std::min(n, sizeof kMagic)) != 0)
      throw_input(idx_path, ": bad magic: not an MMIDIDX index (Megatron-LM indexed dataset)");
    if (n < kHeaderBytes)
      throw_input(idx_path, ": truncated index: ", n, " bytes, shorter than the ", kHeaderBytes,
                  "-byte header");
    const auto version = get<uint64_t>(p + 9);
    if (version != kVersion)
      throw_input(idx_path, ": unsupported MMIDIDX version ", version, " (supported: 1)");
    const uint8_t code = p[17];
    if (!known_dtype(code)) throw_input(idx_path, ": unknown dtype code ", int(code));
    dtype_ = static_cast<DType>(code);
    if (dtype_ == DType::kFloat32 || dtype_ == DType::kFloat64)
      throw_input(idx_path, ": unsupported dtype ", dtype_name(dtype_),
                  ": token files hold integer ids");
    const auto seqs = get<uint64_t>(p + 18), docs = get<uint64_t>(p + 26);
    // Counts bounded first so that the size arithmetic cannot overflow.
    const uint64_t limit = uint64_t{1} << 56;
    const uint64_t need =
        kHeaderBytes + (seqs < limit ? seqs : limit) * 12 + (docs < limit ? docs : limit) * 8;
    // Megatron's builder with multimodal=True appends one mode byte per sequence; Megatron
    // reads such files as text when the modes are ignored, and so do we.
    const bool multimodal = seqs < limit && docs < limit && need + seqs == n && seqs > 0;
    if (multimodal)
      log::info(idx_path, ": a multimodal index (one mode byte per sequence): the modes are ignored");
    if (seqs >= limit || docs >= limit || (need != n && !multimodal))
      throw_input(idx_path, ": ", need > n ? "truncated index" : "inconsistent index",
                  ": header says ", seqs, " sequences and ", docs, " document-index entries (",
                  need, " bytes) but the file has ", n, " bytes");
    num_sequences_ = static_cast<int64_t>(seqs);
    num_doc_entries_ = static_cast<int64_t>(docs);

    const int64_t item = dtype_size(dtype_);
    int64_t tokens = 0;
    for (int64_t i = 0; i < num_sequences_; ++i) {
      const int64_t len = sequence_length(i);
      const auto ptr = get<int64_t>(idx_ + kHeaderBytes + 4 * seqs + 8 * i);
      if (len < 0) throw_input(idx_path, ": sequence ", i, " has negative length ", len);
      if (ptr != tokens * item)
        throw_input(idx_path, ": sequence ", i, " starts at byte ", ptr, " of the .bin, expected ",
                    tokens * item, ": only back-to-back sequences are supported");
      tokens += len;
    }
    num_tokens_ = tokens;
    if (num_doc_entries_ < 1 || document_index(0) != 0 ||
        document_index(num_doc_entries_ - 1) != num_sequences_)
      throw_input(idx_path, ": bad document index: it must run from 0 to the ", num_sequences_,
                  " sequences");
    for (int64_t d = 1; d < num_doc_entries_; ++d)
      if (document_index(d) < document_index(d - 1))
        throw_input(idx_path, ": bad document index: entry ", d, " (", document_index(d),
                    ") is below entry ", d - 1, " (", document_index(d - 1), ")");

    bin_ = map_file(bin_path, bin_bytes_);
    if (static_cast<uint64_t>(bin_bytes_) != static_cast<uint64_t>(num_tokens_ * item))
      throw_input(bin_path, ": ", bin_bytes_, " bytes, but ", idx_path, " describes ", num_tokens_,
                  " ", dtype_name(dtype_), " tokens (", num_tokens_ * item,
                  " bytes): truncated or mismatched files");

    const std::string json_path = prefix_ + ".json";
    if (std::filesystem::exists(json_path)) {
      std::ifstream in(json_path);
      std::stringstream text;
      text << in.rdbuf();
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(text.str());
        if (!j.is_object()) throw_input(json_path, ": not a JSON object");
        if (j.contains("format") && j["format"] != "MMIDIDX")
          throw_input(json_path, ": format ", j["format"].dump(), " is not \"MMIDIDX\"");
        info_.tokenizer = j.value("tokenizer", std::string());
        info_.vocab_size = j.value("vocab_size", int64_t{-1});
        info_.eot = j.value("eot", int32_t{-1});
        if (j.contains("tokens") && j["tokens"].get<int64_t>() != num_tokens_)
          throw_input(json_path, ": says ", j["tokens"].get<int64_t>(), " tokens but ", bin_path,
                      " holds ", num_tokens_, ": the files come from different runs");
        if (j.contains("documents") && j["documents"].get<int64_t>() != num_documents())
          throw_input(json_path, ": says ", j["documents"].get<int64_t>(), " documents but ",
                      idx_path, " holds ", num_documents(), ": the files come from different runs");
      } catch (const nlohmann::json::exception& e) {
        throw_input(json_path, ": malformed sidecar: ", e.what());
      }
    }
    if (vocab_size > 0) check_tokens(vocab_size);
  } catch (...) {
    unmap(idx_, idx_bytes_);
    unmap(bin_, bin_bytes_);
    throw;
  }
}

IndexedDataset::~IndexedDataset() {
  unmap(idx_, idx_bytes_);
  unmap(bin_, bin_bytes_);
}

int64_t IndexedDataset::sequence_length(int64_t i) const {
  MYRIAD_CHECK(i >= 0 && i < num_sequences_, "sequence ", i);
  return get<int32_t>(idx_ + kHeaderBytes + 4 * i);
}

int64_t IndexedDataset::sequence_start(int64_t i) const {
  MYRIAD_CHECK(i >= 0 && i < num_sequences_, "sequence ", i);
  return get<int64_t>(idx_ + kHeaderBytes + 4 * num_sequences_ + 8 * i) / dtype_size(dtype_);
}

int64_t IndexedDataset::document_index(int64_t i) const {
  MYRIAD_CHECK(i >= 0 && i < num_doc_entries_, "document-index entry ", i);
  return get<int64_t>(idx_ + kHeaderBytes + 12 * num_sequences_ + 8 * i);
}

int64_t IndexedDataset::document_begin(int64_t d) const {
  const int64_t first = document_index(d);
  return first < num_sequences_ ? sequence_start(first) : num_tokens_;
}

int64_t IndexedDataset::document_of(int64_t pos) const {
  MYRIAD_CHECK(pos >= 0 && pos < num_tokens_, "token ", pos, " of ", num_tokens_);
  int64_t lo = 0, hi = num_documents();  // document_begin(lo) <= pos < document_begin(hi)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (document_begin(mid) <= pos ? lo : hi) = mid;
  }
  return lo;
}

void IndexedDataset::check_tokens(int64_t vocab) const {
  int64_t bad = 0, at = -1;
  const unsigned char* p = bin_;
  const int64_t n = num_tokens_;
  switch (dtype_) {
    case DType::kUInt8:
      at = vocab >= 256 ? -1 : first_bad<uint8_t>(p, n, vocab, bad);
      break;
    case DType::kInt8:
      at = first_bad<int8_t>(p, n, vocab, bad);
      break;
    case DType::kInt16:
      at = first_bad<int16_t>(p, n, vocab, bad);
      break;
    case DType::kUInt16:
      at = vocab >= 65536 ? -1 : first_bad<uint16_t>(p, n, vocab, bad);
      break;
    case DType::kInt32:
      at = first_bad<int32_t>(p, n, vocab, bad);
      break;
    case DType::kInt64:
      at = first_bad<int64_t>(p, n, vocab, bad);
      break;
    default:
      MYRIAD_CHECK(false, "dtype ", dtype_name(dtype_));
  }
  if (at < 0) return;
  if (bad < 0)
    throw_input(bin_path(), ": token id ", bad, " at position ", at,
                " is negative: the file is corrupt or holds no token ids");
  throw_input(bin_path(), ": token id ", bad, " at position ", at, " >= model.vocab_size ", vocab,
              ": prepare the data with the tokenizer the model uses");
}

void IndexedDataset::read(int64_t begin, int64_t count, int32_t* out) const {
  MYRIAD_CHECK(begin >= 0 && count >= 0 && begin + count <= num_tokens_, "read [", begin, ", ",
               begin + count, ") of ", num_tokens_, " tokens");
  const unsigned char* p = bin_ + begin * dtype_size(dtype_);
  switch (dtype_) {
    case DType::kUInt8:
      widen<uint8_t>(p, count, out);
      break;
    case DType::kInt8:
      widen<int8_t>(p, count, out);
      break;
    case DType::kInt16:
      widen<int16_t>(p, count, out);
      break;
    case DType::kUInt16:
      widen<uint16_t>(p, count, out);
      break;
    case DType::kInt32:
      widen<int32_t>(p, count, out);
      break;
    case DType::kInt64:
      widen<int64_t>(p, count, out);
      break;
    default:
      MYRIAD_CHECK(false, "dtype ", dtype_name(dtype_));
  }
}

std::vector<int32_t> IndexedDataset::read(int64_t begin, int64_t count) const {
  std::vector<int32_t> out(static_cast<size_t>(count));
  read(begin, count, out.data());
  return out;
}

}  // namespace myriad::data
