// The `myriad` binary end to end, started the way a user starts it: prepare, train, resume,
// sample, and the exit code and one-line message of each kind of bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "test_util.h"
#include "observe/tensorboard.h"

namespace fs = std::filesystem;
using myriad::cat;

namespace {

using myriad::test::Result;
using myriad::test::expect_input_error;
using myriad::test::last_line;
using myriad::test::read_file;


// `myriad ARGS` in this process's own environment (the thread count included), ENV added.
Result run(const std::string& args, const std::string& env = "") {
  return myriad::test::run_shell(cat(env, env.empty() ? "" : " ", MYRIAD_BINARY_DIR, "/myriad ", args, " 2>&1"));
}


// What `myriad sample` printed: everything after its log line.
std::string sample_text(const std::string& out) {
  const std::string mark = "prompt tokens\n";
  size_t at = out.find(mark);
  return at == std::string::npos ? "" : out.substr(at + mark.size());
}

std::vector<nlohmann::json> metrics(const fs::path& run_dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}


class Cli : public ::testing::Test {
 protected:
  static fs::path dir_;
  static std::string data_;  // prefix of the prepared corpus (byte tokens)

  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / cat("myriad_cli_", getpid());
    fs::create_directories(dir_);
    data_ = (dir_ / "corpus").string();
    Result r = run(cat("prepare --input /usr/share/games/fortunes/computers --input "
                    "/usr/share/games/fortunes/science --tokenizer byte --output ", data_,
                    " --valid-fraction 0.1 --doc-separator %"));
    ASSERT_EQ(r.code, 0) << r.output << "\n(the fortunes package comes with scripts/setup.sh)";
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // A tiny model on the prepared corpus; `extra` adds flags.
  static std::string train_args(const fs::path& run_dir, const std::string& extra) {
    return cat("train --config ", MYRIAD_SOURCE_DIR, "/configs/demo.toml --run-dir ", run_dir.string(),
               " --set model.layers=2 --set model.d_model=32 --set model.seq_len=32",
               " --set train.global_batch=8 --set train.micro_batch=4 --set optim.warmup_steps=2",
               " --set train.eval_every=0 --set data.train=", data_, "_train --set data.valid=", data_,
               "_valid ", extra);
  }
};
fs::path Cli::dir_;
std::string Cli::data_;

TEST_F(Cli, ResumeIsBitwiseIdentical) {
  const fs::path straight = dir_ / "straight", split = dir_ / "split";
  Result a = run(train_args(straight, "--set train.steps=8 --set checkpoint.every=4 --set optim.name=lamb"));
  ASSERT_EQ(a.code, 0) << a.output;
  // Killed after step 5, one step past its checkpoint: the rerun must redo step 5 exactly. (The
  // saves are synchronous, so that step 4's is committed by then: an asynchronous one may not be.)
  Result b = run(train_args(split, "--set train.steps=8 --set checkpoint.every=4 --set optim.name=lamb "
                                   "--set checkpoint.async=false"), "MYRIAD_INJECT_FAULT=step:5:kill");
  ASSERT_EQ(b.code, 128 + 9) << b.output;
  ASSERT_EQ(metrics(split).size(), 5u);
  // The second half runs in a new process from the step-4 checkpoint.
  Result c = run(train_args(split, "--set train.steps=8 --set checkpoint.every=4 --set optim.name=lamb --resume auto"));
  ASSERT_EQ(c.code, 0) << c.output;
  EXPECT_NE(c.output.find("resume: "), std::string::npos) << c.output;

  auto ma = metrics(straight), mb = metrics(split);
  ASSERT_EQ(ma.size(), 8u);
  ASSERT_EQ(mb.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(ma[i]["step"], mb[i]["step"]);
    EXPECT_EQ(ma[i]["loss"].get<double>(), mb[i]["loss"].get<double>()) << "step " << i + 1;
    EXPECT_EQ(ma[i]["grad_norm"].get<double>(), mb[i]["grad_norm"].get<double>()) << "step " << i + 1;
  }
  // TensorBoard: every logged step's scalars, the loss as metrics.jsonl has it. The resumed run
  // wrote a second file from step 5 on (TensorBoard drops the first file's step 5).
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(straight / "tensorboard")) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  std::map<std::string, int> tags;
  for (const myriad::TensorBoardScalar& s : myriad::read_tensorboard(files[0].string())) {
    ++tags[s.tag];
    if (s.tag == "lm loss") {
      EXPECT_EQ(s.value, float(ma[s.step - 1]["loss"].get<double>())) << s.step;
    }
  }
  for (const char* t : {"lm loss", "learning-rate", "grad-norm", "iteration-time", "throughput/tokens_per_s",
                        "phase/forward_ms", "phase/backward_ms", "phase/optimizer_ms"})
    EXPECT_EQ(tags[t], 8) << t;
  files.clear();
  for (const auto& e : fs::directory_iterator(split / "tensorboard")) files.push_back(e.path());
  ASSERT_EQ(files.size(), 2u);
  std::sort(files.begin(), files.end());
  EXPECT_EQ(myriad::read_tensorboard(files[1].string()).at(0).step, 5);
  // Weights and optimizer state, bit for bit.
  const std::string wa = read_file(straight / "checkpoints/step_00000008/shard_00000.bin");
  ASSERT_FALSE(wa.empty());
  EXPECT_TRUE(wa == read_file(split / "checkpoints/step_00000008/shard_00000.bin"));
}

