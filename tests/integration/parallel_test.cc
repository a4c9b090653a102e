// 3D-parallel training through the launcher against the single-process run: tensor (+
// sequence), pipeline (1F1B, interleaved) and data parallelism (sharded optimizer) and their
// combinations give the same losses at every step and the same final weights once the shards
// are gathered (the checkpoint loader reassembles them); sampling works from the sharded
// checkpoint; a 3D run resumed from its checkpoint is bitwise the uninterrupted one.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "core/config.h"
#include "core/error.h"
#include "model/params.h"

namespace fs = std::filesystem;
using namespace myriad;

namespace {

int sh(const std::string& cmd, std::string* out) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  out->clear();
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out->append(buf, n);
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<nlohmann::json> records(const fs::path& run) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::vector<double> losses(const fs::path& run) {
  std::vector<double> out;
  for (const nlohmann::json& r : records(run)) out.push_back(r["loss"]);
  return out;
}

// Every step's phase timers: compute was timed, the waits of the layout's kinds of
// communication are there, and the phases, disjoint, fit in the step.
void expect_phases(const fs::path& run, bool pp, bool dp) {
  for (const nlohmann::json& r : records(run)) {
    const int64_t step = r["step"];
    EXPECT_GT(r.value("forward_ms", 0.0), 0.0) << "step " << step;
    EXPECT_GT(r.value("backward_ms", 0.0), 0.0) << "step " << step;
    EXPECT_EQ(r.contains("bubble_ms"), pp) << "step " << step;
    EXPECT_EQ(r.contains("dp_wait_ms"), dp) << "step " << step;
    double sum = 0;
    for (const char* k : {"forward_ms", "backward_ms", "bubble_ms", "dp_wait_ms", "optimizer_ms"}) {
      EXPECT_GE(r.value(k, 0.0), 0.0) << k << ", step " << step;
      sum += r.value(k, 0.0);
    }
    EXPECT_LE(sum, r["step_ms"].get<double>() + 1e-3) << "step " << step;
  }
}

// Every model tensor of the latest checkpoint under run, whole (gathered from its pieces).
std::map<std::string, std::vector<float>> weights(const fs::path& run, const Config& cfg) {
  auto dir = checkpoint::latest((run / "checkpoints").string());
  EXPECT_TRUE(dir.has_value());
  nlohmann::json meta = checkpoint::read_meta(*dir);
  ParamLayout layout(cfg);
  std::map<std::string, std::vector<float>> w;
  std::vector<checkpoint::Shard> shards;
  for (const ParamSpec& p : layout.tensors()) w[p.name].resize(p.numel);
  for (const ParamSpec& p : layout.tensors()) {
    ParamLayout::Stored r = layout.stored(p);
    shards.push_back({"model/" + p.name, r.global_shape, r.offset, r.shape, w[p.name].data()});
  }
  checkpoint::load(*dir, meta, shards);
  return w;
}

struct Layout {
  const char* name;
  int nproc;          // processes: tp x pp x dp
  std::string extra;  // the layout's --set flags
};

// ctest names the test cases by this, not by the struct's bytes.
void PrintTo(const Layout& l, std::ostream* os) { *os << l.name; }

// The last line of a rank's log that contains `what`.
std::string log_line(const fs::path& run, int rank, const std::string& what) {
  std::ifstream log(run / "logs" / cat("rank_0000", rank, ".log"));
  std::string found;
  for (std::string line; std::getline(log, line);)
    if (line.find(what) != std::string::npos) found = line;
  return found;
}

int64_t optimizer_bytes(const fs::path& run, int rank) {
  const std::string l = log_line(run, rank, "memory: optimizer state ");
  const size_t at = l.find("optimizer state ");
  return at == std::string::npos ? -1 : std::stoll(l.substr(at + 16));
}

// The flags of a layout that change the model (or optimizer), which the single-process run
// must share; the parallel.* ones are the layout's own.
std::string model_extra(const std::string& extra) {
  std::string out;
  std::istringstream in(extra);
  for (std::string flag, kv; in >> flag >> kv;)
    if (kv.rfind("parallel.", 0) != 0) out += " " + flag + " " + kv;
  return out;
}

const std::string kModel = " --set model.layers=4 --set model.d_model=64 --set model.seq_len=32";

// The test model's config (kModel), with the model.* flags of `extra`.
Config test_config(const std::string& extra = "") {
  std::vector<std::string> model = {"model.layers=4", "model.d_model=64", "model.seq_len=32"};
  std::istringstream flags(extra);
  for (std::string flag, kv; flags >> flag >> kv;)
    if (kv.rfind("model.", 0) == 0) model.push_back(kv);
  return parse_config("", "t", model);
}

std::string bin() { return cat(MYRIAD_BINARY_DIR, "/myriad"); }

// Makes `dir` with the science fortunes in it as byte tokens; returns the arguments of a
// 20-step `train` of the test model on them.
std::string prepare_corpus(const fs::path& dir) {
  fs::create_directories(dir);
  const std::string data = (dir / "corpus").string();
  std::string out;
  EXPECT_EQ(sh(cat(bin(), " prepare --input /usr/share/games/fortunes/science --tokenizer byte --output ",
                   data, " --valid-fraction 0.1 --doc-separator %"), &out), 0) << out;
  return cat(" train --config ", MYRIAD_SOURCE_DIR, "/configs/demo.toml", kModel,
             " --set train.steps=20 --set optim.warmup_steps=4 --set data.train=", data,
             "_train --set data.valid=", data, "_valid");
}

class Parallel : public ::testing::TestWithParam<Layout> {};

const std::string kLlama =
    "--set model.norm=rmsnorm --set model.position_encoding=rope --set model.mlp=swiglu --set model.mlp_hidden=176 "
    "--set model.kv_heads=2 --set model.tied_embeddings=false --set model.bias=false";

const std::string kMoe = kLlama + " --set model.experts=4 --set model.experts_per_token=2 --set model.expert_hidden=88 "
                                   "--set moe.aux_loss=0.01 --set moe.z_loss=0.001";

TEST_P(Parallel, MatchesTheSingleProcessRun) {
  const Layout l = GetParam();
  const fs::path dir = fs::temp_directory_path() / cat("myriad_tp_", l.name, "_", getpid());
  const std::string args = prepare_corpus(dir) + " --set train.eval_every=10 --set checkpoint.every=20" +
                           model_extra(l.extra);
  std::string out;
  ASSERT_EQ(sh(cat("OMP_NUM_THREADS=1 ", bin(), args, " --run-dir ", (dir / "single").string()), &out), 0) << out;
  ASSERT_EQ(sh(cat("OMP_NUM_THREADS=1 ", bin(), " launch --nproc-per-node ", l.nproc, " --", args,
                   " ", l.extra, " --run-dir ", (dir / "tp").string()), &out), 0) << out;
  const Config cfg = test_config(l.extra);

  // The ranks of a tensor-parallel group took their batches from one reader through shared
  // memory.
  if (l.extra.find("parallel.tp=") != std::string::npos) {
    EXPECT_NE(log_line(dir / "tp", 1, "batches shared through memory"), "");
  }
  // Expert parallelism: the experts' groups, as the log says them.
  auto degree = [&](const std::string& key) {  // parallel.<key> in the layout's flags, else 1
    const size_t at = l.extra.find("parallel." + key + "=");
    return at == std::string::npos ? 1 : std::stoi(l.extra.substr(at + key.size() + 10));
  };
  if (degree("ep") > 1) {
    const int tp = degree("tp"), dp = degree("dp"), ep = degree("ep"), cp = degree("cp");
    EXPECT_NE(log_line(dir / "tp", 0, cat("(experts: ep ", ep, " x edp ", tp * cp * dp / ep, ")")), "")
        << "the expert groups fold tp x cp x dp = " << tp * cp * dp << " ranks";
    // The routing at init is uneven: some micro-batch gave a rank's experts more than the
    // balanced share, and their rows went to a buffer grown for them (GptModel::expert_acts).
    if (std::string(l.name) == "moe_ep2_dp2") {
      EXPECT_NE(log_line(dir / "tp", 0, "moe: this rank's experts took"), "");
    }
  }
  // Context parallelism: each rank holds its two chunks of every sequence; with documents each
  // step's record says how even the ranks' attention work was (1: even; the fortunes are
  // shorter than a sequence, so their chunks' work differs).
  if (degree("cp") > 1 && l.extra.find("data.document_mask=true") != std::string::npos) {
    for (const nlohmann::json& r : records(dir / "tp")) {
      EXPECT_GE(r.value("cp_imbalance", 0.0), 1.0) << r.dump();
      EXPECT_LT(r.value("cp_imbalance", 0.0), double(degree("cp"))) << r.dump();
    }
    for (const nlohmann::json& r : records(dir / "single")) EXPECT_FALSE(r.contains("cp_imbalance"));
  }
  if (degree("cp") > 1) {
    const int cp = degree("cp");
    const bool docs = l.extra.find("data.document_mask=true") != std::string::npos;
    EXPECT_NE(log_line(dir / "tp", degree("tp"),
                       cat("context parallel: ", cp, " ranks per sequence, this one holding ", 32 / cp, " of its 32 tokens (",
                           docs ? cat("two of its ", 2 * cp, " chunks, paired per micro-batch")
                                : cat("chunks 1 and ", 2 * cp - 2, " of ", 2 * cp, ")"))),
              "");
  }
  // ZeRO: each data-parallel rank keeps 1/dp of the optimizer state (the allocator's count).
  const size_t dp_at = l.extra.find("parallel.dp=");
  if (dp_at != std::string::npos) {
    const int dp = std::stoi(l.extra.substr(dp_at + 12));
    // m and v, and LAMB's update
    const int states = l.extra.find("optim.name=lamb") != std::string::npos ? 3 : 2;
    const int64_t whole = ParamLayout(cfg).total() * states * int64_t(sizeof(float));
    // Each data-parallel rank reads only its own rows of the global batch (8 in the demo).
    for (int r = 0; r < l.nproc; ++r) {
      const int tp = degree("tp"), cp = degree("cp");
      const int rows = 8 / dp, first = rows * ((r / (tp * cp)) % dp);  // order tp-(cp-)dp-pp: tp fastest
      EXPECT_NE(log_line(dir / "tp", r, cat("data: this rank reads rows [", first, ", ", first + rows,
                                            ") of each global batch of 8")), "") << "rank " << r;
    }
    for (int r = 0; r < l.nproc; ++r) {
      const int64_t mine = optimizer_bytes(dir / "tp", r);
      EXPECT_GT(mine, 0) << "rank " << r;
      if (l.nproc == dp * degree("cp")) {  // sharded over dp x cp (the ranks holding the same weights)
        EXPECT_NEAR(double(mine), double(whole) / l.nproc, 8.0 * l.nproc) << "rank " << r;
      } else {
        EXPECT_LT(mine, whole / dp + 8 * dp) << "rank " << r;  // 3D: a shard of a shard
      }
    }
  }

  std::vector<double> a = losses(dir / "single"), b = losses(dir / "tp");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u) << "metrics.jsonl is written once, by one rank";
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-4 * a[i]) << "step " << i + 1;
  expect_phases(dir / "single", false, false);
  expect_phases(dir / "tp", l.extra.find("parallel.pp=") != std::string::npos,
                dp_at != std::string::npos || degree("cp") > 1);

  auto wa = weights(dir / "single", cfg), wb = weights(dir / "tp", cfg);
  for (auto& [name, w] : wa) {
    double d = 0, r = 0;
    for (size_t i = 0; i < w.size(); ++i) d += std::pow(double(w[i]) - wb[name][i], 2), r += double(w[i]) * w[i];
    EXPECT_LT(std::sqrt(d / std::max(r, 1e-30)), 1e-4) << name;
  }
  // The sharded checkpoint samples in one process.
  ASSERT_EQ(sh(cat(bin(), " sample --checkpoint ", (dir / "tp").string(), " --prompt 'The ' --tokens 20"), &out), 0) << out;
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Parallel,
    ::testing::Values(
        Layout{"tp2", 2, "--set parallel.tp=2"},
        Layout{"tp2_sp", 2, "--set parallel.tp=2 --set parallel.sequence_parallel=true"},
        Layout{"tp4_parallel_window", 4, "--set parallel.tp=4 --set model.parallel_block=true --set model.window=12"},
        Layout{"tp4_sp_window", 4, "--set parallel.tp=4 --set parallel.sequence_parallel=true --set model.window=12"},
        Layout{"pp2", 2, "--set parallel.pp=2"},
        Layout{"pp4", 4, "--set parallel.pp=4"},
        Layout{"pp2_interleaved", 2, "--set parallel.pp=2 --set parallel.virtual_stages=2"},
        Layout{"pp4_interleaved", 4, "--set parallel.pp=4 --set parallel.virtual_stages=2 --set model.layers=8"},
        Layout{"pp2_gpipe_uneven", 2, "--set parallel.pp=2 --set parallel.schedule=gpipe --set parallel.stage_layers=[1,3]"},
        Layout{"tp2_pp2", 4, "--set parallel.tp=2 --set parallel.pp=2 --set parallel.sequence_parallel=true"},
        Layout{"dp2", 2, "--set parallel.dp=2"},
        Layout{"dp4", 4, "--set parallel.dp=4 --set parallel.bucket_mb=0.05"},
        Layout{"dp2_lamb", 2, "--set parallel.dp=2 --set optim.name=lamb --set optim.lr=1e-2"},
        Layout{"tp2_pp2_dp2", 8, "--set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2 --set parallel.bucket_mb=0.05"},
        // The Llama block (RMSNorm, RoPE, SwiGLU, 4 query heads over 2 key/value heads, an
        // untied LM head): tp shards the key/value heads and SwiGLU's gate and up together.
        Layout{"llama_tp2_sp", 2, kLlama + " --set parallel.tp=2 --set parallel.sequence_parallel=true"},
        Layout{"llama_pp2_interleaved", 2, kLlama + " --set parallel.pp=2 --set parallel.virtual_stages=2"},
        Layout{"llama_dp2", 2, kLlama + " --set parallel.dp=2"},
        Layout{"llama_tp2_pp2_dp2", 8, kLlama + " --set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2 "
                                                "--set parallel.sequence_parallel=true --set parallel.bucket_mb=0.05"},
        // Attention inside the packed fortunes (data.document_mask): the starts travel with the
        // tokens to every stage, through the shared batch of a tensor-parallel group, and with
        // a window and full recompute on the way; the vocabulary-parallel loss leaves out the
        // targets that begin a document, over row chunks of the logits (both runs: 10 rows, 20
        // of tp 2's half of the vocabulary).
        Layout{"documents_tp2_sp_window", 2, "--set data.document_mask=true --set data.document_end_loss=false "
                                             "--set model.window=12 --set parallel.tp=2 "
                                             "--set parallel.sequence_parallel=true --set train.logits_mib=0.01"},
        Layout{"documents_pp2_interleaved_recompute", 2, "--set data.document_mask=true --set train.recompute=full "
                                                         "--set parallel.pp=2 --set parallel.virtual_stages=2"},
        Layout{"llama_documents_tp2_pp2_dp2", 8, kLlama + " --set data.document_mask=true --set parallel.tp=2 "
                                                          "--set parallel.pp=2 --set parallel.dp=2 "
                                                          "--set parallel.bucket_mb=0.05"},
        // Mixtures of experts without expert parallelism: every rank holds every expert, ZeRO
        // shards them as any tensor, the pipeline's stages hold whole MoE layers (a dense first
        // layer, a shared expert; the routers' losses in the gradients).
        Layout{"moe_dp2", 2, kMoe + " --set parallel.dp=2"},
        Layout{"moe_pp2_interleaved", 2, kMoe + " --set parallel.pp=2 --set parallel.virtual_stages=2"},
        // Qwen3-MoE's attention (its own head size, the query and key norms) over pp x dp.
        Layout{"qwen3_moe_pp2_dp2", 4, kMoe + " --set model.head_dim=24 --set model.qk_norm=head --set parallel.pp=2 "
                                              "--set parallel.dp=2"},
        // (DeepSeek-V3's bias, moved by the job-wide load: every replica and stage alike.)
        Layout{"moe_pp2_dp2", 4, kMoe + " --set model.dense_layers=1 --set model.shared_experts=1 --set parallel.pp=2 "
                                        "--set parallel.dp=2 --set parallel.bucket_mb=0.05 --set model.router_bias=true "
                                        "--set moe.bias_rate=0.01 --set model.router_score=sigmoid"},
        // Expert parallelism, folded into dp: each rank holds E / ep experts, tokens go to their
        // experts' ranks and back by all-to-all; the experts' ZeRO group is dp / ep ranks.
        Layout{"moe_ep2_dp2", 2, kMoe + " --set parallel.dp=2 --set parallel.ep=2"},
        // (ep 2 x edp 2, 8 experts, a dense layer, a shared expert, the bias, capacity drops, and
        // full recompute: the rows go out again in the backward's refill.)
        Layout{"moe_ep2_dp4", 4, kMoe + " --set model.experts=8 --set model.dense_layers=1 --set model.shared_experts=1 "
                                        "--set model.router_bias=true --set moe.bias_rate=0.01 "
                                        "--set moe.capacity_factor=1.0 --set train.recompute=full "
                                        "--set fault.sdc_check_every=5 --set parallel.dp=4 --set parallel.ep=2 "
                                        "--set parallel.bucket_mb=0.05"},
        Layout{"moe_ep2_pp2_dp2", 4, kMoe + " --set parallel.pp=2 --set parallel.dp=2 --set parallel.ep=2"},
        // Under tp each rank routes its share of the tokens (the balance loss over the whole
        // micro-batch), the shared experts split as the dense MLP; the expert groups fold tp x dp.
        Layout{"moe_tp2", 2, kMoe + " --set model.shared_experts=1 --set parallel.tp=2"},
        // Qwen3's per-head query and key norms under tp (their gradients summed over the ranks' heads).
        Layout{"qwen3_moe_tp2", 2, kMoe + " --set model.head_dim=24 --set model.qk_norm=head --set parallel.tp=2"},
        Layout{"moe_tp2_sp_ep2", 2, kMoe + " --set parallel.tp=2 --set parallel.sequence_parallel=true "
                                           "--set parallel.ep=2 --set model.router_bias=true --set moe.bias_rate=0.01"},
        Layout{"moe_tp2_ep4_dp2", 4, kMoe + " --set model.shared_experts=1 --set parallel.tp=2 --set parallel.dp=2 "
                                            "--set parallel.ep=4 --set train.recompute=selective"},
        Layout{"moe_tp2_ep2_pp2", 4, kMoe + " --set parallel.tp=2 --set parallel.sequence_parallel=true "
                                            "--set parallel.pp=2 --set parallel.ep=2 --set model.dense_layers=1"},
        // Context parallelism: each sequence in 2 cp chunks, rank r holding r and 2 cp - 1 - r;
        // attention gathers the keys and values over cp. The GPT-2 block (learned positions)
        // and the Llama one, each alone and with documents and a window smaller than a chunk
        // (a chunk is 8 tokens at cp 2, 4 at cp 4), with the targets that begin a document left
        // out of the loss; over tp + sp, pp and dp.
        Layout{"cp2", 2, "--set parallel.cp=2"},
        // One micro-batch a step: each step's forward of layer 0 follows the last step's backward
        // of it, whose gathered keys and values (the weights before the update) it must not reuse.
        Layout{"cp2_llama_one_microbatch", 2, kLlama + " --set train.global_batch=1 --set train.micro_batch=1 "
                                                      "--set parallel.cp=2"},
        Layout{"cp2_llama_documents_window", 2, kLlama + " --set data.document_mask=true --set data.document_end_loss=false "
                                                        "--set model.window=6 --set parallel.cp=2"},
        Layout{"cp4_llama", 4, kLlama + " --set parallel.cp=4"},
        Layout{"cp4_documents_window", 4, "--set data.document_mask=true --set model.window=3 --set parallel.cp=4"},
        Layout{"cp2_tp2_sp_llama", 4, kLlama + " --set parallel.cp=2 --set parallel.tp=2 --set parallel.sequence_parallel=true"},
        Layout{"cp2_tp2_sp_documents_window", 4, "--set data.document_mask=true --set data.document_end_loss=false "
                                                 "--set model.window=6 --set parallel.cp=2 --set parallel.tp=2 "
                                                 "--set parallel.sequence_parallel=true"},
        Layout{"cp2_pp2", 4, "--set parallel.cp=2 --set parallel.pp=2"},
        Layout{"cp2_pp2_llama_documents_window", 4, kLlama + " --set data.document_mask=true --set model.window=6 "
                                                            "--set train.recompute=full --set parallel.cp=2 "
                                                            "--set parallel.pp=2 --set parallel.virtual_stages=2"},
        Layout{"cp2_dp2_llama", 4, kLlama + " --set parallel.cp=2 --set parallel.dp=2 --set parallel.bucket_mb=0.05"},
        Layout{"cp2_dp2_documents_window_lamb", 4, "--set data.document_mask=true --set model.window=6 "
                                                   "--set optim.name=lamb --set optim.lr=1e-2 --set parallel.cp=2 "
                                                   "--set parallel.dp=2"},
        // Context parallelism with experts: each cp rank routes its chunks' tokens, the balance
        // and z losses over the whole micro-batch; the expert groups fold cp too.
        Layout{"moe_cp2_documents", 2, kMoe + " --set model.shared_experts=1 --set model.router_bias=true "
                                              "--set moe.bias_rate=0.01 --set data.document_mask=true --set parallel.cp=2"},
        Layout{"moe_cp2_ep4_dp2", 4, kMoe + " --set model.experts=8 --set parallel.cp=2 --set parallel.dp=2 "
                                            "--set parallel.ep=4 --set train.recompute=selective"},
        Layout{"moe_ep2_pp2_dp2_interleaved", 4, kMoe + " --set parallel.pp=2 --set parallel.virtual_stages=2 "
                                                        "--set parallel.dp=2 --set parallel.ep=2 "
                                                        "--set train.recompute=selective"}),
    [](const auto& info) { return std::string(info.param.name); });

