// The parallel layout (core/parallel_layout.h): a table of layouts and their verdicts, each
// refusal by its words, each layout that stands by its sizes; the config check reports the same
// refusal through the --set that caused it.
#include "core/parallel_layout.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>

#include <string>
#include <vector>

#include "core/error.h"
#include "test_util.h"

using namespace myriad;

namespace {

const char* kModel = R"(
[model]
layers = 4
d_model = 32
heads = 4
seq_len = 16
[train]
global_batch = 8
micro_batch = 2
)";

struct Case {
  const char* name;
  std::vector<std::string> sets;
  int64_t world;      // 0: ParallelLayout::of(cfg), else for_world(cfg, world)
  std::string verdict;  // "" stands, else the refusal's words
  // What stands: tp, pp, dp, virtual stages, micro-batches per replica, the schedule, cp, ep.
  int64_t tp = 1, pp = 1, dp = 1, v = 1, micro_batches = 4;
  std::string schedule = "1f1b";
  int64_t cp = 1, ep = 1;
};

TEST(ParallelLayout, EveryLayoutHasItsVerdict) {
  const std::vector<Case> cases = {
      {"one process", {}, 0, ""},
      {"dp from the world", {"parallel.tp=2"}, 4, "", 2, 1, 2, 1, 2},
      {"3d", {"parallel.tp=2", "parallel.pp=2"}, 8, "", 2, 2, 2, 1, 2},
      {"chunks interleave", {"parallel.pp=2", "parallel.virtual_stages=2"}, 2, "", 1, 2, 1, 2, 4, "interleaved"},
      {"chunks on one stage", {"parallel.virtual_stages=2"}, 0, "", 1, 1, 1, 2, 4, "interleaved"},
      {"gpipe", {"parallel.pp=2", "parallel.schedule=gpipe"}, 2, "", 1, 2, 1, 1, 4, "gpipe"},
      {"fp8 in multiples of 16", {"model.d_model=64", "train.precision=fp8"}, 0, ""},
      {"the batch over dp", {"train.global_batch=6"}, 2, "train.global_batch (6) must be a multiple of "
                                                         "train.micro_batch (2) x parallel.dp (2) = 4; use train.global_batch = 4 or 8"},
      {"the batch interleaved", {"parallel.pp=2", "parallel.virtual_stages=2", "train.global_batch=6"}, 2,
       "x parallel.pp (2, for the interleaved schedule) = 4"},
      {"1f1b with chunks", {"parallel.schedule=1f1b", "parallel.virtual_stages=2"}, 0,
       "parallel.schedule = \"1f1b\" runs one chunk per rank but parallel.virtual_stages = 2"},
      {"an unknown schedule", {"parallel.schedule=zb"}, 0, "parallel.schedule = \"zb\" is not one of"},
      {"heads over tp", {"parallel.tp=8"}, 0, "model.heads (4) must be divisible by parallel.tp (8)"},
      {"kv heads over tp", {"model.kv_heads=2", "parallel.tp=4"}, 0,
       "model.kv_heads (2) must be divisible by parallel.tp (4): each tensor-parallel rank holds whole key/value heads"},
      {"the MLP over tp", {"model.mlp_hidden=66", "parallel.tp=4"}, 0,
       "the MLP's features (model.mlp_hidden, 66) must be divisible by parallel.tp (4)"},
      {"sp over tp", {"model.seq_len=18", "parallel.tp=4", "parallel.sequence_parallel=true"}, 0,
       "model.seq_len (18) must be divisible by parallel.tp (4) with parallel.sequence_parallel = true"},
      {"sp needs tp", {"model.seq_len=18", "parallel.sequence_parallel=true"}, 0, ""},
      {"too few layers", {"parallel.pp=4", "parallel.virtual_stages=2"}, 0,
       "model.layers = 4 is fewer than pp x virtual_stages = 4 x 2 = 8 pipeline stages"},
      {"stage counts", {"parallel.pp=2", "parallel.stage_layers=[1, 1, 2]"}, 0,
       "parallel.stage_layers has 3 entries; it needs one per virtual stage: pp x virtual_stages = 2 x 1 = 2"},
      {"an empty stage", {"parallel.pp=2", "parallel.stage_layers=[4, 0]"}, 0, "parallel.stage_layers[1] = 0 must be at least 1"},
      {"stage sums", {"parallel.pp=2", "parallel.stage_layers=[1, 2]"}, 0,
       "parallel.stage_layers sums to 3 layers, but model.layers = 4"},
      {"uneven stages", {"parallel.pp=2", "parallel.stage_layers=[1, 3]"}, 2, "", 1, 2, 1, 1, 4},
      {"a world of part groups", {"parallel.tp=2"}, 3, "world 3 is not divisible by tp 2 x pp 1 = 2"},
      {"dp against the world", {"parallel.dp=2"}, 4, "world 4 is not tp 1 x pp 1 x dp 2 = 2"},
      {"fp8's micro-batch", {"model.d_model=64", "train.precision=fp8", "model.seq_len=12"}, 0,
       "train.precision = \"fp8\" needs train.micro_batch x model.seq_len (24) to be a multiple of 16"},
      // Context parallelism: its ranks come out of the world before dp; 2 cp chunks a sequence.
      {"cp from the world", {"parallel.cp=2", "parallel.tp=2"}, 8, "", 2, 1, 2, 1, 2, "1f1b", 2},
      {"cp x pp x dp", {"parallel.cp=4", "parallel.pp=2"}, 16, "", 1, 2, 2, 1, 2, "1f1b", 4},
      {"cp against the world", {"parallel.cp=2", "parallel.tp=2"}, 6,
       "world 6 is not divisible by tp 2 x pp 1 x cp 2 = 4 (dp = world / (tp x pp x cp))"},
      {"cp against dp", {"parallel.cp=2", "parallel.dp=2"}, 8, "world 8 is not tp 1 x pp 1 x cp 2 x dp 2 = 4"},
      {"cp's chunks", {"parallel.cp=3"}, 0,
       "model.seq_len (16) must be divisible by 2 x parallel.cp (6): each sequence splits into 2 cp equal chunks"},
      {"cp with sp", {"model.seq_len=24", "parallel.cp=2", "parallel.tp=8", "model.heads=8", "model.d_model=64",
                      "parallel.sequence_parallel=true"}, 0,
       "model.seq_len / parallel.cp (12) must be divisible by parallel.tp (8) with parallel.sequence_parallel = true"},
      {"cp with a capacity", {"parallel.cp=2", "model.experts=4", "model.expert_hidden=32", "model.mlp=swiglu",
                              "moe.capacity_factor=1.25"}, 0,
       "moe.capacity_factor = 1.25 with parallel.cp = 2: a capacity drops rows by the weights of the whole micro-batch"},
      {"ep over cp", {"parallel.cp=2", "model.experts=4", "model.expert_hidden=32", "model.mlp=swiglu", "parallel.ep=4"},
       4, "", 1, 1, 2, 1, 2, "1f1b", 2, 4},
      {"ep against cp x dp", {"parallel.cp=2", "model.experts=8", "model.expert_hidden=32", "model.mlp=swiglu",
                              "parallel.ep=8"}, 4,
       "parallel.ep (8) must divide parallel.tp x parallel.cp x the data-parallel degree (1 x 2 x 2 = 4)"},
      {"cp's order", {"parallel.cp=2", "parallel.order=dp-cp-tp-pp"}, 4, "", 1, 1, 2, 1, 2, "1f1b", 2},
      {"an order of four", {"parallel.order=tp-cp-dp-dp"}, 0,
       "parallel.order = \"tp-cp-dp-dp\" must name tp, dp and pp once each (and cp, optionally)"},
      {"fp8's micro-batch under cp", {"model.d_model=64", "train.precision=fp8", "parallel.cp=2", "model.seq_len=16",
                                     "train.micro_batch=1", "train.global_batch=4"}, 0,
       "train.micro_batch x model.seq_len / parallel.cp (8) to be a multiple of 16"},
      {"fp8's width", {"model.d_model=40", "train.precision=fp8"}, 0, "train.precision = \"fp8\" needs model.d_model (40)"},
      {"fp8's MLP per rank", {"model.d_model=64", "train.precision=fp8", "model.mlp_hidden=264", "parallel.tp=2"}, 0,
       "the MLP's width per rank (132) to be a multiple of 16"},
  };
  for (const Case& c : cases) {
    // The config alone (the check every load makes) with the layout's rules that need no world;
    // then the layout itself.
    auto build = [&] { return parse_config(kModel, "layout test", c.sets); };
    if (!c.verdict.empty()) {
      std::string what;
      try {
        const Config cfg = build();
        if (c.world > 0) ParallelLayout::for_world(cfg, c.world); else ParallelLayout::of(cfg);
        ADD_FAILURE() << c.name << ": stands, but should be refused: " << c.verdict;
        continue;
      } catch (const Error& e) {
        EXPECT_EQ(e.cls(), ErrorClass::kInput) << c.name;
        what = e.what();
      }
      EXPECT_NE(what.find(c.verdict), std::string::npos) << c.name << ": " << what;
      continue;
    }
    const Config cfg = build();
    const ParallelLayout l = c.world > 0 ? ParallelLayout::for_world(cfg, c.world) : ParallelLayout::of(cfg);
    EXPECT_EQ(l.tp, c.tp) << c.name;
    EXPECT_EQ(l.pp, c.pp) << c.name;
    EXPECT_EQ(l.dp, c.dp) << c.name;
    EXPECT_EQ(l.virtual_stages, c.v) << c.name;
    EXPECT_EQ(l.micro_batches, c.micro_batches) << c.name;
    EXPECT_EQ(l.schedule, c.schedule) << c.name;
    EXPECT_EQ(l.ep, c.ep) << c.name;
    EXPECT_EQ(l.cp, c.cp) << c.name;
    EXPECT_EQ(l.ranks(), l.tp * l.pp * l.dp * l.cp) << c.name;
    if (c.world > 0) {
      EXPECT_EQ(l.ranks(), c.world) << c.name;
    }
  }
}

