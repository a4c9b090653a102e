// Hugging Face interchange and checkpoint integrity, through the `myriad` binary: export to
// GPT-2 safetensors, import back, checkpoint.init_from, and `myriad verify`. The exported model
// is run by an independent reader (tools/torch_reference.py --gpt2: PyTorch, GPT-2's own
// layout) and must give Myriad's logits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf.h"
#include "runtime/generate.h"
#include "test_util.h"

namespace fs = std::filesystem;
using myriad::cat;
using myriad::test::read_file;
using myriad::test::Result;
using myriad::test::run_myriad;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Exit 2 and one line that says `what`.
void expect_input_error(const Result& r, const std::string& what) {
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, what)) << "expected '" << what << "' in: " << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

class Interchange : public ::testing::Test {
 protected:
  static fs::path dir_;
  static std::string data_;
  static void SetUpTestSuite() { data_ = myriad::test::make_corpus_dir("myriad_hf", dir_); }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string train(const fs::path& rd, const std::string& extra = "") {
    return cat("train --config ", MYRIAD_SOURCE_DIR, "/configs/demo.toml --run-dir ", rd.string(),
               " --set model.layers=2 --set model.d_model=32 --set model.heads=4 --set model.seq_len=16",
               " --set train.global_batch=4 --set train.micro_batch=2 --set train.eval_every=0 --set data.train=",
               data_, " --set data.valid= --set checkpoint.keep_last=0 ", extra);
  }
  // Every model tensor of a checkpoint, whole.
  static std::map<std::string, std::vector<float>> weights(const std::string& dir) {
    const nlohmann::json meta = myriad::checkpoint::read_meta(dir);
    std::map<std::string, std::vector<float>> out;
    for (const auto& t : meta["tensors"]) {
      const std::string name = t["name"];
      if (name.rfind("model/", 0) != 0) continue;
      const auto shape = t["global_shape"].get<std::vector<int64_t>>();
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      out[name].resize(n);
      myriad::checkpoint::load(dir, meta, {{name, shape, std::vector<int64_t>(shape.size(), 0), shape, out[name].data()}});
    }
    return out;
  }
};
fs::path Interchange::dir_;
std::string Interchange::data_;

// Export, import, export: the same bytes; the imported checkpoint holds the same weights, samples
// as the original does, and resumes.
TEST_F(Interchange, ExportImportExportIsTheSameModel) {
  const fs::path rd = dir_ / "run";
  ASSERT_EQ(run_myriad(train(rd, "--set train.steps=3")).code, 0);
  const std::string ckpt = (rd / "checkpoints/step_00000003").string();
  Result e1 = run_myriad(cat("export --checkpoint ", rd.string(), " --format hf --output ", (dir_ / "hf1").string()));
  ASSERT_EQ(e1.code, 0) << e1.output;
  const auto config = nlohmann::json::parse(read_file(dir_ / "hf1/config.json"));
  EXPECT_EQ(config["vocab_size"], 256);
  EXPECT_EQ(config["n_layer"], 2);
  EXPECT_EQ(config["architectures"][0], "GPT2LMHeadModel");
  EXPECT_FALSE(fs::exists(dir_ / "hf1/vocab.json"));  // a byte-level model has no tokenizer files
  Result i = run_myriad(cat("import --hf ", (dir_ / "hf1").string(), " --output ", (dir_ / "imported").string()));
  ASSERT_EQ(i.code, 0) << i.output;
  EXPECT_EQ(weights(ckpt), weights((dir_ / "imported").string()));
  Result e2 = run_myriad(cat("export --checkpoint ", (dir_ / "imported").string(), " --output ", (dir_ / "hf2").string()));
  ASSERT_EQ(e2.code, 0) << e2.output;
  EXPECT_EQ(read_file(dir_ / "hf1/model.safetensors"), read_file(dir_ / "hf2/model.safetensors"));
  // `sample` and `verify` take it; a run resumes from it (step 0, a fresh optimizer).
  Result a = run_myriad(cat("sample --checkpoint ", ckpt, " --prompt abc --tokens 20 --temperature 0"));
  Result b = run_myriad(cat("sample --checkpoint ", (dir_ / "imported").string(), " --prompt abc --tokens 20 --temperature 0"));
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_EQ(a.output.substr(a.output.find("prompt tokens")), b.output.substr(b.output.find("prompt tokens")));
  EXPECT_EQ(run_myriad(cat("verify ", (dir_ / "imported").string())).code, 0);
  Result r = run_myriad(train(dir_ / "from_import", cat("--set train.steps=1 --resume ", (dir_ / "imported").string())));
  EXPECT_EQ(r.code, 0) << r.output;
}

