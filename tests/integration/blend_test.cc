// A blend of training sources end to end, started as a user starts it: two sources prepared
// apart and trained as a weighted blend on two processes, killed mid-epoch of the small one and
// resumed in another layout (dp 2 -> tp 2), against the unbroken run; each validation source's
// loss in metrics.jsonl and in the TensorBoard files; bad sources refused with one line.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "observe/tensorboard.h"
#include "test_util.h"

namespace fs = std::filesystem;
using myriad::cat;
using myriad::test::jsonl;
using myriad::test::last_line;
using myriad::test::Result;
using myriad::test::run_myriad;

namespace {

class BlendRun : public ::testing::Test {
 protected:
  static fs::path dir_;
  static std::string science_, pratchett_, computers_;

  // science (split 0.9 / 0.1), computers (the same) and pratchett, a file of 401 bytes: about 11
  // samples of 32 tokens, so that a blend passes over it many times in 20 steps.
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / cat("myriad_blend_", getpid());
    fs::create_directories(dir_);
    for (const auto& [name, split] : {std::pair<std::string, bool>{"science", true}, {"computers", true}, {"pratchett", false}}) {
      const Result r = run_myriad(cat("prepare --input /usr/share/games/fortunes/", name, " --tokenizer byte --output ",
                                      (dir_ / name).string(), split ? " --valid-fraction 0.1" : "", " --doc-separator %"));
      ASSERT_EQ(r.code, 0) << r.output << "\n(the fortunes package comes with scripts/setup.sh)";
    }
    science_ = (dir_ / "science").string(), computers_ = (dir_ / "computers").string();
    pratchett_ = (dir_ / "pratchett").string();
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // The blend: science 3 parts, pratchett 1; validation on science's and computers' held-out
  // documents. 20 steps of 8 sequences.
  static std::string train(const fs::path& run, const std::string& extra) {
    return cat("train --config ", MYRIAD_SOURCE_DIR, "/configs/demo.toml --run-dir ", run.string(),
               " --set model.layers=2 --set model.d_model=32 --set model.seq_len=32 --set train.steps=20",
               " --set train.global_batch=8 --set train.micro_batch=4 --set optim.warmup_steps=2 --set train.log_every=1",
               " --set train.eval_every=10 --set train.eval_steps=1",
               " --set 'data.train=[{name = \"science\", path = \"", science_, "_train\", weight = 3}, {name = \"pratchett\", "
               "path = \"", pratchett_, "\", weight = 1}]'",
               " --set 'data.valid=[{name = \"science\", path = \"", science_, "_valid\"}, {name = \"computers\", path = \"",
               computers_, "_valid\"}]' ", extra);
  }
};
fs::path BlendRun::dir_;
std::string BlendRun::science_, BlendRun::pratchett_, BlendRun::computers_;

TEST_F(BlendRun, ResumesInAnotherLayoutOnTheUnbrokenStreamAndValidatesEachSource) {
  const std::string launch = "launch --nproc-per-node 2 -- ";
  Result r = run_myriad(cat(launch, train(dir_ / "straight", "--set parallel.dp=2")), "OMP_NUM_THREADS=1");
  ASSERT_EQ(r.code, 0) << r.output;
  // The start says each source's share, size and expected epochs; pratchett runs out and starts
  // over in a new order, and says so.
  EXPECT_NE(r.output.find("data: source 'science' ("), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("75.0% of the samples"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("data: source 'pratchett' starts its epoch 2 (a new order)"), std::string::npos) << r.output;

  // Killed right after step 10 (its checkpoint committed), then resumed on tensor parallelism.
  // Rank 0 kills itself, after its metrics line: a kill of rank 1 first could stop rank 0 before
  // it wrote step 10's (parallel_test says the same).
  r = run_myriad(cat(launch, train(dir_ / "resumed", "--set parallel.dp=2 --set checkpoint.every=10 --set checkpoint.async=false")),
                 "OMP_NUM_THREADS=1 MYRIAD_INJECT_FAULT=step:10:kill@rank=0");
  EXPECT_NE(r.code, 0) << r.output;
  r = run_myriad(cat(launch, train(dir_ / "resumed", "--set parallel.tp=2 --resume auto")), "OMP_NUM_THREADS=1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("step_00000010 (step 10, 80 samples consumed)"), std::string::npos) << r.output;

  std::map<int64_t, nlohmann::json> a, b;
  for (const nlohmann::json& m : jsonl(dir_ / "straight/metrics.jsonl")) a[m["step"]] = m;
  for (const nlohmann::json& m : jsonl(dir_ / "resumed/metrics.jsonl")) b[m["step"]] = m;
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  // The same samples in the same order: the losses of another layout (its sums in another
  // order) within rounding; a different batch would be off by percents.
  for (int64_t step = 1; step <= 20; ++step) {
    EXPECT_NEAR(b[step]["loss"].get<double>(), a[step]["loss"].get<double>(), 1e-4 * a[step]["loss"].get<double>()) << step;
    EXPECT_DOUBLE_EQ(b[step]["epochs/pratchett"].get<double>(), a[step]["epochs/pratchett"].get<double>()) << step;
  }
  // Exact proportions: after 20 steps (160 samples) science has 120 and pratchett 40.
  const double pratchett_samples = 40 / a[20]["epochs/pratchett"].get<double>();
  EXPECT_GT(pratchett_samples, 5);
  EXPECT_LT(pratchett_samples, 20);

  // Each validation source's loss at steps 10 and 20, and val_loss their token-weighted mean
  // (equal tokens here: the plain mean).
  for (int64_t step : {10, 20}) {
    const nlohmann::json& m = a[step];
    ASSERT_TRUE(m.contains("val_loss/science") && m.contains("val_loss/computers")) << m.dump();
    const double sci = m["val_loss/science"], comp = m["val_loss/computers"];
    EXPECT_NE(sci, comp);
    EXPECT_NEAR(m["val_loss"].get<double>(), (sci + comp) / 2, 1e-6);
    EXPECT_NEAR(b[step]["val_loss/computers"].get<double>(), comp, 1e-4 * comp);
  }
  EXPECT_FALSE(a[9].contains("val_loss/science"));
  // The same in TensorBoard, under "lm loss validation/<name>".
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir_ / "straight/tensorboard")) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  std::map<std::string, std::map<int64_t, float>> tags;
  for (const myriad::TensorBoardScalar& s : myriad::read_tensorboard(files[0].string())) tags[s.tag][s.step] = s.value;
  EXPECT_EQ(tags["lm loss validation/science"][10], float(a[10]["val_loss/science"].get<double>()));
  EXPECT_EQ(tags["lm loss validation/computers"][20], float(a[20]["val_loss/computers"].get<double>()));
  EXPECT_EQ(tags["data/epochs/science"].size(), 20u);
}

// In one layout a resumed blend is the unbroken run bit for bit; under new weights it keeps
// each source's place, says what changed, and balances afresh.
TEST_F(BlendRun, ResumesBitwiseAndUnderNewWeightsKeepsEachSourcesPlace) {
  Result r = run_myriad(train(dir_ / "one", ""));
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_myriad(train(dir_ / "split", "--set checkpoint.every=10 --set checkpoint.async=false"),
                 "MYRIAD_INJECT_FAULT=step:10:kill");
  EXPECT_NE(r.code, 0) << r.output;
  r = run_myriad(train(dir_ / "split", "--resume auto"));
  ASSERT_EQ(r.code, 0) << r.output;
  std::map<int64_t, nlohmann::json> a, b;
  for (const nlohmann::json& m : jsonl(dir_ / "one/metrics.jsonl")) a[m["step"]] = m;
  for (const nlohmann::json& m : jsonl(dir_ / "split/metrics.jsonl")) b[m["step"]] = m;
  ASSERT_EQ(b.size(), 20u);
  for (int64_t step = 1; step <= 20; ++step) EXPECT_EQ(b[step]["loss"], a[step]["loss"]) << step;
  EXPECT_EQ(myriad::test::read_file(dir_ / "one/checkpoints/step_00000020/shard_00000.bin"),
            myriad::test::read_file(dir_ / "split/checkpoints/step_00000020/shard_00000.bin"));
  // The same checkpoint continued with pratchett weighing 3 (was 1): half the samples from here.
  const std::string heavier = cat(" --set 'data.train=[{name = \"science\", path = \"", science_, "_train\", weight = 3}, "
                                  "{name = \"pratchett\", path = \"", pratchett_, "\", weight = 3}]'");
  r = run_myriad(train(dir_ / "reweighted", "--set train.steps=10 --set checkpoint.every=10 --set checkpoint.async=false"));
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_myriad(train(dir_ / "reweighted", "--resume auto" + heavier));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("the blend changed since the checkpoint (source 'pratchett' weighs 3, was 1): each source keeps "
                          "its place and its order, and the balancing starts afresh at sample 80"), std::string::npos) << r.output;
  std::map<int64_t, nlohmann::json> c;
  for (const nlohmann::json& m : jsonl(dir_ / "reweighted/metrics.jsonl")) c[m["step"]] = m;
  ASSERT_EQ(c.size(), 20u);
  // pratchett's epochs: 20 of 80 samples before, then 40 of the next 80.
  const double per = a[10]["epochs/pratchett"].get<double>() / 20;  // epochs per sample
  EXPECT_NEAR(c[10]["epochs/pratchett"].get<double>(), 20 * per, 1e-12);
  EXPECT_NEAR(c[20]["epochs/pratchett"].get<double>(), 60 * per, 1e-12);
}

