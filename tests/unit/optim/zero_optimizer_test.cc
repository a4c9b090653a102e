// The ZeRO optimizer pieces together: optimizers over the owned ranges of plan_buckets against
// the optimizer over the whole buffer, on the demo model's layout (2 layers, vocabulary padded).
//   AdamW: bitwise the same parameters and moments, for dp 2 and 4 and buckets that cut tensors.
//   LAMB:  each dp rank a thread with a real Gloo communicator; the reducer sums the partial
//          norms exactly; parameters within 1e-6 relative per tensor, moments bitwise.
//   Memory: the sharded state is 1/dp of the whole (up to the padding), by the counters.
//   Checkpoints: sharded state saved as stored regions loads as whole tensors, and back.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "core/config.h"
#include "core/memory.h"
#include "core/rng.h"
#include "model/params.h"
#include "ops/cpu/reduce.h"
#include "optim/buckets.h"
#include "optim/optimizer.h"
#include "unit/parallel/tp_test_util.h"

namespace myriad {
namespace {

using comm::testing::TempDir;

constexpr int kSteps = 4;

Config demo(const std::string& optim) {
  return load_config(std::string(MYRIAD_SOURCE_DIR) + "/configs/demo.toml",
                     {"model.layers=2", "model.vocab_size=300", cat("optim.name=\"", optim, "\""),
                      "optim.weight_decay=0.1"});
}

std::vector<float> initial_params(const Config& cfg, const ParamLayout& l) {
  std::vector<float> w(l.total());
  init_params(w.data(), l, cfg.model.seed);
  return w;
}

// Random gradients, none on the embedding's padding rows (as in training).
std::vector<float> grads(const ParamLayout& l, int step) {
  std::vector<float> g(l.total());
  const uint64_t k = rng::key(7, step);
  for (int64_t i = 0; i < l.total(); ++i) g[i] = 0.01f * static_cast<float>(rng::normal(k, i));
  const ParamSpec& wte = l.find("wte");
  for (int64_t i = l.vocab_size() * wte.shape[1]; i < wte.numel; ++i) g[wte.offset + i] = 0;
  return g;
}

double lr_of(int step) { return 1e-3 * (step + 1); }

bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// The owned state of `opt` equals `whole` (indexed by the layout) bit for bit.
void expect_state_matches(const Optimizer& opt, const std::vector<float>& state, const float* whole) {
  for (const OwnedPiece& s : opt.pieces())
    ASSERT_TRUE(same_bits(state.data() + s.packed, whole + s.tensor->offset + s.local_begin,
                          s.local_end - s.local_begin))
        << s.tensor->name << " [" << s.local_begin << ", " << s.local_end << ")";
}

std::vector<float> copy(const OptimState& s) { return {s.begin(), s.end()}; }

// The owned elements of w, packed as the optimizer keeps its master weights (like m and v).
std::vector<float> packed(const Optimizer& opt, const std::vector<float>& w) {
  std::vector<float> out;
  for (const FlatRange& o : opt.owned()) out.insert(out.end(), w.begin() + o.begin, w.begin() + o.end);
  return out;
}

// ||a - b|| / ||b|| of each tensor, the largest.
double max_tensor_rel_err(const ParamLayout& l, const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (const ParamSpec& p : l.tensors()) {
    double d = 0, r = 0;
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i)
      d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), r += double(b[i]) * b[i];
    worst = std::max(worst, r > 0 ? std::sqrt(d / r) : std::sqrt(d));
  }
  return worst;
}

// The unsharded optimizer: parameters after each step, and the final state.
struct Reference {
  std::vector<std::vector<float>> w;  // [step]
  std::vector<float> m, v;
};
Reference reference(const Config& cfg, const ParamLayout& l) {
  Reference ref;
  std::vector<float> w = initial_params(cfg, l);
  auto opt = make_optimizer(cfg.optim, l);
  for (int t = 0; t < kSteps; ++t) {
    opt->step(w.data(), grads(l, t).data(), lr_of(t));
    ref.w.push_back(w);
  }
  ref.m = copy(opt->m()), ref.v = copy(opt->v());
  return ref;
}

