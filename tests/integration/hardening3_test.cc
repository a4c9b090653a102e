// Hardening III: what a hostile probe of the new surfaces found, each case run as a user runs it,
// through the `myriad` binary: a fresh run never overwrites another run's checkpoints, a resume
// keeps every source's order, a loss that counts nothing is never a number, a schedule longer
// than the run is said, prepare cleans up after a signal and after a killed prepare, a reader
// of a live run's checkpoint is never pruned from under, sample reads no id past its table, and
// bad flags are input errors.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/state.h"
#include "core/config.h"
#include "data/indexed_dataset.h"
#include "model/params.h"
#include "test_util.h"

namespace fs = std::filesystem;
using myriad::cat;
using myriad::test::jsonl;
using myriad::test::last_line;
using myriad::test::Proc;
using myriad::test::read_file;
using myriad::test::Result;
using myriad::test::expect_input_error;
using myriad::test::run_myriad;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Every file of a directory tree and its bytes (but the lock file, whose holder's description
// each run that takes it writes).
std::map<std::string, std::string> tree_bytes(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != ".myriad.lock")
      out[fs::relative(e.path(), dir).string()] = read_file(e.path());
  return out;
}

// The names whose bytes differ between two trees, or that one lacks.
std::vector<std::string> changed(const std::map<std::string, std::string>& a, const std::map<std::string, std::string>& b) {
  std::vector<std::string> out;
  for (const auto& [name, bytes] : a)
    if (!b.count(name) || b.at(name) != bytes) out.push_back(name);
  for (const auto& [name, bytes] : b)
    if (!a.count(name)) out.push_back(name);
  return out;
}

// The loss of each step of a run's metrics.jsonl.
std::map<int64_t, double> losses(const fs::path& run_dir) {
  std::map<int64_t, double> out;
  for (const nlohmann::json& m : jsonl(run_dir / "metrics.jsonl"))
    if (m.contains("loss")) out[m["step"]] = m["loss"];
  return out;
}