// A run of `nproc` ranks in layout `flags`, saved at step 10 and resumed, is bitwise the
// uninterrupted run: losses, gradient norms, weights and optimizer state.
void expect_resume_is_bitwise(const std::string& name, int nproc, const std::string& flags) {
  const fs::path dir = fs::temp_directory_path() / cat("myriad_resume_", name, "_", getpid());
  const std::string train = cat("OMP_NUM_THREADS=1 ", bin(), " launch --nproc-per-node ", nproc, " --",
                                prepare_corpus(dir), " --set checkpoint.every=10 --set checkpoint.keep_last=0 ", flags);
  std::string out;
  ASSERT_EQ(sh(cat(train, " --run-dir ", (dir / "straight").string()), &out), 0) << out;
  // Killed right after step 10 (its checkpoint committed: a synchronous save), then resumed.
  EXPECT_NE(sh(cat("MYRIAD_INJECT_FAULT=step:10:kill ", train, " --set checkpoint.async=false --run-dir ",
                   (dir / "resumed").string()), &out), 0);
  ASSERT_EQ(sh(cat(train, " --set checkpoint.resume=auto --run-dir ", (dir / "resumed").string()), &out), 0) << out;
  EXPECT_NE(out.find("step_00000010 (step 10, "), std::string::npos) << out;

  // By step: the kill may land after step 10's checkpoint committed and before rank 0 wrote its
  // metrics line (the kill is another rank's, and the launcher then stops them all), so the
  // killed attempt's last line may be missing; the resumed attempt's steps 11-20 may not.
  auto by_step = [](const fs::path& run) {
    std::map<int64_t, double> out;
    for (const nlohmann::json& r : records(run)) out[r["step"].get<int64_t>()] = r["loss"].get<double>();
    return out;
  };
  const std::map<int64_t, double> a = by_step(dir / "straight"), b = by_step(dir / "resumed");
  ASSERT_EQ(a.size(), 20u);
  for (int64_t step = 11; step <= 20; ++step) EXPECT_TRUE(b.count(step)) << "step " << step;
  for (const auto& [step, loss] : b) EXPECT_EQ(loss, a.at(step)) << "step " << step;
  // Every stored tensor (weights, both moments), bit for bit.
  auto last = [](const fs::path& run) { return *checkpoint::latest((run / "checkpoints").string()); };
  const nlohmann::json ma = checkpoint::read_meta(last(dir / "straight")), mb = checkpoint::read_meta(last(dir / "resumed"));
  const Config cfg = test_config(flags);
  ParamLayout layout(cfg);
  for (const char* prefix : {"model/", "optim/m/", "optim/v/"})
    for (const ParamSpec& p : layout.tensors()) {
      ParamLayout::Stored r = layout.stored(p);
      std::vector<float> wa(p.numel), wb(p.numel);
      checkpoint::load(last(dir / "straight"), ma, {{prefix + p.name, r.global_shape, r.offset, r.shape, wa.data()}});
      checkpoint::load(last(dir / "resumed"), mb, {{prefix + p.name, r.global_shape, r.offset, r.shape, wb.data()}});
      EXPECT_TRUE(wa == wb) << prefix << p.name;
    }
  fs::remove_all(dir);
}

