// train.recompute on the oracle: the layer schedule (model/gpt.h) keeps fewer activations per
// layer and refills them before each layer's backward with the forward's own ops, so selective
// and full train bitwise as none does, whatever the block and however the layers are chunked.
// test_gpu checks the same on the CUDA op set, and how much device memory each mode saves.
#include <gtest/gtest.h>

#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/config.h"
#include "optim/optimizer.h"
#include "runtime/engine.h"

using namespace myriad;

namespace {

Config config(std::vector<std::string> sets, const std::string& mode) {
  for (const char* s : {"model.layers=3", "model.d_model=32", "model.heads=2", "model.seq_len=16",
                        "model.vocab_size=96", "train.micro_batch=2", "train.global_batch=4",
                        "optim.lr=3e-3", "optim.warmup_steps=0", "train.steps=3", "train.device=cpu"})
    sets.insert(sets.begin(), s);
  sets.push_back("train.recompute=" + mode);
  return parse_config("", "recompute test", sets);
}

std::vector<int32_t> batch(const Config& cfg, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<int32_t> t(cfg.train.global_batch * (cfg.model.seq_len + 1));
  for (auto& x : t) x = static_cast<int32_t>(gen() % cfg.model.vocab_size);
  return t;
}

struct Case {
  const char* name;
  std::vector<std::string> sets;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class Recompute : public ::testing::TestWithParam<std::tuple<Case, const char*>> {};

TEST_P(Recompute, TrainsBitwiseAsNone) {
  const auto& [c, mode] = GetParam();
  auto ref = make_engine(config(c.sets, "none")), e = make_engine(config(c.sets, mode));
  const Config cfg = config(c.sets, mode);
  for (int step = 1; step <= 3; ++step) {
    const std::vector<int32_t> tokens = batch(cfg, 40 + step);
    const double lr = lr_at(cfg.optim, step - 1, cfg.train.steps);
    const StepResult r = ref->train_step(tokens.data(), step, lr), x = e->train_step(tokens.data(), step, lr);
    EXPECT_EQ(x.loss, r.loss) << "step " << step;
    EXPECT_EQ(x.grad_norm, r.grad_norm) << "step " << step;
  }
  const int64_t P = ref->layout().total();
  const auto a = e->host_state(), b = ref->host_state();
  EXPECT_TRUE(std::equal(a.params, a.params + P, b.params)) << "parameters";
  EXPECT_TRUE(std::equal(a.m, a.m + P, b.m)) << "first moments";
  // A forward alone goes through the shared buffers too, and the next step still matches.
  const std::vector<int32_t> tokens = batch(cfg, 7);
  EXPECT_EQ(e->loss(tokens.data(), 2), ref->loss(tokens.data(), 2));
  EXPECT_EQ(e->train_step(tokens.data(), 4, 1e-3).loss, ref->train_step(tokens.data(), 4, 1e-3).loss);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, Recompute,
    ::testing::Combine(::testing::Values(Case{"sequential", {}},
                                         Case{"parallel_window", {"model.parallel_block=true", "model.window=5"}},
                                         Case{"two_chunks", {"parallel.virtual_stages=3"}},
                                         // a dense layer, then MoE layers with a shared expert: the
                                         // recompute set holds both MLPs' tensors
                                         Case{"moe", {"model.mlp=swiglu", "model.experts=4", "model.experts_per_token=2",
                                                      "model.expert_hidden=24", "model.shared_experts=1",
                                                      "model.dense_layers=1", "moe.z_loss=0.01",
                                                      "parallel.virtual_stages=3"}},
                                         // Qwen3's attention: its own head size and the query and
                                         // key norms, whose input the slot keeps beside qkv
                                         Case{"qk_norm", {"model.mlp=swiglu", "model.head_dim=24",
                                                          "model.qk_norm=head", "model.position_encoding=rope",
                                                          "model.experts=4", "model.experts_per_token=2"}}),
                       ::testing::Values("norms", "selective", "full")),
    [](const auto& info) { return std::string(std::get<0>(info.param).name) + "_" + std::get<1>(info.param); });

}  // namespace