// The exported model, run by PyTorch from the safetensors bytes in GPT-2's layout, gives
// Myriad's logits at every position.
TEST_F(Interchange, TheExportedModelGivesMyriadsLogits) {
  const fs::path rd = dir_ / "logits";
  ASSERT_EQ(run_myriad(train(rd, "--set train.steps=3 --set model.heads=2")).code, 0);
  const fs::path hf = dir_ / "logits_hf", io = dir_ / "logits_io";
  ASSERT_EQ(run_myriad(cat("export --checkpoint ", rd.string(), " --output ", hf.string())).code, 0);
  fs::create_directories(io);
  const int B = 2, T = 16;
  std::mt19937 rng(7);
  std::vector<int32_t> tokens(B * T);
  for (int32_t& t : tokens) t = std::uniform_int_distribution<int>(0, 255)(rng);
  std::ofstream(io / "tokens.bin", std::ios::binary).write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4);
  std::ofstream(io / "tokens.json") << nlohmann::json({{"batch", B}, {"seq_len", T}}).dump();
  const std::string cmd = cat("/usr/bin/python3 ", MYRIAD_SOURCE_DIR, "/tools/torch_reference.py --gpt2 ", hf.string(),
                              " ", io.string(), " > ", (io / "log.txt").string(), " 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(io / "log.txt");
  const std::string ref_bytes = read_file(io / "gpt2_logits.bin");
  const int V = 256;
  ASSERT_EQ(ref_bytes.size(), size_t(B) * T * V * 4);
  const float* ref = reinterpret_cast<const float*>(ref_bytes.data());
  // Myriad's logits of each prefix: its last position's are position t's of the whole sequence.
  myriad::LoadedModel m = myriad::load_for_inference((rd / "checkpoints/step_00000003").string());
  std::vector<float> logits(m.cfg.padded_vocab());
  double worst = 0;
  for (int b = 0; b < B; ++b)
    for (int t = 1; t <= T; ++t) {
      m.engine->last_logits(tokens.data() + b * T, 1, t, logits.data());
      for (int v = 0; v < V; ++v) {
        const double want = ref[(int64_t(b) * T + t - 1) * V + v];
        worst = std::max(worst, std::abs(logits[v] - want) / std::max(1.0, std::abs(want)));
      }
    }
  EXPECT_LT(worst, 1e-4);
}

// A gpt2-tokenizer model exports its tokenizer's files too.
TEST_F(Interchange, AGpt2TokenizerModelExportsItsTokenizer) {
  const std::string gpt2_data = (dir_ / "gpt2corpus").string();
  ASSERT_EQ(run_myriad(cat("prepare --input /usr/share/games/fortunes/computers --tokenizer gpt2 --output ", gpt2_data,
                           " --doc-separator %")).code, 0);
  const fs::path rd = dir_ / "gpt2";
  ASSERT_EQ(run_myriad(train(rd, cat("--set train.steps=1 --set data.tokenizer=gpt2 --set model.vocab_size=50257 --set data.train=",
                                     gpt2_data))).code, 0);
  Result e = run_myriad(cat("export --checkpoint ", rd.string(), " --output ", (dir_ / "gpt2_hf").string()));
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_EQ(nlohmann::json::parse(read_file(dir_ / "gpt2_hf/config.json"))["vocab_size"], 50257);
  EXPECT_FALSE(read_file(dir_ / "gpt2_hf/vocab.json").empty());
  EXPECT_FALSE(read_file(dir_ / "gpt2_hf/merges.txt").empty());
}

// What GPT-2 cannot express is refused, naming the option.
TEST_F(Interchange, AModelGpt2CannotExpressIsRefused) {
  for (const auto& [flag, named] : std::vector<std::pair<std::string, std::string>>{
           {"--set model.parallel_block=true", "model.parallel_block"},
           {"--set model.window=8", "model.window"},
           {"--set model.bias=false", "model.bias"}}) {
    const fs::path rd = dir_ / cat("refused_", named);
    ASSERT_EQ(run_myriad(train(rd, "--set train.steps=1 " + flag)).code, 0);
    expect_input_error(run_myriad(cat("export --checkpoint ", rd.string(), " --output ", (dir_ / "refused_out").string())),
                       named);
  }
}

