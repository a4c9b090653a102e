// Tensor (and sequence) parallel training against the single-process model: ranks are threads
// with their own Gloo communicators; 20 AdamW steps on fixed random batches through the CPU
// engine; every step's loss and the gathered final weights must match the single process.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "core/config.h"
#include "model/gpt.h"
#include "model/params.h"
#include "optim/optimizer.h"
#include "parallel/mappings.h"
#include "runtime/engine.h"
#include "tp_test_util.h"

using namespace myriad;
using namespace myriad::parallel;
using namespace myriad::parallel::testing;

namespace {

constexpr int kSteps = 20;

struct Variant {
  const char* name;
  int tp;
  bool sp;
  bool parallel_block;
  int window;
  bool bias = true;
  const char* optim = "adamw";  // lamb: its trust ratios take norms over the tp shards
  std::vector<std::string> block = {};  // the block's variant keys (--set), GPT-2's when empty
};

// The Llama block: RMSNorm, RoPE, SwiGLU with its gate and up rows split together, 4 query heads
// over 2 key/value heads (each tp 2 rank holds one), an untied LM head.
const std::vector<std::string> kLlama = {"model.norm=rmsnorm", "model.position_encoding=rope", "model.mlp=swiglu",
                                         "model.mlp_hidden=176", "model.kv_heads=2", "model.tied_embeddings=false"};

std::ostream& operator<<(std::ostream& os, const Variant& v) { return os << v.name; }

Config tiny(const Variant& v) {
  std::vector<std::string> sets = {"model.layers=2", "model.d_model=64", "model.heads=4", "model.seq_len=16",
    "model.vocab_size=300", "train.micro_batch=2", "train.global_batch=4",
    "train.device=cpu", cat("train.steps=", kSteps),
    // LAMB's step is lr times a trust ratio of about ||w|| / ||update||: a larger lr.
    std::string(v.optim) == "lamb" ? "optim.lr=3e-2" : "optim.lr=3e-3", "optim.min_lr=3e-4",
    "optim.warmup_steps=3", "optim.grad_clip=1.0", cat("parallel.tp=", v.tp),
    cat("parallel.sequence_parallel=", v.sp ? "true" : "false"),
    cat("model.parallel_block=", v.parallel_block ? "true" : "false"),
    cat("model.window=", v.window), cat("model.bias=", v.bias ? "true" : "false"),
    cat("optim.name=", v.optim)};
  sets.insert(sets.end(), v.block.begin(), v.block.end());
  return parse_config("", "test", sets);
}

// Fixed random batches (global_batch, T+1), one per step, that a model can learn from: tokens
// from 64 words spread over the vocabulary (so every vocabulary shard holds targets), each
// followed by its successor in a fixed cycle 3 times in 4, by a random word otherwise.
std::vector<std::vector<int32_t>> batches(const Config& cfg) {
  std::mt19937 gen(42);
  std::vector<int32_t> words(cfg.model.vocab_size);
  for (size_t i = 0; i < words.size(); ++i) words[i] = static_cast<int32_t>(i);
  std::shuffle(words.begin(), words.end(), gen);
  words.resize(64);
  std::uniform_int_distribution<int> pick(0, 63), coin(0, 3);
  std::vector<std::vector<int32_t>> out(kSteps);
  const int64_t row = cfg.model.seq_len + 1;
  for (auto& b : out) {
    b.resize(cfg.train.global_batch * row);
    for (size_t i = 0; i < b.size(); i += row) {
      int w = pick(gen);
      for (int64_t j = 0; j < row; ++j) {
        b[i + j] = words[w];
        w = coin(gen) == 0 ? pick(gen) : (w + 1) % 64;
      }
    }
  }
  return out;
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

struct Trace {
  std::vector<float> losses;
  std::vector<double> norms;
  std::vector<float> params;  // canonical global layout
  std::vector<float> logits;  // last_logits after training, (B, Vp)
};

const std::vector<int32_t>& prompt() {
  static const std::vector<int32_t> p = [] {
    std::vector<int32_t> v(2 * 7);  // B = 2, T = 7: B*T not divisible by tp (no SP there)
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>((i * 37 + 5) % 300);
    return v;
  }();
  return p;
}

Trace single_process(const Config& cfg) {
  omp_set_num_threads(1);
  Trace run;
  auto engine = make_engine(cfg);
  for (const auto& b : batches(cfg)) {
    const int64_t s = static_cast<int64_t>(run.losses.size());
    StepResult r = engine->train_step(b.data(), s + 1, lr_at(cfg.optim, s, cfg.train.steps));
    run.losses.push_back(r.loss);
    run.norms.push_back(r.grad_norm);
  }
  run.params.assign(engine->host_state().params,
                    engine->host_state().params + engine->layout().total());
  run.logits.resize(2 * cfg.padded_vocab());
  engine->last_logits(prompt().data(), 2, 7, run.logits.data());
  return run;
}

class TensorParallel : public ::testing::TestWithParam<Variant> {
 protected:
  TempDir dir_;
};

TEST_P(TensorParallel, MatchesSingleProcessOver20Steps) {
  const Variant v = GetParam();
  const Config cfg = tiny(v);
  const Trace ref = single_process(cfg);
  const ParamLayout global(cfg);
  const auto data = batches(cfg);

  const int t = v.tp;
  std::vector<Trace> runs(t);
  std::vector<std::vector<float>> replicated(t);  // each rank's copy of the replicated tensors
  std::vector<float> gathered(global.total(), 0.0f);
  run_group(dir_, t, [&](int r, comm::Communicator& tp) {
    ParallelContext ctx{&tp};
    auto engine = make_engine(cfg, &ctx);
    const ParamLayout& local = engine->layout();
    ASSERT_EQ(local.tp_size(), t);
    ASSERT_EQ(local.tp_rank(), r);
    Trace& run = runs[r];
    for (int64_t s = 0; s < kSteps; ++s) {
      StepResult res = engine->train_step(data[s].data(), s + 1, lr_at(cfg.optim, s, kSteps));
      run.losses.push_back(res.loss);
      run.norms.push_back(res.grad_norm);
    }
    // Each shard to its place in the canonical layout (shards are disjoint; the replicated
    // tensors are written by rank 0 and compared across ranks below).
    const float* w = engine->host_state().params;
    for (const ParamSpec& p : local.tensors()) {
      const ParamSpec& g = global.find(p.name);
      EXPECT_EQ(p.global_shape, g.shape) << p.name;
      if (p.replicated()) {
        replicated[r].insert(replicated[r].end(), w + p.offset, w + p.offset + p.numel);
        if (r != 0) continue;
      }
      for (int64_t i = 0; i < p.numel; ++i) gathered[g.offset + p.global_index(i)] = w[p.offset + i];
    }
    run.logits.resize(2 * cfg.padded_vocab());
    engine->last_logits(prompt().data(), 2, 7, run.logits.data());
  });
  if (HasFailure()) return;

  double worst_loss = 0;
  for (int s = 0; s < kSteps; ++s) {
    for (int r = 0; r < t; ++r) {
      // Every rank reports the same loss and norm, bit for bit.
      ASSERT_EQ(runs[r].losses[s], runs[0].losses[s]) << "step " << s << " rank " << r;
      ASSERT_EQ(runs[r].norms[s], runs[0].norms[s]) << "step " << s << " rank " << r;
    }
    worst_loss = std::max(worst_loss, rel(runs[0].losses[s], ref.losses[s]));
    EXPECT_LT(rel(runs[0].losses[s], ref.losses[s]), 1e-4)
        << "step " << s << ": tp " << runs[0].losses[s] << " vs single " << ref.losses[s];
    EXPECT_LT(rel(runs[0].norms[s], ref.norms[s]), 1e-4) << "step " << s;
  }
  // The loss went down: the comparison is over a run that learns.
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.1);
  for (int r = 1; r < t; ++r) EXPECT_EQ(replicated[r], replicated[0]) << "rank " << r;

  double d = 0, n = 0;
  for (int64_t i = 0; i < global.total(); ++i) {
    d += (double(gathered[i]) - ref.params[i]) * (double(gathered[i]) - ref.params[i]);
    n += double(ref.params[i]) * ref.params[i];
  }
  const double wdiff = std::sqrt(d / n);
  EXPECT_LT(wdiff, 1e-4);
  for (const ParamSpec& p : global.tensors()) {  // per tensor, to name a culprit
    double dd = 0, nn = 0;
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i)
      dd += (double(gathered[i]) - ref.params[i]) * (double(gathered[i]) - ref.params[i]),
          nn += double(ref.params[i]) * ref.params[i];
    EXPECT_LT(nn > 0 ? std::sqrt(dd / nn) : std::sqrt(dd), 1e-3) << p.name;
  }
  // Generation's logits, gathered over the vocabulary shards.
  double ld = 0, ln = 0;
  for (size_t i = 0; i < ref.logits.size(); ++i) {
    EXPECT_EQ(runs[1].logits[i], runs[0].logits[i]);
    ld += (double(runs[0].logits[i]) - ref.logits[i]) * (double(runs[0].logits[i]) - ref.logits[i]);
    ln += double(ref.logits[i]) * ref.logits[i];
  }
  EXPECT_LT(std::sqrt(ld / ln), 1e-4);
  std::printf("[ %s ] worst loss rel. error %.2e, final weights ||diff||/||w|| %.2e, final loss %.4f\n",
              v.name, worst_loss, wdiff, ref.losses.back());
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, TensorParallel,
    ::testing::Values(Variant{"tp2", 2, false, false, 0}, Variant{"tp2_sp", 2, true, false, 0},
                      Variant{"tp4", 4, false, false, 0}, Variant{"tp4_sp", 4, true, false, 0},
                      Variant{"tp2_parallel_block_window", 2, false, true, 5},
                      Variant{"tp2_sp_parallel_block_window", 2, true, true, 5},
                      Variant{"tp4_sp_parallel_block_window", 4, true, true, 5},
                      Variant{"tp4_window_nobias", 4, false, false, 6, false},
                      Variant{"tp4_sp_nobias", 4, true, false, 0, false},
                      Variant{"tp2_sp_lamb", 2, true, false, 0, true, "lamb"},
                      Variant{"tp4_lamb", 4, false, false, 0, true, "lamb"},
                      Variant{"tp2_sp_llama", 2, true, false, 0, false, "adamw", kLlama},
                      Variant{"tp2_llama_parallel_block_window_bias", 2, false, true, 5, true, "adamw", kLlama},
                      Variant{"tp2_sp_llama_lamb", 2, true, false, 0, false, "lamb", kLlama},
                      // 4 key/value heads: tp 4 gives each rank one with its query head.
                      Variant{"tp4_sp_llama_kv4", 4, true, false, 0, false, "adamw",
                              {"model.norm=rmsnorm", "model.position_encoding=rope", "model.mlp=swiglu",
                               "model.mlp_hidden=176", "model.kv_heads=4"}}),
    [](const auto& info) { return std::string(info.param.name); });

