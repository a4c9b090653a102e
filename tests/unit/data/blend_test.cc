// The blend of training sources (data/blend.h): exact proportions over every prefix of the
// stream, a resume that continues the same stream, a changed blend whose sources keep their
// places without a burst, epoch caps, and the loader reading each source in its own order.
#include "data/blend.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "data/loader.h"
#include "data_test_util.h"

using namespace myriad;
using namespace myriad::data;
using myriad::data::test_util::input_error;
using myriad::data::test_util::TempDir;

namespace {

DataSources three(double a = 0.5, double b = 0.3, double c = 0.2) {
  return {{"web", "w", a, 0}, {"code", "c", b, 0}, {"books", "b", c, 0}};
}

std::vector<Blend::Pick> take(Blend& blend, int64_t n) {
  std::vector<Blend::Pick> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(blend.next());
  return out;
}

// Every prefix of `picks` holds each source within one sample of its share of the prefix.
void expect_exact(const std::vector<Blend::Pick>& picks, const std::vector<double>& share) {
  std::vector<int64_t> count(share.size(), 0);
  for (size_t i = 0; i < picks.size(); ++i) {
    ++count[picks[i].source];
    for (size_t s = 0; s < share.size(); ++s)
      ASSERT_LE(std::abs(double(count[s]) - share[s] * double(i + 1)), 1.0)
          << "source " << s << " after " << i + 1 << " samples: " << count[s];
  }
}

}  // namespace

TEST(Blend, EveryPrefixOfTheStreamIsWithinOneSampleOfItsShare) {
  Blend blend(three(), {1000, 700, 50});
  const std::vector<Blend::Pick> picks = take(blend, 10000);
  expect_exact(picks, {0.5, 0.3, 0.2});
  // Each source's samples are numbered 0, 1, 2, ... in the order it gives them.
  std::vector<int64_t> next(3, 0);
  for (const Blend::Pick& p : picks) ASSERT_EQ(p.sample, next[p.source]++);
  EXPECT_EQ(blend.position().taken, (std::vector<int64_t>{5000, 3000, 2000}));
  EXPECT_DOUBLE_EQ(blend.epochs_taken(2), 40.0);  // books, 50 samples: 40 passes
  // Weights need not sum to 1.
  Blend scaled(three(5, 3, 2), {10, 10, 10});
  const std::vector<Blend::Pick> again = take(scaled, 10000);
  for (size_t i = 0; i < again.size(); ++i) ASSERT_EQ(again[i].source, picks[i].source) << i;
}

TEST(Blend, AResumeFromASavedPositionContinuesTheSameStream) {
  Blend whole(three(), {100, 100, 100});
  const std::vector<Blend::Pick> all = take(whole, 3000);
  Blend first(three(), {100, 100, 100});
  take(first, 1234);
  const BlendPosition saved = first.position();
  Blend resumed(three(), {100, 100, 100});
  EXPECT_EQ(resumed.resume(saved), "");
  const std::vector<Blend::Pick> rest = take(resumed, 3000 - 1234);
  for (size_t i = 0; i < rest.size(); ++i) {
    ASSERT_EQ(rest[i].source, all[1234 + i].source) << i;
    ASSERT_EQ(rest[i].sample, all[1234 + i].sample) << i;
  }
  EXPECT_EQ(resumed.position(), whole.position());
}

