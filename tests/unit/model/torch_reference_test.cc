// The CPU backend against an independent reference: PyTorch on CPU (tools/torch_reference.py,
// float64 autograd) for the logits, the loss, every parameter gradient, one AdamW step and one
// LAMB step written from the paper's equations.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf.h"
#include "core/config.h"
#include "core/error.h"
#include "model/gpt.h"
#include "optim/optimizer.h"

using namespace myriad;
namespace fs = std::filesystem;

namespace {

struct Variant {
  const char* name;
  bool parallel_block;
  int window;
  bool bias;
  std::vector<std::string> block = {};  // the block's variant keys (--set), GPT-2's when empty
  bool documents = false;               // rows of packed documents (data.document_mask)
  // A mixture of experts: the router's rows of experts 1 and 2 made equal (their scores tie for
  // every token), and what the routing must have met: ties at the k-th place, an expert with no
  // token in some layer.
  bool tie_router = false;
  bool expect_ties = false, expect_idle_expert = false, expect_drops = false;
};

std::vector<float> read_f32(const fs::path& p, size_t n) {
  std::vector<float> v(n);
  std::ifstream in(p, std::ios::binary);
  EXPECT_TRUE(in) << p;
  in.read(reinterpret_cast<char*>(v.data()), n * sizeof(float));
  EXPECT_EQ(static_cast<size_t>(in.gcount()), n * sizeof(float)) << p;
  return v;
}

template <class T>
void write_raw(const fs::path& p, const std::vector<T>& v) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// ||a - b|| / ||b|| over [begin, begin + n) (absolute when b is zero there).
double rel_diff(const float* a, const float* b, int64_t n) {
  double d = 0, r = 0;
  for (int64_t i = 0; i < n; ++i) d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), r += double(b[i]) * b[i];
  return r > 0 ? std::sqrt(d / r) : std::sqrt(d);
}

// Random weights of a visible scale (norm weights around 1, padded vocabulary rows zero) into
// `model`, B random rows of T+1 tokens into `tokens`, and both with the model's description as
// tools/torch_reference.py reads them (tools/README.md) into `dir`.
void write_reference_inputs(const fs::path& dir, const Config& cfg, Gpt& model, int B, std::vector<int32_t>& tokens,
                            bool tie_router = false) {
  const ModelConfig& m = cfg.model;
  const ParamLayout& layout = model.layout();
  const int64_t T = m.seq_len;
  std::mt19937_64 gen(42);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  for (const ParamSpec& p : layout.tensors())
    for (int64_t i = 0; i < p.numel; ++i) {
      float& w = model.params()[p.offset + i];
      w = (p.init_std > 0 ? 0.0f : float(p.init_value)) + normal(gen);
      if (vocab_rows(p) && i >= m.vocab_size * m.d_model) w = 0;
    }
  for (const ParamSpec& p : layout.tensors())  // router rows 1 and 2 (E, C): equal logits, equal scores
    if (tie_router && p.name.find("mlp.router.w") != std::string::npos)
      std::copy_n(model.params() + p.offset + m.d_model, m.d_model, model.params() + p.offset + 2 * m.d_model);
  tokens.assign(B * (T + 1), 0);
  for (auto& t : tokens) t = static_cast<int32_t>(gen() % m.vocab_size);
  fs::create_directories(dir);
  nlohmann::json js = {{"layers", m.layers}, {"d_model", m.d_model}, {"heads", m.heads}, {"seq_len", T},
                       {"vocab_size", m.vocab_size}, {"padded_vocab", cfg.padded_vocab()},
                       {"window", m.window}, {"parallel_block", m.parallel_block}, {"bias", m.bias},
                       {"document_end_loss", cfg.data.document_end_loss},
                       {"norm", m.norm}, {"norm_eps", m.norm_eps}, {"positions", m.position_encoding},
                       {"rope_theta", m.rope_theta}, {"mlp", m.mlp}, {"mlp_hidden", m.ffn()},
                       {"kv_heads", m.kv()}, {"tied", m.tied_embeddings},
                       {"head_dim", m.head_dim()}, {"qk_norm", m.qk_norm},
                       {"experts", m.experts}, {"experts_per_token", m.experts_per_token},
                       {"expert_hidden", m.expert_ffn()}, {"shared_hidden", m.shared_ffn()},
                       {"dense_layers", m.dense_layers}, {"moe_every", m.moe_every},
                       {"router_score", m.router_score}, {"router_norm_topk", m.router_norm_topk},
                       {"router_scale", m.router_scale}, {"router_groups", m.router_groups},
                       {"router_top_groups", m.router_top_groups}, {"capacity_factor", cfg.moe.capacity_factor},
                       {"aux_loss", cfg.moe.aux_loss}, {"z_loss", cfg.moe.z_loss},
                       {"batch", B},
                       {"optim", {{"lr", cfg.optim.lr}, {"beta1", cfg.optim.beta1}, {"beta2", cfg.optim.beta2},
                                  {"eps", cfg.optim.eps}, {"weight_decay", cfg.optim.weight_decay},
                                  {"grad_clip", cfg.optim.grad_clip}}}};
  js["rope_scaling"] = nullptr;
  if (m.rope_scaling == "llama3")
    js["rope_scaling"] = {{"type", "llama3"}, {"factor", m.rope_factor}, {"low_freq_factor", m.rope_low_freq_factor},
                          {"high_freq_factor", m.rope_high_freq_factor},
                          {"original_max_position_embeddings", m.rope_original_positions}};
  js["params"] = nlohmann::json::array();
  js["decay"] = nlohmann::json::array();
  for (const ParamSpec& p : layout.tensors()) {
    js["params"].push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}});
    if (p.decay) js["decay"].push_back(p.name);
  }
  std::ofstream(dir / "model.json") << js.dump();
  write_raw(dir / "params.bin", std::vector<float>(model.params(), model.params() + model.num_params()));
  write_raw(dir / "tokens.bin", tokens);
}