TEST(Parallel3d, ResumeIsBitwiseTheUninterruptedRun) {
  expect_resume_is_bitwise("3d", 8, "--set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2 --set parallel.bucket_mb=0.05");
}

// Context parallelism (the Llama block, documents and a window smaller than a chunk of 8): the
// same, over cp 2 x dp 2.
TEST(ContextParallel, ResumeIsBitwiseTheUninterruptedRun) {
  expect_resume_is_bitwise("cp", 4, kLlama + " --set data.document_mask=true --set model.window=6 "
                                             "--set parallel.cp=2 --set parallel.dp=2");
}

// A checkpoint of one layout resumes in another (every rank reads its regions of the stored
// tensors, its owned optimizer state included): 10 steps on dp 2, then the other 10 on
// tp 2 x pp 2, match 20 steps of one process.
TEST(Parallel3d, ResumesInAnotherLayout) {
  const fs::path dir = fs::temp_directory_path() / cat("myriad_reshard_", getpid());
  const std::string train = cat("OMP_NUM_THREADS=1 ", bin(), " launch --nproc-per-node ");
  const std::string args = prepare_corpus(dir);
  std::string out;
  ASSERT_EQ(sh(cat("OMP_NUM_THREADS=1 ", bin(), args, " --run-dir ", (dir / "single").string()), &out), 0) << out;
  // Killed right after step 10, its checkpoint committed (a synchronous save; the schedule of 20
  // steps throughout). Rank 0 alone, after it logged the step: were every rank to kill itself,
  // rank 1's death could have the launcher kill rank 0 before its step-10 line (seen under load).
  EXPECT_NE(sh(cat("MYRIAD_INJECT_FAULT=step:10:kill@rank=0 ", train, 2, " --", args,
                   " --set checkpoint.every=10 --set checkpoint.async=false --set parallel.dp=2 --run-dir ",
                   (dir / "resharded").string()), &out), 0);
  ASSERT_EQ(sh(cat(train, 4, " --", args, " --set parallel.tp=2 --set parallel.pp=2 --resume auto --run-dir ",
                   (dir / "resharded").string()), &out), 0) << out;
  EXPECT_NE(out.find("step_00000010 (step 10, "), std::string::npos) << out;
  std::vector<double> a = losses(dir / "single"), b = losses(dir / "resharded");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-4 * a[i]) << "step " << i + 1;
  fs::remove_all(dir);
}