// The pre-ZeRO LAMB (one pass per tensor, whole buffer): the default optimizer must stay it.
void legacy_lamb_step(const OptimConfig& c, const ParamLayout& l, int64_t t, float* params,
                      const float* grads, float* ms, float* vs, double lr) {
  const float b1 = c.beta1, b2 = c.beta2, eps = c.eps;
  const float c1 = 1.0 - std::pow(c.beta1, t), c2 = 1.0 - std::pow(c.beta2, t);
  std::vector<float> update(l.total());
  for (const ParamSpec& p : l.tensors()) {
    const float wd = p.decay ? c.weight_decay : 0.0;
    float *w = params + p.offset, *m = ms + p.offset, *v = vs + p.offset, *u = update.data() + p.offset;
    const float* g = grads + p.offset;
    for (int64_t i = 0; i < p.numel; ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      u[i] = (m[i] / c1) / (std::sqrt(v[i] / c2) + eps) + wd * w[i];
    }
    const double wn = std::sqrt(cpu::sum_squares(w, p.numel)), un = std::sqrt(cpu::sum_squares(u, p.numel));
    const float step = lr * (wn > 0 && un > 0 ? wn / un : 1.0);
    for (int64_t i = 0; i < p.numel; ++i) w[i] -= step * u[i];
  }
}

TEST(ZeroOptimizer, DefaultIsTheWholeBuffer) {
  for (const char* name : {"adamw", "lamb"}) {
    const Config cfg = demo(name);
    const ParamLayout l(cfg);
    auto whole = make_optimizer(cfg.optim, l);
    auto one_rank = make_optimizer(cfg.optim, l, plan_buckets(l.total(), 1, 5000).owned(0));
    EXPECT_EQ(whole->owned(), (std::vector<FlatRange>{{0, l.total()}}));
    EXPECT_EQ(one_rank->owned(), whole->owned());
    EXPECT_EQ(static_cast<int64_t>(whole->m().size()), l.total());
    std::vector<float> a = initial_params(cfg, l), b = a, c = a;
    std::vector<float> lm(l.total()), lv(l.total());
    for (int t = 0; t < kSteps; ++t) {
      const std::vector<float> g = grads(l, t);
      whole->step(a.data(), g.data(), lr_of(t));
      one_rank->step(b.data(), g.data(), lr_of(t));
      if (std::string(name) == "lamb") legacy_lamb_step(cfg.optim, l, t + 1, c.data(), g.data(), lm.data(), lv.data(), lr_of(t));
    }
    EXPECT_TRUE(same_bits(a.data(), b.data(), l.total())) << name;
    if (std::string(name) == "lamb") {
      EXPECT_TRUE(same_bits(a.data(), c.data(), l.total()));
      EXPECT_TRUE(same_bits(whole->m().data(), lm.data(), l.total()));
    }
  }
}

// The clipping coefficient the engine passes to the update is the scaling pass it replaced:
// stepping on grads x c equals stepping on grads with grad_scale c, bit for bit.
TEST(ZeroOptimizer, GradScaleIsTheScaledGradientsBitForBit) {
  for (const char* name : {"adamw", "lamb"}) {
    const Config cfg = demo(name);
    const ParamLayout l(cfg);
    auto scaled_first = make_optimizer(cfg.optim, l), scaled_inside = make_optimizer(cfg.optim, l);
    std::vector<float> a = initial_params(cfg, l), b = a;
    for (int t = 0; t < kSteps; ++t) {
      const float c = t % 2 ? 0.3f + 0.1f * t : 1.0f;
      const std::vector<float> g = grads(l, t);
      std::vector<float> gc = g;
      for (float& x : gc) x *= c;
      scaled_first->step(a.data(), gc.data(), lr_of(t));
      scaled_inside->step(b.data(), g.data(), lr_of(t), c);
      if (c != 1.0f) {
        ASSERT_FALSE(same_bits(g.data(), gc.data(), l.total()));  // the scale matters
      }
    }
    EXPECT_TRUE(same_bits(a.data(), b.data(), l.total())) << name;
    EXPECT_TRUE(same_bits(scaled_first->m().data(), scaled_inside->m().data(), l.total())) << name;
    EXPECT_TRUE(same_bits(scaled_first->v().data(), scaled_inside->v().data(), l.total())) << name;
  }
}