// Two runs of the same layout give the same bits (fixed reduction orders everywhere).
TEST(TensorParallelDeterminism, SameBitsTwice) {
  TempDir dir;
  const Config cfg = tiny(Variant{"", 2, true, false, 0});
  const auto data = batches(cfg);
  std::vector<std::vector<float>> params(2);
  for (int run = 0; run < 2; ++run)
    run_group(dir, 2, [&](int r, comm::Communicator& tp) {
      ParallelContext ctx{&tp};
      auto engine = make_engine(cfg, &ctx);
      for (int64_t s = 0; s < 5; ++s)
        engine->train_step(data[s].data(), s + 1, lr_at(cfg.optim, s, kSteps));
      if (r == 1)
        params[run].assign(engine->host_state().params,
                           engine->host_state().params + engine->layout().total());
    });
  EXPECT_EQ(params[0], params[1]);
}

// Every TP shard is exactly its slice of the global initialization.
TEST(TensorParallelInit, ShardsAreSlicesOfTheGlobalModel) {
  for (int t : {2, 4}) {
    Config cfg = tiny(Variant{"", t, false, false, 0});
    const ParamLayout global(cfg);
    std::vector<float> g(global.total());
    init_params(g.data(), global, cfg.model.seed);
    std::vector<int> covered(global.total(), 0);
    for (int r = 0; r < t; ++r) {
      const ParamLayout local(cfg, r, t);
      std::vector<float> w(local.total());
      init_params(w.data(), local, cfg.model.seed);
      ASSERT_EQ(local.tensors().size(), global.tensors().size());
      for (const ParamSpec& p : local.tensors()) {
        const ParamSpec& gp = global.find(p.name);
        for (int64_t i = 0; i < p.numel; ++i) {
          ASSERT_EQ(w[p.offset + i], g[gp.offset + p.global_index(i)]) << p.name << " " << i;
          covered[gp.offset + p.global_index(i)] += p.replicated() ? (r == 0) : 1;
        }
      }
    }
    for (int64_t i = 0; i < global.total(); ++i) ASSERT_EQ(covered[i], 1) << i;
  }
}