class HardeningIII : public ::testing::Test {
 protected:
  static fs::path dir_;
  static std::string data_, other_;
  static void SetUpTestSuite() {
    data_ = myriad::test::make_corpus_dir("myriad_hardening3", dir_);
    other_ = (dir_ / "science").string();
    const Result r = run_myriad(cat("prepare --input /usr/share/games/fortunes/science --tokenizer byte --output ", other_,
                                    " --doc-separator %"));
    ASSERT_EQ(r.code, 0) << r.output;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // A tiny model on one process; `extra` adds flags.
  static std::string train(const fs::path& run_dir, const std::string& extra = "") {
    return cat("train --config ", MYRIAD_SOURCE_DIR, "/configs/demo.toml --run-dir ", run_dir.string(),
               " --set model.layers=2 --set model.d_model=32 --set model.heads=2 --set model.seq_len=16",
               " --set train.global_batch=8 --set train.micro_batch=4 --set train.eval_every=0 --set data.train=", data_,
               " --set data.valid= --set train.log_every=1 --set optim.warmup_steps=2 --set checkpoint.async=false ", extra);
  }
};
fs::path HardeningIII::dir_;
std::string HardeningIII::data_, HardeningIII::other_;

// Item 1: a fresh train into a run directory that holds another run's committed checkpoints is
// refused, naming them, before it changes a byte; --resume auto continues them.
TEST_F(HardeningIII, AFreshRunNeverOverwritesAnotherRunsCheckpoints) {
  const fs::path rd = dir_ / "fresh";
  ASSERT_EQ(run_myriad(train(rd, "--set train.steps=15 --set checkpoint.every=5 --set checkpoint.keep_last=2")).code, 0);
  const auto before = tree_bytes(rd / "checkpoints");
  ASSERT_TRUE(before.count("step_00000015/COMMITTED") && before.count("step_00000010/COMMITTED"));
  const Result again = run_myriad(train(rd, "--set train.steps=15 --set checkpoint.every=5 --set checkpoint.keep_last=2 "
                                            "--set model.seed=99"));
  expect_input_error(again, cat("checkpoint directory ", (rd / "checkpoints").string(),
                                " holds committed checkpoints of an earlier run (step_00000015, step_00000010)"));
  EXPECT_TRUE(contains(last_line(again.output), "--resume auto")) << again.output;
  EXPECT_EQ(changed(tree_bytes(rd / "checkpoints"), before), std::vector<std::string>{}) << "nothing under checkpoints/ changed";
  // init_from is a fresh run too.
  expect_input_error(run_myriad(train(rd, cat("--set train.steps=15 --set checkpoint.init_from=", (rd / "checkpoints").string()))),
                     "holds committed checkpoints of an earlier run");
  // The run itself goes on.
  const Result on = run_myriad(train(rd, "--set train.steps=20 --set checkpoint.every=5 --set checkpoint.keep_last=2 "
                                         "--resume auto"));
  ASSERT_EQ(on.code, 0) << on.output;
  EXPECT_TRUE(fs::exists(rd / "checkpoints/step_00000020/COMMITTED"));
}

// Item 2: a lone source resumed as part of a blend (a second source of weight 1e-9, which the
// 10 steps never reach) reads the stream it read alone: the losses are the unbroken run's, bit
// for bit; and the blend's first source resumed alone keeps the blend's order.
TEST_F(HardeningIII, ASourceKeepsItsOrderWhenABlendFormsOrEnds) {
  const std::string steps = "--set train.steps=20 --set checkpoint.every=10 ";
  const std::string blend = cat("--set 'data.train=[{name = \"corpus\", path = \"", data_, "\", weight = 1}, {name = "
                                "\"science\", path = \"", other_, "\", weight = 1e-9}]' ");
  const std::string killed = "MYRIAD_INJECT_FAULT=step:10:kill";  // after step 10's save
  ASSERT_EQ(run_myriad(train(dir_ / "lone_straight", steps)).code, 0);
  EXPECT_NE(run_myriad(train(dir_ / "lone_then_blend", steps), killed).code, 0);
  const Result r = run_myriad(train(dir_ / "lone_then_blend", steps + blend + "--resume auto"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "each source keeps its place and its order")) << r.output;
  const auto straight = losses(dir_ / "lone_straight"), resumed = losses(dir_ / "lone_then_blend");
  ASSERT_EQ(resumed.size(), 20u);
  for (int64_t s = 11; s <= 20; ++s) EXPECT_EQ(resumed.at(s), straight.at(s)) << "step " << s;

  ASSERT_EQ(run_myriad(train(dir_ / "blend_straight", steps + blend)).code, 0);
  EXPECT_NE(run_myriad(train(dir_ / "blend_then_lone", steps + blend), killed).code, 0);
  ASSERT_EQ(run_myriad(train(dir_ / "blend_then_lone", steps + "--resume auto")).code, 0);
  const auto b = losses(dir_ / "blend_straight"), l = losses(dir_ / "blend_then_lone");
  ASSERT_EQ(l.size(), 20u);
  for (int64_t s = 11; s <= 20; ++s) EXPECT_EQ(l.at(s), b.at(s)) << "step " << s;
  EXPECT_NE(b.at(1), straight.at(1)) << "a blend's source reads another order than a lone one";
}

// Item 5: with data.document_end_loss = false, data of one-token documents counts no target: a
// run on it is refused at start; a validation source whose batches count none is left out of
// val_loss (said once), never a NaN; a training step that counts none is skipped, said once.
TEST_F(HardeningIII, ALossThatCountsNoTargetIsNeverANumber) {
  // singles: 400 one-token documents. mixed: 40 one-token documents (2.5 samples of 16), then
  // long ones: its first validation batch (2 samples, unshuffled) counts nothing.
  auto write = [&](const std::string& name, int singles, int longs) {
    const std::string prefix = (dir_ / name).string();
    myriad::data::IndexedDatasetWriter w(prefix, 256, "byte", 0);
    for (int i = 0; i < singles; ++i) w.add_document(std::vector<int32_t>{65 + i % 26});
    for (int i = 0; i < longs; ++i) {
      std::vector<int32_t> doc;
      for (int k = 0; k < 40; ++k) doc.push_back(97 + (i * 7 + k) % 26);
      w.add_document(doc);
    }
    w.finish();
    return prefix;
  };
  const std::string singles = write("singles", 400, 0), mixed = write("mixed", 40, 40);
  const std::string masked = "--set data.document_mask=true --set data.document_end_loss=false --set train.steps=6 ";
  expect_input_error(run_myriad(train(dir_ / "singles", masked + "--set data.train=" + singles)),
                     cat(singles, ": data.train's source 'singles' has only one-token documents"));
  expect_input_error(run_myriad(train(dir_ / "singles_valid", masked + "--set data.valid=" + singles)),
                     "has only one-token documents");

  const Result r = run_myriad(train(dir_ / "mixed", masked + "--set train.global_batch=2 --set train.micro_batch=1 "
                                    "--set train.eval_every=3 --set train.eval_steps=1 --set data.train=" + mixed +
                                    " --set 'data.valid=[{name = \"mixed\", path = \"" + mixed + "\"}, {name = \"corpus\", "
                                    "path = \"" + data_ + "\"}]'"));
  ASSERT_EQ(r.code, 0) << r.output;
  size_t said = 0;
  for (size_t at = 0; (at = r.output.find("validation source(s) 'mixed' counted no target", at)) != std::string::npos; ++at)
    ++said;
  EXPECT_EQ(said, 1u) << r.output;
  int evaluated = 0;
  for (const nlohmann::json& m : jsonl(dir_ / "mixed/metrics.jsonl")) {
    EXPECT_FALSE(m.contains("val_loss/mixed")) << m.dump();
    if (!m.contains("val_loss")) continue;
    ++evaluated;
    ASSERT_TRUE(m["val_loss"].is_number()) << m.dump();
    EXPECT_EQ(m["val_loss"], m["val_loss/corpus"]) << "the one source that counted is the mean";
  }
  EXPECT_EQ(evaluated, 2);
  for (const nlohmann::json& m : jsonl(dir_ / "mixed/metrics.jsonl")) {
    if (m.contains("loss")) {
      EXPECT_TRUE(m["loss"].is_number() && m["loss"].get<double>() > 0) << m.dump();
    }
  }
}

// Item 6: WSD's decay longer than the run is refused; a warmup longer than the run is said,
// with the lr it ends at.
TEST_F(HardeningIII, AScheduleLongerThanTheRunIsRefusedOrSaid) {
  expect_input_error(run_myriad(train(dir_ / "wsd", "--set train.steps=20 --set optim.decay=wsd --set optim.decay_steps=50")),
                     "optim.decay_steps = 50 is longer than the steps after warmup (train.steps 20 - optim.warmup_steps 2 = 18)");
  const Result r = run_myriad(train(dir_ / "warm", "--set train.steps=3 --set optim.warmup_steps=700"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "optim.warmup_steps = 700 is not shorter than train.steps = 3: the run ends in its warmup"))
      << r.output;
}

// Item 7: SIGTERM during a parallel prepare removes its scratch folder and temporary files and
// ends the process by the signal; what a killed prepare (SIGKILL: no clean-up) left is removed
// by the next prepare to the same output, and said; a live process's files are left alone.
TEST_F(HardeningIII, PrepareLeavesNothingBehindAfterASignal) {
  const fs::path out = dir_ / "prep";
  fs::create_directories(out);
  // Inputs large enough to take a while: many documents each.
  std::vector<std::string> inputs;
  for (int i = 0; i < 2; ++i) {
    const fs::path in = out / cat("big", i, ".txt");
    std::ofstream f(in);
    for (int k = 0; k < 400000; ++k) f << "line " << k << " of input " << i << "\n%\n";
    inputs.push_back(in.string());
  }
  const std::string cmd = cat("prepare --input ", inputs[0], " --input ", inputs[1], " --tokenizer gpt2 --jobs 2 ",
                              "--doc-separator % --output ", (out / "corpus").string());
  auto litter = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(out)) {
      const std::string n = e.path().filename().string();
      if (n.find(".tmp-") != std::string::npos || n.rfind(".myriad-prepare-", 0) == 0) names.push_back(n);
    }
    return names;
  };
  for (int sig : {SIGTERM, SIGKILL}) {
    Proc p(cmd, "", out / "prepare.log");
    bool started = false;
    for (int i = 0; i < 400 && !started; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
      started = !litter().empty();
    }
    ASSERT_TRUE(started) << "no scratch folder appeared: " << p.output();
    p.kill(sig);
    EXPECT_EQ(p.wait(60), 128 + sig) << p.output();
    if (sig == SIGTERM) {
      EXPECT_TRUE(litter().empty()) << litter().front();
      EXPECT_TRUE(contains(p.output(), "prepare: stopped by signal 15")) << p.output();
    } else {
      EXPECT_FALSE(litter().empty()) << "SIGKILL leaves what it was writing";
    }
  }
  // A live process's look-alike is never touched; the killed one's are removed, and said.
  const fs::path live = out / cat("corpus.bin.tmp-", getppid());
  std::ofstream(live) << "a live process's";
  const Result r = run_myriad(cmd);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "left by a prepare that was killed (its process is gone)")) << r.output;
  const std::vector<std::string> left = litter();
  EXPECT_EQ(left, std::vector<std::string>{live.filename().string()});
  EXPECT_TRUE(fs::exists(out / "corpus.bin") && fs::exists(out / "corpus.idx"));
}

