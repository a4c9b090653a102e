#include "data/indexed_dataset.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data_test_util.h"

using namespace myriad;
using namespace myriad::data;
using myriad::data::test_util::input_error;
using myriad::data::test_util::read_file;
using myriad::data::test_util::TempDir;
using myriad::data::test_util::write_file;

namespace {

void write_docs(const std::string& prefix, int64_t vocab,
                const std::vector<std::vector<int32_t>>& docs, const std::string& tokenizer = "") {
  IndexedDatasetWriter w(prefix, vocab, tokenizer, tokenizer.empty() ? -1 : 0);
  for (const auto& d : docs) w.add_document(d);
  w.finish();
}

template <class T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

template <class T>
T at(const std::string& s, size_t offset) {
  T v;
  std::memcpy(&v, s.data() + offset, sizeof v);
  return v;
}

// An index written field by field, as Megatron-LM writes one.
std::string make_index(uint8_t dtype, const std::vector<int32_t>& lengths,
                       const std::vector<int64_t>& pointers, const std::vector<int64_t>& docs) {
  std::string s("MMIDIDX\0\0", 9);
  put<uint64_t>(s, 1);
  put<uint8_t>(s, dtype);
  put<uint64_t>(s, lengths.size());
  put<uint64_t>(s, docs.size());
  for (auto v : lengths) put(s, v);
  for (auto v : pointers) put(s, v);
  for (auto v : docs) put(s, v);
  return s;
}

}  // namespace

TEST(IndexedDataset, ExactIndexLayout) {
  TempDir dir;
  const std::string prefix = dir / "tiny";
  write_docs(prefix, 256, {{1, 2, 3}, {4}, {5, 6}});
  const std::string idx = read_file(prefix + ".idx");
  ASSERT_EQ(idx.size(), 34u + 3 * 4 + 3 * 8 + 4 * 8);
  EXPECT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
  EXPECT_EQ(at<uint64_t>(idx, 9), 1u);   // version
  EXPECT_EQ(at<uint8_t>(idx, 17), 8u);   // dtype: uint16
  EXPECT_EQ(at<uint64_t>(idx, 18), 3u);  // sequences
  EXPECT_EQ(at<uint64_t>(idx, 26), 4u);  // document-index entries
  const int32_t lengths[] = {3, 1, 2};
  const int64_t pointers[] = {0, 6, 8}, doc_index[] = {0, 1, 2, 3};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(at<int32_t>(idx, 34 + 4 * i), lengths[i]);
    EXPECT_EQ(at<int64_t>(idx, 46 + 8 * i), pointers[i]);
  }
  for (int i = 0; i < 4; ++i) EXPECT_EQ(at<int64_t>(idx, 70 + 8 * i), doc_index[i]);
  // Byte-for-byte what a field-by-field writer makes.
  EXPECT_EQ(idx, make_index(8, {3, 1, 2}, {0, 6, 8}, {0, 1, 2, 3}));
  const std::string bin = read_file(prefix + ".bin");
  ASSERT_EQ(bin.size(), 12u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(at<uint16_t>(bin, 2 * i), i + 1);
  EXPECT_FALSE(std::filesystem::exists(prefix + ".json"));  // no tokenizer, no sidecar
}

