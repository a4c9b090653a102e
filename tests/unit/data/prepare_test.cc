#include "data/prepare.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer.h"
#include "data_test_util.h"

using namespace myriad;
using namespace myriad::data;
using myriad::data::test_util::input_error;
using myriad::data::test_util::read_file;
using myriad::data::test_util::TempDir;
using myriad::data::test_util::write_file;

namespace {

// The documents of a prepared file: its token stream cut after each eot, decoded.
std::vector<std::string> documents(const IndexedDataset& d, const Tokenizer& tok) {
  const auto ids = d.read(0, d.num_tokens());
  EXPECT_TRUE(!ids.empty() && ids.back() == tok.eot()) << "the stream must end with eot";
  std::vector<std::string> docs;
  std::vector<int32_t> cur;
  for (const int32_t id : ids) {
    if (id == tok.eot()) {
      docs.push_back(tok.decode(cur));
      cur.clear();
    } else {
      cur.push_back(id);
    }
  }
  return docs;
}

// Fortune-style: entries separated by lines "%", including empty and blank entries.
std::string fortune_file(int entries, std::vector<std::string>& expected) {
  std::string text;
  for (int i = 0; i < entries; ++i) {
    std::string entry = "Fortune number " + std::to_string(i) + ".\n";
    if (i % 3 == 0) entry += "\tA second line, 100% true.\n";
    text += entry + "%\n";
    expected.push_back(entry);
    if (i % 7 == 0) text += "%\n";       // an empty entry
    if (i % 11 == 0) text += "  \n%\n";  // a blank one
  }
  return text;
}

}  // namespace