TEST(Blend, NewWeightsKeepEachSourcesPlaceAndBalanceAfreshWithoutABurst) {
  Blend before(three(0.8, 0.1, 0.1), {100, 100, 100});
  take(before, 1000);  // web 800, code 100, books 100
  Blend after(three(0.2, 0.4, 0.4), {100, 100, 100});
  const std::string changed = after.resume(before.position());
  EXPECT_NE(changed.find("source 'web' weighs 0.2, was 0.8"), std::string::npos) << changed;
  EXPECT_EQ(after.position().since, 1000);
  EXPECT_EQ(after.position().base, (std::vector<int64_t>{800, 100, 100}));
  const std::vector<Blend::Pick> picks = take(after, 500);
  // Each source goes on from where it stood ...
  std::vector<int64_t> first(3, -1);
  for (const Blend::Pick& p : picks)
    if (first[p.source] < 0) first[p.source] = p.sample;
  EXPECT_EQ(first, (std::vector<int64_t>{800, 100, 100}));
  // ... and the new shares hold from the resume on: web is not starved to make up for 1000
  // samples of the old weights.
  expect_exact(picks, {0.2, 0.4, 0.4});
  // A source new to the blend starts at its beginning; one that left is named.
  DataSources with_papers = three(0.2, 0.4, 0.4);
  with_papers.erase(with_papers.begin() + 2);
  with_papers.push_back({"papers", "p", 0.4, 0});
  Blend other(with_papers, {100, 100, 100});
  const std::string c2 = other.resume(before.position());
  EXPECT_NE(c2.find("source 'papers' is new"), std::string::npos) << c2;
  EXPECT_NE(c2.find("source 'books' left the blend"), std::string::npos) << c2;
  EXPECT_EQ(other.position().taken, (std::vector<int64_t>{800, 100, 0}));
}

TEST(Blend, ASourceAtItsEpochCapLeavesAndTheOthersShareItsPlace) {
  DataSources s = three();
  s[2].epochs = 2;  // books: 2 passes of 50 samples, then out
  Blend blend(s, {1000, 1000, 50});
  const std::vector<Blend::Pick> picks = take(blend, 2000);
  EXPECT_EQ(blend.position().taken[2], 100);
  EXPECT_FALSE(blend.active(2));
  EXPECT_DOUBLE_EQ(blend.share(2), 0.0);
  EXPECT_DOUBLE_EQ(blend.share(0), 0.625);
  EXPECT_EQ(blend.capacity(), -1) << "web and code have no cap";
  // Up to where books left (its 100th sample, near 100 / 0.2 = 500: its count within one of
  // 0.2 x the samples) the shares hold; after it 5:3.
  const int64_t left = blend.position().since;
  EXPECT_LE(std::abs(0.2 * double(left) - 100), 1.0) << left;
  expect_exact({picks.begin(), picks.begin() + left}, {0.5, 0.3, 0.2});
  expect_exact({picks.begin() + left, picks.end()}, {0.625, 0.375, 0.0});
  // With every source capped the blend runs out with an error that says what to change.
  DataSources capped = {{"a", "a", 1, 1}, {"b", "b", 1, 1}};
  Blend small(capped, {3, 3});
  EXPECT_EQ(small.capacity(), 6);
  take(small, 6);
  const std::string msg = input_error([&] { small.next(); });
  EXPECT_NE(msg.find("every source reached its epoch cap after 6 samples"), std::string::npos) << msg;
}

