#include "core/config.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "core/parallel_layout.h"
#include "model/flops.h"
#include "model/params.h"
#include "test_util.h"

using namespace myriad;
using myriad::test::input_error;

namespace {

const char* kSmall = R"(
[model]
layers = 2
d_model = 32
heads = 4
seq_len = 16
)";

}  // namespace

TEST(Config, EveryPresetLoadsAndValidates) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(MYRIAD_SOURCE_DIR) + "/configs")) {
    if (e.path().extension() != ".toml") continue;
    EXPECT_NO_THROW(load_config(e.path().string())) << e.path();
    ++n;
  }
  EXPECT_GE(n, 9);
  Config demo = load_config(std::string(MYRIAD_SOURCE_DIR) + "/configs/demo.toml");
  // The demo admits every layout the parallel tests use.
  EXPECT_EQ(demo.model.layers % 8, 0);
  EXPECT_EQ(demo.model.heads % 4, 0);
  EXPECT_EQ(demo.train.global_batch % (2 * demo.train.micro_batch), 0);
  // The interleaved schedule on 4 stages (the issue's demo command) needs m % 4 == 0.
  EXPECT_EQ(demo.train.global_batch / demo.train.micro_batch % 4, 0);
  EXPECT_EQ(demo.train.log_every, 1);
  Config big = load_config(std::string(MYRIAD_SOURCE_DIR) + "/configs/gpt-175b.toml");
  EXPECT_EQ(big.model.layers, 96);
  EXPECT_EQ(big.model.d_model, 12288);
  EXPECT_EQ(big.model.heads, 128);
  EXPECT_EQ(big.model.vocab_size, 64000);
}

TEST(Config, ValuesAndOverrides) {
  Config c = parse_config(kSmall, "small.toml",
                          {"model.window=8", "optim.name=lamb", "data.train=data/x_train",
                           "optim.lr=0.5", "parallel.stage_layers=[1, 1]", "parallel.pp=2",
                           "comm.nccl_env.NCCL_IB_TIMEOUT=22", "model.bias=false"});
  EXPECT_EQ(c.model.layers, 2);
  EXPECT_EQ(c.model.window, 8);
  EXPECT_EQ(c.optim.name, "lamb");
  ASSERT_EQ(c.data.train.size(), 1u);
  EXPECT_EQ(c.data.train[0], source_of_prefix("data/x_train"));
  EXPECT_EQ(c.data.train[0].name, "x_train");
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.5);
  EXPECT_EQ(c.parallel.stage_layers, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(c.comm.nccl_env.at("NCCL_IB_TIMEOUT"), "22");
  EXPECT_FALSE(c.model.bias);
  // An integer is accepted where a number is expected.
  EXPECT_DOUBLE_EQ(parse_config(kSmall, "x", {"optim.lr=1"}).optim.lr, 1.0);
}

TEST(Config, TomlRoundTrip) {
  Config c = parse_config(kSmall, "small.toml", {"optim.lr=0.000123456789", "model.window=3",
                                                 "comm.nccl_env.NCCL_DEBUG=WARN", "parallel.pp=2",
                                                 "parallel.stage_layers=[1, 1]"});
  Config d = parse_config(to_toml(c), "round trip");
  EXPECT_EQ(to_toml(c), to_toml(d));
  EXPECT_DOUBLE_EQ(d.optim.lr, 0.000123456789);
  EXPECT_EQ(d.comm.nccl_env.at("NCCL_DEBUG"), "WARN");
}