// Item 10: a reader of a live run's checkpoint holds it: the run's pruning passes it over while
// it is read (and takes it at a later save), so an export from a run directory under training
// never finds its checkpoint pruned half way.
TEST_F(HardeningIII, ACheckpointBeingReadIsNotPrunedFromUnderItsReader) {
  const fs::path rd = dir_ / "held";
  ASSERT_EQ(run_myriad(train(rd, "--set train.steps=2 --set checkpoint.every=1 --set checkpoint.keep_last=1")).code, 0);
  const std::string step2 = (rd / "checkpoints/step_00000002").string();
  {
    const myriad::checkpoint::ReadHold held(rd.string());
    EXPECT_EQ(held.dir(), step2);
    const Result r = run_myriad(train(rd, "--set train.steps=4 --set checkpoint.every=1 --set checkpoint.keep_last=1 "
                                          "--resume auto"));
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, cat("kept ", step2, " for now: a reader holds it"))) << r.output;
    EXPECT_TRUE(fs::exists(step2 + "/COMMITTED"));
    EXPECT_FALSE(fs::exists(rd / "checkpoints/step_00000003")) << "what no reader holds is pruned";
  }
  // Released, a later save prunes it.
  ASSERT_EQ(run_myriad(train(rd, "--set train.steps=5 --set checkpoint.every=1 --set checkpoint.keep_last=1 "
                                 "--resume auto")).code, 0);
  EXPECT_FALSE(fs::exists(step2));
  // Many exports from a run directory while it trains and prunes: none fails.
  Proc live(train(rd, "--set train.steps=400 --set checkpoint.every=1 --set checkpoint.keep_last=1 --resume auto"), "",
            dir_ / "held.log");
  for (int i = 0; i < 12; ++i) {
    const Result e = run_myriad(cat("export --checkpoint ", rd.string(), " --output ", (dir_ / cat("held_hf", i)).string()));
    EXPECT_EQ(e.code, 0) << e.output;
  }
  EXPECT_EQ(live.wait(), 0) << live.output();
}