// Expert parallelism: each ep rank's layout holds whole experts, [q E/ep, (q+1) E/ep) of every MoE
// layer, after every other tensor from the alignment's multiple (the expert region); the shards
// are slices of the global initialization and cover the canonical experts exactly once, under tp
// too (the experts are whole on each tp rank).
TEST(ExpertParallelLayout, ShardsAreWholeExpertsAfterTheRest) {
  Config cfg = tiny(Variant{"", 1, false, false, 0});
  cfg.model.norm = "rmsnorm", cfg.model.mlp = "swiglu", cfg.model.position_encoding = "rope", cfg.model.bias = false;
  cfg.model.experts = 8, cfg.model.experts_per_token = 2, cfg.model.expert_hidden = 24, cfg.model.shared_experts = 1;
  const ParamLayout global(cfg);
  ASSERT_GT(global.expert_region().size(), 0);
  std::vector<float> g(global.total());
  init_params(g.data(), global, cfg.model.seed);
  for (int tp : {1, 2})
    for (int ep : {2, 4}) {
      std::vector<int> covered(global.total(), 0);
      for (int t = 0; t < tp; ++t)
        for (int q = 0; q < ep; ++q) {
          const ParamLayout local(cfg, t, tp, nullptr, ExpertShard{q, ep, 7});
          const FlatRange experts = local.expert_region();
          EXPECT_EQ(experts.begin % 7, 0);
          EXPECT_GE(experts.begin, local.dense_total());
          EXPECT_LT(experts.begin, local.dense_total() + 7);
          std::vector<float> w(local.total());
          init_params(w.data(), local, cfg.model.seed);
          for (const ParamSpec& p : local.tensors()) {
            const bool in_region = p.offset >= experts.begin;
            EXPECT_EQ(in_region, p.expert) << p.name;
            if (p.expert) {
              EXPECT_EQ(p.split_dim, 0) << p.name;
              EXPECT_EQ(p.shape[0] * ep, p.global_shape[0]) << p.name;
              EXPECT_EQ(p.global_offset[0], q * p.shape[0]) << p.name;
            }
            const ParamSpec& gp = global.find(p.name);
            for (int64_t i = 0; i < p.numel; ++i) {
              ASSERT_EQ(w[p.offset + i], g[gp.offset + p.global_index(i)]) << p.name << " " << i;
              // Each canonical element once: experts by their ep rank on tp rank 0, the rest on
              // ep rank 0 (tp's own shards, or tp rank 0's copy).
              const bool counts = p.expert ? t == 0 : q == 0 && (!p.replicated() || t == 0);
              covered[gp.offset + p.global_index(i)] += counts;
            }
          }
        }
      for (int64_t i = 0; i < global.total(); ++i) ASSERT_EQ(covered[i], 1) << "tp " << tp << ", ep " << ep << ": " << i;
    }
}