TEST(Config, UnknownKeySuggestsNearest) {
  std::string e = input_error([] { parse_config("[model]\nlayer = 3\n", "my.toml"); });
  EXPECT_NE(e.find("my.toml"), std::string::npos) << e;
  EXPECT_NE(e.find("model.layer"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'model.layers'"), std::string::npos) << e;
  e = input_error([] { parse_config("[optimizer]\nlr = 3\n", "my.toml"); });
  EXPECT_NE(e.find("unknown section [optimizer]"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'optim'"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"train.step=3"}); });
  EXPECT_NE(e.find("--set train.step=3"), std::string::npos) << e;
  EXPECT_NE(e.find("'train.steps'"), std::string::npos) << e;
  e = input_error([] { parse_config("[observe]\ntensorbord = true\n", "my.toml"); });
  EXPECT_NE(e.find("unknown key observe.tensorbord"), std::string::npos) << e;
  EXPECT_NE(e.find("'observe.tensorboard'"), std::string::npos) << e;
}

TEST(Config, WrongTypesNameTheKey) {
  std::string e = input_error([] { parse_config("[model]\nlayers = \"eight\"\n", "my.toml"); });
  EXPECT_NE(e.find("model.layers must be an integer, got a string"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"model.bias=maybe"}); });
  EXPECT_NE(e.find("--set model.bias=maybe"), std::string::npos) << e;
  EXPECT_NE(e.find("true or false"), std::string::npos) << e;
  e = input_error([] { parse_config("[model]\nlayers = 2.5\n", "my.toml"); });
  EXPECT_NE(e.find("model.layers must be an integer"), std::string::npos) << e;
  e = input_error([] { parse_config("[model\nlayers = 2\n", "broken.toml"); });
  EXPECT_NE(e.find("broken.toml:1"), std::string::npos) << e;
  e = input_error([] { load_config("/nonexistent/x.toml"); });
  EXPECT_NE(e.find("/nonexistent/x.toml"), std::string::npos) << e;
}

TEST(Config, ImpossibleShapes) {
  std::string e = input_error([] { parse_config(kSmall, "my.toml", {"model.d_model=30"}); });
  EXPECT_NE(e.find("model.d_model (30) must be divisible by model.heads (4)"), std::string::npos) << e;
  EXPECT_EQ(e.rfind("--set model.d_model=30: ", 0), 0u) << "the value came from --set, not the file: " << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"model.window=-1"}); });
  EXPECT_NE(e.find("model.window"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"model.positions=8"}); });
  EXPECT_NE(e.find("model.seq_len (16) exceeds model.positions (8)"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"train.global_batch=10", "train.micro_batch=4"}); });
  EXPECT_NE(e.find("train.global_batch (10) must be a multiple of train.micro_batch (4)"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"parallel.tp=3"}); });
  EXPECT_NE(e.find("model.heads (4) must be divisible by parallel.tp (3)"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"optim.name=adam"}); });
  EXPECT_NE(e.find("did you mean 'adamw'"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"train.attention=flash"}); });
  EXPECT_NE(e.find("train.attention"), std::string::npos) << e;
  EXPECT_NE(e.find("cudnn"), std::string::npos) << "the error lists the choices: " << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"train.deterministic=yes"}); });
  EXPECT_NE(e.find("--set train.deterministic=yes"), std::string::npos) << e;
}

// The Llama keys: what cannot be built is refused, naming the key and the arithmetic.
TEST(Config, ImpossibleLlamaShapes) {
  std::string e = input_error([] { parse_config(kSmall, "my.toml", {"model.kv_heads=3"}); });
  EXPECT_NE(e.find("model.kv_heads (3) must divide model.heads (4)"), std::string::npos) << e;
  EXPECT_EQ(e.rfind("--set model.kv_heads=3: ", 0), 0u) << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"model.kv_heads=2", "parallel.tp=4"}); });
  EXPECT_NE(e.find("model.kv_heads (2) must be divisible by parallel.tp (4)"), std::string::npos) << e;
  EXPECT_NE(e.find("not replicated"), std::string::npos) << "the error says why: " << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"model.position_encoding=rope", "model.rope_theta=0"}); });
  EXPECT_NE(e.find("model.rope_theta must be positive, got 0"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"model.position_encoding=rope", "model.rope_theta=-5"}); });
  EXPECT_NE(e.find("model.rope_theta must be positive"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"model.position_encoding=alibi"}); });
  EXPECT_NE(e.find("model.position_encoding = \"alibi\" is not one of: learned, rope"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"model.position_encoding=rope", "model.rope_scaling=yarn"}); });
  EXPECT_NE(e.find("model.rope_scaling = \"yarn\""), std::string::npos) << e;
  e = input_error([] {
    parse_config(kSmall, "my.toml", {"model.position_encoding=rope", "model.rope_scaling=llama3",
                                     "model.rope_low_freq_factor=4", "model.rope_high_freq_factor=4"});
  });
  EXPECT_NE(e.find("model.rope_high_freq_factor (4) must exceed model.rope_low_freq_factor (4)"), std::string::npos) << e;
  // Head size 32 / 4 = 8 rotates; 36 / 4 = 9 cannot.
  e = input_error([] { parse_config(kSmall, "my.toml", {"model.position_encoding=rope", "model.d_model=36"}); });
  EXPECT_NE(e.find("head size d_model / heads = 9 is odd"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"model.norm=batchnorm"}); });
  EXPECT_NE(e.find("model.norm"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"model.norm_eps=1e-6"}); });
  EXPECT_NE(e.find("LayerNorm's epsilon is fixed at 1e-5"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"model.mlp=relu"}); });
  EXPECT_NE(e.find("model.mlp = \"relu\" is not one of: gelu, swiglu"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"model.mlp_hidden=30", "parallel.tp=4"}); });
  EXPECT_NE(e.find("model.mlp_hidden, 30) must be divisible by parallel.tp (4)"), std::string::npos) << e;
  // What is valid parses.
  const Config c = parse_config(kSmall, "my.toml", {"model.kv_heads=2", "parallel.tp=2", "model.norm=rmsnorm",
                                                    "model.norm_eps=1e-6", "model.position_encoding=rope"});
  EXPECT_EQ(c.model.kv(), 2);
  EXPECT_EQ(c.model.ffn(), 128);
}