// Item 4: sample reads no id past the model's table: a prompt id outside the vocabulary is an
// input error before any lookup, and --logits is written only on success.
TEST_F(HardeningIII, SampleChecksEveryPromptIdBeforeItIsLookedUp) {
  // A model of 100 ids with the byte tokenizer (256): only a checkpoint written by hand can hold
  // one, now that train and import refuse it.
  myriad::Config cfg = myriad::parse_config("", "small", {"model.layers=1", "model.d_model=16", "model.heads=2",
                                                          "model.seq_len=8", "model.vocab_size=100"});
  const myriad::ParamLayout layout(cfg);
  std::vector<float> params(static_cast<size_t>(layout.total()), 0.01f);
  std::vector<myriad::checkpoint::Shard> shards;
  for (const myriad::ParamSpec& p : layout.tensors()) {
    const auto st = layout.stored(p);
    shards.push_back({myriad::checkpoint::param_name(p.name), st.global_shape,
                      std::vector<int64_t>(st.global_shape.size(), 0), st.global_shape, params.data() + p.offset});
  }
  myriad::checkpoint::Meta meta;
  meta.config = myriad::to_toml(cfg), meta.tokenizer = "byte";
  const fs::path ck = dir_ / "small_vocab";
  myriad::checkpoint::save_as(ck.string(), 0, myriad::checkpoint::encode(meta), shards);
  const fs::path logits = dir_ / "logits.json";
  const Result bad = run_myriad(cat("sample --checkpoint ", ck.string(), " --prompt 'zz' --tokens 2 --logits ", logits.string()));
  expect_input_error(bad, "the prompt's token 0 is id 122, outside the model's vocabulary of 100 ids");
  EXPECT_FALSE(fs::exists(logits)) << "--logits is written only on success";
  const Result good = run_myriad(cat("sample --checkpoint ", ck.string(), " --prompt '!!' --tokens 2 --logits ", logits.string()));
  ASSERT_EQ(good.code, 0) << good.output;
  EXPECT_EQ(nlohmann::json::parse(read_file(logits))["logits"].size(), 100u);
}