TEST(TensorParallelLayout, ShardShapesAndOffsets) {
  Config cfg = tiny(Variant{"", 4, false, false, 0});
  const ParamLayout l(cfg, 2, 4);
  const int64_t C = 64, Vp = cfg.padded_vocab();
  EXPECT_EQ(Vp, 512);
  auto check = [&](const char* name, std::vector<int64_t> shape, std::vector<int64_t> off, int dim) {
    const ParamSpec& p = l.find(name);
    EXPECT_EQ(p.shape, shape) << name;
    EXPECT_EQ(p.global_offset, off) << name;
    EXPECT_EQ(p.split_dim, dim) << name;
  };
  check("wte", {Vp / 4, C}, {2 * Vp / 4, 0}, 0);
  check("wpe", {16, C}, {0, 0}, -1);
  check("h.0.ln1.w", {C}, {0}, -1);
  check("h.0.attn.qkv.w", {3 * C / 4, C}, {2 * 3 * C / 4, 0}, 0);
  check("h.0.attn.qkv.b", {3 * C / 4}, {2 * 3 * C / 4}, 0);
  check("h.0.attn.proj.w", {C, C / 4}, {0, 2 * C / 4}, 1);
  check("h.0.attn.proj.b", {C}, {0}, -1);
  check("h.1.mlp.fc.w", {C, C}, {2 * C, 0}, 0);
  check("h.1.mlp.proj.w", {C, C}, {0, 2 * C}, 1);
  check("h.1.mlp.proj.b", {C}, {0}, -1);
  EXPECT_EQ(l.matmul_params(), ParamLayout(cfg).matmul_params());
  int64_t at = 0;
  for (const ParamSpec& p : l.tensors()) {
    EXPECT_EQ(p.offset, at) << p.name;
    at += p.numel;
  }
  EXPECT_EQ(at, l.total());
  // The element (row 5, column 3) of the local proj shard is (5, 2*16 + 3) globally.
  EXPECT_EQ(l.find("h.0.attn.proj.w").global_index(5 * 16 + 3), 5 * C + 32 + 3);
}

TEST(TensorParallelConfig, Errors) {
  TempDir dir;
  // seq_len not divisible by tp with sequence parallelism.
  Variant v{"", 4, true, false, 0};
  Config cfg = tiny(v);
  cfg.model.seq_len = 18;
  run_group(dir, 4, [&](int, comm::Communicator& tp) {
    ParallelContext ctx{&tp};
    try {
      Gpt g(cfg, &ctx);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.cls(), ErrorClass::kInput);
      EXPECT_NE(std::string(e.what()).find("model.seq_len (18) must be divisible by parallel.tp (4)"),
                std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