// A checkpoint of cp 4 resumes under cp 2, and that one's in one process: 5 steps on cp 4, 5
// on cp 2, 10 alone match 20 steps of one process (within 1e-4: the ranks' sums of the keys'
// gradients and of the loss's parts are another order of additions than one process's).
TEST(ContextParallel, ResumesUnderAnotherCp) {
  const fs::path dir = fs::temp_directory_path() / cat("myriad_cp_reshard_", getpid());
  const std::string launch = cat("OMP_NUM_THREADS=1 ", bin(), " launch --nproc-per-node ");
  const std::string args = prepare_corpus(dir) + " --set data.document_mask=true " + kLlama +
                           " --set checkpoint.every=5 --set checkpoint.async=false";
  std::string out;
  ASSERT_EQ(sh(cat("OMP_NUM_THREADS=1 ", bin(), args, " --run-dir ", (dir / "single").string()), &out), 0) << out;
  EXPECT_NE(sh(cat("MYRIAD_INJECT_FAULT=step:5:kill ", launch, 4, " --", args, " --set parallel.cp=4 --run-dir ",
                   (dir / "resharded").string()), &out), 0);
  EXPECT_NE(sh(cat("MYRIAD_INJECT_FAULT=step:10:kill ", launch, 2, " --", args,
                   " --set parallel.cp=2 --resume auto --run-dir ", (dir / "resharded").string()), &out), 0);
  EXPECT_NE(out.find("step_00000005 (step 5, "), std::string::npos) << out;
  ASSERT_EQ(sh(cat("OMP_NUM_THREADS=1 ", bin(), args, " --resume auto --run-dir ", (dir / "resharded").string()), &out),
            0) << out;
  EXPECT_NE(out.find("step_00000010 (step 10, "), std::string::npos) << out;
  std::map<int64_t, double> a, b;
  for (const nlohmann::json& r : records(dir / "single")) a[r["step"].get<int64_t>()] = r["loss"].get<double>();
  for (const nlohmann::json& r : records(dir / "resharded")) b[r["step"].get<int64_t>()] = r["loss"].get<double>();
  ASSERT_EQ(a.size(), 20u);
  for (int64_t step = 1; step <= 20; ++step) {
    if (!b.count(step)) {  // a kill may take the step's metrics line with it (ResumeIsBitwise says why)
      EXPECT_TRUE(step == 5 || step == 10) << "step " << step;
      continue;
    }
    EXPECT_NEAR(b.at(step), a.at(step), 1e-4 * a.at(step)) << "step " << step;
  }
  fs::remove_all(dir);
}