TEST(ZeroOptimizer, ShardedAdamWIsBitwiseTheSame) {
  const Config cfg = demo("adamw");
  const ParamLayout l(cfg);
  const Reference ref = reference(cfg, l);
  for (int dp : {2, 4})
    for (int64_t bucket : {1000, 4099, 0}) {
      SCOPED_TRACE(testing::Message() << "dp " << dp << " bucket " << bucket);
      const GradBuckets b = plan_buckets(l.total(), dp, bucket);
      // Each rank: its packed master weights, kept across steps, and its copy of the whole
      // buffer, into which the update writes the owned ranges.
      std::vector<float> w = initial_params(cfg, l);
      std::vector<std::vector<float>> flat(dp, w), master;
      std::vector<std::unique_ptr<Optimizer>> opts;
      for (int r = 0; r < dp; ++r) {
        opts.push_back(make_optimizer(cfg.optim, l, b.owned(r), {}, flat[r].data()));
        master.push_back(packed(*opts[r], w));
      }
      for (int t = 0; t < kSteps; ++t) {
        const std::vector<float> g = grads(l, t);
        std::vector<float> next = w;  // what the all-gather of the owned parameters gives
        for (int r = 0; r < dp; ++r) {
          std::vector<float>& mine = flat[r];
          std::copy(w.begin(), w.end(), mine.begin());
          opts[r]->step(master[r].data(), g.data(), lr_of(t));
          ASSERT_EQ(master[r], packed(*opts[r], mine)) << "the compute copy's owned ranges are the master";
          std::vector<char> own(l.total(), 0);
          for (const FlatRange& o : opts[r]->owned()) {
            std::fill(own.begin() + o.begin, own.begin() + o.end, 1);
            std::copy(mine.begin() + o.begin, mine.begin() + o.end, next.begin() + o.begin);
          }
          for (int64_t i = 0; i < l.total(); ++i) {
            ASSERT_TRUE(own[i] || same_bits(&mine[i], &w[i], 1)) << "rank " << r << " wrote element " << i;
          }
        }
        w = next;
        ASSERT_TRUE(same_bits(w.data(), ref.w[t].data(), l.total())) << "step " << t;
      }
      for (int r = 0; r < dp; ++r) {
        expect_state_matches(*opts[r], copy(opts[r]->m()), ref.m.data());
        expect_state_matches(*opts[r], copy(opts[r]->v()), ref.v.data());
      }
    }
}

// Sums each rank's doubles exactly: their bytes travel as floats through an all-gather (which
// only copies) and are added in rank order, so every rank gets the same bits.
NormReducer exact_sum(comm::Communicator& c, std::atomic<int>& calls) {
  return [&c, &calls](std::vector<double>& sums) {
    ++calls;
    const int64_t chunk = 2 * static_cast<int64_t>(sums.size());
    std::vector<float> all(chunk * c.size());
    std::memcpy(all.data() + chunk * c.rank(), sums.data(), sums.size() * sizeof(double));
    c.all_gather(all.data() + chunk * c.rank(), all.data(), chunk)->wait();
    std::fill(sums.begin(), sums.end(), 0.0);
    for (int q = 0; q < c.size(); ++q)
      for (size_t k = 0; k < sums.size(); ++k) {
        double x;
        std::memcpy(&x, all.data() + chunk * q + 2 * k, sizeof(double));
        sums[k] += x;
      }
  };
}

TEST(ZeroOptimizer, ShardedLambMatchesWithExactNormReduction) {
  const Config cfg = demo("lamb");
  const ParamLayout l(cfg);
  const Reference ref = reference(cfg, l);
  TempDir dir;
  for (int dp : {2, 4}) {
    SCOPED_TRACE(testing::Message() << "dp " << dp);
    const GradBuckets b = plan_buckets(l.total(), dp, 3001);
    std::atomic<int> calls{0};
    parallel::testing::run_group(dir, dp, [&](int r, comm::Communicator& c) {
      std::vector<float> w = initial_params(cfg, l);
      auto opt = make_optimizer(cfg.optim, l, b.owned(r), exact_sum(c, calls), w.data());
      std::vector<float> master = packed(*opt, w);
      for (int t = 0; t < kSteps; ++t) {
        opt->step(master.data(), grads(l, t).data(), lr_of(t));
        // All-gather the owned parameters: a sum in which every element has one non-zero term.
        std::vector<float> gathered(l.total(), 0.0f);
        for (const FlatRange& o : opt->owned())
          std::copy(w.begin() + o.begin, w.begin() + o.end, gathered.begin() + o.begin);
        c.all_reduce(gathered.data(), l.total())->wait();
        std::copy(gathered.begin(), gathered.end(), w.begin());
        const double err = max_tensor_rel_err(l, w, ref.w[t]);
        EXPECT_LT(err, 1e-6) << "rank " << r << " step " << t;
        if (r == 0 && t == kSteps - 1) std::printf("  dp %d: largest per-tensor relative error %.2e\n", dp, err);
      }
      expect_state_matches(*opt, copy(opt->m()), ref.m.data());
      expect_state_matches(*opt, copy(opt->v()), ref.v.data());
    });
    EXPECT_EQ(calls.load(), dp * kSteps);  // once per step per rank
  }
}