// Items 9, 11 (unit-tested in config_test), 13, 14 and the small refusals: bad flags are input
// errors naming the flag, never a crash.
TEST_F(HardeningIII, BadFlagsAreInputErrorsNotCrashes) {
  const std::string bench = cat("bench --config ", MYRIAD_SOURCE_DIR, "/configs/demo.toml --set model.layers=1 ");
  expect_input_error(run_myriad(bench + "--steps 0"), "bench: --steps 0 must be at least 1");
  expect_input_error(run_myriad(bench + "--steps -1"), "bench: --steps -1 must be at least 1");
  expect_input_error(run_myriad(bench + "--warmup -5"), "bench: --warmup -5 must be 0 or more");
  expect_input_error(run_myriad(cat("plan --config ", MYRIAD_SOURCE_DIR, "/configs/gpt-1.3b.toml --gpus 8 --cluster ",
                                    MYRIAD_SOURCE_DIR, "/configs/clusters/h200.toml --batch -1")),
                     "plan: --batch must be a positive number of sequences, got -1");
  expect_input_error(run_myriad(cat("report ", (dir_ / "no_such_run").string())), "is not a directory");
  expect_input_error(run_myriad(train(dir_ / "overflow", cat("--set 'data.train=1e308 ", data_, " 1e308 ", other_, "'"))),
                     "data.train's weights sum to inf");
  // Two prefixes of one file name in Megatron's string: each named by its path, both trained.
  const fs::path twin = dir_ / "twin";
  fs::create_directories(twin);
  for (const char* ext : {".bin", ".idx", ".json"}) fs::copy_file(other_ + ext, (twin / "corpus").string() + ext);
  const Result t = run_myriad(train(dir_ / "twins", cat("--set train.steps=2 --set 'data.train=0.5 ", data_, " 0.5 ",
                                                        (twin / "corpus").string(), "'")));
  ASSERT_EQ(t.code, 0) << t.output;
  EXPECT_TRUE(contains(t.output, cat("data: source '", data_, "'"))) << t.output;
}

// Unclear cases, decided: SIGTERM as the last step ends leaves a launch that finished every
// worker with exit 0, not "preempted".
TEST_F(HardeningIII, APreemptionAsTheRunEndsIsNoPreemption) {
  const fs::path rd = dir_ / "last_step", out = dir_ / "last_step.log";
  // The last step sleeps 3 s, and the signal comes during it.
  Proc p(cat("launch --nproc-per-node 2 -- ", train(rd, "--set train.steps=3 --set parallel.dp=2")),
         "MYRIAD_INJECT_FAULT=step:3:pause:3000", out);
  bool at_last = false;
  for (int i = 0; i < 2400 && !at_last; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    at_last = contains(read_file(out), "step 2/3");
  }
  ASSERT_TRUE(at_last) << p.output();
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  p.kill(SIGTERM);
  EXPECT_EQ(p.wait(120), 0) << p.output();
  EXPECT_TRUE(fs::exists(rd / "checkpoints/step_00000003/COMMITTED"));
}

}  // namespace