// The config check is the layout's: the same words, blamed on the --set that gave the value.
TEST(ParallelLayout, TheConfigCheckNamesTheSetThatBrokeIt) {
  const std::string e = myriad::test::input_error([] { parse_config(kModel, "x", {"model.kv_heads=2", "parallel.tp=4"}); });
  EXPECT_EQ(e.rfind("--set ", 0), 0u) << e;
  EXPECT_NE(e.find("model.kv_heads (2) must be divisible by parallel.tp (4)"), std::string::npos) << e;
}

}  // namespace

// Context parallelism's rows: every position of the sequence on exactly one rank, two chunks of
// T / 2cp each, and the causal triangle's work (a query at position i sees i + 1 keys) the same on
// every rank.
TEST(ContextRows, EveryPositionOnceAndTheWorkBalanced) {
  const myriad::ContextRows one = myriad::context_rows(12, 1, 0);
  EXPECT_EQ(one.n, 1);
  EXPECT_EQ(one.begin[0], 0);
  EXPECT_EQ(one.end[0], 12);
  for (const int64_t cp : {2, 3, 4, 8}) {
    const int64_t T = 2 * cp * 5;
    std::vector<int> owner(T, -1);
    std::vector<int64_t> work(cp, 0);
    for (int64_t r = 0; r < cp; ++r) {
      const myriad::ContextRows rows = myriad::context_rows(T, cp, r);
      ASSERT_EQ(rows.n, 2);
      EXPECT_EQ(rows.count(), T / cp);
      EXPECT_LT(rows.end[0], rows.begin[1] + 1);  // in order
      for (int k = 0; k < 2; ++k)
        for (int64_t i = rows.begin[k]; i < rows.end[k]; ++i) {
          EXPECT_EQ(owner[i], -1) << "position " << i << " on two ranks";
          owner[i] = static_cast<int>(r);
          work[r] += i + 1;
        }
    }
    for (int64_t i = 0; i < T; ++i) EXPECT_GE(owner[i], 0) << "position " << i << " on no rank";
    for (int64_t r = 1; r < cp; ++r) EXPECT_EQ(work[r], work[0]) << "cp " << cp;
    for (int64_t r = 0; r < cp; ++r)
      EXPECT_EQ(myriad::context_pairs(myriad::context_rows(T, cp, r), nullptr, 0), work[r]) << "cp " << cp;
    // Rank 0 holds the first chunk and the last.
    const myriad::ContextRows r0 = myriad::context_rows(T, cp, 0);
    EXPECT_EQ(r0.begin[0], 0);
    EXPECT_EQ(r0.end[1], T);
  }
}

