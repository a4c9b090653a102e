#include "data/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>

#include "core/error.h"
#include "data_test_util.h"

using namespace myriad;
using namespace myriad::data;
using myriad::data::test_util::input_error;
using myriad::data::test_util::TempDir;

namespace {

// A dataset whose token at stream position p is p % 1000 (vocab 1000), in a few documents.
std::string make_stream(const TempDir& dir, int64_t tokens) {
  const std::string prefix = dir / "stream";
  IndexedDatasetWriter w(prefix, 1000);
  std::vector<int32_t> doc;
  for (int64_t p = 0; p < tokens; ++p) {
    doc.push_back(static_cast<int32_t>(p % 1000));
    if (doc.size() == 777 || p + 1 == tokens) {
      w.add_document(doc);
      doc.clear();
    }
  }
  w.finish();
  return prefix;
}

std::vector<std::vector<int32_t>> take(BatchLoader& l, int steps) {
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < steps; ++i) out.push_back(l.next().tokens);
  return out;
}

}  // namespace

TEST(Sampler, DeterministicPermutationPerEpoch) {
  const int64_t n = 1000;
  Sampler a(n, 17, true), b(n, 17, true), c(n, 18, true);
  std::vector<int64_t> e0, e1;
  for (int64_t k = 0; k < n; ++k) e0.push_back(a.sample(k));
  for (int64_t k = n; k < 2 * n; ++k) e1.push_back(a.sample(k));
  // Same (seed, k), same sample, whatever order the samples are asked in.
  for (int64_t k = 2 * n - 1; k >= 0; --k) ASSERT_EQ(b.sample(k), k < n ? e0[k] : e1[k - n]);
  // Each epoch is a permutation, and the epochs differ.
  for (const auto* e : {&e0, &e1}) {
    std::vector<int64_t> sorted = *e;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(sorted[i], i);
  }
  EXPECT_NE(e0, e1);
  // Another seed, another order; no shuffle, the identity.
  int same = 0;
  for (int64_t k = 0; k < n; ++k) same += c.sample(k) == e0[k];
  EXPECT_LT(same, 20);
  Sampler id(n, 17, false);
  for (int64_t k = 0; k < 3 * n; k += 7) ASSERT_EQ(id.sample(k), k % n);
  // The permutation is the function of (n, seed, epoch) that the sampler uses.
  const auto p1 = epoch_permutation(n, 17, 1);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(static_cast<int64_t>(p1[i]), e1[i]);
  // Spread: the first tenth of an epoch is not bunched at the start of the data.
  int64_t low = 0;
  for (int64_t i = 0; i < n / 10; ++i) low += e0[i] < n / 2;
  EXPECT_GT(low, 25);
  EXPECT_LT(low, 75);
}

TEST(BatchLoader, BatchesAreSamples) {
  TempDir dir;
  IndexedDataset data(make_stream(dir, 5000), 1000);
  const int64_t T = 16;
  EXPECT_EQ(num_samples(data, T), (5000 - 1) / T);
  BatchLoader l(data, T, 3, true, 4, 0, 4, 0);
  Sampler s(num_samples(data, T), 3, true);
  for (int step = 0; step < 3; ++step) {
    const Batch b = l.next();
    EXPECT_EQ(b.B, 4);
    EXPECT_EQ(b.T, T);
    EXPECT_EQ(b.first_sample, step * 4);
    ASSERT_EQ(b.tokens.size(), 4u * (T + 1));
    for (int64_t r = 0; r < 4; ++r) {
      const int64_t first = s.sample(step * 4 + r) * T;
      for (int64_t t = 0; t <= T; ++t) ASSERT_EQ(b.tokens[r * (T + 1) + t], (first + t) % 1000);
    }
  }
  EXPECT_EQ(l.consumed(), 12);
}

TEST(BatchLoader, DocumentStartsComeFromTheDocumentIndex) {
  // Documents of 5, 1, 1, 7, 3, 20, 2, 9 tokens (one of 1 at the very end too): each batch row's
  // starts are where its positions' documents began, counted from the row and at least 0.
  TempDir dir;
  const std::vector<int> lengths = {5, 1, 1, 7, 3, 20, 2, 9, 1};
  std::vector<int64_t> begins;  // stream position of each document's first token
  {
    IndexedDatasetWriter w(dir / "docs", 1000);
    int64_t at = 0;
    for (int n : lengths) {
      begins.push_back(at);
      w.add_document(std::vector<int32_t>(n, 7));
      at += n;
    }
    w.finish();
  }
  IndexedDataset data(dir / "docs", 1000);
  const int64_t total = data.num_tokens(), T = 6;
  auto expected = [&](int64_t pos) {  // the last document to begin at or before pos
    int64_t b = 0;
    for (int64_t x : begins)
      if (x <= pos) b = x;
    return b;
  };
  for (int64_t pos = 0; pos < total; ++pos) ASSERT_EQ(data.document_begin(data.document_of(pos)), expected(pos));
  for (int64_t begin = 0; begin + T <= total; ++begin) {
    std::vector<int32_t> out(T);
    document_starts(data, begin, T, out.data());
    for (int64_t i = 0; i < T; ++i)
      ASSERT_EQ(out[i], std::max<int64_t>(0, expected(begin + i) - begin)) << "row from " << begin << ", position " << i;
  }
  // The loader's rows carry them, row by row with the tokens, and only when asked.
  BatchLoader l(data, T, 3, true, 4, 1, 2, 0, /*documents=*/true);
  Sampler s(num_samples(data, T), 3, true);
  const Batch b = l.next();
  ASSERT_EQ(b.doc_starts.size(), 2u * (T + 1));
  for (int64_t r = 0; r < 2; ++r) {
    std::vector<int32_t> want(T + 1);
    document_starts(data, s.sample(1 + r) * T, T + 1, want.data());
    EXPECT_EQ(std::vector<int32_t>(b.doc_starts.begin() + r * (T + 1), b.doc_starts.begin() + (r + 1) * (T + 1)), want);
  }
  EXPECT_TRUE(BatchLoader(data, T, 3, true, 4, 0, 4, 0).next().doc_starts.empty());
}