// A mixture of experts trains, resumes bitwise (the routing is deterministic: the rows go to the
// experts in one order), samples, and is never filled from a dense checkpoint, or the reverse.
TEST_F(Cli, AMixtureOfExpertsResumesBitwiseAndNeverTakesADenseModelsWeights) {
  // With DeepSeek-V3's bias (a power of two of a rate, so that its sums are exact).
  const std::string moe = "--set model.mlp=swiglu --set model.experts=4 --set model.experts_per_token=2 "
                          "--set model.expert_hidden=48 --set model.shared_experts=1 --set model.dense_layers=1 "
                          "--set model.router_bias=true --set moe.bias_rate=0.015625 "
                          "--set moe.z_loss=0.001 --set train.steps=8 --set checkpoint.every=4 ";
  const fs::path straight = dir_ / "moe_straight", split = dir_ / "moe_split";
  Result a = run(train_args(straight, moe));
  ASSERT_EQ(a.code, 0) << a.output;
  Result b = run(train_args(split, moe + "--set checkpoint.async=false"), "MYRIAD_INJECT_FAULT=step:5:kill");
  ASSERT_EQ(b.code, 128 + 9) << b.output;
  Result c = run(train_args(split, moe + "--resume auto"));
  ASSERT_EQ(c.code, 0) << c.output;
  auto ma = metrics(straight), mb = metrics(split);
  ASSERT_EQ(ma.size(), 8u);
  ASSERT_EQ(mb.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(ma[i]["loss"].get<double>(), mb[i]["loss"].get<double>()) << "step " << i + 1;
  const std::string wa = read_file(straight / "checkpoints/step_00000008/shard_00000.bin");
  ASSERT_FALSE(wa.empty());
  EXPECT_TRUE(wa == read_file(split / "checkpoints/step_00000008/shard_00000.bin"));
  Result s = run(cat("sample --checkpoint ", straight.string(), " --prompt 'The ' --tokens 16 --seed 3"));
  EXPECT_EQ(s.code, 0) << s.output;
  // Each step's load: layer 1 (the first is dense) sent 8 x 32 tokens x 2 rows to its experts;
  // the imbalance is max / mean (at least 1), the routers' losses those the gradients took.
  for (const nlohmann::json& m : ma) {
    ASSERT_TRUE(m.contains("expert_load")) << m.dump();
    ASSERT_EQ(m["expert_load"].size(), 1u) << m.dump();
    double rows = 0, most = 0;
    for (double t : m["expert_load"]["1"].get<std::vector<double>>()) rows += t, most = std::max(most, t);
    EXPECT_EQ(rows, 8 * 32 * 2) << m.dump();
    EXPECT_DOUBLE_EQ(m["expert_imbalance/1"].get<double>(), most / (rows / 4)) << m.dump();
    EXPECT_GT(m["moe_aux_loss"].get<double>(), 0) << m.dump();
    EXPECT_GT(m["moe_z_loss"].get<double>(), 0) << m.dump();
  }
  // The bias after 4 steps: each step moved it by the rate toward that step's mean load.
  {
    std::vector<double> want(4, 0.0);
    for (size_t i = 0; i < 4; ++i) {
      const auto load = ma[i]["expert_load"]["1"].get<std::vector<double>>();
      for (size_t e = 0; e < 4; ++e) want[e] += 0.015625 * ((128.0 > load[e]) - (128.0 < load[e]));  // mean 512 / 4
    }
    const std::string ckpt = (straight / "checkpoints/step_00000004").string();
    std::vector<float> bias(4);
    myriad::checkpoint::load(ckpt, myriad::checkpoint::read_meta(ckpt),
                             {{"model/h.1.mlp.router.bias", {4}, {0}, {4}, bias.data()}});
    for (size_t e = 0; e < 4; ++e) EXPECT_EQ(bias[e], want[e]) << "expert " << e;
    EXPECT_NE(want, std::vector<double>(4, 0.0)) << "the loads were never uneven: the test saw no update";
  }
  std::map<std::string, int> tb;
  for (const auto& e : fs::directory_iterator(straight / "tensorboard"))
    for (const myriad::TensorBoardScalar& x : myriad::read_tensorboard(e.path().string())) ++tb[x.tag];
  for (const char* t : {"moe/aux_loss", "moe/z_loss", "moe/imbalance/layer_1"}) EXPECT_EQ(tb[t], 8) << t;
  // With a capacity the rows past it are dropped and counted: kept + dropped = every routed row.
  const fs::path capped = dir_ / "moe_capped";
  ASSERT_EQ(run(train_args(capped, moe + "--set moe.capacity_factor=1.0 --set train.steps=2")).code, 0);
  for (const nlohmann::json& m : metrics(capped)) {
    double rows = 0;
    for (double t : m["expert_load"]["1"].get<std::vector<double>>()) {
      rows += t;
      EXPECT_LE(t, 2 * 64) << m.dump();  // 2 micro-batches of 4 x 32 tokens: at most 64 rows of each
    }
    EXPECT_EQ(rows + m["moe_dropped"].get<double>(), 8 * 32 * 2) << m.dump();
  }
  // The report draws the load (layer x expert over the steps) from the metrics alone.
  Result rep = myriad::test::run_shell(cat(MYRIAD_BINARY_DIR, "/myriad report ", straight.string(), " 2>&1"));
  EXPECT_EQ(rep.code, 0) << rep.output;
  EXPECT_NE(rep.output.find("expert load: 1 MoE layers x 4 experts over 8 logged steps (1..8)"), std::string::npos)
      << rep.output;
  EXPECT_TRUE(fs::exists(straight / "report/experts.png"));
  // A dense checkpoint into an MoE model and the reverse: refused, naming both kinds.
  const fs::path dense = dir_ / "moe_dense";
  ASSERT_EQ(run(train_args(dense, "--set model.mlp=swiglu --set train.steps=1")).code, 0);
  expect_input_error(run(train_args(dir_ / "moe_from_dense", moe + "--set checkpoint.init_from=" + dense.string())),
                     "model.experts = 0 in the checkpoint (a dense model) but 4 in the config (a mixture of experts)");
  expect_input_error(run(train_args(dir_ / "dense_from_moe", "--set model.mlp=swiglu --set checkpoint.init_from=" +
                                                                 straight.string())),
                     "model.experts = 4 in the checkpoint (a mixture of experts) but 0 in the config (a dense model)");
  expect_input_error(run(train_args(dense, moe + "--resume auto")),
                     "model.experts = 0 in the checkpoint (a dense model) but 4 in the config (a mixture of experts)");
  // Other layers MoE, other expert widths: the weights would not land where they belong.
  expect_input_error(run(train_args(dir_ / "moe_shifted", moe + "--set model.dense_layers=0 --set checkpoint.init_from=" +
                                                             straight.string())),
                     "model.dense_layers = 1 and model.moe_every = 1 in the checkpoint but 0 and 1 in the config");
  expect_input_error(run(train_args(dir_ / "moe_wider", moe + "--set model.expert_hidden=64 --set checkpoint.init_from=" +
                                                            straight.string())),
                     "model.expert_hidden = 48 in the checkpoint but 64 in the config");
}

// Warmup-stable-decay, continued: a 20-step run saved at step 10 (the stable phase) and
// continued to 30 steps decays at its new end, trains steps 11-20 at the peak where the short
// run decayed, and ends on min_lr.
TEST_F(Cli, AWsdRunContinuedWithMoreStepsDecaysAtItsNewEnd) {
  const fs::path run_dir = dir_ / "wsd";
  const std::string wsd = "--set optim.decay=wsd --set optim.decay_steps=4 --set optim.lr=0.002 --set optim.min_lr=0.0002 "
                          "--set checkpoint.every=10 --set train.log_every=1 ";
  Result r = run(train_args(run_dir, wsd + "--set train.steps=20"));
  ASSERT_EQ(r.code, 0) << r.output;
  std::map<int64_t, double> lr;
  for (const nlohmann::json& m : metrics(run_dir)) lr[m["step"]] = m["lr"];
  EXPECT_DOUBLE_EQ(lr[16], 0.002);
  EXPECT_LT(lr[17], 0.002);
  EXPECT_NEAR(lr[20], 0.0002, 1e-12);
  r = run(train_args(run_dir, wsd + "--set train.steps=30 --set checkpoint.resume=" + (run_dir / "checkpoints/step_00000010").string()));
  ASSERT_EQ(r.code, 0) << r.output;
  lr.clear();
  for (const nlohmann::json& m : metrics(run_dir)) lr[m["step"]] = m["lr"];
  ASSERT_EQ(lr.size(), 30u);
  for (int64_t step = 11; step <= 26; ++step) EXPECT_DOUBLE_EQ(lr[step], 0.002) << step;
  EXPECT_LT(lr[27], 0.002);
  EXPECT_GT(lr[27], lr[28]);
  EXPECT_NEAR(lr[30], 0.0002, 1e-12);
}

TEST_F(Cli, SampleFromCheckpointIsDeterministic) {
  const fs::path rd = dir_ / "sample";
  ASSERT_EQ(run(train_args(rd, "--set train.steps=3")).code, 0);
  Result a = run(cat("sample --checkpoint ", rd.string(), " --prompt 'The ' --tokens 40 --seed 3"));
  Result b = run(cat("sample --checkpoint ", (rd / "checkpoints/step_00000003").string(),
                  " --prompt 'The ' --tokens 40 --seed 3"));
  ASSERT_EQ(a.code, 0) << a.output;
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_EQ(sample_text(a.output).rfind("The ", 0), 0u) << a.output;
  EXPECT_GT(sample_text(a.output).size(), 8u) << a.output;
  EXPECT_EQ(sample_text(a.output), sample_text(b.output));
  Result g = run(cat("sample --checkpoint ", rd.string(), " --prompt 'The ' --tokens 40 --seed 4"));
  EXPECT_NE(sample_text(a.output), sample_text(g.output)) << "different seeds, same sample";
  // A temperature too small for a normal double (a denormal) is a number like any other: as
  // good as greedy. One too large for a double is out of range, and the error says so.
  Result greedy = run(cat("sample --checkpoint ", rd.string(), " --prompt 'The ' --tokens 40 --temperature 0"));
  Result tiny = run(cat("sample --checkpoint ", rd.string(), " --prompt 'The ' --tokens 40 --temperature 1e-320"));
  ASSERT_EQ(greedy.code, 0) << greedy.output;
  ASSERT_EQ(tiny.code, 0) << tiny.output;
  EXPECT_EQ(sample_text(tiny.output), sample_text(greedy.output));
  Result huge = run(cat("sample --checkpoint ", rd.string(), " --prompt 'The ' --temperature 1e400"));
  EXPECT_EQ(huge.code, 2) << huge.output;
  EXPECT_NE(last_line(huge.output).find("--temperature is out of range, got '1e400'"), std::string::npos) << huge.output;
}

TEST_F(Cli, BadConfigAndCommandLine) {
  expect_input_error(run(train_args(dir_ / "bad", "--set model.layer=3")), "did you mean 'model.layers'");
  expect_input_error(run(train_args(dir_ / "bad", "--set model.heads=5")), "model.d_model (32) must be divisible by model.heads (5)");
  expect_input_error(run(train_args(dir_ / "bad", "--set model.d_model=thirty")), "model.d_model must be an integer");
  expect_input_error(run("train --config /nonexistent.toml"), "/nonexistent.toml");
  expect_input_error(run(train_args(dir_ / "bad", "--set data.train=/nonexistent/x")), "/nonexistent/x");
  expect_input_error(run(train_args(dir_ / "bad", "--run-dri x")), "did you mean 'run-dir'");
  expect_input_error(run("trian"), "did you mean 'train'");
}

TEST_F(Cli, BadTokenFiles) {
  const fs::path bad = dir_ / "badtokens";
  fs::create_directories(bad);
  // Bad magic.
  fs::copy_file(data_ + "_train.bin", bad / "magic.bin");
  std::string idx = read_file(data_ + "_train.idx");
  std::string broken = idx;
  broken[0] = 'X';
  std::ofstream(bad / "magic.idx", std::ios::binary) << broken;
  expect_input_error(run(train_args(dir_ / "bad", cat("--set data.train=", (bad / "magic").string()))), "magic.idx");
  // Truncated token file.
  std::string bin = read_file(data_ + "_train.bin");
  std::ofstream(bad / "short.bin", std::ios::binary) << bin.substr(0, bin.size() / 2);
  fs::copy_file(data_ + "_train.idx", bad / "short.idx");
  expect_input_error(run(train_args(dir_ / "bad", cat("--set data.train=", (bad / "short").string()))), "short.bin");
  // Token ids beyond the model's vocabulary.
  expect_input_error(run(train_args(dir_ / "bad", "--set model.vocab_size=100")), "vocab");
}

TEST_F(Cli, BadCheckpoints) {
  const fs::path rd = dir_ / "ckpt";
  ASSERT_EQ(run(train_args(rd, "--set train.steps=2")).code, 0);
  // A different model.
  expect_input_error(run(train_args(rd, "--set train.steps=4 --set model.d_model=64 --resume auto")),
                     "model.d_model = 32 in the checkpoint but 64");
  // The same shapes, another block: a text key differs (LayerNorm's tensors without biases are
  // RMSNorm's).
  const fs::path nb = dir_ / "ckpt_nobias";
  ASSERT_EQ(run(train_args(nb, "--set train.steps=2 --set model.bias=false")).code, 0);
  expect_input_error(run(train_args(nb, "--set train.steps=4 --set model.bias=false --set model.norm=rmsnorm --resume auto")),
                     "model.norm = \"layernorm\" in the checkpoint but \"rmsnorm\" in the config");
  // One flipped byte in the tensor data.
  const fs::path shard = rd / "checkpoints/step_00000002/shard_00000.bin";
  std::string bytes = read_file(shard);
  bytes[bytes.size() / 6] ^= 0x10;  // inside the model's weights (a third of the file)
  std::ofstream(shard, std::ios::binary) << bytes;
  expect_input_error(run(train_args(rd, "--set train.steps=4 --resume auto")), "checksum mismatch");
  expect_input_error(run(cat("sample --checkpoint ", rd.string(), " --prompt x")), "checksum mismatch");
}

TEST_F(Cli, FailedSaveNeverDamagesTheCommittedCheckpoint) {
  const fs::path rd = dir_ / "failsave";
  ASSERT_EQ(run(train_args(rd, "--set train.steps=2")).code, 0);
  const std::string before = read_file(rd / "checkpoints/step_00000002/shard_00000.bin");
  // A full disk in the middle of the next save: a runtime fault (retryable), nothing committed.
  Result full = run(train_args(rd, "--set train.steps=4 --resume auto"), "MYRIAD_INJECT_FAULT=checkpoint_write:fail");
  EXPECT_EQ(full.code, 3) << full.output;
  EXPECT_NE(last_line(full.output).find("No space left"), std::string::npos) << full.output;
  EXPECT_FALSE(fs::exists(rd / "checkpoints/step_00000004"));
  // Killed in the middle of the save.
  Result killed = run(train_args(rd, "--set train.steps=4 --resume auto"), "MYRIAD_INJECT_FAULT=checkpoint_write:kill");
  EXPECT_EQ(killed.code, 128 + 9) << killed.output;
  EXPECT_FALSE(fs::exists(rd / "checkpoints/step_00000004"));
  EXPECT_EQ(read_file(rd / "checkpoints/step_00000002/shard_00000.bin"), before);
  // The next attempt resumes from step 2 and finishes; partial leftovers are cleaned up.
  Result ok = run(train_args(rd, "--set train.steps=4 --resume auto"));
  ASSERT_EQ(ok.code, 0) << ok.output;
  EXPECT_NE(ok.output.find("step 2, "), std::string::npos) << ok.output;
  EXPECT_TRUE(fs::exists(rd / "checkpoints/step_00000004/COMMITTED"));
  for (const auto& e : fs::directory_iterator(rd / "checkpoints"))
    EXPECT_EQ(e.path().filename().string().find("partial"), std::string::npos) << e.path();
  EXPECT_EQ(metrics(rd).size(), 4u);
}

}  // namespace