TEST(Blend, TheLoaderReadsEachSourceInItsOwnOrderAndEveryRankWalksOneStream) {
  TempDir dir;
  // Two files whose samples start with a token saying which file and which sample: 1000 + s, 2000 + s.
  std::vector<std::unique_ptr<IndexedDataset>> files;
  for (int f = 1; f <= 2; ++f) {
    const std::string prefix = dir / ("src" + std::to_string(f));
    IndexedDatasetWriter w(prefix, 4000);
    std::vector<int32_t> doc;
    for (int p = 0; p < 40 * 3 + 1; ++p) doc.push_back(f * 1000 + p / 3);  // sample s starts at token 3 s
    w.add_document(doc);
    w.finish();
    files.push_back(std::make_unique<IndexedDataset>(prefix, 4000));
  }
  const DataSources sources = {{"one", "src1", 3, 0}, {"two", "src2", 1, 0}};
  Blend blend(sources, {40, 40});
  auto loader = [&](int64_t begin, int64_t len, const Blend& at) {
    std::vector<SourceFile> fs = {{files[0].get(), source_seed(7, "one", SourceOrder::kNamed)}, {files[1].get(), source_seed(7, "two", SourceOrder::kNamed)}};
    return std::make_unique<BatchLoader>(fs, at, 3, true, 8, begin, len);
  };
  auto whole = loader(0, 8, blend);
  std::vector<int32_t> seen1, seen2;
  for (int step = 0; step < 10; ++step) {  // 80 samples: 60 of one (1.5 epochs), 20 of two
    const Batch b = whole->next();
    for (int r = 0; r < 8; ++r) {
      const int32_t t = b.tokens[r * 4];
      (t < 2000 ? seen1 : seen2).push_back(t);
    }
  }
  EXPECT_EQ(seen1.size(), 60u);
  EXPECT_EQ(seen2.size(), 20u);
  std::vector<int32_t> epoch(seen1.begin(), seen1.begin() + 40);
  std::sort(epoch.begin(), epoch.end());
  for (int s = 0; s < 40; ++s) EXPECT_EQ(epoch[s], 1000 + s) << "source one's first epoch is a permutation";
  EXPECT_NE(std::vector<int32_t>(seen1.begin(), seen1.begin() + 20), std::vector<int32_t>(seen1.begin() + 40, seen1.end()))
      << "its second epoch has a new order";
  // Two ranks' slices reassemble the global batch.
  auto a = loader(0, 5, blend), c = loader(5, 3, blend), w2 = loader(0, 8, blend);
  for (int step = 0; step < 4; ++step) {
    const Batch x = a->next(), y = c->next(), z = w2->next();
    std::vector<int32_t> both = x.tokens;
    both.insert(both.end(), y.tokens.begin(), y.tokens.end());
    EXPECT_EQ(both, z.tokens) << step;
  }
  // A lone source keeps the run's seed: its order is the one-file loader's.
  EXPECT_EQ(source_seed(7, "one", SourceOrder::kRunSeed), 7u);
  EXPECT_NE(source_seed(7, "one", SourceOrder::kNamed), source_seed(7, "two", SourceOrder::kNamed));
}

// Hardening III item 2: a source's order is fixed when it enters the run and kept by every
// resume, whether it becomes part of a blend or the last one left; a position saved before the
// orders were kept reads as it was written (a lone source: the run's seed).
TEST(Blend, ASourceKeepsItsOrderWhetherOthersJoinItOrLeave) {
  const DataSource web{"web", "w", 1, 0}, code{"code", "c", 1e-9, 0};
  Blend lone({web}, {100});
  EXPECT_EQ(lone.order(0), SourceOrder::kRunSeed) << "a run of one file reads the run's seed's order";
  take(lone, 10);
  Blend joined({web, code}, {100, 100});
  joined.resume(lone.position());
  EXPECT_EQ(joined.order(0), SourceOrder::kRunSeed) << "web keeps its order in the blend";
  EXPECT_EQ(joined.order(1), SourceOrder::kNamed) << "a new source draws its own";
  EXPECT_EQ(source_seed(7, "web", joined.order(0)), source_seed(7, "web", lone.order(0)));
  Blend fresh({web, code}, {100, 100});
  EXPECT_EQ(fresh.order(0), SourceOrder::kNamed) << "a blend's sources, from the start, mix their names";
  take(fresh, 10);
  Blend left({web}, {100});
  left.resume(fresh.position());
  EXPECT_EQ(left.order(0), SourceOrder::kNamed) << "the last source left keeps the blend's order";
  // Kept by a resume of the same blend, and by a position saved without orders.
  Blend again({web}, {100});
  EXPECT_EQ(again.resume(left.position()), "");
  EXPECT_EQ(again.order(0), SourceOrder::kNamed);
  BlendPosition old = lone.position();
  old.orders.clear();
  Blend from_old({web, code}, {100, 100});
  from_old.resume(old);
  EXPECT_EQ(from_old.order(0), SourceOrder::kRunSeed);
  BlendPosition old_blend = fresh.position();
  old_blend.orders.clear();
  Blend from_old_blend({web}, {100});
  from_old_blend.resume(old_blend);
  EXPECT_EQ(from_old_blend.order(0), SourceOrder::kNamed);
}