// data.document_mask end to end: the same blend from the same weights loses differently on its
// first step (rows cross document boundaries in the packed fortunes), in training and validation.
TEST_F(BlendRun, DocumentMaskChangesWhatEachTokenSees) {
  const std::string steps = "--set train.steps=2 --set train.eval_every=1";
  const Result plain = run_myriad(train(dir_ / "plain", steps));
  ASSERT_EQ(plain.code, 0) << plain.output;
  const Result docs = run_myriad(train(dir_ / "docs", steps + " --set data.document_mask=true"));
  ASSERT_EQ(docs.code, 0) << docs.output;
  EXPECT_NE(docs.output.find("attention stays inside each document"), std::string::npos) << docs.output;
  const auto a = jsonl(dir_ / "plain" / "metrics.jsonl"), b = jsonl(dir_ / "docs" / "metrics.jsonl");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (const char* key : {"loss", "val_loss/science", "val_loss/computers"}) {
    const double x = a[0][key].get<double>(), y = b[0][key].get<double>();
    EXPECT_TRUE(std::isfinite(y)) << key;
    EXPECT_GT(std::abs(x - y), 1e-6 * x) << key << ": the mask changed nothing";
  }
  // Without the starts' end positions in the loss, the losses are other again.
  const Result ends = run_myriad(train(dir_ / "ends", steps + " --set data.document_mask=true --set data.document_end_loss=false"));
  ASSERT_EQ(ends.code, 0) << ends.output;
  const auto c = jsonl(dir_ / "ends" / "metrics.jsonl");
  ASSERT_EQ(c.size(), 2u);
  EXPECT_GT(std::abs(c[0]["loss"].get<double>() - b[0]["loss"].get<double>()), 1e-6);
  const Result alone = run_myriad(train(dir_ / "alone", "--set data.document_end_loss=false"));
  EXPECT_EQ(alone.code, 2) << alone.output;
  EXPECT_NE(last_line(alone.output).find("data.document_end_loss = false leaves out"), std::string::npos) << alone.output;
}