class TorchReference : public ::testing::TestWithParam<Variant> {};

const std::vector<std::string> kLlama = {"model.norm=rmsnorm", "model.norm_eps=1e-6", "model.position_encoding=rope",
                                         "model.rope_theta=500", "model.mlp=swiglu", "model.mlp_hidden=48",
                                         "model.kv_heads=2", "model.tied_embeddings=false"};

std::vector<std::string> with_documents(std::vector<std::string> sets) {
  sets.push_back("data.document_mask=true");
  return sets;
}
const std::vector<std::string> kLlamaDocuments = with_documents(kLlama);

std::vector<std::string> with(std::vector<std::string> sets, const std::vector<std::string>& more) {
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

TEST_P(TorchReference, LogitsLossGradsAndOneOptimizerStep) {
  const Variant v = GetParam();
  const int B = 3, T = 8;
  std::vector<std::string> sets = {"model.layers=2", "model.d_model=32", "model.heads=4", "model.seq_len=8",
                                   "model.vocab_size=50", cat("model.window=", v.window),
                                   cat("model.parallel_block=", v.parallel_block ? "true" : "false"),
                                   cat("model.bias=", v.bias ? "true" : "false"), "train.micro_batch=3",
                                   "train.global_batch=3", "optim.lr=0.01", "optim.weight_decay=0.1",
                                   "optim.grad_clip=0.5"};
  sets.insert(sets.end(), v.block.begin(), v.block.end());
  Config cfg = parse_config("", "test", sets);
  const ModelConfig& m = cfg.model;
  Gpt model(cfg);
  const ParamLayout& layout = model.layout();
  const int64_t P = model.num_params(), Vp = cfg.padded_vocab();

  std::vector<int32_t> tokens;
  fs::path dir = fs::temp_directory_path() / cat("myriad_torchref_", v.name, "_", ::getpid());
  write_reference_inputs(dir, cfg, model, B, tokens, v.tie_router);
  // Packed documents, each token's start laid out as the tokens (T+1 a row): row 0 one
  // document begun before it, row 1 documents of 3, 1, 1 and 4 tokens, row 2 a new document
  // every other token.
  std::vector<int32_t> docs;
  if (v.documents) {
    docs = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 4, 5, 5, 5, 5, 0, 0, 2, 2, 4, 4, 6, 6, 8};
    write_raw(dir / "docs.bin", docs);
  }
  const Rows rows(tokens.data(), v.documents ? docs.data() : nullptr);
  const std::string cmd = cat("/usr/bin/python3 ", MYRIAD_SOURCE_DIR, "/tools/torch_reference.py ",
                              dir.string(), " > ", (dir / "log.txt").string(), " 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0)
      << "tools/torch_reference.py failed (Debian's python3-torch comes with scripts/setup.sh); log in "
      << (dir / "log.txt");

  // The routing met the case the variant is for (PyTorch's account of it).
  if (v.expect_ties || v.expect_idle_expert || v.expect_drops) {
    std::ifstream in(dir / "ref_router.json");
    const nlohmann::json r = nlohmann::json::parse(in);
    if (v.expect_ties) {
      EXPECT_GT(r["ties"].get<int>(), 0) << r.dump();
    }
    bool idle = false;
    for (const auto& layer : r["counts"])
      for (const auto& c : layer) idle |= c.get<int>() == 0;
    if (v.expect_idle_expert) {
      EXPECT_TRUE(idle) << r.dump();
    }
    if (v.expect_drops) {
      EXPECT_GT(r["dropped"].get<int>(), 0) << r.dump();
    }
  }

  // Forward: logits and loss.
  const float loss = model.loss(rows, B);
  std::vector<float> ref_logits = read_f32(dir / "ref_logits.bin", B * T * Vp);
  EXPECT_LT(rel_diff(model.logits(), ref_logits.data(), B * T * Vp), 1e-5);
  double ref_loss = 0;
  std::ifstream(dir / "ref_loss.txt") >> ref_loss;
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::abs(ref_loss));

  // Sampling's logits of a prefix are the full forward's at the prefix's last position
  // (attention is causal), whatever the prefix length.
  for (int t : {1, T / 2 + 1, T}) {
    if (v.documents) break;  // sampling reads one document
    // With a capacity, which rows are dropped depends on every token of the micro-batch: a
    // prefix is routed as a shorter batch (GShard's and Switch's capacity behave alike).
    if (cfg.moe.capacity_factor > 0) break;
    std::vector<int32_t> prefix(B * t);
    for (int b = 0; b < B; ++b)
      std::copy_n(tokens.begin() + b * (T + 1), t, prefix.begin() + b * t);
    std::vector<float> last(B * Vp);
    model.last_logits(prefix.data(), B, t, last.data());
    for (int b = 0; b < B; ++b)
      EXPECT_LT(rel_diff(last.data() + b * Vp, ref_logits.data() + (int64_t(b) * T + t - 1) * Vp, Vp), 1e-5)
          << "prefix of " << t << " tokens, row " << b;
  }

  // Backward: every parameter's gradient.
  model.zero_grads();
  EXPECT_FLOAT_EQ(model.forward_backward(rows, B, 1.0f), loss);
  std::vector<float> ref_grads = read_f32(dir / "ref_grads.bin", P);
  for (const ParamSpec& p : layout.tensors())
    EXPECT_LT(rel_diff(model.grads() + p.offset, ref_grads.data() + p.offset, p.numel), 1e-5) << p.name;

  // One clipped AdamW step and one clipped LAMB step from the same point and the same gradients:
  // PyTorch's, which the gradients above matched. From Myriad's own, the rounding noise of the
  // gradients that are zero in exact arithmetic (below) reaches LAMB's per-tensor trust ratio,
  // and through it every element of that tensor, by an amount that depends on the machine's libm
  // and BLAS kernels (1.1e-3 of qkv.b's update on an AVX2-only EPYC).
  const std::vector<float> w0(model.params(), model.params() + P), g0 = ref_grads;
  for (const char* name : {"adamw", "lamb"}) {
    OptimConfig oc = cfg.optim;
    oc.name = name;
    std::vector<float> w = w0, g = g0;
    clip_grad_norm(g.data(), P, oc.grad_clip);
    make_optimizer(oc, layout)->step(w.data(), g.data(), oc.lr);
    std::vector<float> ref = read_f32(dir / cat("ref_", name, ".bin"), P);
    // State that is not trained (an MoE router's bias) is left as it was, bit for bit.
    for (const ParamSpec& p : layout.tensors())
      if (!p.trained) {
        EXPECT_TRUE(std::equal(w.begin() + p.offset, w.begin() + p.offset + p.numel, w0.begin() + p.offset))
            << name << " moved " << p.name;
      }
    // Adam's first step divides each gradient by its own magnitude, so where the gradient is at
    // rounding-noise scale the step is noise too. The key bias's gradient is zero in exact
    // arithmetic (it adds one constant to a row of scores); an fc weight whose rows sit deep in
    // GELU's negative tail gets 1e-8-sized gradients whose float value depends on the libm's
    // tanh. Those elements (|g| within 100 x eps of zero) are compared at the gradient level
    // only, above.
    for (int64_t i = 0; i < P; ++i)
      if (std::abs(g[i]) < 100 * oc.eps) w[i] = ref[i] = w0[i];
    for (int64_t l = 0; l < cfg.model.layers && cfg.model.bias; ++l) {
      const ParamSpec& b = layout.find(cat("h.", l, ".attn.qkv.b"));
      const int64_t D = m.head_dim(), G = m.heads / m.kv();
      for (int64_t g = 0; g < m.kv(); ++g)  // key head g's rows follow its G query heads'
        for (int64_t d = 0; d < D; ++d) {
          const int64_t i = b.offset + (g * (G + 2) + G) * D + d;
          w[i] = ref[i] = w0[i];
        }
    }
    std::vector<float> du(P), dr(P);
    for (int64_t i = 0; i < P; ++i) du[i] = w[i] - w0[i], dr[i] = ref[i] - w0[i];
    for (const ParamSpec& p : layout.tensors()) {
      EXPECT_LT(rel_diff(w.data() + p.offset, ref.data() + p.offset, p.numel), 1e-5) << name << " " << p.name;
      // The update itself, a much smaller quantity than the weights, to 1e-3.
      EXPECT_LT(rel_diff(du.data() + p.offset, dr.data() + p.offset, p.numel), 1e-3) << name << " " << p.name;
    }
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, TorchReference,
    ::testing::Values(Variant{"sequential", false, 0, true}, Variant{"window3", false, 3, true},
                      Variant{"parallel_nobias", true, 0, false}, Variant{"parallel_window", true, 3, true},
                      // The Llama block: RMSNorm, RoPE, SwiGLU, 4 query heads over 2 key/value
                      // heads, an untied LM head.
                      Variant{"llama", false, 0, false, kLlama},
                      // Multi-query, tied, RoPE with Llama 3.1's scaling in all three of its
                      // regimes (head size 8: wavelengths 6, 63, 628 and 6283 against 16 and 64).
                      Variant{"llama_mqa_tied_scaled", false, 0, false,
                              {"model.norm=rmsnorm", "model.position_encoding=rope", "model.mlp=swiglu",
                               "model.mlp_hidden=40", "model.kv_heads=1", "model.rope_scaling=llama3",
                               "model.rope_original_positions=64", "model.rope_factor=8"}},
                      // Qwen2-like biases with GQA, the parallel block and a window.
                      Variant{"llama_parallel_window_bias", true, 3, true, kLlama},
                      // The variant keys are independent: LayerNorm and GELU with RoPE and GQA.
                      Variant{"rope_gqa_layernorm_gelu", false, 0, true,
                              {"model.position_encoding=rope", "model.kv_heads=2", "model.rope_theta=100"}},
                      // Packed documents against a block-diagonal causal mask: GPT-2's block, and
                      // Llama's with GQA and a window that cuts inside the documents.
                      Variant{"documents", false, 0, true, {"data.document_mask=true"}, true},
                      Variant{"llama_documents_window", false, 2, false, kLlamaDocuments, true},
                      // ... and the loss without the targets that begin a document.
                      Variant{"documents_without_end_loss", true, 0, true,
                              {"data.document_mask=true", "data.document_end_loss=false"}, true},
                      // Mixtures of experts (docs/notes/moe.md), their routers' losses in the
                      // gradients: softmax top-2 of 4, renormalized, with the balance and z
                      // losses and two experts whose scores tie everywhere (some at the 2nd place);
                      Variant{"moe_softmax_ties", false, 0, false,
                              with(kLlama, {"model.experts=4", "model.experts_per_token=2", "model.expert_hidden=24",
                                            "moe.aux_loss=0.1", "moe.z_loss=0.01"}),
                              false, true, true, false},
                      // sigmoid top-1 of 8, scaled and not renormalized, a shared expert, the first
                      // layer dense; some expert gets no token;
                      Variant{"moe_sigmoid_shared_idle", false, 0, false,
                              with(kLlama, {"model.experts=8", "model.experts_per_token=1", "model.expert_hidden=16",
                                            "model.router_score=sigmoid", "model.router_norm_topk=false",
                                            "model.router_scale=2.5", "model.shared_experts=1",
                                            "model.shared_expert_hidden=20", "model.dense_layers=1",
                                            "moe.aux_loss=0.05"}),
                              false, false, false, true},
                      // DeepSeek-V3's routing: sigmoid scores renormalized, a bias on the keys of
                      // the choice (random here; never trained: unchanged by both steps), 2 of 4
                      // groups of 2; and a capacity that drops rows (the lowest weights);
                      Variant{"moe_groups_capacity", false, 0, false,
                              with(kLlama, {"model.experts=8", "model.experts_per_token=3", "model.expert_hidden=16",
                                            "model.router_score=sigmoid", "model.router_bias=true", "model.router_groups=4",
                                            "model.router_top_groups=2", "moe.capacity_factor=1.25",
                                            "moe.aux_loss=0.02"}),
                              false, false, false, false, true},
                      // Qwen3's attention: a head size apart from d_model / heads (12, not 8),
                      // RMSNorm on each query and key head before RoPE; dense, and with experts
                      // (Qwen3-MoE); OLMoE's: one RMSNorm over a token's queries, one over its keys;
                      Variant{"qwen3_head_dim_qk_norm", false, 0, false,
                              with(kLlama, {"model.head_dim=12", "model.qk_norm=head"})},
                      Variant{"qwen3_moe", false, 0, false,
                              with(kLlama, {"model.head_dim=12", "model.qk_norm=head", "model.experts=4",
                                            "model.experts_per_token=2", "model.expert_hidden=20", "moe.aux_loss=0.01"})},
                      Variant{"olmoe", false, 0, false,
                              with(kLlama, {"model.qk_norm=all", "model.kv_heads=4", "model.experts=8",
                                            "model.experts_per_token=2", "model.expert_hidden=16",
                                            "model.router_norm_topk=false", "moe.aux_loss=0.01"})},
                      // the parallel block over packed documents, every second layer MoE.
                      Variant{"moe_parallel_documents", true, 0, true,
                              with(kLlamaDocuments, {"model.experts=4", "model.experts_per_token=3",
                                                     "model.moe_every=2", "moe.z_loss=0.001"}),
                              true}),
    [](const auto& info) { return std::string(info.param.name); });

// Hugging Face's Llama-block decoders, checked independently of Myriad's own export:
// tools/torch_reference.py --hf-write writes a random model in transformers' layout of a family
// (q_proj/k_proj/v_proj, gate_proj/up_proj, Qwen3's q_norm/k_norm, the MoE blocks' gate and
// per-expert tensors; safetensors of its own writing; config.json in transformers 4's or 5's
// form) and its logits by a separate HF-style forward (repeat_kv, rotate_half, a softmax router
// with torch.topk, each expert on its tokens). Myriad imports it: the weights come back as the
// ones the script was given, bit for bit, and Myriad's logits of the imported model are the
// script's.
struct HfCase {
  const char* name;
  const char* family;  // llama, qwen3, qwen3_moe, mixtral
  int generation;      // transformers' config form: 4 or 5
  std::vector<std::string> block;
};

class HfDecoder : public ::testing::TestWithParam<HfCase> {};

TEST_P(HfDecoder, ImportOfTransformersLayoutGivesTheSameModel) {
  const HfCase v = GetParam();
  const int B = 2;
  // A vocabulary that covers the byte tokenizer's 256 ids, which the import takes for it.
  std::vector<std::string> sets = {"model.layers=2", "model.d_model=32", "model.heads=4", "model.seq_len=8",
                                   "model.vocab_size=256", "model.bias=false", "train.micro_batch=2",
                                   "train.global_batch=2"};
  sets.insert(sets.end(), v.block.begin(), v.block.end());
  const Config cfg = parse_config("", "test", sets);
  Gpt model(cfg);
  std::vector<int32_t> tokens;
  const fs::path dir = fs::temp_directory_path() / cat("myriad_hf_", v.name, "_", ::getpid());
  write_reference_inputs(dir, cfg, model, B, tokens);
  const std::string cmd = cat("/usr/bin/python3 ", MYRIAD_SOURCE_DIR, "/tools/torch_reference.py --hf-write ", v.family,
                              " ", dir.string(), " --hf-generation ", v.generation, " > ", (dir / "log.txt").string(), " 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "tools/torch_reference.py --hf-write failed; log in " << (dir / "log.txt");

  checkpoint::import_hf((dir / "hf").string(), (dir / "ckpt").string());
  const nlohmann::json meta = checkpoint::read_meta((dir / "ckpt").string());
  const Config imported = parse_config(meta.at("config").get<std::string>(), "meta");
  for (const auto& [key, a, b] : {std::tuple<const char*, int64_t, int64_t>{"kv_heads", imported.model.kv(), cfg.model.kv()},
                                  {"mlp_hidden", imported.model.ffn(), cfg.model.ffn()},
                                  {"vocab_size", imported.model.vocab_size, cfg.model.vocab_size}})
    EXPECT_EQ(a, b) << key;
  EXPECT_EQ(imported.model.tied_embeddings, cfg.model.tied_embeddings);
  EXPECT_EQ(imported.model.rope_theta, cfg.model.rope_theta);
  EXPECT_EQ(imported.model.rope_scaling, cfg.model.rope_scaling);
  EXPECT_EQ(imported.model.norm_eps, cfg.model.norm_eps);
  EXPECT_EQ(imported.model.head_dim(), cfg.model.head_dim());
  EXPECT_EQ(imported.model.qk_norm, cfg.model.qk_norm);
  for (const auto& [key, a, b] : {std::tuple<const char*, int64_t, int64_t>{"experts", imported.model.experts, cfg.model.experts},
                                  {"moe layers", imported.model.moe_layers(), cfg.model.moe_layers()}})
    EXPECT_EQ(a, b) << key;
  if (cfg.model.moe()) {
    EXPECT_EQ(imported.model.experts_per_token, cfg.model.experts_per_token);
    EXPECT_EQ(imported.model.expert_ffn(), cfg.model.expert_ffn());
    EXPECT_EQ(imported.model.router_norm_topk, cfg.model.router_norm_topk);
    for (int64_t l = 0; l < cfg.model.layers; ++l) EXPECT_EQ(imported.model.layer_is_moe(l), cfg.model.layer_is_moe(l)) << l;
  }

  // The imported weights, gathered into a model of the same config.
  Config same = imported;
  same.model.seq_len = cfg.model.seq_len;
  Gpt back(same);
  ASSERT_EQ(back.num_params(), model.num_params());
  std::vector<checkpoint::Shard> shards;
  for (const ParamSpec& p : back.layout().tensors()) {
    const ParamLayout::Stored r = back.layout().stored(p);
    shards.push_back({"model/" + p.name, r.global_shape, r.offset, r.shape, back.params() + p.offset});
  }
  checkpoint::load((dir / "ckpt").string(), meta, shards);
  for (const ParamSpec& p : back.layout().tensors())
    EXPECT_EQ(std::memcmp(back.params() + p.offset, model.params() + p.offset, p.numel * sizeof(float)), 0) << p.name;

  const int T = static_cast<int>(cfg.model.seq_len), V = static_cast<int>(cfg.model.vocab_size);
  const int64_t Vp = cfg.padded_vocab();
  back.loss(tokens.data(), B);
  std::vector<double> hf(static_cast<size_t>(B) * T * V);
  std::ifstream in(dir / "hf_logits.bin", std::ios::binary);
  in.read(reinterpret_cast<char*>(hf.data()), hf.size() * sizeof(double));
  ASSERT_TRUE(in) << dir / "hf_logits.bin";
  double d = 0, r = 0;
  for (int64_t n = 0; n < int64_t(B) * T; ++n)
    for (int j = 0; j < V; ++j) {
      const double a = back.logits()[n * Vp + j], b = hf[n * V + j];
      d += (a - b) * (a - b), r += b * b;
    }
  EXPECT_LT(std::sqrt(d / r), 1e-5);
  fs::remove_all(dir);
}

const std::vector<std::string> kQwen3 = {"model.norm=rmsnorm", "model.norm_eps=1e-6", "model.position_encoding=rope",
                                         "model.rope_theta=1000000", "model.mlp=swiglu", "model.mlp_hidden=40",
                                         "model.kv_heads=2", "model.head_dim=16", "model.qk_norm=head"};
const std::vector<std::string> kExperts = {"model.experts=4", "model.experts_per_token=2", "model.expert_hidden=12",
                                           "model.tied_embeddings=false"};

INSTANTIATE_TEST_SUITE_P(
    Families, HfDecoder,
    ::testing::Values(HfCase{"llama_gqa_untied", "llama", 4, kLlama},
                      HfCase{"llama_mqa_tied_scaled", "llama", 4,
                             {"model.norm=rmsnorm", "model.position_encoding=rope", "model.mlp=swiglu",
                              "model.mlp_hidden=40", "model.kv_heads=1", "model.rope_scaling=llama3",
                              "model.rope_original_positions=64", "model.rope_factor=8"}},
                      HfCase{"llama_mha_v5", "llama", 5,
                             {"model.norm=rmsnorm", "model.position_encoding=rope", "model.mlp=swiglu",
                              "model.mlp_hidden=64", "model.tied_embeddings=false"}},
                      // Qwen3: a head size (16) apart from d_model / heads (8), per-head norms, tied.
                      HfCase{"qwen3_tied", "qwen3", 4, kQwen3},
                      HfCase{"qwen3_untied_v5", "qwen3", 5, with(kQwen3, {"model.tied_embeddings=false"})},
                      // Qwen3-MoE: a dense first layer (mlp_only_layers [0]), renormalized weights;
                      // then every second layer sparse (decoder_sparse_step 2), not renormalized.
                      HfCase{"qwen3_moe_dense_first", "qwen3_moe", 4, with(with(kQwen3, kExperts), {"model.dense_layers=1"})},
                      HfCase{"qwen3_moe_sparse_step_v5", "qwen3_moe", 5,
                             with(with(kQwen3, kExperts), {"model.moe_every=2", "model.router_norm_topk=false",
                                                           "model.layers=4"})},
                      HfCase{"mixtral", "mixtral", 4,
                             with(kExperts, {"model.norm=rmsnorm", "model.norm_eps=1e-5", "model.position_encoding=rope",
                                             "model.mlp=swiglu", "model.mlp_hidden=12", "model.kv_heads=1"})},
                      HfCase{"mixtral_v5", "mixtral", 5,
                             with(kExperts, {"model.norm=rmsnorm", "model.position_encoding=rope", "model.mlp=swiglu",
                                             "model.kv_heads=2", "model.experts=3", "model.experts_per_token=3",
                                             "model.mlp_hidden=12"})}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