TEST(IndexedDataset, WriteReadBack) {
  TempDir dir;
  const std::string prefix = dir / "sub/dir/data";  // directories are created
  std::vector<std::vector<int32_t>> docs = {{50256, 0, 7}, {}, {123, 50000}, {9}};
  write_docs(prefix, 50257, docs, "gpt2");
  IndexedDataset d(prefix, 50257);
  EXPECT_EQ(d.dtype(), DType::kUInt16);
  EXPECT_EQ(d.num_tokens(), 6);
  EXPECT_EQ(d.num_sequences(), 3);  // the empty document is skipped
  EXPECT_EQ(d.num_documents(), 3);
  EXPECT_EQ(d.sequence_length(1), 2);
  EXPECT_EQ(d.sequence_start(2), 5);
  EXPECT_EQ(d.document_index(3), 3);
  EXPECT_EQ(d.read(0, 6), (std::vector<int32_t>{50256, 0, 7, 123, 50000, 9}));
  EXPECT_EQ(d.read(2, 3), (std::vector<int32_t>{7, 123, 50000}));
  EXPECT_EQ(d.tokenizer(), "gpt2");
  EXPECT_EQ(d.info().vocab_size, 50257);
  const auto side = nlohmann::json::parse(read_file(prefix + ".json"));
  EXPECT_EQ(side["format"], "MMIDIDX");
  EXPECT_EQ(side["version"], 1);
  EXPECT_EQ(side["tokenizer"], "gpt2");
  EXPECT_EQ(side["vocab_size"], 50257);
  EXPECT_EQ(side["documents"], 3);
  EXPECT_EQ(side["tokens"], 6);
  // The same files open from either file name.
  EXPECT_EQ(IndexedDataset(prefix + ".bin").num_tokens(), 6);
  EXPECT_EQ(IndexedDataset(prefix + ".idx").num_tokens(), 6);
  // Rewritten without a tokenizer, the old sidecar goes too.
  write_docs(prefix, 50257, {{1, 2}});
  EXPECT_FALSE(std::filesystem::exists(prefix + ".json"));
  EXPECT_EQ(IndexedDataset(prefix).num_tokens(), 2);
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path()))
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
}

TEST(IndexedDataset, LargeVocabUsesInt32) {
  TempDir dir;
  write_docs(dir / "big", 100000, {{99999, 65535, 65536}});
  EXPECT_EQ(read_file(dir / "big.idx")[17], 4);  // int32
  EXPECT_EQ(read_file(dir / "big.bin").size(), 12u);
  IndexedDataset d(dir / "big", 100000);
  EXPECT_EQ(d.read(0, 3), (std::vector<int32_t>{99999, 65535, 65536}));
}

TEST(IndexedDataset, ReadsMegatronVariants) {
  TempDir dir;
  // uint8 tokens, two documents of which the first has two sequences, no sidecar.
  write_file(dir / "m.idx", make_index(1, {2, 1, 3}, {0, 2, 3}, {0, 2, 3}));
  write_file(dir / "m.bin", std::string("\x01\x02\x03\x04\x05\xff", 6));
  IndexedDataset d(dir / "m", 256);
  EXPECT_EQ(d.num_documents(), 2);
  EXPECT_EQ(d.tokenizer(), "");
  EXPECT_EQ(d.read(0, 6), (std::vector<int32_t>{1, 2, 3, 4, 5, 255}));
  // int64 tokens.
  std::string bin;
  for (int64_t v : {5, 6, 7}) put(bin, v);
  write_file(dir / "w.idx", make_index(5, {3}, {0}, {0, 1}));
  write_file(dir / "w.bin", bin);
  EXPECT_EQ(IndexedDataset(dir / "w", 8).read(0, 3), (std::vector<int32_t>{5, 6, 7}));
}