namespace {
// `myriad plan` end to end: a prediction, a search, and its bad input.
TEST(Plan, PredictsSearchesAndRefusesBadInput) {
  const std::string base = cat("plan --config ", MYRIAD_SOURCE_DIR, "/configs/gpt-175b.toml --cluster ", MYRIAD_SOURCE_DIR,
                               "/configs/clusters/a100-megascale.toml --batch 768 --gpus 256");
  Result p = run(cat(base, " --layout tp=8,pp=8,v=6,mb=1 --features megascale"));
  EXPECT_EQ(p.code, 0) << p.output;
  EXPECT_NE(p.output.find("layout tp 8 x pp 8 (v 6) x dp 4"), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("| MFU "), std::string::npos) << p.output;
  Result s = run(cat(base, " --search"));
  EXPECT_EQ(s.code, 0) << s.output;
  EXPECT_NE(s.output.find("#1 layout"), std::string::npos) << s.output;
  Result bad = run(cat(base, " --layout tp=8,pp=7"));
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("does not divide 256 GPUs"), std::string::npos) << bad.output;
  Result missing = run(cat("plan --config ", MYRIAD_SOURCE_DIR, "/configs/gpt-175b.toml --gpus 8 --cluster /nonexistent.toml"));
  EXPECT_EQ(missing.code, 2) << missing.output;
  EXPECT_NE(missing.output.find("/nonexistent.toml"), std::string::npos) << missing.output;
}