// Broken safetensors files: one line, exit 2, the file and the fault named.
TEST_F(Interchange, BadSafetensorsAreInputErrors) {
  const fs::path rd = dir_ / "bad";
  ASSERT_EQ(run_myriad(train(rd, "--set train.steps=1")).code, 0);
  const fs::path good = dir_ / "bad_hf";
  ASSERT_EQ(run_myriad(cat("export --checkpoint ", rd.string(), " --output ", good.string())).code, 0);
  auto variant = [&](const std::string& name, auto change) {
    const fs::path d = dir_ / name;
    fs::create_directories(d);
    fs::copy_file(good / "config.json", d / "config.json", fs::copy_options::overwrite_existing);
    auto tensors = myriad::checkpoint::read_safetensors((good / "model.safetensors").string());
    change(tensors, d);
    return cat("import --hf ", d.string(), " --output ", (d / "out").string());
  };
  // A header cut short.
  {
    const fs::path d = dir_ / "truncated";
    fs::create_directories(d);
    fs::copy_file(good / "config.json", d / "config.json", fs::copy_options::overwrite_existing);
    std::ofstream(d / "model.safetensors", std::ios::binary) << read_file(good / "model.safetensors").substr(0, 40);
    expect_input_error(run_myriad(cat("import --hf ", d.string(), " --output ", (d / "out").string())), "truncated header");
  }
  // A wrong dtype.
  {
    const fs::path d = dir_ / "dtype";
    fs::create_directories(d);
    fs::copy_file(good / "config.json", d / "config.json", fs::copy_options::overwrite_existing);
    std::string bytes = read_file(good / "model.safetensors");
    const size_t at = bytes.find("\"F32\"");
    ASSERT_NE(at, std::string::npos);
    bytes.replace(at, 5, "\"F16\"");
    std::ofstream(d / "model.safetensors", std::ios::binary) << bytes;
    expect_input_error(run_myriad(cat("import --hf ", d.string(), " --output ", (d / "out").string())), "dtype F16");
  }
  expect_input_error(run_myriad(variant("missing", [](auto& t, const fs::path& d) {
                       t.erase("h.1.mlp.c_fc.bias");
                       myriad::checkpoint::write_safetensors((d / "model.safetensors").string(), t);
                     })),
                     "tensor h.1.mlp.c_fc.bias is missing");
  expect_input_error(run_myriad(variant("shape", [](auto& t, const fs::path& d) {
                       t["h.0.attn.c_proj.weight"].shape = {16, 64};
                       myriad::checkpoint::write_safetensors((d / "model.safetensors").string(), t);
                     })),
                     "tensor h.0.attn.c_proj.weight has shape [16, 64]");
}

// checkpoint.init_from: the weights of another run, step 0, a fresh optimizer. (A learning rate
// too small to move an fp32 weight leaves them as loaded, bit for bit.)
TEST_F(Interchange, InitFromStartsAFreshRunFromTheWeights) {
  const fs::path a = dir_ / "init_a", b = dir_ / "init_b";
  ASSERT_EQ(run_myriad(train(a, "--set train.steps=2")).code, 0);
  Result r = run_myriad(train(b, cat("--set train.steps=1 --set optim.lr=1e-30 --set optim.min_lr=0 --set checkpoint.init_from=",
                                     a.string())));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "init: the weights of ")) << r.output;
  EXPECT_EQ(weights((a / "checkpoints/step_00000002").string()), weights((b / "checkpoints/step_00000001").string()));
  const auto meta = myriad::checkpoint::read_meta((b / "checkpoints/step_00000001").string());
  EXPECT_EQ(meta["optimizer"]["steps_taken"], 1);
  // A model of another shape: its last line names the tensor and both shapes, exit 2.
  Result c = run_myriad(train(dir_ / "init_c", cat("--set train.steps=1 --set model.d_model=64 --set checkpoint.init_from=",
                                                   a.string())));
  EXPECT_EQ(c.code, 2) << c.output;
  const std::string last = c.output.substr(c.output.rfind('\n', c.output.size() - 2) + 1);
  EXPECT_TRUE(contains(last, "checkpoint.init_from: checkpoint ")) << c.output;
  EXPECT_TRUE(contains(last, "but the model expects")) << c.output;
}

// `myriad verify`: 0 for a sound checkpoint; one flipped byte is found and its file and piece
// named, exit 2.
TEST_F(Interchange, VerifyFindsAFlippedByte) {
  const fs::path rd = dir_ / "verify";
  ASSERT_EQ(run_myriad(train(rd, "--set train.steps=1")).code, 0);
  const fs::path ckpt = rd / "checkpoints/step_00000001";
  Result ok = run_myriad(cat("verify ", ckpt.string()));
  EXPECT_EQ(ok.code, 0) << ok.output;
  EXPECT_TRUE(contains(ok.output, "is sound")) << ok.output;
  std::string bytes = read_file(ckpt / "shard_00000.bin");
  const size_t at = bytes.size() * 2 / 3;
  bytes[at] ^= 0x01;
  std::ofstream(ckpt / "shard_00000.bin", std::ios::binary) << bytes;
  Result bad = run_myriad(cat("verify ", ckpt.string()));
  expect_input_error(bad, "shard_00000.bin: piece 0 of tensor ");
  EXPECT_TRUE(contains(bad.output, "checksum mismatch")) << bad.output;
  // The named tensor is the one whose bytes hold the flipped one.
  const auto meta = nlohmann::json::parse(read_file(ckpt / "meta.json"));
  std::string holder;
  for (const auto& t : meta["tensors"])
    for (const auto& p : t["pieces"]) {
      int64_t n = 4;
      for (int64_t d : p["shape"]) n *= d;
      if (p["byte_offset"].get<int64_t>() <= int64_t(at) && int64_t(at) < p["byte_offset"].get<int64_t>() + n) holder = t["name"];
    }
  EXPECT_TRUE(contains(bad.output, "tensor " + holder + " ")) << holder << ": " << bad.output;
}

}  // namespace