TEST(IndexedDataset, BadInputsNameTheFile) {
  TempDir dir;
  const std::string p = dir / "d";
  write_docs(p, 256, {{1, 2, 3}, {4, 5}});
  const std::string good_idx = read_file(p + ".idx"), good_bin = read_file(p + ".bin");
  const auto expect_error = [&](const std::string& file, const std::string& words,
                                int64_t vocab = 0) {
    const std::string msg = input_error([&] { IndexedDataset d(p, vocab); });
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_NE(msg.find(words), std::string::npos) << msg;
    write_file(p + ".idx", good_idx);
    write_file(p + ".bin", good_bin);
  };

  std::string idx = good_idx;
  idx[0] = 'X';
  write_file(p + ".idx", idx);
  expect_error(p + ".idx", "bad magic");

  idx = good_idx;
  idx[9] = 2;
  write_file(p + ".idx", idx);
  expect_error(p + ".idx", "version 2");

  idx = good_idx;
  idx[17] = 7;
  write_file(p + ".idx", idx);
  expect_error(p + ".idx", "float32");

  write_file(p + ".idx", good_idx.substr(0, good_idx.size() - 8));
  expect_error(p + ".idx", "truncated");
  write_file(p + ".idx", good_idx.substr(0, 20));
  expect_error(p + ".idx", "truncated");
  write_file(p + ".idx", "");
  expect_error(p + ".idx", "truncated");

  write_file(p + ".bin", good_bin.substr(0, good_bin.size() - 2));
  expect_error(p + ".bin", "bytes");
  write_file(p + ".bin", good_bin + "xx");
  expect_error(p + ".bin", "bytes");

  std::filesystem::remove(p + ".bin");
  expect_error(p + ".bin", "cannot open");
  std::filesystem::remove(p + ".idx");
  expect_error(p + ".idx", "cannot open");

  // A document index that does not end at the sequence count.
  write_file(p + ".idx", make_index(8, {3, 2}, {0, 6}, {0, 1}));
  expect_error(p + ".idx", "document index");
  // Sequences not back to back.
  write_file(p + ".idx", make_index(8, {3, 2}, {0, 8}, {0, 1, 2}));
  expect_error(p + ".idx", "sequence 1");

  write_file(p + ".json", R"({"format":"MMIDIDX","version":1,"tokens":4})");
  expect_error(p + ".json", "different runs");
  write_file(p + ".json", "{not json");
  expect_error(p + ".json", "malformed");
}

TEST(IndexedDataset, TokenBeyondVocab) {
  TempDir dir;
  std::vector<int32_t> doc(20000, 5);
  doc[12345] = 300;
  write_docs(dir / "g", 50257, {{1, 2}, {}, doc});
  IndexedDataset ok(dir / "g", 50257);  // fine for the vocabulary it was made with
  const std::string msg = input_error([&] { IndexedDataset d(dir / "g", 256); });
  EXPECT_NE(msg.find(dir / "g.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("token id 300 at position 12347 >= model.vocab_size 256: prepare the data "
                     "with the tokenizer the model uses"),
            std::string::npos)
      << msg;
  // Negative ids in a signed file.
  std::string bin;
  for (int32_t v : {1, -4}) put(bin, v);
  write_file(dir / "n.idx", make_index(4, {2}, {0}, {0, 1}));
  write_file(dir / "n.bin", bin);
  EXPECT_NE(input_error([&] { IndexedDataset d(dir / "n", 10); }).find("token id -4 at position 1"),
            std::string::npos);
}

TEST(IndexedDataset, UnfinishedWriterLeavesNothing) {
  TempDir dir;
  {
    IndexedDatasetWriter w(dir / "x", 256, "byte", 0);
    w.add_document(std::vector<int32_t>{1, 2, 3});
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  {
    IndexedDatasetWriter w(dir / "y", 256);
    EXPECT_NE(input_error([&] {
                w.add_document(std::vector<int32_t>{1, 256});
              }).find("256"),
              std::string::npos);
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

// Megatron's builder with multimodal=True writes one mode byte per sequence after the document
// index; the tokens read as text data, the modes ignored. One byte more or less stays an error.
TEST(IndexedDataset, MultimodalIndexReadsAsText) {
  TempDir dir;
  std::string idx = make_index(1, {2, 1, 3}, {0, 2, 3}, {0, 2, 3});
  write_file(dir / "m.bin", std::string("\x01\x02\x03\x04\x05\x06", 6));
  write_file(dir / "m.idx", idx + std::string("\x00\x01\x00", 3));
  IndexedDataset d(dir / "m", 256);
  EXPECT_EQ(d.num_sequences(), 3);
  EXPECT_EQ(d.num_documents(), 2);
  EXPECT_EQ(d.read(0, 6), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  write_file(dir / "m.idx", idx + std::string("\x00\x01", 2));
  EXPECT_NE(input_error([&] { IndexedDataset e(dir / "m", 256); }).find("inconsistent index"),
            std::string::npos);
}
