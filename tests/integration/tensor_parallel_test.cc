// Tensor (+ sequence) parallel training through the launcher against the single-process run:
// the same losses at every step, the same final weights once the shards are gathered (the
// checkpoint loader reassembles them), and sampling from the sharded checkpoint.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

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

std::vector<double> losses(const fs::path& run) {
  std::vector<double> out;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line)["loss"]);
  return out;
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
  int tp;
  std::string extra;
};

class TensorParallel : public ::testing::TestWithParam<Layout> {};

TEST_P(TensorParallel, MatchesTheSingleProcessRun) {
  const Layout l = GetParam();
  const fs::path dir = fs::temp_directory_path() / cat("myriad_tp_", l.name, "_", getpid());
  fs::create_directories(dir);
  std::string data = (dir / "corpus").string(), out;
  const std::string bin = cat(MYRIAD_BINARY_DIR, "/myriad");
  ASSERT_EQ(sh(cat(bin, " prepare --input /usr/share/games/fortunes/science --tokenizer byte --output ",
                   data, " --valid-fraction 0.1 --doc-separator %"), &out), 0) << out;
  const std::string args = cat(
      " train --config ", MYRIAD_SOURCE_DIR, "/configs/demo.toml --set model.layers=2",
      " --set model.d_model=64 --set model.seq_len=32 --set train.steps=20 --set train.eval_every=10",
      " --set optim.warmup_steps=4 --set checkpoint.every=20 --set data.train=", data, "_train",
      " --set data.valid=", data, "_valid ", l.extra);
  ASSERT_EQ(sh(cat("OMP_NUM_THREADS=1 ", bin, args, " --run-dir ", (dir / "single").string()), &out), 0) << out;
  ASSERT_EQ(sh(cat("OMP_NUM_THREADS=1 ", bin, " launch --nproc-per-node ", l.tp, " --", args,
                   " --set parallel.tp=", l.tp, " --run-dir ", (dir / "tp").string()), &out), 0) << out;

  // The ranks of the group took their batches from one reader through shared memory.
  std::ifstream log(dir / "tp/logs/rank_00001.log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("batches shared through memory"), std::string::npos) << text;

  std::vector<double> a = losses(dir / "single"), b = losses(dir / "tp");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u) << "metrics.jsonl is written once, by one rank";
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-4 * a[i]) << "step " << i + 1;

  const bool parallel_block = l.extra.find("parallel_block=true") != std::string::npos;
  Config cfg = parse_config("", "t", {"model.layers=2", "model.d_model=64", "model.seq_len=32",
                                      cat("model.parallel_block=", parallel_block ? "true" : "false")});
  auto wa = weights(dir / "single", cfg), wb = weights(dir / "tp", cfg);
  for (auto& [name, w] : wa) {
    double d = 0, r = 0;
    for (size_t i = 0; i < w.size(); ++i) d += std::pow(double(w[i]) - wb[name][i], 2), r += double(w[i]) * w[i];
    EXPECT_LT(std::sqrt(d / std::max(r, 1e-30)), 1e-4) << name;
  }
  // The sharded checkpoint samples in one process.
  ASSERT_EQ(sh(cat(bin, " sample --checkpoint ", (dir / "tp").string(), " --prompt 'The ' --tokens 20"), &out), 0) << out;
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, TensorParallel,
    ::testing::Values(Layout{"tp2", 2, ""}, Layout{"tp2_sp", 2, "--set parallel.sequence_parallel=true"},
                      Layout{"tp4_parallel_window", 4, "--set model.parallel_block=true --set model.window=12"},
                      Layout{"tp4_sp_window", 4, "--set parallel.sequence_parallel=true --set model.window=12"}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