// The experts reshard on load as tensor shards do: 10 steps of an MoE model with each of 4 ranks
// holding one expert (ep 4), the other 10 with two stages of ep 2 x dp 2, match one process.
TEST(Parallel3d, AnMoeResumesWithAnotherExpertSplit) {
  const fs::path dir = fs::temp_directory_path() / cat("myriad_reshard_ep_", getpid());
  const std::string train = cat("OMP_NUM_THREADS=1 ", bin(), " launch --nproc-per-node 4 --");
  const std::string args = prepare_corpus(dir) + " " + kMoe + " --set model.router_bias=true --set moe.bias_rate=0.01";
  std::string out;
  ASSERT_EQ(sh(cat("OMP_NUM_THREADS=1 ", bin(), args, " --run-dir ", (dir / "single").string()), &out), 0) << out;
  EXPECT_NE(sh(cat("MYRIAD_INJECT_FAULT=step:10:kill ", train, args,
                   " --set checkpoint.every=10 --set checkpoint.async=false --set parallel.dp=4 --set parallel.ep=4 "
                   "--run-dir ", (dir / "resharded").string()), &out), 0);
  ASSERT_EQ(sh(cat(train, args, " --set parallel.pp=2 --set parallel.dp=2 --set parallel.ep=2 --resume auto --run-dir ",
                   (dir / "resharded").string()), &out), 0) << out;
  EXPECT_NE(out.find("step_00000010 (step 10, "), std::string::npos) << out;
  // By step: the killed attempt's step-10 line may be missing (the kill of one rank stops the
  // others, rank 0 perhaps before it wrote it); the resumed attempt's steps 11-20 may not.
  std::map<int64_t, double> resumed;
  for (const nlohmann::json& r : records(dir / "resharded")) resumed[r["step"].get<int64_t>()] = r["loss"].get<double>();
  std::vector<double> a = losses(dir / "single");
  ASSERT_EQ(a.size(), 20u);
  for (int64_t step = 11; step <= 20; ++step) EXPECT_TRUE(resumed.count(step)) << "step " << step;
  for (const auto& [step, loss] : resumed) EXPECT_NEAR(loss, a[step - 1], 1e-4 * a[step - 1]) << "step " << step;
  fs::remove_all(dir);
}