TEST(BatchLoader, ResumeGivesTheSameBatches) {
  TempDir dir;
  IndexedDataset data(make_stream(dir, 3001), 1000);  // 187 samples of 16: steps cross epochs
  const int64_t gb = 8, T = 16;
  BatchLoader full(data, T, 42, true, gb, 0, gb, 0);
  const auto all = take(full, 60);
  EXPECT_EQ(full.consumed(), 60 * gb);  // what was taken, not what was prefetched
  for (const int64_t resume_step : {1, 23, 47}) {
    BatchLoader resumed(data, T, 42, true, gb, 0, gb, resume_step * gb);
    const auto rest = take(resumed, 60 - static_cast<int>(resume_step));
    for (size_t i = 0; i < rest.size(); ++i) ASSERT_EQ(rest[i], all[resume_step + i]) << i;
    EXPECT_EQ(resumed.consumed(), 60 * gb);
  }
  BatchLoader other(data, T, 43, true, gb, 0, gb, 0);
  EXPECT_NE(take(other, 1)[0], all[0]);
}

TEST(BatchLoader, SlicesReassembleTheGlobalBatch) {
  TempDir dir;
  IndexedDataset data(make_stream(dir, 4000), 1000);
  const int64_t gb = 8, T = 10, row = T + 1;
  BatchLoader whole(data, T, 5, true, gb, 0, gb, 16);
  BatchLoader a(data, T, 5, true, gb, 0, 3, 16), b(data, T, 5, true, gb, 3, 5, 16);
  for (int step = 0; step < 5; ++step) {
    const auto w = whole.next(), x = a.next(), y = b.next();
    EXPECT_EQ(x.B, 3);
    EXPECT_EQ(y.B, 5);
    std::vector<int32_t> joined = x.tokens;
    joined.insert(joined.end(), y.tokens.begin(), y.tokens.end());
    ASSERT_EQ(joined.size(), static_cast<size_t>(gb * row));
    EXPECT_EQ(joined, w.tokens);
  }
}

TEST(BatchLoader, ValidationOrderIsSequential) {
  TempDir dir;
  IndexedDataset data(make_stream(dir, 200), 1000);
  BatchLoader l(data, 9, 1, false, 2, 0, 2, 0);
  EXPECT_EQ(num_samples(data, 9), 22);
  for (int step = 0; step < 12; ++step) {  // wraps around after 11 steps
    const auto b = l.next();
    for (int r = 0; r < 2; ++r) EXPECT_EQ(b.tokens[r * 10], ((step * 2 + r) % 22) * 9);
  }
}

TEST(BatchLoader, BadArguments) {
  TempDir dir;
  IndexedDataset data(make_stream(dir, 100), 1000);
  const std::string msg = input_error([&] { BatchLoader l(data, 100, 0, true, 1, 0, 1, 0); });
  EXPECT_NE(msg.find(dir / "stream.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("seq_len 100"), std::string::npos) << msg;
  EXPECT_EQ(num_samples(data, 99), 1);
  input_error([&] { BatchLoader l(data, 8, 0, true, 4, 2, 3, 0); });
  input_error([&] { BatchLoader l(data, 8, 0, true, 0, 0, 1, 0); });
  input_error([&] { BatchLoader l(data, 8, 0, true, 4, 0, 4, -1); });
}

TEST(BatchLoader, RethrowsTheThreadsError) {
  TempDir dir;
  IndexedDataset data(make_stream(dir, 100), 1000);
  // A batch of 2^61 rows of 3 tokens is more than a vector can hold: building it throws
  // std::length_error in the background thread (before any allocation), and next() must
  // rethrow it, every time it is called.
  const int64_t rows = int64_t{1} << 61;
  BatchLoader l(data, 2, 0, true, rows, 0, rows, 0);
  EXPECT_THROW(l.next(), std::length_error);
  EXPECT_THROW(l.next(), std::length_error);
  EXPECT_EQ(l.consumed(), 0);
}

TEST(BatchLoader, StopsCleanly) {
  TempDir dir;
  IndexedDataset data(make_stream(dir, 3000), 1000);
  for (int i = 0; i < 20; ++i) {
    BatchLoader l(data, 16, i, true, 4, 0, 4, 0);
    if (i % 2) l.next();
  }
}