TEST(Prepare, FortunesWithValidationSplit) {
  TempDir dir;
  std::vector<std::string> expected;
  write_file(dir / "a.txt", fortune_file(30, expected));
  write_file(dir / "b.txt", "%\nlast file, first entry\n%\nno newline at the end");
  expected.push_back("last file, first entry\n");
  expected.push_back("no newline at the end");

  PrepareOptions o;
  o.inputs = {dir / "a.txt", dir / "b.txt"};
  o.tokenizer = "byte";
  o.output_prefix = dir / "out/fortunes";
  o.valid_fraction = 0.25;
  o.doc_separator = "%";
  const PrepareStats st = prepare(o);
  ASSERT_EQ(st.splits.size(), 2u);
  EXPECT_EQ(st.documents, 32);
  EXPECT_EQ(st.splits[0].prefix, dir / "out/fortunes_train");
  EXPECT_EQ(st.splits[1].prefix, dir / "out/fortunes_valid");
  EXPECT_EQ(st.splits[1].documents, 8);  // every 4th of 32
  EXPECT_EQ(st.splits[0].documents, 24);
  EXPECT_EQ(st.skipped, 3);  // the blank entries; empty ones are not even documents
  EXPECT_GE(st.seconds, 0.0);

  auto tok = make_tokenizer("byte");
  IndexedDataset train(dir / "out/fortunes_train", 256), valid(dir / "out/fortunes_valid", 256);
  EXPECT_EQ(train.tokenizer(), "byte");
  EXPECT_EQ(train.num_documents(), 24);
  EXPECT_EQ(train.num_tokens(), st.splits[0].tokens);
  const auto tdocs = documents(train, *tok), vdocs = documents(valid, *tok);
  // Every document ends with exactly one eot, at its sequence's end.
  for (int64_t s = 0; s < train.num_sequences(); ++s) {
    const auto seq = train.read(train.sequence_start(s), train.sequence_length(s));
    EXPECT_EQ(std::count(seq.begin(), seq.end(), 0), 1);
    EXPECT_EQ(seq.back(), 0);
  }
  // Disjoint and covering, in a deterministic interleaving: document j is valid iff j % 4 == 3.
  ASSERT_EQ(tdocs.size() + vdocs.size(), expected.size());
  size_t ti = 0, vi = 0;
  for (size_t j = 0; j < expected.size(); ++j)
    EXPECT_EQ(j % 4 == 3 ? vdocs[vi++] : tdocs[ti++], expected[j]) << "document " << j;
  EXPECT_FALSE(std::filesystem::exists(dir / "out/fortunes.bin"));
  for (const auto& e : std::filesystem::directory_iterator(dir / "out"))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

TEST(Prepare, WholeFilesAndJsonLines) {
  TempDir dir;
  write_file(dir / "one.txt", "Hello world\n%\nstill the same document\n");
  write_file(dir / "empty.txt", "");
  write_file(dir / "docs.jsonl",
             "{\"text\": \"first doc\", \"id\": 1}\n\n{\"text\": \"caf\\u00e9 \\n "
             "second\"}\n{\"text\": \"\"}\n");
  PrepareOptions o;
  o.inputs = {dir / "one.txt", dir / "empty.txt", dir / "docs.jsonl"};
  o.tokenizer = "gpt2";
  o.output_prefix = dir / "all";
  const auto st = prepare(o);
  ASSERT_EQ(st.splits.size(), 1u);
  EXPECT_EQ(st.splits[0].prefix, dir / "all");
  EXPECT_EQ(st.documents, 3);
  auto tok = make_tokenizer("gpt2");
  IndexedDataset d(dir / "all", tok->vocab_size());
  EXPECT_EQ(d.tokenizer(), "gpt2");
  EXPECT_EQ(d.info().eot, 50256);
  std::vector<int32_t> want;
  for (const std::string s :
       {"Hello world\n%\nstill the same document\n", "first doc", "café \n second"}) {
    const auto ids = tok->encode(s);
    want.insert(want.end(), ids.begin(), ids.end());
    want.push_back(50256);
  }
  EXPECT_EQ(d.read(0, d.num_tokens()), want);
}

TEST(Prepare, InputErrors) {
  TempDir dir;
  PrepareOptions o;
  o.inputs = {dir / "missing.txt"};
  o.tokenizer = "byte";
  o.output_prefix = dir / "x";
  EXPECT_NE(input_error([&] { prepare(o); }).find(dir / "missing.txt"), std::string::npos);

  write_file(dir / "bad.jsonl", "{\"text\": \"ok\"}\n{\"txt\": \"no\"}\n");
  o.inputs = {dir / "bad.jsonl"};
  EXPECT_NE(input_error([&] { prepare(o); }).find(dir / "bad.jsonl:2"), std::string::npos);

  write_file(dir / "t.txt", "a\n%\nb\n");
  o.inputs = {dir / "t.txt"};
  o.tokenizer = "bpe";
  EXPECT_NE(input_error([&] { prepare(o); }).find("bpe"), std::string::npos);
  o.tokenizer = "byte";
  o.valid_fraction = 0.9;
  input_error([&] { prepare(o); });
  o.valid_fraction = 0.1;  // two documents: nothing would go to validation
  o.doc_separator = "%";
  std::string e = input_error([&] { prepare(o); });
  EXPECT_NE(e.find("_valid"), std::string::npos) << e;
  EXPECT_NE(e.find("valid_fraction 0.1 of 2 documents rounds to 0"), std::string::npos) << e;
  // An output that names a directory would write hidden files (dir/.bin): refused, with an example.
  o.valid_fraction = 0;
  for (const std::string& out : {dir.path().string() + "/", dir.path().string()}) {
    o.output_prefix = out;
    e = input_error([&] { prepare(o); });
    EXPECT_NE(e.find("is a directory"), std::string::npos) << e;
    EXPECT_NE(e.find(dir / "corpus"), std::string::npos) << e;
  }
  EXPECT_TRUE(std::filesystem::exists(dir / "t.txt"));
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))  // nothing half-written
    EXPECT_TRUE(e.path().extension() == ".txt" || e.path().extension() == ".jsonl") << e.path();
}

// An output that is one of the inputs would be overwritten by the result (issue 26, item 5):
// refused before anything is written, however the paths are spelled.
TEST(Prepare, AnOutputThatIsAnInputIsRefused) {
  TempDir dir;
  const std::string corpus = "{\"text\": \"one\"}\n{\"text\": \"two\"}\n";
  write_file(dir / "corpus.json", corpus);
  write_file(dir / "c2.bin", "a\n%\nb\n");
  write_file(dir / "x_valid.idx", "a\n%\nb\n%\nc\n");
  PrepareOptions o;
  o.tokenizer = "byte";
  o.doc_separator = "%";
  struct Case {
    std::string input, prefix;
    double valid;
  };
  for (const Case& c : {Case{dir / "corpus.json", dir / "corpus", 0}, Case{dir / "c2.bin", dir / "sub/../c2", 0},
                        Case{dir / "./x_valid.idx", dir / "x", 0.5}}) {
    o.inputs = {c.input};
    o.output_prefix = c.prefix;
    o.valid_fraction = c.valid;
    const std::string e = input_error([&] { prepare(o); });
    EXPECT_NE(e.find("is also an input"), std::string::npos) << e;
    EXPECT_NE(e.find(std::filesystem::path(c.input).filename().string()), std::string::npos) << e;
  }
  EXPECT_EQ(read_file(dir / "corpus.json"), corpus);
  EXPECT_EQ(read_file(dir / "c2.bin"), "a\n%\nb\n");
  EXPECT_EQ(read_file(dir / "x_valid.idx"), "a\n%\nb\n%\nc\n");
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))  // nothing written
    EXPECT_TRUE(e.path().extension() != ".tmp" && e.path().filename() != "corpus.bin") << e.path();
}