// The Llama presets hold Meta's published shapes; their parameter counts are the published ones.
TEST(Config, LlamaPresetsHaveThePublishedShapes) {
  const std::string dir = std::string(MYRIAD_SOURCE_DIR) + "/configs/";
  const Config l1 = load_config(dir + "llama-3.2-1b.toml"), l3 = load_config(dir + "llama-3.2-3b.toml"),
               l8 = load_config(dir + "llama-3-8b.toml"), l70 = load_config(dir + "llama-3-70b.toml");
  for (const Config* c : {&l1, &l3, &l8, &l70}) {
    EXPECT_TRUE(c->model.rmsnorm() && c->model.rope() && c->model.swiglu() && !c->model.bias);
    EXPECT_EQ(c->model.kv(), 8);
    EXPECT_EQ(c->model.vocab_size, 128256);
    EXPECT_EQ(c->model.rope_theta, 500000);
    EXPECT_EQ(c->data.tokenizer, "llama3");
  }
  EXPECT_TRUE(l1.model.tied_embeddings && l3.model.tied_embeddings);
  EXPECT_FALSE(l8.model.tied_embeddings || l70.model.tied_embeddings);
  EXPECT_EQ(l1.model.rope_scaling, "llama3");
  EXPECT_EQ(l1.model.rope_factor, 32);
  EXPECT_EQ(l8.model.rope_scaling, "");
  // Every parameter (embedding, norms and all), as transformers counts them.
  auto count = [](const Config& c) {
    const ModelConfig& m = c.model;
    const int64_t C = m.d_model, D = m.head_dim();
    const int64_t layer = C * (m.heads + 2 * m.kv()) * D + m.heads * D * C + 3 * C * m.ffn() + 2 * C;
    return m.layers * layer + m.vocab_size * C * (m.tied_embeddings ? 1 : 2) + C;
  };
  EXPECT_EQ(count(l1), 1235814400);
  EXPECT_EQ(count(l3), 3212749824);
  EXPECT_EQ(count(l8), 8030261248);
  EXPECT_EQ(count(l70), 70553706496);
  // The layout holds exactly those (the padded vocabulary rows apart: 128256 is a multiple of 128).
  EXPECT_EQ(ParamLayout(l1).total(), count(l1));
}