// Trains `train` (a launch, 20 steps) into dir/on, and again with `off` set into dir/off: the same
// losses and weights, bit for bit. The model's flags are in `extra`.
void expect_off_gives_the_same_bits(const fs::path& dir, const std::string& train, const std::string& off,
                                    const std::string& extra = "") {
  std::string out;
  ASSERT_EQ(sh(cat(train, " --run-dir ", (dir / "on").string()), &out), 0) << out;
  ASSERT_EQ(sh(cat(train, " --set ", off, " --run-dir ", (dir / "off").string()), &out), 0) << out;
  std::vector<double> a = losses(dir / "on"), b = losses(dir / "off");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
  const Config cfg = test_config(extra);
  auto wa = weights(dir / "on", cfg), wb = weights(dir / "off", cfg);
  for (auto& [name, w] : wa) EXPECT_TRUE(w == wb[name]) << name;
}

// Expert parallelism's exchanges waited for at once (moe.overlap_dispatch = false) instead of
// behind the shared experts' GEMMs: the same exchanges and the same arithmetic, so the same bits.
TEST(ExpertParallelOverlap, OffGivesTheSameBits) {
  const fs::path dir = fs::temp_directory_path() / cat("myriad_ep_overlap_", getpid());
  const std::string moe = kMoe + " --set model.shared_experts=1";
  expect_off_gives_the_same_bits(dir, cat("OMP_NUM_THREADS=1 ", bin(), " launch --nproc-per-node 2 --", prepare_corpus(dir),
                                          " ", moe, " --set parallel.dp=2 --set parallel.ep=2"),
                                 "moe.overlap_dispatch=false", moe);
  fs::remove_all(dir);
}