// With documents the chunks' work is their documents': cp 2 over 16 tokens, chunks of 4 (rank 0
// holds [0, 4) and [12, 16), rank 1 [4, 12)).
TEST(ContextRows, DocumentsMakeEachChunksWorkItsOwn) {
  auto pairs = [](const std::vector<int32_t>& starts, int64_t window) {
    std::vector<int64_t> p;
    for (int64_t r = 0; r < 2; ++r) p.push_back(myriad::context_pairs(myriad::context_rows(16, 2, r), starts.data(), window));
    return p;
  };
  auto docs = [](std::vector<int> lengths) {
    std::vector<int32_t> s;
    for (int n : lengths)
      for (int i = 0; i < n; ++i) s.push_back(static_cast<int32_t>(s.size()) - i);
    return s;
  };
  // Documents of a chunk each: 1 + 2 + 3 + 4 = 10 a chunk, even.
  EXPECT_EQ(pairs(docs({4, 4, 4, 4}), 0), (std::vector<int64_t>{20, 20}));
  // Two of eight: a chunk of the first half of each (10) and of the second (5 + 6 + 7 + 8 = 26),
  // which the assignment pairs: even.
  EXPECT_EQ(pairs(docs({8, 8}), 0), (std::vector<int64_t>{36, 36}));
  // Twelve and four: rank 1 holds the long document's late rows (26 + 42), rank 0 its first chunk
  // and the short document (10 + 10).
  EXPECT_EQ(pairs(docs({12, 4}), 0), (std::vector<int64_t>{20, 68}));
  // A window of 2 caps every row at two keys, the documents' first rows at one.
  EXPECT_EQ(pairs(docs({12, 4}), 2), (std::vector<int64_t>{7 + 7, 8 + 8}));
}