// --valid-fraction F puts the nearest whole number of documents to F of them into validation,
// spread evenly (issue 26, item 11: 0.4 gave 1/3 and 0.26 gave 1/4). A fraction 1/k keeps its
// placement: document j is valid when j % k == k - 1.
TEST(Prepare, ValidFractionSplitsOffTheNearestDocumentCount) {
  TempDir dir;
  auto docs = [&](int n) {
    std::string text;
    for (int i = 0; i < n; ++i) text += "document " + std::to_string(i) + "\n%\n";
    write_file(dir / "in.txt", text);
  };
  PrepareOptions o;
  o.inputs = {dir / "in.txt"};
  o.tokenizer = "byte";
  o.doc_separator = "%";
  o.output_prefix = dir / "out";
  struct Case {
    int documents;
    double fraction;
    int64_t valid;
  };
  for (const Case& c : {Case{10, 0.4, 4}, Case{100, 0.26, 26}, Case{1000, 0.4, 400}, Case{7, 0.3, 2},
                        Case{5, 0.3, 2}, Case{4, 0.4, 2}, Case{32, 0.25, 8}, Case{31, 0.1, 3}, Case{35, 0.1, 4},
                        Case{9, 0.5, 5}}) {
    docs(c.documents);
    o.valid_fraction = c.fraction;
    const PrepareStats st = prepare(o);
    ASSERT_EQ(st.splits.size(), 2u);
    EXPECT_EQ(st.splits[1].documents, c.valid) << c.documents << " documents, fraction " << c.fraction;
    EXPECT_EQ(st.splits[0].documents, c.documents - c.valid) << c.documents << " documents, fraction " << c.fraction;
  }
  // Spread evenly: no two valid documents next to each other below one half.
  docs(20);
  o.valid_fraction = 0.4;
  prepare(o);
  auto tok = make_tokenizer("byte");
  const auto vdocs = documents(IndexedDataset(dir / "out_valid", 256), *tok);
  std::vector<std::string> want;
  for (int j : {2, 4, 7, 9, 12, 14, 17, 19}) want.push_back("document " + std::to_string(j) + "\n");
  EXPECT_EQ(vdocs, want);
}

// A file the user already has under an output name is never replaced (issue 26's rule: a path
// that exists is replaced only when the command can prove it wrote it, or with --overwrite):
// an earlier prepare's files, which their PREFIX.json sidecar proves, are; a user's are refused,
// named; a user's PREFIX.bin.tmp is not the writer's temporary file and is left alone.
TEST(Prepare, AnExistingOutputIsReplacedOnlyWhenPrepareWroteIt) {
  TempDir dir;
  write_file(dir / "in.txt", "one\n%\ntwo\n%\nthree\n%\nfour\n");
  PrepareOptions o;
  o.inputs = {dir / "in.txt"};
  o.tokenizer = "byte";
  o.doc_separator = "%";
  struct Case {
    std::string file;  // the user's, under an output name
    double valid;
  };
  for (const Case& c : {Case{"x.bin", 0}, Case{"x.idx", 0}, Case{"x.json", 0}, Case{"x_valid.idx", 0.5},
                        Case{"x_train.json", 0.5}}) {
    write_file(dir / c.file, "mine\n");
    o.output_prefix = dir / "x";
    o.valid_fraction = c.valid;
    const std::string e = input_error([&] { prepare(o); });
    EXPECT_NE(e.find(dir / c.file), std::string::npos) << e;
    EXPECT_NE(e.find("--overwrite"), std::string::npos) << e;
    EXPECT_EQ(read_file(dir / c.file), "mine\n");
    for (const auto& f : std::filesystem::directory_iterator(dir.path()))  // nothing else written
      EXPECT_TRUE(f.path().filename() == "in.txt" || f.path().filename() == c.file) << f.path();
    // --overwrite replaces it; then the files are prepare's, and a second prepare replaces them.
    o.overwrite = true;
    EXPECT_EQ(prepare(o).documents, 4) << c.file;
    o.overwrite = false;
    EXPECT_EQ(prepare(o).documents, 4) << c.file;
    EXPECT_NE(read_file(dir / c.file), "mine\n");
    for (const auto& f : std::filesystem::directory_iterator(dir.path()))
      if (f.path().filename() != "in.txt") std::filesystem::remove(f.path());
  }
  // A sidecar of another program's (no tokenizer) proves nothing.
  write_file(dir / "m.bin", "theirs");
  write_file(dir / "m.json", "{\"format\": \"MMIDIDX\", \"version\": 1}\n");
  o.output_prefix = dir / "m";
  o.valid_fraction = 0;
  EXPECT_NE(input_error([&] { prepare(o); }).find(dir / "m.bin"), std::string::npos);
  EXPECT_EQ(read_file(dir / "m.bin"), "theirs");
  // PREFIX.bin.tmp is a name a user may have: neither truncated nor removed.
  write_file(dir / "t.bin.tmp", "mine\n");
  write_file(dir / "t.idx.tmp", "mine too\n");
  o.output_prefix = dir / "t";
  EXPECT_EQ(prepare(o).documents, 4);
  EXPECT_EQ(read_file(dir / "t.bin.tmp"), "mine\n");
  EXPECT_EQ(read_file(dir / "t.idx.tmp"), "mine too\n");
  EXPECT_EQ(IndexedDataset(dir / "t", 256).num_documents(), 4);
  for (const auto& f : std::filesystem::directory_iterator(dir.path()))  // no temporary file left behind
    EXPECT_EQ(f.path().filename().string().find(".tmp-"), std::string::npos) << f.path();
}