// A mixture of experts' keys: what cannot be built is refused, naming the key.
TEST(Config, ImpossibleMoeShapes) {
  const std::vector<std::string> moe = {"model.mlp=swiglu", "model.experts=4"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), moe.begin(), moe.end());
    return more;
  };
  std::string e = input_error([] { parse_config(kSmall, "my.toml", {"model.experts=4"}); });
  EXPECT_NE(e.find("model.experts = 4 makes SwiGLU experts: set model.mlp = \"swiglu\""), std::string::npos) << e;
  e = input_error([&] { parse_config(kSmall, "my.toml", with({"model.experts_per_token=5"})); });
  EXPECT_NE(e.find("model.experts_per_token (5) must be in [1, model.experts = 4]"), std::string::npos) << e;
  e = input_error([&] { parse_config(kSmall, "my.toml", with({"model.dense_layers=2"})); });
  EXPECT_NE(e.find("no layer is MoE (model.dense_layers = 2, model.moe_every = 1, model.layers = 2)"),
            std::string::npos) << e;
  e = input_error([&] { parse_config(kSmall, "my.toml", with({"model.router_score=relu"})); });
  EXPECT_NE(e.find("model.router_score = \"relu\" is not one of: softmax, sigmoid"), std::string::npos) << e;
  e = input_error([&] { parse_config(kSmall, "my.toml", with({"model.router_groups=3"})); });
  EXPECT_NE(e.find("model.router_groups (3) must divide model.experts (4)"), std::string::npos) << e;
  e = input_error([&] { parse_config(kSmall, "my.toml", with({"model.router_groups=2", "model.router_top_groups=3"})); });
  EXPECT_NE(e.find("model.router_top_groups (3) must be in [1, model.router_groups = 2]"), std::string::npos) << e;
  e = input_error([&] { parse_config(kSmall, "my.toml", with({"model.router_groups=4", "model.experts_per_token=2"})); });
  EXPECT_NE(e.find("model.experts_per_token (2) exceeds the experts of 1 groups of 1"), std::string::npos) << e;
  e = input_error([&] { parse_config(kSmall, "my.toml", with({"moe.capacity_factor=-0.5"})); });
  EXPECT_NE(e.find("moe.capacity_factor must be 0 or more"), std::string::npos) << e;
  e = input_error([&] { parse_config(kSmall, "my.toml", with({"moe.aux_loss=-1"})); });
  EXPECT_NE(e.find("moe.aux_loss must be 0 or more"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"model.shared_experts=1"}); });
  EXPECT_NE(e.find("set model.experts (routed experts per MoE layer) too"), std::string::npos) << e;
  // Under tp each rank routes its share of the tokens: dropless only, shared experts split.
  e = input_error([&] { parse_config(kSmall, "my.toml", with({"parallel.tp=2", "moe.capacity_factor=1.5"})); });
  EXPECT_NE(e.find("moe.capacity_factor = 1.5 with parallel.tp = 2"), std::string::npos) << e;
  e = input_error([&] {
    parse_config(kSmall, "my.toml", with({"parallel.tp=2", "model.shared_experts=1", "model.shared_expert_hidden=33"}));
  });
  EXPECT_NE(e.find("shared experts' features (model.shared_experts x model.shared_expert_hidden = 33) must be "
                   "divisible by parallel.tp (2)"), std::string::npos) << e;
  // Expert parallelism: whole experts per rank, on the data-parallel ranks, of an MoE model.
  e = input_error([&] { parse_config(kSmall, "my.toml", with({"parallel.ep=3"})); });
  EXPECT_NE(e.find("model.experts (4) must be divisible by parallel.ep (3)"), std::string::npos) << e;
  e = input_error([&] { parse_config(kSmall, "my.toml", with({"parallel.ep=0"})); });
  EXPECT_NE(e.find("parallel.ep must be positive, got 0"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"parallel.ep=2"}); });
  EXPECT_NE(e.find("parallel.ep = 2 splits the experts of an MoE model, but model.experts = 0"), std::string::npos) << e;
  e = input_error([&] { parse_config(kSmall, "my.toml", with({"parallel.ep=4", "parallel.dp=2"})); });
  EXPECT_NE(e.find("parallel.ep (4) must divide parallel.tp x the data-parallel degree (1 x 2 = 2)"), std::string::npos) << e;
  e = input_error([&] { ParallelLayout::for_world(parse_config(kSmall, "my.toml", with({"parallel.ep=4"})), 6); });
  EXPECT_NE(e.find("parallel.ep (4) must divide parallel.tp x the data-parallel degree (1 x 6 = 6)"), std::string::npos) << e;
  EXPECT_EQ(ParallelLayout::for_world(parse_config(kSmall, "my.toml", with({"parallel.ep=2", "train.global_batch=16"})), 4).edp(), 2);
  // Which layers are MoE: the first dense_layers dense, then every moe_every-th (Qwen's rule).
  const Config c = parse_config("[model]\nlayers = 6\n", "my.toml", with({"model.dense_layers=1", "model.moe_every=2"}));
  std::vector<int64_t> moe_layers;
  for (int64_t l = 0; l < 6; ++l)
    if (c.model.layer_is_moe(l)) moe_layers.push_back(l);
  EXPECT_EQ(moe_layers, (std::vector<int64_t>{1, 3, 5}));
  EXPECT_EQ(c.model.expert_ffn(), c.model.ffn());  // expert_hidden 0: mlp_hidden's
}