// Data-parallel overlap off (parallel.overlap_dp = false) runs the same collectives on the same
// buffers, serialized: the same bits as with overlap, and the waits are reported either way.
TEST(DataParallelOverlap, OffGivesTheSameBits) {
  const fs::path dir = fs::temp_directory_path() / cat("myriad_dp_overlap_", getpid());
  expect_off_gives_the_same_bits(dir, cat("OMP_NUM_THREADS=1 ", bin(), " launch --nproc-per-node 4 --",
                                          prepare_corpus(dir), " --set parallel.pp=2 --set parallel.dp=2",
                                          " --set parallel.bucket_mb=0.05"),
                                 "parallel.overlap_dp=false");
  expect_phases(dir / "on", true, true);
  expect_phases(dir / "off", true, true);
  fs::remove_all(dir);
}

// Context parallelism's overlap (parallel.overlap_cp): the backward's key/value gather started
// before the MLP's backward or at the attention's gives the same bits, over tp 2 + sp (whose own
// collectives run while the gather is in flight) and selective recompute.
TEST(ContextParallelOverlap, OffGivesTheSameBits) {
  const fs::path dir = fs::temp_directory_path() / cat("myriad_cp_overlap_", getpid());
  expect_off_gives_the_same_bits(dir, cat("OMP_NUM_THREADS=1 ", bin(), " launch --nproc-per-node 4 --",
                                          prepare_corpus(dir), " ", kLlama,
                                          " --set data.document_mask=true --set train.recompute=selective",
                                          " --set parallel.cp=2 --set parallel.tp=2 --set parallel.sequence_parallel=true"),
                                 "parallel.overlap_cp=false", kLlama);
  fs::remove_all(dir);
}

}  // namespace