// Inputs tokenized at once give the files one thread writes, byte for byte, and leave nothing
// behind; --per-input writes one output per input, each split on its own.
TEST(Prepare, ParallelInputsWriteTheFilesOfOneThreadAndPerInputOutputs) {
  TempDir dir;
  std::vector<std::string> ignored;
  write_file(dir / "a.txt", fortune_file(40, ignored));
  write_file(dir / "b.jsonl", "{\"text\": \"one\"}\n{\"text\": \"  \"}\n{\"text\": \"two\\nlines\"}\n");
  write_file(dir / "c.txt", fortune_file(9, ignored));
  write_file(dir / "d.txt", fortune_file(23, ignored));
  PrepareOptions o;
  o.inputs = {dir / "a.txt", dir / "b.jsonl", dir / "c.txt", dir / "d.txt"};
  o.tokenizer = "byte";
  o.doc_separator = "%";
  o.valid_fraction = 0.1;
  o.jobs = 1;
  o.output_prefix = dir / "one/x";
  const PrepareStats serial = prepare(o);
  o.jobs = 3;
  o.output_prefix = dir / "three/x";
  const PrepareStats parallel = prepare(o);
  EXPECT_EQ(parallel.documents, serial.documents);
  EXPECT_EQ(parallel.skipped, serial.skipped);
  for (const char* f : {"x_train.bin", "x_train.idx", "x_train.json", "x_valid.bin", "x_valid.idx", "x_valid.json"})
    EXPECT_EQ(read_file(dir / (std::string("three/") + f)), read_file(dir / (std::string("one/") + f))) << f;
  size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir / "three")) {
    ++entries;
    EXPECT_NE(e.path().filename().string()[0], '.') << e.path();
  }
  EXPECT_EQ(entries, 6u) << "the parts' directory is gone";

  o.per_input = true;
  o.output_prefix = dir / "each/src";
  o.inputs = {dir / "a.txt", dir / "d.txt"};
  const PrepareStats each = prepare(o);
  ASSERT_EQ(each.splits.size(), 4u);
  EXPECT_EQ(each.splits[0].prefix, dir / "each/src_a_train");
  EXPECT_EQ(each.splits[3].prefix, dir / "each/src_d_valid");
  // Each is what a prepare of that input alone writes.
  o.per_input = false;
  o.inputs = {dir / "d.txt"};
  o.output_prefix = dir / "alone/d";
  prepare(o);
  EXPECT_EQ(read_file(dir / "each/src_d_train.bin"), read_file(dir / "alone/d_train.bin"));
  EXPECT_EQ(read_file(dir / "each/src_d_valid.idx"), read_file(dir / "alone/d_valid.idx"));
  // Two inputs of one name cannot each have theirs.
  std::filesystem::create_directories(dir / "sub");
  write_file(dir / "sub/a.txt", fortune_file(5, ignored));
  o.per_input = true;
  o.inputs = {dir / "a.txt", dir / "sub/a.txt"};
  EXPECT_NE(input_error([&] { prepare(o); }).find("are both named a"), std::string::npos);
}