// Qwen3's and OLMoE's attention keys.
TEST(Config, HeadSizeAndQkNorm) {
  const Config c = parse_config(kSmall, "my.toml", {"model.head_dim=12", "model.qk_norm=head"});
  EXPECT_EQ(c.model.head_dim(), 12);  // not d_model / heads = 8
  std::string e = input_error([] { parse_config(kSmall, "my.toml", {"model.qk_norm=layer"}); });
  EXPECT_NE(e.find("model.qk_norm = \"layer\" is not one of: \"\" (none), head"), std::string::npos) << e;
  // Qwen3's per-head norm runs under tp (its weights' gradients summed over tp); OLMoE's, over
  // every head, would have to split with them.
  EXPECT_EQ(parse_config(kSmall, "my.toml", {"model.qk_norm=head", "parallel.tp=2"}).parallel.tp, 2);
  e = input_error([] { parse_config(kSmall, "my.toml", {"model.qk_norm=all", "parallel.tp=2"}); });
  EXPECT_NE(e.find("model.qk_norm = \"all\" with parallel.tp = 2"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"model.head_dim=9", "model.position_encoding=rope"}); });
  EXPECT_NE(e.find("the head size model.head_dim = 9 is odd"), std::string::npos) << e;
  // d_model need not divide by heads when head_dim is given.
  EXPECT_EQ(parse_config(kSmall, "my.toml", {"model.d_model=36", "model.head_dim=8"}).model.head_dim(), 8);
}

// Mixtral's preset holds the published shape: 46.7B parameters of which 12.9B a token uses, in
// transformers' count (46,702,792,704); the layout holds every one, and MFU's N counts the active
// matmul weights only.
TEST(Config, MoePresetsHaveThePublishedCounts) {
  const Config mx = load_config(std::string(MYRIAD_SOURCE_DIR) + "/configs/mixtral-8x7b.toml");
  const model::ParamCounts n = model::param_counts(mx.model);
  EXPECT_EQ(n.total, 46702792704.0);
  EXPECT_EQ(std::llround(n.active / 1e8), 129);  // "12.9B active"
  EXPECT_EQ(n.active, 12879925248.0);
  EXPECT_EQ(ParamLayout(mx).total(), int64_t(n.total));  // 32000 is a multiple of 128: no padding
  // 6N's N: attention, the router, 2 of 8 experts, the LM head.
  const double d = 4096, layer = d * (32 + 2 * 8) * 128 + 32 * 128 * d + 8 * d + 2 * 3 * d * 14336;
  EXPECT_EQ(model::matmul_params(mx.model, 32000), 32 * layer + 32000 * d);
  EXPECT_EQ(double(ParamLayout(mx).matmul_params()), model::matmul_params(mx.model, 32000));
  // Qwen3-30B-A3B (a head size of 128 over d 2048 and 32 heads, QK-norm per head, 128 experts, 8
  // per token) and OLMoE-1B-7B (QK-norm over whole queries and keys, 64 experts, 8 per token):
  // transformers' counts, 30,532,122,624 and 6,919,161,856, and "3.3B" and "1.3B" active.
  const Config q = load_config(std::string(MYRIAD_SOURCE_DIR) + "/configs/qwen3-30b-a3b.toml");
  EXPECT_EQ(model::param_counts(q.model).total, 30532122624.0);
  EXPECT_EQ(model::param_counts(q.model).active, 3353032704.0);
  EXPECT_EQ(ParamLayout(q).total(), int64_t(model::param_counts(q.model).total));  // 151936 = 1187 x 128
  const Config o = load_config(std::string(MYRIAD_SOURCE_DIR) + "/configs/olmoe-1b-7b.toml");
  EXPECT_EQ(model::param_counts(o.model).total, 6919161856.0);
  EXPECT_EQ(model::param_counts(o.model).active, 1282017280.0);
  EXPECT_EQ(ParamLayout(o).total(), int64_t(model::param_counts(o.model).total));  // 50304 = 393 x 128
  // Qwen3-0.6B (dense, head_dim 128 over d 1024 and 16 heads, QK-norm per head, tied):
  // transformers' count, 596,049,920.
  const Config q06 = load_config(std::string(MYRIAD_SOURCE_DIR) + "/configs/qwen3-0.6b.toml");
  EXPECT_EQ(model::param_counts(q06.model).total, 596049920.0);
  EXPECT_EQ(model::param_counts(q06.model).active, 596049920.0);
  EXPECT_EQ(ParamLayout(q06).total(), int64_t(model::param_counts(q06.model).total));
  // Qwen3-235B-A22B (94 layers of 128 experts of 1536, d 4096, 64 heads of 128): Qwen's "235B
  // total, 22B activated" (this count: 235,093,634,560 and 22,190,763,520).
  const Config big = load_config(std::string(MYRIAD_SOURCE_DIR) + "/configs/qwen3-235b-a22b.toml");
  EXPECT_NEAR(model::param_counts(big.model).total, 235e9, 0.5e9);
  EXPECT_NEAR(model::param_counts(big.model).active, 22e9, 0.5e9);
  for (const Config* c : {&q, &o, &big})
    EXPECT_EQ(double(ParamLayout(*c).matmul_params()), model::matmul_params(c->model, c->padded_vocab()));
  // A dense model's two counts are one, and the Llama preset's is the published one.
  const Config l8 = load_config(std::string(MYRIAD_SOURCE_DIR) + "/configs/llama-3-8b.toml");
  EXPECT_EQ(model::param_counts(l8.model).total, 8030261248.0);
  EXPECT_EQ(model::param_counts(l8.model).active, 8030261248.0);
}