// A layout that divides the GPUs but not the memory is as impossible as one that does not
// divide: its prediction is shown, and the exit code says so. A key given twice is refused.
TEST(Plan, ALayoutThatDoesNotFitAndARepeatedKeyAreInputErrors) {
  const std::string base = cat("plan --config ", MYRIAD_SOURCE_DIR, "/configs/gpt-175b.toml --cluster ", MYRIAD_SOURCE_DIR,
                               "/configs/clusters/a100-megascale.toml --batch 768 --gpus 256");
  Result big = run(cat(base, " --layout tp=1,pp=1,mb=1"));
  EXPECT_EQ(big.code, 2) << big.output;
  EXPECT_NE(big.output.find("DOES NOT FIT"), std::string::npos) << big.output;
  EXPECT_NE(big.output.find("\nmyriad: input error: plan: the layout does not fit: needs "), std::string::npos)
      << big.output;
  // The hint names the recompute modes that keep less than the layout's, and none past full.
  EXPECT_NE(big.output.find("or recompute=norms, recompute=selective, recompute=full\n"), std::string::npos)
      << big.output;
  Result full = run(cat(base, " --layout tp=1,pp=1,mb=1,recompute=full"));
  EXPECT_EQ(full.code, 2) << full.output;
  EXPECT_EQ(full.output.find("recompute=norms"), std::string::npos) << full.output;
  Result twice = run(cat(base, " --layout tp=8,tp=4,pp=8"));
  EXPECT_EQ(twice.code, 2) << twice.output;
  EXPECT_NE(twice.output.find("myriad: input error: plan: --layout 'tp=8,tp=4,pp=8' gives tp twice"), std::string::npos)
      << twice.output;
  EXPECT_EQ(twice.output.find("layout tp"), std::string::npos) << "no prediction for an ambiguous layout: " << twice.output;
}
}  // namespace