TEST_F(BlendRun, BadSourcesAreRefusedWithOneLineNamingThem) {
  auto refused = [&](const std::string& set, const std::string& words) {
    const Result r = run_myriad(cat("train --config ", MYRIAD_SOURCE_DIR, "/configs/demo.toml --run-dir ",
                                    (dir_ / "bad").string(), " --set model.seq_len=32 --set data.valid= ", set));
    EXPECT_EQ(r.code, 2) << set << "\n" << r.output;
    EXPECT_NE(last_line(r.output).find(words), std::string::npos) << set << "\n" << r.output;
  };
  const std::string two = cat("{name = \"science\", path = \"", science_, "_train\"}, ");
  refused(cat("--set 'data.train=[", two, "{name = \"p\", path = \"", pratchett_, "\", weight = 0}]'"),
          "data.train's source 'p' has weight 0");
  refused(cat("--set 'data.train=[", two, "{name = \"p\", path = \"", pratchett_, "\", weight = \"a lot\"}]'"),
          "data.train[1].weight must be a number, got a string");
  refused(cat("--set 'data.train=[", two, "{name = \"gone\", path = \"", (dir_ / "nothing").string(), "\"}]'"),
          (dir_ / "nothing").string());
  // A source of another tokenizer: its sidecar says gpt2.
  const std::string gpt2 = (dir_ / "gpt2").string();
  ASSERT_EQ(run_myriad(cat("prepare --input /usr/share/games/fortunes/goedel --tokenizer gpt2 --output ", gpt2,
                           " --doc-separator %")).code, 0);
  refused(cat("--set 'data.train=[", two, "{name = \"g\", path = \"", gpt2, "\"}]'"), "data.train's source 'g' was prepared "
          "with the gpt2 tokenizer");
  // A source too short for one sample.
  refused(cat("--set model.seq_len=512 --set model.positions=512 --set 'data.train=[", two, "{name = \"p\", path = \"",
              pratchett_, "\"}]'"), "pratchett.bin");
  // Every source capped below the run's samples.
  refused(cat("--set 'data.train=[{name = \"p\", path = \"", pratchett_, "\", epochs = 2}]' --set train.steps=100"),
          "data.train's sources are all capped (epochs)");
}

}  // namespace
