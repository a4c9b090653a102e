// Sampling on a GPU machine (`myriad sample`: load_for_inference, then generate). Sampling has
// no device option, so a checkpoint's train.device = auto must run a model the CUDA kernels
// cannot (head size 32, as an imported small GPT-2 has) on the CPU rather than fail; and the
// attention's kernel choice is logged once, not once per token (each token's context length is
// a new attention shape).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/config.h"
#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/generate.h"

namespace fs = std::filesystem;
using namespace myriad;

namespace {

// A step-0 checkpoint of a fresh model of `sets` in a new folder, its config as given (the
// weights made by a CPU engine, whatever train.device says), written as `myriad import` writes one.
std::string fresh_checkpoint(const std::string& name, const std::vector<std::string>& sets) {
  const Config cfg = parse_config("", "gpu test", sets);
  Config on_cpu = cfg;
  on_cpu.train.device = "cpu";
  std::unique_ptr<Engine> e = make_engine(on_cpu);
  std::vector<checkpoint::Shard> shards;
  for (const ParamSpec& p : e->layout().tensors()) {
    ParamLayout::Stored r = e->layout().stored(p);
    if (!r.empty())
      shards.push_back({"model/" + p.name, r.global_shape, r.offset, r.shape, e->host_state().params + p.offset});
  }
  const fs::path dir = fs::temp_directory_path() / cat("myriad_gpu_sample_", name, "_", getpid());
  fs::remove_all(dir);
  checkpoint::save_as(dir.string(), 0, {{"config", to_toml(cfg)}}, shards);
  return dir.string();
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(Sample, AutoRunsAModelTheGpuCannotOnTheCpu) {
  ASSERT_TRUE(cuda_available()) << "a GPU test";
  // Head size 64 / 2 = 32: not among the CUDA attention's (64, 80, 128).
  const std::string dir = fresh_checkpoint("head32", {"model.layers=2", "model.d_model=64", "model.heads=2",
                                                       "model.seq_len=64", "model.vocab_size=256", "train.device=auto"});
  testing::internal::CaptureStderr();
  LoadedModel m;
  try {
    m = load_for_inference(dir);
  } catch (const Error& e) {
    const std::string log = testing::internal::GetCapturedStderr();
    FAIL() << "load_for_inference failed: " << e.what() << "\n" << log;
  }
  const std::string log = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(m.engine);
  EXPECT_EQ(m.engine->device().rfind("cpu", 0), 0u) << m.engine->device();
  EXPECT_EQ(count(log, "sampling on the CPU"), 1) << log;
  EXPECT_NE(log.find("head size"), std::string::npos) << "the info line says why: " << log;
  SampleOptions opt;
  opt.tokens = 12;
  EXPECT_EQ(generate(*m.engine, m.cfg, {1, 2, 3}, opt).size(), 12u);
  // Asked for explicitly, the GPU stays an input error that names the head size.
  const std::string cuda = fresh_checkpoint("head32_cuda", {"model.layers=2", "model.d_model=64", "model.heads=2",
                                                             "model.seq_len=64", "model.vocab_size=256",
                                                             "train.device=cuda"});
  try {
    load_for_inference(cuda);
    ADD_FAILURE() << "train.device = cuda with head size 32 loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.cls(), ErrorClass::kInput) << e.what();
    EXPECT_NE(std::string(e.what()).find("head size"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
  fs::remove_all(cuda);
}

// Where cuDNN refuses the shapes of a sample (cuDNN < 9.16 takes no T that is not a multiple of
// 128, a machine without cuDNN takes none), Myriad's kernel runs them: said once, not per token.
// (Where cuDNN takes every shape nothing is logged, and the test holds as well.)
TEST(Sample, TheAttentionKernelChoiceIsLoggedOnce) {
  ASSERT_TRUE(cuda_available()) << "a GPU test";
  const std::string dir = fresh_checkpoint("head64", {"model.layers=2", "model.d_model=128", "model.heads=2",
                                                       "model.seq_len=256", "model.vocab_size=256",
                                                       "train.device=auto"});
  LoadedModel m = load_for_inference(dir);
  EXPECT_EQ(m.engine->device().rfind("cuda", 0), 0u) << m.engine->device();
  SampleOptions opt;
  opt.tokens = 40;
  opt.temperature = 0;
  testing::internal::CaptureStderr();
  const std::vector<int32_t> out = generate(*m.engine, m.cfg, {1, 2, 3}, opt);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(out.size(), 40u);
  EXPECT_LE(count(log, "attention: Myriad's kernel for"), 1) << log;
  fs::remove_all(dir);
}

}  // namespace