TEST(Config, PaddedVocab) {
  Config c = parse_config(kSmall, "x", {"model.vocab_size=50257"});
  EXPECT_EQ(c.padded_vocab(), 50304);
  c.parallel.tp = 4;
  EXPECT_EQ(c.padded_vocab(), 50688);  // a multiple of 128 x 4
  EXPECT_EQ(parse_config(kSmall, "x", {"model.vocab_size=256"}).padded_vocab(), 256);
}

// A batch that does not split: the keys, the factors and the nearest valid global_batch; the
// message names where the value came from (the file, or the --set that gave it).
TEST(Config, GlobalBatchMustSplitIntoMicroBatches) {
  const std::string base = "[train]\nglobal_batch = 12\nmicro_batch = 4\n";
  Config c = parse_config(base, "a.toml");
  EXPECT_EQ(ParallelLayout::of(c, 1).micro_batches, 3);
  EXPECT_EQ(ParallelLayout::of(c, 3).micro_batches, 1);
  std::string e = myriad::test::input_error([&] { ParallelLayout::of(c, 2); });
  EXPECT_EQ(e, "config: train.global_batch (12) must be a multiple of train.micro_batch (4) x "
               "parallel.dp (2) = 8; use train.global_batch = 8 or 16");
  e = myriad::test::input_error([&] { ParallelLayout::of(c, 4); });
  EXPECT_NE(e.find("= 16; use train.global_batch = 16"), std::string::npos) << e;
  e = myriad::test::input_error([&] { parse_config(base, "a.toml", {"train.micro_batch=5"}); });
  EXPECT_EQ(e.rfind("--set train.micro_batch=5: train.global_batch (12) must be a multiple of "
                    "train.micro_batch (5) = 5; use train.global_batch = 10 or 15", 0), 0u) << e;
  e = myriad::test::input_error([&] {
    parse_config(base + "[parallel]\npp = 2\nvirtual_stages = 2\n", "a.toml", {"train.global_batch=4"});
  });
  EXPECT_EQ(e, "--set train.global_batch=4: train.global_batch (4) must be a multiple of "
               "train.micro_batch (4) x parallel.pp (2, for the interleaved schedule) = 8; use "
               "train.global_batch = 8") << e;
  // From the file itself, the file is named.
  e = myriad::test::input_error([&] { parse_config("[train]\nglobal_batch = 6\nmicro_batch = 4\n", "b.toml"); });
  EXPECT_EQ(e.rfind("b.toml: train.global_batch (6)", 0), 0u) << e;
}

