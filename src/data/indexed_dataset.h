// Token files in Megatron-LM's indexed-dataset format (MMIDIDX, version 1), so that data
// prepared by either system loads in the other.
//
// PREFIX.idx, little-endian, packed (no padding):
//   char[9]  magic "MMIDIDX\0\0"
//   u64      version = 1
//   u8       dtype code of the .bin (see DType)
//   u64      S, the number of sequences
//   u64      D, the number of document-index entries
//   i32[S]   sequence lengths, in tokens
//   i64[S]   sequence pointers, byte offsets into the .bin
//   i64[D]   document index: 0, then the number of sequences at the end of each document
//            (0, 1, ..., S when every document is one sequence, as our writer makes it)
// PREFIX.bin: the tokens of all sequences back to back.
// PREFIX.json (ours, optional): {"format":"MMIDIDX","version":1,"tokenizer":"gpt2",
//   "vocab_size":50257,"eot":50256,"documents":N,"tokens":M}.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace myriad::data {

// Megatron's dtype codes.
enum class DType : uint8_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUInt16 = 8,
};
int64_t dtype_size(DType d);
const char* dtype_name(DType d);
// Megatron's rule: uint16 when the vocabulary fits (< 65500), else int32.
DType dtype_for_vocab(int64_t vocab_size);

// "data/x" from "data/x", "data/x.bin" or "data/x.idx".
std::string dataset_prefix(const std::string& path_or_prefix);

// Writes PREFIX.bin, PREFIX.idx and (when `tokenizer` is not empty) PREFIX.json, one sequence
// per document. Everything goes to temporary names of this process's own (PREFIX.bin.tmp-PID,
// ...; a file already under such a name is left alone) that finish() renames into place, so an
// interrupted writer never leaves a partial file under a final name; destroying an unfinished
// writer removes its temporary files. Not thread-safe.
class IndexedDatasetWriter {
 public:
  // The parent directory is created. `eot` goes to the sidecar only.
  IndexedDatasetWriter(std::string prefix, int64_t vocab_size, std::string tokenizer = "",
                       int32_t eot = -1);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // Appends one document; its ids must lie in [0, vocab_size). An empty document is skipped.
  void add_document(std::span<const int32_t> tokens);
  // Writes the index and sidecar and renames the three files into place.
  void finish();

  int64_t documents() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t tokens() const { return tokens_; }

 private:
  void flush();
  void remove_temporaries();

  std::string prefix_;
  int64_t vocab_size_;
  std::string tokenizer_;
  int32_t eot_;
  DType dtype_;
  std::FILE* bin_ = nullptr;
  std::string bin_tmp_, idx_tmp_, json_tmp_;  // the temporary files this writer made
  std::vector<char> buffer_;      // encoded tokens not yet written to the .bin
  std::vector<int32_t> lengths_;  // [documents]
  int64_t tokens_ = 0;
  bool finished_ = false;
};

// Facts from PREFIX.json; empty/-1 where there is no sidecar (e.g. Megatron-prepared data).
struct DatasetInfo {
  std::string tokenizer;
  int64_t vocab_size = -1;
  int32_t eot = -1;
};

// A read-only, memory-mapped MMIDIDX dataset, seen as one stream of tokens (the sequences in
// order). The constructor validates everything up front and throws one-line input errors that
// name the file: bad magic, unsupported version or dtype, a truncated or inconsistent index, a
// .bin whose size does not match the index, and, when vocab_size > 0, any token id outside
// [0, vocab_size). The sequences must be stored back to back (Megatron and our writer do).
// Thread safety: const methods may be called from any number of threads at once.
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& path_or_prefix, int64_t vocab_size = 0);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  std::string bin_path() const { return prefix_ + ".bin"; }
  DType dtype() const { return dtype_; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_sequences() const { return num_sequences_; }
  // Documents as the document index counts them (its entries less one).
  int64_t num_documents() const { return num_doc_entries_ - 1; }
  int64_t sequence_length(int64_t i) const;  // tokens of sequence i
  int64_t sequence_start(int64_t i) const;   // stream position of sequence i's first token
  int64_t document_index(int64_t i) const;   // entry i of the document index
  // Stream position of document d's first token (num_tokens() for d = num_documents(); an
  // empty document begins where the next does).
  int64_t document_begin(int64_t d) const;
  // The document holding stream token pos (0 <= pos < num_tokens()): the last one to begin at
  // or before it, found by bisection of the document index.
  int64_t document_of(int64_t pos) const;
  const DatasetInfo& info() const { return info_; }
  // The tokenizer named by the sidecar, "" without one.
  const std::string& tokenizer() const { return info_.tokenizer; }

  // Tokens [begin, begin + count) of the stream, widened to int32, into out[count].
  void read(int64_t begin, int64_t count, int32_t* out) const;
  std::vector<int32_t> read(int64_t begin, int64_t count) const;
  // Every token id in [0, vocab_size), else an input error naming the file and the first bad
  // id (what the constructor checks when given vocab_size > 0).
  void check_tokens(int64_t vocab_size) const;

 private:

  std::string prefix_;
  DType dtype_ = DType::kUInt16;
  int64_t num_tokens_ = 0;
  int64_t num_sequences_ = 0;
  int64_t num_doc_entries_ = 0;
  DatasetInfo info_;
  // Both files stay mapped for the object's lifetime. The .idx arrays are unaligned (the header
  // is 34 bytes), so they are read through memcpy.
  const unsigned char* idx_ = nullptr;  // [idx_bytes_]
  size_t idx_bytes_ = 0;
  const unsigned char* bin_ = nullptr;  // [num_tokens * dtype_size]
  size_t bin_bytes_ = 0;
};

}  // namespace myriad::data