TEST(ZeroOptimizer, StateBytesShrinkWithDp) {
  const Config cfg = demo("lamb");  // m, v and the update scratch
  const ParamLayout l(cfg);
  const MemoryKind kind = MemoryKind::kOptimizerState;
  const int64_t base = memory_bytes(kind);
  int64_t whole_bytes;
  {
    auto whole = make_optimizer(cfg.optim, l);
    whole_bytes = memory_bytes(kind) - base;
    EXPECT_EQ(whole_bytes, 3 * l.total() * int64_t(sizeof(float)));
  }
  EXPECT_EQ(memory_bytes(kind), base);
  const int dp = 4;
  const GradBuckets b = plan_buckets(l.total(), dp, 2048);
  memory_reset_peak(kind);
  std::vector<std::unique_ptr<Optimizer>> ranks;
  for (int r = 0; r < dp; ++r) {
    const int64_t before = memory_bytes(kind);
    ranks.push_back(make_optimizer(cfg.optim, l, b.owned(r)));
    const int64_t bytes = memory_bytes(kind) - before;
    // A quarter of the padded buffer, less this rank's share of the (< dp elements of) padding.
    EXPECT_LE(bytes, whole_bytes / dp + 3 * dp * int64_t(sizeof(float))) << "rank " << r;
    EXPECT_GE(bytes, whole_bytes / dp - 3 * dp * int64_t(sizeof(float))) << "rank " << r;
  }
  EXPECT_EQ(memory_bytes(kind) - base, whole_bytes);  // together, exactly the whole
  EXPECT_EQ(memory_peak_bytes(kind), memory_bytes(kind));
  ranks.clear();
  EXPECT_EQ(memory_bytes(kind), base);
  EXPECT_STREQ(memory_kind_name(kind), "optimizer_state");
}

// The optimizer's state as checkpoint shards: each owned piece as its stored regions.
std::vector<checkpoint::Shard> state_shards(const ParamLayout& l, Optimizer& opt) {
  std::vector<checkpoint::Shard> out;
  for (auto [prefix, state] : {std::pair{"optim/m/", &opt.m()}, std::pair{"optim/v/", &opt.v()}})
    for (const OwnedPiece& s : opt.pieces())
      for (const auto& r : l.stored_regions(*s.tensor, s.local_begin, s.local_end))
        out.push_back({prefix + s.tensor->name, r.global_shape, r.offset, r.shape,
                       state->data() + s.packed + (r.local_begin - s.local_begin)});
  return out;
}

TEST(ZeroOptimizer, ShardedStateRoundTripsThroughCheckpoints) {
  const Config cfg = demo("adamw");
  const ParamLayout l(cfg);
  const Reference ref = reference(cfg, l);
  TempDir dir;
  auto run = [&](int dp, int rank) {
    auto opt = make_optimizer(cfg.optim, l, plan_buckets(l.total(), dp, 1000).owned(rank));
    std::vector<float> w = packed(*opt, initial_params(cfg, l));
    for (int t = 0; t < kSteps; ++t) opt->step(w.data(), grads(l, t).data(), lr_of(t));
    return opt;
  };
  // dp 2 saves (both ranks' shards in one save), a whole-buffer optimizer loads.
  std::vector<std::unique_ptr<Optimizer>> saved;
  std::vector<checkpoint::Shard> shards;
  for (int r = 0; r < 2; ++r) {
    saved.push_back(run(2, r));
    for (auto& s : state_shards(l, *saved.back())) shards.push_back(s);
  }
  const std::string ckpt = checkpoint::save(dir.path() + "/a", 1, nlohmann::json::object(), shards);
  auto whole = make_optimizer(cfg.optim, l);
  checkpoint::load(ckpt, checkpoint::read_meta(ckpt), state_shards(l, *whole));
  EXPECT_TRUE(same_bits(whole->m().data(), ref.m.data(), l.total()));
  EXPECT_TRUE(same_bits(whole->v().data(), ref.v.data(), l.total()));

  // The whole state saved, dp 4 loads.
  const std::string ckpt2 = checkpoint::save(dir.path() + "/b", 1, nlohmann::json::object(), state_shards(l, *whole));
  for (int r = 0; r < 4; ++r) {
    auto opt = make_optimizer(cfg.optim, l, plan_buckets(l.total(), 4, 1000).owned(r));
    checkpoint::load(ckpt2, checkpoint::read_meta(ckpt2), state_shards(l, *opt));
    expect_state_matches(*opt, copy(opt->m()), ref.m.data());
    expect_state_matches(*opt, copy(opt->v()), ref.v.data());
  }
}

}  // namespace
}  // namespace myriad