TEST(Config, Fp8IsRefusedWhereItCannotRun) {
  std::string e = input_error([] { parse_config(kSmall, "my.toml", {"train.precision=fp16"}); });
  EXPECT_NE(e.find("train.precision = \"fp16\" is not one of: bf16, fp8"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"train.precision=fp8", "train.device=cpu"}); });
  EXPECT_NE(e.find("train.precision = \"fp8\" runs on Hopper GPUs"), std::string::npos) << e;
  EXPECT_NE(e.find("use train.precision = \"bf16\""), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "my.toml", {"train.precision=fp8", "train.device=cuda", "train.fp8_gradients=e4m4"}); });
  EXPECT_NE(e.find("train.fp8_gradients = \"e4m4\" is not one of: e5m2, e4m3"), std::string::npos) << e;
  for (const char* key : {"train.fp8_gradients=e4m3", "train.fp8_fast_accum=true", "train.fp8_scaling=block"}) {
    e = input_error([&] { parse_config(kSmall, "my.toml", {key, "train.device=cuda"}); });
    EXPECT_NE(e.find("shape the FP8 recipe, but train.precision = \"bf16\""), std::string::npos) << key << ": " << e;
  }
  e = input_error([] { parse_config(kSmall, "my.toml", {"train.precision=fp8", "train.device=cuda", "train.fp8_scaling=tile"}); });
  EXPECT_NE(e.find("train.fp8_scaling = \"tile\" is not one of: tensor, block"), std::string::npos) << e;
  // cuBLASLt's block-scaled GEMMs take no fast accumulation.
  e = input_error([] {
    parse_config(kSmall, "my.toml", {"train.precision=fp8", "train.device=cuda", "train.fp8_scaling=block", "train.fp8_fast_accum=true"});
  });
  EXPECT_NE(e.find("train.fp8_fast_accum = true with train.fp8_scaling = \"block\""), std::string::npos) << e;
  EXPECT_NE(e.find("set train.fp8_fast_accum = false, or train.fp8_scaling = \"tensor\""), std::string::npos) << e;
  EXPECT_EQ(parse_config(kSmall, "my.toml", {"train.precision=fp8", "train.device=cuda", "train.fp8_scaling=block"}).train.fp8_scaling,
            "block");
  e = input_error([] { parse_config(kSmall, "my.toml", {"train.fp8_lm_head=true", "train.device=cuda"}); });
  EXPECT_NE(e.find("train.fp8_lm_head = true puts the LM head in FP8"), std::string::npos) << e;
  EXPECT_NE(e.find("set train.precision = \"fp8\" too"), std::string::npos) << e;
  // On a GPU (device auto or cuda) the key parses; the engine checks the GPU (tests/gpu/fp8_test.cc).
  EXPECT_EQ(parse_config(kSmall, "my.toml", {"train.precision=fp8", "train.device=cuda"}).train.precision, "fp8");
  EXPECT_TRUE(
      parse_config(kSmall, "my.toml", {"train.precision=fp8", "train.fp8_lm_head=true", "train.device=cuda"}).train.fp8_lm_head);
  // Tensor parallelism in fp8 parses (the engine reduces each amax over the group).
  const Config tp = parse_config(kSmall, "my.toml", {"train.precision=fp8", "train.device=cuda", "parallel.tp=2",
                                                     "train.fp8_gradients=e4m3", "train.fp8_fast_accum=true"});
  EXPECT_EQ(tp.parallel.tp, 2);
  EXPECT_EQ(tp.train.fp8_gradients, "e4m3");
  EXPECT_TRUE(tp.train.fp8_fast_accum);
}