// The chunks paired by the micro-batch's documents: without documents (window or not) exactly
// Llama 3's context_rows; with them, every position on one rank, two chunks a rank in order, and
// the busiest rank's pairs the least any pairing of the 2 cp chunks gives (checked against all
// pairings, over two rows of random documents).
TEST(ContextAssignment, PairsTheHeaviestChunkWithTheLightest) {
  for (const int64_t cp : {2, 3, 4, 8})
    for (const int64_t window : {0, 3}) {
      const int64_t T = 2 * cp * 6;
      const std::vector<myriad::ContextRows> a = myriad::context_assignment(T, cp, nullptr, 1, T + 1, window);
      ASSERT_EQ(static_cast<int64_t>(a.size()), cp);
      for (int64_t r = 0; r < cp; ++r) {
        const myriad::ContextRows want = myriad::context_rows(T, cp, r);
        EXPECT_EQ(a[r].n, 2);
        for (int k = 0; k < 2; ++k) {
          EXPECT_EQ(a[r].begin[k], want.begin[k]) << "cp " << cp << " window " << window << " rank " << r;
          EXPECT_EQ(a[r].end[k], want.end[k]) << "cp " << cp << " window " << window << " rank " << r;
        }
      }
    }
  // Documents of 12 and 4 over 16 tokens, cp 2: chunks of 10, 26, 42 and 10 pairs; Llama 3's
  // chunks give 20 and 68, the pairing {0, 2} and {1, 3} 52 and 36.
  std::vector<int32_t> starts;
  for (int n : {12, 4})
    for (int i = 0; i < n; ++i) starts.push_back(static_cast<int32_t>(starts.size()) - i);
  starts.push_back(12);  // the row's T + 1-th position (the last target's)
  const std::vector<myriad::ContextRows> two = myriad::context_assignment(16, 2, starts.data(), 1, 17, 0);
  EXPECT_EQ(two[0].begin[0], 0);
  EXPECT_EQ(two[0].begin[1], 8);
  EXPECT_EQ(two[1].begin[0], 4);
  EXPECT_EQ(two[1].begin[1], 12);
  EXPECT_EQ(myriad::context_pairs(two[0], starts.data(), 0), 52);
  EXPECT_EQ(myriad::context_pairs(two[1], starts.data(), 0), 36);

  std::mt19937 gen(7);
  for (const int64_t cp : {2, 3, 4}) {
    const int64_t T = 2 * cp * 8, stride = T + 1, rows = 2;
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<int32_t> s;
      for (int64_t b = 0; b < rows; ++b) {
        int64_t at = 0;
        while (at < stride) {
          const int64_t n = std::uniform_int_distribution<int64_t>(1, T / 2)(gen);
          for (int64_t i = 0; i < n && at < stride; ++i, ++at) s.push_back(static_cast<int32_t>(at - i));
        }
      }
      const std::vector<myriad::ContextRows> a = myriad::context_assignment(T, cp, s.data(), rows, stride, 0);
      std::vector<int> owner(T, -1);
      int64_t busiest = 0;
      for (int64_t r = 0; r < cp; ++r) {
        ASSERT_EQ(a[r].n, 2);
        EXPECT_LT(a[r].end[0], a[r].begin[1] + 1);  // in order
        EXPECT_EQ(a[r].count(), T / cp);
        for (int k = 0; k < 2; ++k)
          for (int64_t i = a[r].begin[k]; i < a[r].end[k]; ++i) {
            ASSERT_EQ(owner[i], -1) << "position " << i << " on two ranks";
            owner[i] = static_cast<int>(r);
          }
        int64_t p = 0;
        for (int64_t b = 0; b < rows; ++b) p += myriad::context_pairs(a[r], s.data() + b * stride, 0);
        busiest = std::max(busiest, p);
      }
      // The chunks' pairs, and the best of all pairings (a perfect matching of the 2 cp chunks).
      const int64_t L = T / (2 * cp);
      std::vector<int64_t> w(2 * cp, 0);
      for (int64_t c = 0; c < 2 * cp; ++c) {
        myriad::ContextRows one;
        one.begin[0] = c * L, one.end[0] = (c + 1) * L;
        for (int64_t b = 0; b < rows; ++b) w[c] += myriad::context_pairs(one, s.data() + b * stride, 0);
      }
      std::function<int64_t(std::vector<bool>&)> best = [&](std::vector<bool>& used) -> int64_t {
        int64_t first = 0;
        while (first < 2 * cp && used[first]) ++first;
        if (first == 2 * cp) return 0;
        int64_t out = INT64_MAX;
        used[first] = true;
        for (int64_t c = first + 1; c < 2 * cp; ++c) {
          if (used[c]) continue;
          used[c] = true;
          out = std::min(out, std::max(w[first] + w[c], best(used)));
          used[c] = false;
        }
        used[first] = false;
        return out;
      };
      std::vector<bool> used(2 * cp, false);
      EXPECT_EQ(busiest, best(used)) << "cp " << cp << " trial " << trial;
    }
  }
}
