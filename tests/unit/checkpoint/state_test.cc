// A checkpoint's components (checkpoint/state.h, runtime/state.h): each saves what it holds and
// loads it back, through a real save and load; meta.json's schema decodes what it encodes.
#include "checkpoint/state.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "core/config.h"
#include "runtime/engine.h"
#include "runtime/state.h"

namespace myriad {
namespace {

namespace fs = std::filesystem;

Config tiny() {
  return load_config(std::string(MYRIAD_SOURCE_DIR) + "/configs/demo.toml",
                     {"model.layers=2", "model.d_model=32", "model.seq_len=16", "model.vocab_size=256"});
}

TEST(CheckpointState, MetaDecodesWhatItEncodesAndNamesAMissingField) {
  checkpoint::Meta m;
  m.step = 12, m.config = "[model]\nlayers = 2\n", m.tokenizer = "gpt2";
  m.data.consumed = 96, m.data.seed = 7, m.optimizer = {"adamw", 12}, m.rng = {1234, 7};
  m.recent_losses = {3.5, 3.25}, m.skipped_steps = {6}, m.imported_from = "/hf/gpt2";
  const nlohmann::json j = nlohmann::json::parse(checkpoint::encode(m).dump());
  const checkpoint::Meta back = checkpoint::decode_meta(j, "ck");
  EXPECT_EQ(checkpoint::encode(back), checkpoint::encode(m));
  nlohmann::json broken = j;
  broken["data"].erase("consumed");
  try {
    checkpoint::decode_meta(broken, "ck/step_00000012");
    FAIL() << "no error";
  } catch (const checkpoint::Corrupt& e) {
    EXPECT_NE(std::string(e.what()).find("ck/step_00000012: meta.json has no data.consumed"), std::string::npos)
        << e.what();
  }
  broken = j;
  broken["optimizer"]["steps_taken"] = "twelve";
  EXPECT_THROW(checkpoint::decode_meta(broken, "ck"), checkpoint::Corrupt);
  // Fields added later are optional: an older checkpoint has no skip list or loss history.
  broken = j;
  broken.erase("skipped_steps"), broken.erase("fault"), broken.erase("tokenizer");
  const checkpoint::Meta old = checkpoint::decode_meta(broken, "ck");
  EXPECT_TRUE(old.skipped_steps.empty() && old.recent_losses.empty() && old.tokenizer.empty());
}

TEST(CheckpointState, TheNamesLiveOnce) {
  EXPECT_EQ(checkpoint::param_name("wte"), "model/wte");
  EXPECT_EQ(checkpoint::moment_name(1, "wte"), "optim/m/wte");
  EXPECT_EQ(checkpoint::moment_name(2, "wte"), "optim/v/wte");
  EXPECT_TRUE(checkpoint::is_param("model/h.0.ln_1.w"));
  EXPECT_FALSE(checkpoint::is_param("optim/m/h.0.ln_1.w"));
}

// Each component, saved from one run's state and loaded into another's, restores it: the
// tensors through checkpoint::save and checkpoint::load, the fields through meta.json.
TEST(CheckpointState, EveryComponentRoundTripsThroughACheckpoint) {
  const Config cfg = tiny();
  const fs::path root = fs::temp_directory_path() / cat("myriad_state_", getpid());
  fs::remove_all(root);

  struct Run {
    std::unique_ptr<Engine> engine;
    int64_t step = 0;
    data::Blend blend{{{"web", "w", 0.7, 0}, {"code", "c", 0.3, 2}}, {500, 60}};
    std::vector<double> losses;
    std::vector<int64_t> skips;
    checkpoint::Components state;
    explicit Run(const Config& cfg) : engine(make_engine(cfg)) {
      state = run_state(*engine, cfg, step, blend, losses, skips);
    }
  };
  Run a(cfg), b(cfg);
  // A state no fresh run has: distinct parameters and moments, a position, losses, a skip.
  Engine::HostState sa = a.engine->host_state();
  const int64_t n = a.engine->layout().total();
  for (int64_t i = 0; i < n; ++i) sa.params[i] = 0.001f * float(i % 997) - 0.3f;
  int64_t owned = 0;
  for (const FlatRange& r : sa.owned) owned += r.end - r.begin;
  for (int64_t i = 0; i < owned; ++i) sa.m[i] = 1e-3f * float(i % 13), sa.v[i] = 1e-6f * float(i % 17);
  *sa.steps_taken = 9;
  a.step = 9, a.losses = {4.5, 4.25, 4.0}, a.skips = {6, 30};
  for (int i = 0; i < 72; ++i) a.blend.next();

  const std::string dir = checkpoint::save(root.string(), a.step,
                                           checkpoint::encode(checkpoint::meta_of(a.state, to_toml(cfg), "byte")),
                                           checkpoint::shards_of(a.state, true));
  const nlohmann::json meta = checkpoint::read_meta(dir);
  checkpoint::load(dir, meta, checkpoint::shards_of(b.state, false));
  checkpoint::restore(b.state, checkpoint::decode_meta(meta, dir));

  Engine::HostState sb = b.engine->host_state();
  EXPECT_EQ(std::vector<float>(sb.params, sb.params + n), std::vector<float>(sa.params, sa.params + n));
  EXPECT_EQ(std::vector<float>(sb.m, sb.m + owned), std::vector<float>(sa.m, sa.m + owned));
  EXPECT_EQ(std::vector<float>(sb.v, sb.v + owned), std::vector<float>(sa.v, sa.v + owned));
  EXPECT_EQ(*sb.steps_taken, 9);
  EXPECT_EQ(b.step, 9);
  EXPECT_EQ(b.blend.position().consumed, 72);
  EXPECT_EQ(b.blend.position(), a.blend.position()) << "every source's place";
  EXPECT_EQ(b.losses, a.losses);
  EXPECT_EQ(b.skips, std::vector<int64_t>{6}) << "the steps skipped up to the save, not the ones ahead";
  const checkpoint::Meta m = checkpoint::decode_meta(meta, dir);
  EXPECT_EQ(m.rng.model_seed, cfg.model.seed);
  EXPECT_EQ(m.data.seed, cfg.train.seed);
  EXPECT_EQ(m.optimizer.name, cfg.optim.name);
  fs::remove_all(root);
}

}  // namespace
}  // namespace myriad