TEST(Config, DataSourcesArePrefixesOrNamedWeightedLists) {
  const char* blend = R"(
[[data.train]]
name = "web"
path = "data/web"
weight = 0.7

[[data.train]]
name = "code"
path = "data/code"
weight = 3
epochs = 2

[data]
valid = [{name = "web", path = "data/web_val"}, {path = "data/code_val"}]
)";
  const Config c = parse_config(blend, "blend.toml");
  ASSERT_EQ(c.data.train.size(), 2u);
  EXPECT_EQ(c.data.train[0], (DataSource{"web", "data/web", 0.7, 0}));
  EXPECT_EQ(c.data.train[1], (DataSource{"code", "data/code", 3, 2}));
  ASSERT_EQ(c.data.valid.size(), 2u);
  EXPECT_EQ(c.data.valid[1].name, "code_val") << "a source without a name is named for its file";
  // The round trip keeps the list; a lone prefix stays a string; "" is none.
  const Config d = parse_config(to_toml(c), "round trip");
  EXPECT_EQ(d.data.train, c.data.train);
  EXPECT_EQ(d.data.valid, c.data.valid);
  const Config lone = parse_config(kSmall, "x", {"data.train=data/x", "data.valid="});
  EXPECT_NE(to_toml(lone).find("train = 'data/x'"), std::string::npos) << to_toml(lone);
  EXPECT_TRUE(lone.data.valid.empty());
  EXPECT_EQ(parse_config(kSmall, "x", {"data.train=[{name = \"a\", path = \"p\", weight = 2}]"}).data.train[0].weight, 2);

  // Megatron-LM's blend string: weight and prefix pairs, each source named for its file; a
  // prefix whose first word is no number stays one prefix, spaces and all.
  const Config mega = parse_config(kSmall, "x", {"data.train=0.7 data/web_train 3e-1 /d/code"});
  ASSERT_EQ(mega.data.train.size(), 2u);
  EXPECT_EQ(mega.data.train[0], (DataSource{"web_train", "data/web_train", 0.7, 0}));
  EXPECT_EQ(mega.data.train[1], (DataSource{"code", "/d/code", 0.3, 0}));
  EXPECT_EQ(parse_config(to_toml(mega), "round trip").data.train, mega.data.train);
  EXPECT_EQ(parse_config(kSmall, "x", {"data.train=my data/x"}).data.train,
            (DataSources{DataSource{"x", "my data/x", 1, 0}}));
  // Hardening III: two prefixes of one file name are named by their paths (the string cannot
  // name them); a validation string in the blend's form is refused (validation does not blend).
  const Config twins = parse_config(kSmall, "x", {"data.train=0.5 a/train 0.5 b/train 1 c/web"});
  ASSERT_EQ(twins.data.train.size(), 3u);
  EXPECT_EQ(twins.data.train[0].name, "a/train");
  EXPECT_EQ(twins.data.train[1].name, "b/train");
  EXPECT_EQ(twins.data.train[2].name, "web") << "a file name of its own stays the name";
  EXPECT_EQ(parse_config(to_toml(twins), "round trip").data.train, twins.data.train);
  std::string v = input_error([] { parse_config(kSmall, "x", {"data.valid=1 data/v"}); });
  EXPECT_NE(v.find("data.valid = \"1 data/v\" reads as Megatron-LM's blend"), std::string::npos) << v;
  EXPECT_NE(v.find("validation sources are not blended"), std::string::npos) << v;
  EXPECT_EQ(parse_config(kSmall, "x", {"data.valid=data/v w"}).data.valid[0].path, "data/v w");
  // Weights whose sum is not a finite number cannot be normalized.
  v = input_error([] { parse_config(kSmall, "x", {"data.train=1e308 data/a 1e308 data/b"}); });
  EXPECT_NE(v.find("data.train's weights sum to inf"), std::string::npos) << v;

  // Bad sources: one line naming the source or the key.
  std::string e = input_error([] { parse_config(kSmall, "x", {"data.train=0.7 data/web 0.3"}); });
  EXPECT_NE(e.find("weight 0.3 has no prefix"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "x", {"data.train=0.7 data/web heavy data/code"}); });
  EXPECT_NE(e.find("'heavy' in a weight's place is not a number"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "x", {"data.train=0 data/web 1 data/code"}); });
  EXPECT_NE(e.find("data.train's source 'web' has weight 0"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "x", {"data.train=[{name = \"a\", path = \"p\", weight = 0}]"}); });
  EXPECT_NE(e.find("data.train's source 'a' has weight 0"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "x", {"data.train=[{name = \"a\", path = \"p\", weight = -1}]"}); });
  EXPECT_NE(e.find("source 'a' has weight -1"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "x", {"data.train=[{name = \"a\", path = \"p\", weight = \"heavy\"}]"}); });
  EXPECT_NE(e.find("data.train[0].weight must be a number, got a string"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "x", {"data.train=[{name = \"a\", path = \"p\"}, {name = \"a\", path = \"q\"}]"}); });
  EXPECT_NE(e.find("names two sources 'a' (p and q)"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "x", {"data.train=[{name = \"a\"}]"}); });
  EXPECT_NE(e.find("data.train[0] has no path"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "x", {"data.valid=[{name = \"a\", path = \"p\", weight = 1}]"}); });
  EXPECT_NE(e.find("data.valid[0] has an unknown key weight"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "x", {"data.train=[{name = \"a\", path = \"p\", epochs = -1}]"}); });
  EXPECT_NE(e.find("source 'a' has epochs -1"), std::string::npos) << e;
  e = input_error([] { parse_config(kSmall, "x", {"data.train=3"}); });
  EXPECT_NE(e.find("data.train must be a prefix (a string) or an array of sources"), std::string::npos) << e;
}

// Hardening III item 11: a --set is blamed only for the whole key it gave, never for a key that
// merely begins with it.
TEST(Config, SetErrorsNameTheWholeKey) {
  std::string e = input_error([] { parse_config(kSmall, "x", {"optim.decay=wsd", "optim.decay_steps=-3"}); });
  EXPECT_EQ(e.rfind("--set optim.decay_steps=-3: ", 0), 0u) << e;
  e = input_error([] { parse_config(kSmall, "x", {"model.mlp=gelu", "model.mlp_hidden=-2"}); });
  EXPECT_EQ(e.rfind("--set model.mlp_hidden=-2: ", 0), 0u) << e;
  e = input_error([] { parse_config(kSmall, "x", {"checkpoint.async=true", "checkpoint.async_policy=later"}); });
  EXPECT_EQ(e.rfind("--set checkpoint.async_policy=later: ", 0), 0u) << e;
  // The shorter key is still found where it stands whole.
  e = input_error([] { parse_config(kSmall, "x", {"optim.decay=sometimes", "optim.decay_steps=3"}); });
  EXPECT_EQ(e.rfind("--set optim.decay=sometimes: ", 0), 0u) << e;
}
