// Hugging Face interchange and checkpoint integrity, through the `myriad` binary: export to
// GPT-2 safetensors, import back, checkpoint.init_from, and `myriad verify`. The exported model
// is run by an independent reader (tools/torch_reference.py --gpt2: PyTorch, GPT-2's own
// layout) and must give Myriad's logits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf.h"
#include "data/tokenizer.h"
#include "runtime/generate.h"
#include "test_util.h"

namespace fs = std::filesystem;
using myriad::cat;
using myriad::test::read_file;
using myriad::test::Result;
using myriad::test::run_myriad;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A safetensors file's header and its data section, to craft broken files from a good one.
std::pair<nlohmann::json, std::string> split_safetensors(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[i]);
  return {nlohmann::json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
}
std::string join_safetensors(const nlohmann::json& header, const std::string& data) {
  const std::string text = header.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(uint64_t(text.size()) >> (8 * i));
  return out + text + data;
}

// The names in a folder, sorted.
std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Runs the shell script `script` as root of a user and mount namespace of its own, where it may
// mount a tmpfs (read-only, or small enough to fill); false when this machine allows no such
// namespace (the test is then skipped, saying so).
bool in_own_mount_namespace(const fs::path& dir, const std::string& script) {
  fs::create_directories(dir / "probe");
  const std::string probe = cat("unshare -rm sh -c 'mount -t tmpfs none ", (dir / "probe").string(), "' 2>/dev/null");
  if (std::system(probe.c_str()) != 0) return false;
  std::ofstream(dir / "script.sh") << script;
  const int rc = std::system(cat("unshare -rm sh ", (dir / "script.sh").string(), " > ", (dir / "script.log").string(),
                                 " 2>&1").c_str());
  EXPECT_EQ(rc, 0) << read_file(dir / "script.log");
  return true;
}

// Exit 2 and one line that says `what`.
void expect_one_line_error(const Result& r, const std::string& what) {
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
  // A byte-level run of one step (dir_/small) and its export (dir_/small_hf), made once.
  static fs::path small_export() {
    const fs::path hf = dir_ / "small_hf";
    if (!fs::exists(hf / "model.safetensors")) {
      EXPECT_EQ(run_myriad(train(dir_ / "small", "--set train.steps=1")).code, 0);
      const Result e = run_myriad(cat("export --checkpoint ", (dir_ / "small").string(), " --output ", hf.string()));
      EXPECT_EQ(e.code, 0) << e.output;
    }
    return hf;
  }
  // A gpt2-tokenizer run of one step (dir_/gpt2), made once.
  static fs::path gpt2_run() {
    const fs::path rd = dir_ / "gpt2";
    if (!fs::exists(rd / "checkpoints")) {
      const std::string gpt2_data = (dir_ / "gpt2corpus").string();
      EXPECT_EQ(run_myriad(cat("prepare --input /usr/share/games/fortunes/computers --tokenizer gpt2 --output ", gpt2_data,
                               " --doc-separator %")).code, 0);
      EXPECT_EQ(run_myriad(train(rd, cat("--set train.steps=1 --set data.tokenizer=gpt2 --set model.vocab_size=50257 ",
                                         "--set data.train=", gpt2_data))).code, 0);
    }
    return rd;
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
  const fs::path rd = gpt2_run();
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
    expect_one_line_error(run_myriad(cat("export --checkpoint ", rd.string(), " --output ", (dir_ / "refused_out").string())),
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
    expect_one_line_error(run_myriad(cat("import --hf ", d.string(), " --output ", (d / "out").string())), "truncated header");
  }
  // A dtype Myriad does not read (F32, BF16 and F16 it does).
  {
    const fs::path d = dir_ / "dtype";
    fs::create_directories(d);
    fs::copy_file(good / "config.json", d / "config.json", fs::copy_options::overwrite_existing);
    std::string bytes = read_file(good / "model.safetensors");
    const size_t at = bytes.find("\"F32\"");
    ASSERT_NE(at, std::string::npos);
    bytes.replace(at, 5, "\"F64\"");
    std::ofstream(d / "model.safetensors", std::ios::binary) << bytes;
    expect_one_line_error(run_myriad(cat("import --hf ", d.string(), " --output ", (d / "out").string())), "dtype F64");
  }
  expect_one_line_error(run_myriad(variant("missing", [](auto& t, const fs::path& d) {
                       t.erase("h.1.mlp.c_fc.bias");
                       myriad::checkpoint::write_safetensors((d / "model.safetensors").string(), t);
                     })),
                     "tensor h.1.mlp.c_fc.bias is missing");
  expect_one_line_error(run_myriad(variant("shape", [](auto& t, const fs::path& d) {
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
  EXPECT_TRUE(contains(last, "model.d_model = 32 in the checkpoint but 64 in the config")) << c.output;
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
  expect_one_line_error(bad, "shard_00000.bin: piece 0 of tensor ");
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

// A path that exists is never replaced by an import, however it is spelled (issue 26, item 1:
// `--output nonexist/../victim` emptied victim). The temporary directory beside the new
// checkpoint is the import's own: a user's CKPT.partial is left alone.
TEST_F(Interchange, ImportNeverReplacesAnExistingPath) {
  const fs::path hf = small_export(), victim = dir_ / "victim";
  fs::create_directories(victim);
  std::ofstream(victim / "important.txt") << "x\n";
  for (const std::string& out : {(dir_ / "nonexist/../victim").string(), (victim / "nope/..").string(),
                                 victim.string() + "/", (victim / ".").string(), victim.string()}) {
    const Result r = run_myriad(cat("import --hf ", hf.string(), " --output ", out));
    expect_one_line_error(r, "exists");
    EXPECT_TRUE(contains(r.output, victim.string())) << r.output;
    EXPECT_EQ(listing(victim), std::vector<std::string>{"important.txt"});
    EXPECT_EQ(read_file(victim / "important.txt"), "x\n");
  }
  fs::create_directories(dir_ / "fresh.partial");
  std::ofstream(dir_ / "fresh.partial/keep.txt") << "keep\n";
  const Result r = run_myriad(cat("import --hf ", hf.string(), " --output ", (dir_ / "fresh").string()));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(listing(dir_ / "fresh.partial"), std::vector<std::string>{"keep.txt"});
  EXPECT_FALSE(fs::exists(dir_ / "fresh/keep.txt"));
  EXPECT_EQ(run_myriad(cat("verify ", (dir_ / "fresh").string())).code, 0);
  for (const auto& e : fs::directory_iterator(dir_))  // no temporary directory left behind
    EXPECT_EQ(e.path().filename().string().find("fresh.partial-"), std::string::npos) << e.path();
}

// After an export the folder holds exactly that export's files, which its manifest lists (issue
// 26, item 7: a byte model exported over a gpt2 one kept GPT-2's tokenizer files). A folder
// with files export did not write is refused unless --overwrite is given.
TEST_F(Interchange, AnExportFolderHoldsExactlyThatExport) {
  const fs::path out = dir_ / "shared_hf";
  Result e = run_myriad(cat("export --checkpoint ", gpt2_run().string(), " --output ", out.string()));
  ASSERT_EQ(e.code, 0) << e.output;
  const std::vector<std::string> gpt2_files = {"config.json", "merges.txt", "model.safetensors", "myriad_export.json",
                                               "tokenizer_config.json", "vocab.json"};
  EXPECT_EQ(listing(out), gpt2_files);
  const auto manifest = nlohmann::json::parse(read_file(out / "myriad_export.json"));
  EXPECT_EQ(manifest["files"], nlohmann::json({"config.json", "merges.txt", "model.safetensors", "tokenizer_config.json",
                                               "vocab.json"}));
  small_export();
  e = run_myriad(cat("export --checkpoint ", (dir_ / "small").string(), " --output ", out.string()));
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_EQ(listing(out), (std::vector<std::string>{"config.json", "model.safetensors", "myriad_export.json"}));
  EXPECT_EQ(nlohmann::json::parse(read_file(out / "config.json"))["vocab_size"], 256);
  // A file the export did not write: refused and named, the folder left as it is.
  std::ofstream(out / "notes.txt") << "mine\n";
  const std::string model = read_file(out / "model.safetensors");
  expect_one_line_error(run_myriad(cat("export --checkpoint ", gpt2_run().string(), " --output ", out.string())),
                     "notes.txt");
  EXPECT_EQ(read_file(out / "notes.txt"), "mine\n");
  EXPECT_EQ(read_file(out / "model.safetensors"), model);
  // --overwrite: the folder is the export's alone afterwards.
  e = run_myriad(cat("export --checkpoint ", (dir_ / "small").string(), " --output ", out.string(), " --overwrite"));
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_EQ(listing(out), (std::vector<std::string>{"config.json", "model.safetensors", "myriad_export.json"}));
  // Another tool's model (no manifest) is refused; an empty folder is taken.
  fs::create_directories(dir_ / "theirs");
  std::ofstream(dir_ / "theirs/model.safetensors") << "theirs";
  expect_one_line_error(run_myriad(cat("export --checkpoint ", (dir_ / "small").string(), " --output ", (dir_ / "theirs").string())),
                     "model.safetensors");
  EXPECT_EQ(read_file(dir_ / "theirs/model.safetensors"), "theirs");
  fs::create_directories(dir_ / "empty_out");
  e = run_myriad(cat("export --checkpoint ", (dir_ / "small").string(), " --output ", (dir_ / "nope/../empty_out").string()));
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_EQ(listing(dir_ / "empty_out"), (std::vector<std::string>{"config.json", "model.safetensors", "myriad_export.json"}));
  // A file, or the checkpoint's own folder, is never the output.
  std::ofstream(dir_ / "a_file") << "f";
  expect_one_line_error(run_myriad(cat("export --checkpoint ", (dir_ / "small").string(), " --output ", (dir_ / "a_file").string(),
                                    " --overwrite")),
                     "not a directory");
  expect_one_line_error(run_myriad(cat("export --checkpoint ", (dir_ / "small").string(), " --output ", (dir_ / "small").string(),
                                    " --overwrite")),
                     "holds the checkpoint");
  EXPECT_EQ(run_myriad(cat("verify ", (dir_ / "small").string())).code, 0);
  for (const auto& f : fs::directory_iterator(dir_))  // no temporary folder left behind
    EXPECT_EQ(f.path().filename().string().find(".tmp-"), std::string::npos) << f.path();
}

// An export that fails on a full disk leaves the earlier export whole and says why (issue 26,
// item 6: the earlier model.safetensors was truncated, and the error said "cannot write").
TEST_F(Interchange, AnExportThatFailsLeavesTheEarlierExportWhole) {
  small_export();
  const fs::path d = dir_ / "full", disk = d / "disk";
  fs::create_directories(disk);
  const std::string bin = cat("OMP_NUM_THREADS=1 ", MYRIAD_BINARY_DIR, "/myriad export --checkpoint ",
                              (dir_ / "small").string(), " --output ", (disk / "out").string());
  const std::string script = cat("mount -t tmpfs -o size=1m none ", disk.string(), " || exit 1\n",
                                 bin, " || exit 1\n",
                                 "cp ", (disk / "out/model.safetensors").string(), " ", (d / "first.st").string(), "\n",
                                 "head -c 4000000 /dev/zero > ", (disk / "fill").string(), " 2>/dev/null\n",
                                 "truncate -s -16K ", (disk / "fill").string(), " || exit 1\n",
                                 bin, " > ", (d / "second.log").string(), " 2>&1; echo $? > ", (d / "second.rc").string(), "\n",
                                 "cp ", (disk / "out/model.safetensors").string(), " ", (d / "after.st").string(), "\n",
                                 "ls -A ", (disk / "out").string(), " > ", (d / "out.ls").string(), "\n",
                                 "ls -A ", disk.string(), " > ", (d / "disk.ls").string(), "\n");
  if (!in_own_mount_namespace(d, script)) GTEST_SKIP() << "unshare -rm cannot mount a tmpfs here: nothing fills a disk";
  const std::string log = read_file(d / "second.log");
  EXPECT_EQ(read_file(d / "second.rc"), "3\n") << log;
  EXPECT_TRUE(contains(log, "No space left on device")) << log;
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
  EXPECT_EQ(read_file(d / "after.st"), read_file(d / "first.st"));
  EXPECT_FALSE(read_file(d / "first.st").empty());
  EXPECT_EQ(read_file(d / "out.ls"), "config.json\nmodel.safetensors\nmyriad_export.json\n");
  EXPECT_EQ(read_file(d / "disk.ls"), "fill\nout\n");  // the temporary folder removed
}

// Export to a new folder that cannot be created: an input error that names it and says why
// (issue 26, item 10; an internal error before). /sys refuses new folders even to root (EPERM;
// EACCES to another user); a read-only tmpfs, where this machine lets a test mount one, is the
// read-only filesystem.
TEST_F(Interchange, AnExportThatCannotCreateItsFolderIsAnInputError) {
  small_export();
  Result r = run_myriad(cat("export --checkpoint ", (dir_ / "small").string(), " --output /sys/myriad_export_test"));
  expect_one_line_error(r, "/sys/myriad_export_test");
  EXPECT_TRUE(contains(r.output, "Operation not permitted") || contains(r.output, "Permission denied")) << r.output;
  const fs::path d = dir_ / "ro", ro = d / "mnt";
  fs::create_directories(ro);
  const std::string script = cat("mount -t tmpfs -o ro none ", ro.string(), " || exit 1\n", "OMP_NUM_THREADS=1 ",
                                 MYRIAD_BINARY_DIR, "/myriad export --checkpoint ", (dir_ / "small").string(), " --output ",
                                 (ro / "new").string(), " > ", (d / "log").string(), " 2>&1; echo $? > ",
                                 (d / "rc").string(), "\n");
  if (!in_own_mount_namespace(d, script)) GTEST_SKIP() << "unshare -rm cannot mount a tmpfs here";
  r = {std::stoi(read_file(d / "rc")), read_file(d / "log")};
  expect_one_line_error(r, (ro / "new").string());
  EXPECT_TRUE(contains(r.output, "Read-only file system")) << r.output;
}

// An --output that is a mount point (a volume's root) cannot be swapped with a folder beside it
// (rename gives EBUSY): the export is written inside it instead, and the folder then holds that
// export's files only, the earlier export's others removed, a killed export's staging folder
// too. A file no export wrote is still refused; a full disk leaves the earlier export whole.
TEST_F(Interchange, AnExportIntoAMountPointIsWrittenInsideIt) {
  small_export();
  const fs::path d = dir_ / "mounted", out = d / "out", full = d / "full";
  fs::create_directories(out);
  fs::create_directories(full);
  auto exporting = [&](const fs::path& ckpt, const fs::path& to, const std::string& name, const std::string& extra = "") {
    return cat("OMP_NUM_THREADS=1 ", MYRIAD_BINARY_DIR, "/myriad export --checkpoint ", ckpt.string(), " --output ",
               to.string(), " ", extra, " > ", (d / (name + ".log")).string(), " 2>&1; echo $? > ",
               (d / (name + ".rc")).string(), "\n", "ls -A ", to.string(), " > ", (d / (name + ".ls")).string(), "\n");
  };
  const fs::path stale = out / ".myriad-tmp-4194303";  // no process has this pid
  const std::string script = cat(
      "mount -t tmpfs none ", out.string(), " || exit 1\n", exporting(gpt2_run(), out, "first"),
      "mkdir ", stale.string(), " && echo x > ", (stale / "model.safetensors").string(), "\n",
      exporting(dir_ / "small", out, "second"),
      "cp ", (out / "model.safetensors").string(), " ", (d / "second.st").string(), "\n",
      "cp ", (out / "myriad_export.json").string(), " ", (d / "second.json").string(), "\n",
      "echo mine > ", (out / "notes.txt").string(), "\n", exporting(dir_ / "small", out, "third"),
      "cp ", (out / "notes.txt").string(), " ", (d / "third.notes").string(), "\n",
      "mount -t tmpfs -o size=1m none ", full.string(), " || exit 1\n", exporting(dir_ / "small", full, "fourth"),
      "head -c 4000000 /dev/zero > ", (full / "fill").string(), " 2>/dev/null\n",
      "truncate -s -16K ", (full / "fill").string(), " || exit 1\n",
      exporting(gpt2_run(), full, "fifth", "--overwrite"),
      "cp ", (full / "model.safetensors").string(), " ", (d / "fifth.st").string(), "\n");
  if (!in_own_mount_namespace(d, script)) GTEST_SKIP() << "unshare -rm cannot mount a tmpfs here";
  auto rc = [&](const std::string& name) { return read_file(d / (name + ".rc")); };
  EXPECT_EQ(rc("first"), "0\n") << read_file(d / "first.log");
  EXPECT_EQ(read_file(d / "first.ls"), "config.json\nmerges.txt\nmodel.safetensors\nmyriad_export.json\n"
                                       "tokenizer_config.json\nvocab.json\n");
  EXPECT_EQ(rc("second"), "0\n") << read_file(d / "second.log");
  EXPECT_EQ(read_file(d / "second.ls"), "config.json\nmodel.safetensors\nmyriad_export.json\n");
  EXPECT_EQ(read_file(d / "second.st"), read_file(dir_ / "small_hf/model.safetensors"));
  EXPECT_EQ(nlohmann::json::parse(read_file(d / "second.json"))["files"],
            nlohmann::json({"config.json", "model.safetensors"}));
  const Result third{std::stoi(rc("third")), read_file(d / "third.log")};
  expect_one_line_error(third, "notes.txt");
  EXPECT_EQ(read_file(d / "third.notes"), "mine\n");
  EXPECT_EQ(read_file(d / "third.ls"), "config.json\nmodel.safetensors\nmyriad_export.json\nnotes.txt\n");
  // The full disk: staging fails, the earlier export stays whole, the staging folder goes.
  EXPECT_EQ(rc("fourth"), "0\n") << read_file(d / "fourth.log");
  const std::string log = read_file(d / "fifth.log");
  EXPECT_EQ(rc("fifth"), "3\n") << log;
  EXPECT_TRUE(contains(log, "No space left on device")) << log;
  EXPECT_TRUE(contains(log, full.string() + " is left as it was")) << log;
  EXPECT_FALSE(contains(log, "export: export:")) << log;
  EXPECT_EQ(read_file(d / "fifth.ls"), "config.json\nfill\nmodel.safetensors\nmyriad_export.json\n");
  EXPECT_EQ(read_file(d / "fifth.st"), read_file(dir_ / "small_hf/model.safetensors"));
  for (const auto& e : fs::directory_iterator(d))  // no folder beside the mount points left behind
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

// --overwrite never removes the checkpoint being exported, also when it is reached through a
// symbolic link that leads into OUT (the check compared the spelled paths).
TEST_F(Interchange, AnOutputThatHoldsTheCheckpointThroughALinkIsRefused) {
  small_export();
  const fs::path out = dir_ / "holds_link", link = dir_ / "link_to_run";
  fs::create_directories(out);
  fs::copy(dir_ / "small", out / "run", fs::copy_options::recursive);
  fs::create_directory_symlink(out / "run", link);
  for (const fs::path& ckpt : {link, link / "checkpoints"}) {
    expect_one_line_error(run_myriad(cat("export --checkpoint ", ckpt.string(), " --output ", out.string(), " --overwrite")),
                       "holds the checkpoint");
    EXPECT_EQ(run_myriad(cat("verify ", (out / "run").string())).code, 0);
  }
}

// Non-finite weights are an input error naming the tensor and the element (issue 26, item 8: a
// NaN imported with exit 0).
TEST_F(Interchange, ImportRefusesNonFiniteWeights) {
  const fs::path good = small_export();
  for (const auto& [tensor, element, value] : std::vector<std::tuple<std::string, int, float>>{
           {"ln_f.weight", 3, std::nanf("")}, {"h.1.mlp.c_fc.weight", 1000, -INFINITY}, {"wte.weight", 0, INFINITY}}) {
    const fs::path d = dir_ / cat("nonfinite_", element);
    fs::create_directories(d);
    fs::copy_file(good / "config.json", d / "config.json", fs::copy_options::overwrite_existing);
    auto t = myriad::checkpoint::read_safetensors((good / "model.safetensors").string());
    t[tensor].data[element] = value;
    myriad::checkpoint::write_safetensors((d / "model.safetensors").string(), t);
    const Result r = run_myriad(cat("import --hf ", d.string(), " --output ", (d / "out").string()));
    expect_one_line_error(r, cat("tensor ", tensor, " element ", element, " is ", std::isnan(value) ? "nan" : value > 0 ? "inf" : "-inf"));
    EXPECT_TRUE(contains(r.output, (d / "model.safetensors").string())) << r.output;
    EXPECT_FALSE(fs::exists(d / "out"));
  }
}

// Malformed headers and configs: one line, exit 2, the file and the field named (issue 26, item
// 10: each was an internal error).
TEST_F(Interchange, MalformedHeadersAndConfigsAreInputErrors) {
  const fs::path good = small_export();
  const auto [header, data] = split_safetensors(read_file(good / "model.safetensors"));
  const auto config = nlohmann::json::parse(read_file(good / "config.json"));
  auto import = [&](const std::string& name, const nlohmann::json& h, const nlohmann::json& c) {
    const fs::path d = dir_ / cat("malformed_", name);
    fs::create_directories(d);
    std::ofstream(d / "config.json") << c.dump();
    std::ofstream(d / "model.safetensors", std::ios::binary) << join_safetensors(h, data);
    return run_myriad(cat("import --hf ", d.string(), " --output ", (d / "out").string()));
  };
  const uint64_t huge = (uint64_t(1) << 62) + 1;
  struct HeaderCase {
    std::string name, key;
    nlohmann::json value;
    std::string says;
  };
  for (const HeaderCase& c : std::vector<HeaderCase>{
           {"offsets", "data_offsets", {"0", "128"}, "tensor ln_f.bias: data_offsets"},
           {"offsets3", "data_offsets", {0, 64, 128}, "tensor ln_f.bias: data_offsets"},
           {"dtype", "dtype", 7, "tensor ln_f.bias: dtype"},
           {"negative", "shape", {-1}, "tensor ln_f.bias: shape [-1]"},
           {"huge", "shape", {huge}, cat("tensor ln_f.bias: shape [", huge, "]")},
           {"shape_text", "shape", "32", "tensor ln_f.bias: shape"}}) {
    nlohmann::json h = header;
    h["ln_f.bias"][c.key] = c.value;
    if (c.name == "huge") h["ln_f.bias"]["data_offsets"] = {0, 4};
    const Result r = import(c.name, h, config);
    expect_one_line_error(r, c.says);
    EXPECT_TRUE(contains(r.output, "model.safetensors")) << r.output;
  }
  struct ConfigCase {
    std::string key;
    nlohmann::json value;
  };
  for (const ConfigCase& c : std::vector<ConfigCase>{{"activation_function", nullptr},
                                                     {"myriad", 5},
                                                     {"myriad", {{"tokenizer", 5}}},
                                                     {"model_type", 2},
                                                     {"scale_attn_weights", "yes"},
                                                     {"layer_norm_epsilon", "small"},
                                                     {"n_inner", "big"}}) {
    nlohmann::json bad = config;
    bad[c.key] = c.value;
    const Result r = import(cat("config_", c.key), header, bad);
    expect_one_line_error(r, c.key);
    EXPECT_TRUE(contains(r.output, "config.json")) << r.output;
  }
  // model.safetensors a directory, config.json a directory.
  for (const std::string file : {"model.safetensors", "config.json"}) {
    const fs::path d = dir_ / cat("dir_", file);
    fs::create_directories(d);
    fs::copy(good, d, fs::copy_options::overwrite_existing | fs::copy_options::recursive);
    fs::remove(d / file);
    fs::create_directories(d / file);
    const Result r = run_myriad(cat("import --hf ", d.string(), " --output ", (d / "out").string()));
    expect_one_line_error(r, (d / file).string());
    EXPECT_TRUE(contains(r.output, "not a file")) << r.output;
  }
}

// The attention mask buffers a released GPT-2 stores (in any dtype) are dropped, unread (issue
// 26, item 11: a BOOL one blocked the import).
TEST_F(Interchange, ImportDropsAMaskBufferOfAnyDtype) {
  const fs::path good = small_export();
  auto [header, data] = split_safetensors(read_file(good / "model.safetensors"));
  const uint64_t at = data.size();
  header["h.0.attn.bias"] = {{"dtype", "BOOL"}, {"shape", {1, 1, 16, 16}}, {"data_offsets", {at, at + 256}}};
  header["transformer.h.1.attn.bias"] = {{"dtype", "U8"}, {"shape", {1, 1, 16, 16}}, {"data_offsets", {at + 256, at + 512}}};
  header["h.1.attn.masked_bias"] = {{"dtype", "F16"}, {"shape", nlohmann::json::array()}, {"data_offsets", {at + 512, at + 514}}};
  data.append(514, '\1');
  const fs::path d = dir_ / "mask_hf";
  fs::create_directories(d);
  fs::copy_file(good / "config.json", d / "config.json", fs::copy_options::overwrite_existing);
  std::ofstream(d / "model.safetensors", std::ios::binary) << join_safetensors(header, data);
  const Result r = run_myriad(cat("import --hf ", d.string(), " --output ", (d / "out").string()));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(weights((d / "out").string()), weights(myriad::checkpoint::resolve((dir_ / "small").string())));
}

// ---- Llama (LlamaForCausalLM) ----

const char* kLlamaSets =
    "--set model.norm=rmsnorm --set model.position_encoding=rope --set model.mlp=swiglu --set model.mlp_hidden=88 "
    "--set model.kv_heads=2 --set model.tied_embeddings=false --set model.bias=false";

// A Llama checkpoint exports to LlamaForCausalLM (bf16 unless asked), in shards with an index
// when over --max-shard-size; its import is the same model; fp32 export -> import -> export gives
// the same bytes, and the bf16 import is the bf16-rounded model.
TEST_F(Interchange, ALlamaExportsAndImportsBothWays) {
  const fs::path rd = dir_ / "llama";
  ASSERT_EQ(run_myriad(train(rd, cat("--set train.steps=2 ", kLlamaSets))).code, 0);
  const std::string ckpt = myriad::checkpoint::resolve(rd.string());
  const Result e = run_myriad(cat("export --checkpoint ", rd.string(), " --output ", (dir_ / "llama_hf").string()));
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_EQ(listing(dir_ / "llama_hf"), (std::vector<std::string>{"config.json", "model.safetensors", "myriad_export.json"}));
  const auto config = nlohmann::json::parse(read_file(dir_ / "llama_hf/config.json"));
  EXPECT_EQ(config["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["num_attention_heads"], 4);
  EXPECT_EQ(config["intermediate_size"], 88);
  EXPECT_EQ(config["hidden_size"], 32);
  EXPECT_EQ(config["head_dim"], 8);
  EXPECT_EQ(config["hidden_act"], "silu");
  EXPECT_EQ(config["tie_word_embeddings"], false);
  EXPECT_EQ(config["attention_bias"], false);
  EXPECT_EQ(config["rope_scaling"], nullptr);
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  const auto [header, data] = split_safetensors(read_file(dir_ / "llama_hf/model.safetensors"));
  EXPECT_EQ(header["model.layers.1.self_attn.k_proj.weight"]["dtype"], "BF16");
  EXPECT_EQ(header["model.layers.1.self_attn.k_proj.weight"]["shape"], nlohmann::json({16, 32}));
  EXPECT_EQ(header["model.layers.0.mlp.gate_proj.weight"]["shape"], nlohmann::json({88, 32}));
  EXPECT_EQ(header["lm_head.weight"]["shape"], nlohmann::json({256, 32}));

  // fp32: the same model back, and the same bytes again.
  ASSERT_EQ(run_myriad(cat("export --checkpoint ", ckpt, " --dtype fp32 --output ", (dir_ / "llama_f32").string())).code, 0);
  Result i = run_myriad(cat("import --hf ", (dir_ / "llama_f32").string(), " --output ", (dir_ / "llama_back").string()));
  ASSERT_EQ(i.code, 0) << i.output;
  EXPECT_EQ(weights(ckpt), weights((dir_ / "llama_back").string()));
  ASSERT_EQ(run_myriad(cat("export --checkpoint ", (dir_ / "llama_back").string(), " --dtype fp32 --output ",
                           (dir_ / "llama_f32_again").string())).code, 0);
  EXPECT_EQ(read_file(dir_ / "llama_f32/model.safetensors"), read_file(dir_ / "llama_f32_again/model.safetensors"));

  // bf16: each weight rounded to nearest even, and a second bf16 export the same bytes.
  ASSERT_EQ(run_myriad(cat("import --hf ", (dir_ / "llama_hf").string(), " --output ", (dir_ / "llama_bf16").string())).code, 0);
  const auto full = weights(ckpt), rounded = weights((dir_ / "llama_bf16").string());
  for (const auto& [name, w] : full) {
    const std::vector<float>& r = rounded.at(name);
    ASSERT_EQ(r.size(), w.size()) << name;
    for (size_t k = 0; k < w.size(); ++k) {
      uint32_t u;
      std::memcpy(&u, &w[k], 4);
      u += 0x7fffu + ((u >> 16) & 1u);
      u &= 0xffff0000u;
      float want;
      std::memcpy(&want, &u, 4);
      ASSERT_EQ(r[k], want) << name << " element " << k;
    }
  }
  ASSERT_EQ(run_myriad(cat("export --checkpoint ", (dir_ / "llama_bf16").string(), " --output ",
                           (dir_ / "llama_hf_again").string())).code, 0);
  EXPECT_EQ(read_file(dir_ / "llama_hf/model.safetensors"), read_file(dir_ / "llama_hf_again/model.safetensors"));

  // In shards of at most 20 KB, with transformers' index; imported, the same model.
  ASSERT_EQ(run_myriad(cat("export --checkpoint ", ckpt, " --dtype fp32 --max-shard-size 20KB --output ",
                           (dir_ / "llama_sharded").string())).code, 0);
  const auto index = nlohmann::json::parse(read_file(dir_ / "llama_sharded/model.safetensors.index.json"));
  std::set<std::string> shards;
  for (const auto& [tensor, file] : index["weight_map"].items()) shards.insert(file.get<std::string>());
  EXPECT_GT(shards.size(), 2u);
  for (const std::string& f : shards) {
    EXPECT_TRUE(fs::exists(dir_ / "llama_sharded" / f)) << f;
    EXPECT_TRUE(f.ends_with(cat("-of-", std::string(5 - std::to_string(shards.size()).size(), '0'), shards.size(),
                                ".safetensors"))) << f;
  }
  EXPECT_FALSE(fs::exists(dir_ / "llama_sharded/model.safetensors"));
  int64_t total = 0;
  for (const auto& [tensor, file] : index["weight_map"].items()) {
    const auto [h, d] = split_safetensors(read_file(dir_ / "llama_sharded" / file.get<std::string>()));
    ASSERT_TRUE(h.contains(tensor)) << tensor << " in " << file;
    total += h[tensor]["data_offsets"][1].get<int64_t>() - h[tensor]["data_offsets"][0].get<int64_t>();
  }
  EXPECT_EQ(index["metadata"]["total_size"], total);
  Result si = run_myriad(cat("import --hf ", (dir_ / "llama_sharded").string(), " --output ", (dir_ / "llama_from_shards").string()));
  ASSERT_EQ(si.code, 0) << si.output;
  EXPECT_EQ(weights(ckpt), weights((dir_ / "llama_from_shards").string()));

  // It samples and trains on, and its greedy sample is the original's.
  Result a = run_myriad(cat("sample --checkpoint ", ckpt, " --prompt abc --tokens 20 --temperature 0"));
  Result b = run_myriad(cat("sample --checkpoint ", (dir_ / "llama_back").string(), " --prompt abc --tokens 20 --temperature 0"));
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_EQ(a.output.substr(a.output.find("prompt tokens")), b.output.substr(b.output.find("prompt tokens")));
  Result r = run_myriad(train(dir_ / "llama_on", cat("--set train.steps=1 ", kLlamaSets, " --resume ",
                                                     (dir_ / "llama_back").string())));
  EXPECT_EQ(r.code, 0) << r.output;
}

// A llama3-tokenized model exports the tokenizer transformers' AutoTokenizer loads: Myriad's own
// tokenizer.json (setup.sh builds it from llama3-tokenizer-js) with its special tokens.
TEST_F(Interchange, ALlama3TokenizerModelExportsItsTokenizer) {
  const fs::path rd = dir_ / "llama3";
  const std::string data = (dir_ / "llama3corpus").string();
  ASSERT_EQ(run_myriad(cat("prepare --input /usr/share/games/fortunes/science --tokenizer llama3 --output ", data,
                           " --doc-separator %")).code, 0);
  Result t = run_myriad(train(rd, cat("--set train.steps=1 --set data.tokenizer=llama3 --set model.vocab_size=128256 ",
                                      "--set train.global_batch=2 --set train.micro_batch=1 --set data.train=", data, " ",
                                      kLlamaSets)));
  ASSERT_EQ(t.code, 0) << t.output;
  ASSERT_EQ(run_myriad(cat("export --checkpoint ", rd.string(), " --output ", (dir_ / "llama3_hf").string())).code, 0);
  EXPECT_EQ(read_file(dir_ / "llama3_hf/tokenizer.json"), read_file(fs::path(myriad::data::llama3_dir()) / "tokenizer.json"));
  const auto tc = nlohmann::json::parse(read_file(dir_ / "llama3_hf/tokenizer_config.json"));
  EXPECT_EQ(tc["tokenizer_class"], "PreTrainedTokenizerFast");
  EXPECT_EQ(tc["eos_token"], "<|end_of_text|>");
  const auto config = nlohmann::json::parse(read_file(dir_ / "llama3_hf/config.json"));
  EXPECT_EQ(config["vocab_size"], 128256);
  EXPECT_EQ(config["bos_token_id"], 128000);
  EXPECT_EQ(config["eos_token_id"], 128001);
  EXPECT_EQ(config["myriad"]["tokenizer"], "llama3");
  // Imported, the tokenizer comes back with it.
  ASSERT_EQ(run_myriad(cat("import --hf ", (dir_ / "llama3_hf").string(), " --output ", (dir_ / "llama3_back").string())).code, 0);
  EXPECT_EQ(myriad::checkpoint::read_meta((dir_ / "llama3_back").string())["tokenizer"], "llama3");
}

// A context extension: a RoPE model trained at 16 positions continues at 64 from that
// checkpoint's weights (checkpoint.init_from) with another theta and Llama 3's scaling, and its
// first step starts from exactly those weights (a learning rate of 1e-30 leaves them as they
// were). Learned positions have no such freedom: their table's shape differs, named.
TEST_F(Interchange, AContextExtensionStartsFromAShorterModel) {
  const fs::path shorter = dir_ / "ext_16", longer = dir_ / "ext_64";
  ASSERT_EQ(run_myriad(train(shorter, cat("--set train.steps=2 --set model.rope_theta=10000 ", kLlamaSets))).code, 0);
  const Result r = run_myriad(train(longer, cat("--set train.steps=1 --set optim.lr=1e-30 --set optim.min_lr=0 ",
                                                "--set model.seq_len=64 --set model.rope_theta=40000 ",
                                                "--set model.rope_scaling=llama3 --set model.rope_factor=4 ",
                                                "--set model.rope_original_positions=16 --set checkpoint.init_from=",
                                                shorter.string(), " ", kLlamaSets)));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "init: the weights of ")) << r.output;
  EXPECT_EQ(weights((shorter / "checkpoints/step_00000002").string()), weights((longer / "checkpoints/step_00000001").string()));
  small_export();  // dir_/small: a GPT-2 block trained at 16 positions
  const Result gpt2 = run_myriad(train(dir_ / "ext_gpt2", cat("--set train.steps=1 --set model.seq_len=64 --set checkpoint.init_from=",
                                                              (dir_ / "small").string())));
  EXPECT_EQ(gpt2.code, 2) << gpt2.output;
  EXPECT_TRUE(contains(gpt2.output, "wpe")) << gpt2.output;
}

// What Myriad cannot express, in a LlamaForCausalLM config or in an export, is refused with
// exit 2 and one line naming the field or key.
TEST_F(Interchange, WhatLlamaOrMyriadCannotExpressIsRefused) {
  const fs::path rd = dir_ / "llama_bad";
  ASSERT_EQ(run_myriad(train(rd, cat("--set train.steps=1 ", kLlamaSets))).code, 0);
  const fs::path good = dir_ / "llama_bad_hf";
  ASSERT_EQ(run_myriad(cat("export --checkpoint ", rd.string(), " --output ", good.string())).code, 0);
  auto with_config = [&](const std::string& name, const std::function<void(nlohmann::json&)>& change) {
    const fs::path d = dir_ / name;
    fs::create_directories(d);
    fs::copy_file(good / "model.safetensors", d / "model.safetensors", fs::copy_options::overwrite_existing);
    nlohmann::json c = nlohmann::json::parse(read_file(good / "config.json"));
    change(c);
    std::ofstream(d / "config.json") << c.dump(2);
    return run_myriad(cat("import --hf ", d.string(), " --output ", (d / "out").string()));
  };
  expect_one_line_error(with_config("yarn", [](auto& c) { c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; }),
                     "rope_scaling.rope_type = \"yarn\"");
  expect_one_line_error(with_config("bias", [](auto& c) { c["attention_bias"] = true; }),
                     "attention_bias = true but mlp_bias = false");
  expect_one_line_error(with_config("gelu", [](auto& c) { c["hidden_act"] = "gelu"; }), "hidden_act = \"gelu\"");
  // transformers' "default" scaling is none.
  EXPECT_EQ(with_config("default_scaling", [](auto& c) { c["rope_scaling"] = {{"rope_type", "default"}}; }).code, 0);
  // A head_dim of its own is read (Qwen3's is): here the tensors then disagree with it.
  expect_one_line_error(with_config("head_dim", [](auto& c) { c["head_dim"] = 16; }),
                        "tensor model.layers.0.self_attn.q_proj.weight has shape [32, 32] but the config makes it [64, 32]");
  expect_one_line_error(with_config("kv3", [](auto& c) { c["num_key_value_heads"] = 3; }),
                     "num_key_value_heads = 3 does not divide num_attention_heads = 4");
  expect_one_line_error(with_config("theta", [](auto& c) { c["rope_theta"] = 0; }), "model.rope_theta must be positive");
  expect_one_line_error(with_config("tied", [](auto& c) { c["tie_word_embeddings"] = true; }),
                     "lm_head.weight differs from model.embed_tokens.weight but tie_word_embeddings is true");
  // Export: a window, a parallel block, a bad dtype or shard size.
  ASSERT_EQ(run_myriad(train(dir_ / "llama_window", cat("--set train.steps=1 --set model.window=4 ", kLlamaSets))).code, 0);
  expect_one_line_error(run_myriad(cat("export --checkpoint ", (dir_ / "llama_window").string(), " --output ",
                                    (dir_ / "llama_window_hf").string())),
                     "model.window = 4 (LlamaForCausalLM's attention is full causal)");
  EXPECT_FALSE(fs::exists(dir_ / "llama_window_hf"));
  // A Llama with a head size of its own writes it (LlamaConfig's head_dim); a mixture of experts
  // or Qwen3's query and key norms go to their own families (HfFamilies below).
  ASSERT_EQ(run_myriad(train(dir_ / "llama_hd", cat("--set train.steps=1 ", kLlamaSets, " --set model.head_dim=16"))).code, 0);
  ASSERT_EQ(run_myriad(cat("export --checkpoint ", (dir_ / "llama_hd").string(), " --output ",
                           (dir_ / "llama_hd_hf").string())).code, 0);
  const auto hd = nlohmann::json::parse(read_file(dir_ / "llama_hd_hf/config.json"));
  EXPECT_EQ(hd["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(hd["head_dim"], 16);
  // A GPT-2 block with fewer key/value heads fits neither format; the message names what GPT-2 lacks.
  ASSERT_EQ(run_myriad(train(dir_ / "gpt2_gqa", "--set train.steps=1 --set model.kv_heads=2")).code, 0);
  expect_one_line_error(run_myriad(cat("export --checkpoint ", (dir_ / "gpt2_gqa").string(), " --output ",
                                    (dir_ / "gpt2_gqa_hf").string())),
                     "model.kv_heads = 2, which GPT-2 cannot express, and model.norm = \"layernorm\"");
  expect_one_line_error(run_myriad(cat("export --checkpoint ", rd.string(), " --dtype fp16 --output ", (dir_ / "x").string())),
                     "--dtype fp16 is not one of: bf16, fp32");
  expect_one_line_error(run_myriad(cat("export --checkpoint ", rd.string(), " --max-shard-size lots --output ", (dir_ / "x").string())),
                     "--max-shard-size lots is not a size");
  EXPECT_FALSE(fs::exists(dir_ / "x"));
}

// Hardening III items 3, 8 and 12: the rotary parameters in either form transformers writes
// (before 5: rope_theta and rope_scaling at the top; from 5: rope_parameters), each read, the
// two compared where a file has both; nothing the file does not say is filled in; each refusal
// names the field and its value as written. A theta other than the default and Llama 3.1's
// scaling, so that neither can hide behind a default.
TEST_F(Interchange, RotaryParametersInEitherFormWithNothingFilledIn) {
  const fs::path rd = dir_ / "rope";
  ASSERT_EQ(run_myriad(train(rd, cat("--set train.steps=1 ", kLlamaSets, " --set model.rope_theta=500000 --set "
                                     "model.rope_scaling=llama3 --set model.rope_factor=4 --set model.rope_original_positions=8"))).code, 0);
  const fs::path good = dir_ / "rope_hf";
  ASSERT_EQ(run_myriad(cat("export --checkpoint ", rd.string(), " --dtype fp32 --output ", good.string())).code, 0);
  const auto exported = nlohmann::json::parse(read_file(good / "config.json"));
  EXPECT_EQ(exported["rope_theta"], 500000.0);
  EXPECT_EQ(exported["rope_scaling"]["rope_type"], "llama3");
  auto with_config = [&](const std::string& name, const std::function<void(nlohmann::json&)>& change) {
    const fs::path d = dir_ / name;
    fs::create_directories(d);
    fs::copy_file(good / "model.safetensors", d / "model.safetensors", fs::copy_options::overwrite_existing);
    nlohmann::json c = exported;
    change(c);
    std::ofstream(d / "config.json") << c.dump(2);
    return run_myriad(cat("import --hf ", d.string(), " --output ", (d / "out").string()));
  };
  auto imported = [&](const std::string& name) {
    const std::string dir = (dir_ / name / "out").string();
    return myriad::parse_config(myriad::checkpoint::read_meta(dir)["config"].get<std::string>(), dir).model;
  };
  // transformers 5's form: rope_parameters alone.
  const nlohmann::json v5 = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 4.0}, {"low_freq_factor", 1.0},
                             {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8}};
  for (const auto& [name, change] : std::vector<std::pair<std::string, std::function<void(nlohmann::json&)>>>{
           {"rope_v4", [](nlohmann::json&) {}},
           {"rope_v5", [&](nlohmann::json& c) { c.erase("rope_theta"), c.erase("rope_scaling"), c["rope_parameters"] = v5; }},
           {"rope_both", [&](nlohmann::json& c) { c["rope_parameters"] = v5; }},
           {"rope_v5_null_scaling", [&](nlohmann::json& c) { c.erase("rope_theta"), c["rope_scaling"] = nullptr, c["rope_parameters"] = v5; }}}) {
    const Result r = with_config(name, change);
    ASSERT_EQ(r.code, 0) << name << ": " << r.output;
    const myriad::ModelConfig m = imported(name);
    EXPECT_EQ(m.rope_theta, 500000.0) << name;
    EXPECT_EQ(m.rope_scaling, "llama3") << name;
    EXPECT_EQ(m.rope_factor, 4.0) << name;
    EXPECT_EQ(m.rope_original_positions, 8) << name;
    EXPECT_EQ(weights((dir_ / name / "out").string()), weights(myriad::checkpoint::resolve(rd.string()))) << name;
  }
  // The same model samples the same in either form: its positions turn as they did.
  const Result a = run_myriad(cat("sample --checkpoint ", rd.string(), " --prompt abc --tokens 12 --temperature 0"));
  const Result b = run_myriad(cat("sample --checkpoint ", (dir_ / "rope_v5/out").string(), " --prompt abc --tokens 12 --temperature 0"));
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_EQ(a.output.substr(a.output.find("prompt tokens")), b.output.substr(b.output.find("prompt tokens")));
  // rope_type default in the new form: no scaling, the theta read.
  ASSERT_EQ(with_config("rope_v5_default", [](auto& c) {
              c.erase("rope_theta"), c.erase("rope_scaling"), c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 250000.0}};
            }).code, 0);
  EXPECT_EQ(imported("rope_v5_default").rope_theta, 250000.0);
  EXPECT_EQ(imported("rope_v5_default").rope_scaling, "");

  // Refused, naming the field and its value as written.
  expect_one_line_error(with_config("rope_disagree", [&](auto& c) { c["rope_parameters"] = v5, c["rope_parameters"]["rope_theta"] = 10000.0; }),
                     "rope_theta = 500000.0 but rope_parameters.rope_theta = 10000.0: the two forms disagree");
  expect_one_line_error(with_config("rope_disagree_factor", [&](auto& c) { c["rope_parameters"] = v5, c["rope_parameters"]["factor"] = 8.0; }),
                     "describe different rotary scalings: the two forms disagree");
  expect_one_line_error(with_config("rope_bare", [](auto& c) { c["rope_scaling"] = {{"rope_type", "llama3"}}; }),
                     "rope_scaling.factor is missing");
  expect_one_line_error(with_config("rope_bare_v5", [](auto& c) {
                       c.erase("rope_scaling"), c["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
                     }),
                     "rope_parameters.low_freq_factor is missing");
  expect_one_line_error(with_config("rope_fraction", [](auto& c) { c["rope_scaling"]["original_max_position_embeddings"] = 8192.9; }),
                     "rope_scaling.original_max_position_embeddings is 8192.9, not an integer");
  expect_one_line_error(with_config("rope_huge", [](auto& c) { c["rope_scaling"]["original_max_position_embeddings"] = 1e30; }),
                     "rope_scaling.original_max_position_embeddings is 1e+30, not an integer");
  expect_one_line_error(with_config("rope_per_layer", [&](auto& c) { c["rope_parameters"] = {{"full_attention", v5}}; }),
                     "rope_parameters.full_attention is an object");
  // The sizes, in transformers' words.
  expect_one_line_error(with_config("kv0", [](auto& c) { c["num_key_value_heads"] = 0; }),
                     "num_key_value_heads = 0: it must be a positive integer");
  // A head_dim of its own is taken (5 heads of 8 over 32 features: the tensors then disagree).
  expect_one_line_error(with_config("head_dim_decoupled", [](auto& c) {
    c["num_attention_heads"] = 5, c["num_key_value_heads"] = 5, c["head_dim"] = 8;
  }), "tensor model.layers.0.self_attn.q_proj.weight has shape [32, 32] but the config makes it [40, 32]");
  expect_one_line_error(with_config("hidden_odd", [](auto& c) { c["num_attention_heads"] = 5, c.erase("head_dim"); }),
                     "hidden_size = 32 is not a multiple of num_attention_heads = 5");
  // Item 4: a vocabulary smaller than its tokenizer's is refused at import.
  expect_one_line_error(with_config("vocab100", [](auto& c) { c["vocab_size"] = 100; }),
                     "vocab_size = 100 is below the byte tokenizer's 256 ids");
}

// Hardening III, unclear cases decided: safetensors as the reference library reads them
// (the tensors tile the data exactly: overlapping offsets and trailing bytes are refused); a
// folder with both model.safetensors and an index loads model.safetensors, as transformers does;
// --max-shard-size in any case, a lowercase b counting bits as in transformers; a GPT-2-layout
// model on Llama 3's ids exports that tokenizer and its special ids.
TEST_F(Interchange, UnclearCasesDecided) {
  const fs::path good = small_export();
  const auto [header, data] = split_safetensors(read_file(good / "model.safetensors"));
  auto import = [&](const std::string& name, const std::string& bytes) {
    const fs::path d = dir_ / name;
    fs::create_directories(d);
    fs::copy_file(good / "config.json", d / "config.json", fs::copy_options::overwrite_existing);
    std::ofstream(d / "model.safetensors", std::ios::binary) << bytes;
    return run_myriad(cat("import --hf ", d.string(), " --output ", (d / "out").string()));
  };
  expect_one_line_error(import("trailing", join_safetensors(header, data + std::string(64, '\0'))),
                     "64 bytes follow the last tensor's data");
  const nlohmann::json overlap = {{"a", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
                                   {"b", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {4, 12}}}},
                                   {"c", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {12, 20}}}}};
  expect_one_line_error(import("overlap", join_safetensors(overlap, std::string(20, '\0'))), "data_offsets overlap at byte 4");
  nlohmann::json gap = header;
  gap["ln_f.bias"]["data_offsets"] = gap["ln_f.weight"]["data_offsets"];  // its own bytes then belong to nothing
  expect_one_line_error(import("gap", join_safetensors(gap, data)), "data_offsets leave a gap at byte");

  // Both a single file and an index: the single file is read, and the log says so.
  const fs::path both = dir_ / "both";
  fs::copy(good, both, fs::copy_options::recursive);
  std::ofstream(both / "model.safetensors.index.json") << R"({"weight_map": {"wte.weight": "gone.safetensors"}})";
  const Result r = run_myriad(cat("import --hf ", both.string(), " --output ", (both / "out").string()));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "reading model.safetensors, as transformers does")) << r.output;

  // --max-shard-size in lowercase: bytes as transformers counts them (a lowercase b is bits).
  const std::string ckpt = myriad::checkpoint::resolve((dir_ / "small").string());
  const Result kb = run_myriad(cat("export --checkpoint ", ckpt, " --max-shard-size 80kb --output ", (dir_ / "lower").string()));
  ASSERT_EQ(kb.code, 0) << kb.output;
  EXPECT_TRUE(contains(kb.output, "--max-shard-size 80kb is 10000 bytes")) << kb.output;
  const auto index = nlohmann::json::parse(read_file(dir_ / "lower/model.safetensors.index.json"));
  EXPECT_GT(index["weight_map"].size(), 0u);
  ASSERT_EQ(run_myriad(cat("export --checkpoint ", ckpt, " --max-shard-size 10KB --output ", (dir_ / "upper").string())).code, 0);
  EXPECT_EQ(read_file(dir_ / "lower/model.safetensors.index.json"), read_file(dir_ / "upper/model.safetensors.index.json"));

  // A GPT-2 layout on Llama 3's ids.
  const std::string llama_data = (dir_ / "gpt2_llama3_corpus").string();
  ASSERT_EQ(run_myriad(cat("prepare --input /usr/share/games/fortunes/science --tokenizer llama3 --output ", llama_data,
                           " --doc-separator %")).code, 0);
  const fs::path rd = dir_ / "gpt2_llama3";
  ASSERT_EQ(run_myriad(train(rd, cat("--set train.steps=1 --set data.tokenizer=llama3 --set model.vocab_size=128256 ",
                                     "--set train.global_batch=2 --set train.micro_batch=1 --set data.train=", llama_data))).code, 0);
  ASSERT_EQ(run_myriad(cat("export --checkpoint ", rd.string(), " --output ", (dir_ / "gpt2_llama3_hf").string())).code, 0);
  const auto config = nlohmann::json::parse(read_file(dir_ / "gpt2_llama3_hf/config.json"));
  EXPECT_EQ(config["model_type"], "gpt2");
  EXPECT_EQ(config["bos_token_id"], 128000);
  EXPECT_EQ(config["eos_token_id"], 128001);
  EXPECT_EQ(read_file(dir_ / "gpt2_llama3_hf/tokenizer.json"), read_file(fs::path(myriad::data::llama3_dir()) / "tokenizer.json"));
}

}  // namespace

namespace {

// Qwen3, Qwen3-MoE and Mixtral, each trained two steps and sent both ways: the config.json
// transformers reads, the tensors' names, an fp32 round trip to the same bytes and weights, a
// sharded one.
struct FamilyCase {
  const char* name;
  const char* architecture;
  const char* sets;
  std::vector<std::string> tensors;  // some the export must hold, with their shapes below
  std::vector<std::vector<int64_t>> shapes;
};

const char* kQwen3Sets =
    "--set model.norm=rmsnorm --set model.position_encoding=rope --set model.mlp=swiglu --set model.mlp_hidden=40 "
    "--set model.kv_heads=2 --set model.head_dim=16 --set model.qk_norm=head --set model.bias=false "
    "--set model.rope_theta=1000000";

class HfFamilies : public Interchange, public ::testing::WithParamInterface<FamilyCase> {};

TEST_P(HfFamilies, ExportAndImportBothWays) {
  const FamilyCase c = GetParam();
  const fs::path rd = dir_ / c.name, hf = dir_ / cat(c.name, "_hf"), f32 = dir_ / cat(c.name, "_f32");
  const Result t = run_myriad(train(rd, cat("--set train.steps=2 ", c.sets)));
  ASSERT_EQ(t.code, 0) << t.output;
  const std::string ckpt = myriad::checkpoint::resolve(rd.string());
  const Result e = run_myriad(cat("export --checkpoint ", rd.string(), " --output ", hf.string()));
  ASSERT_EQ(e.code, 0) << e.output;
  const auto config = nlohmann::json::parse(read_file(hf / "config.json"));
  EXPECT_EQ(config["architectures"][0], c.architecture);
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  const auto [header, data] = split_safetensors(read_file(hf / "model.safetensors"));
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    ASSERT_TRUE(header.contains(c.tensors[i])) << c.tensors[i];
    EXPECT_EQ(header[c.tensors[i]]["shape"], nlohmann::json(c.shapes[i])) << c.tensors[i];
  }
  // fp32: the same model back, and the same bytes again.
  ASSERT_EQ(run_myriad(cat("export --checkpoint ", ckpt, " --dtype fp32 --output ", f32.string())).code, 0);
  const Result i = run_myriad(cat("import --hf ", f32.string(), " --output ", (dir_ / cat(c.name, "_back")).string()));
  ASSERT_EQ(i.code, 0) << i.output;
  EXPECT_EQ(weights(ckpt), weights((dir_ / cat(c.name, "_back")).string()));
  ASSERT_EQ(run_myriad(cat("export --checkpoint ", (dir_ / cat(c.name, "_back")).string(), " --dtype fp32 --output ",
                           (dir_ / cat(c.name, "_again")).string())).code, 0);
  EXPECT_EQ(read_file(f32 / "model.safetensors"), read_file(dir_ / cat(c.name, "_again") / "model.safetensors"));
  // The config too, but for the step it records (the import is a step-0 checkpoint).
  auto first = nlohmann::json::parse(read_file(f32 / "config.json")),
       again = nlohmann::json::parse(read_file(dir_ / cat(c.name, "_again") / "config.json"));
  first["myriad"].erase("step"), again["myriad"].erase("step");
  EXPECT_EQ(first.dump(), again.dump());
  // bf16 in, and sharded in: the same model.
  ASSERT_EQ(run_myriad(cat("import --hf ", hf.string(), " --output ", (dir_ / cat(c.name, "_bf16")).string())).code, 0);
  ASSERT_EQ(run_myriad(cat("export --checkpoint ", ckpt, " --dtype fp32 --max-shard-size 20KB --output ",
                           (dir_ / cat(c.name, "_sharded")).string())).code, 0);
  EXPECT_TRUE(fs::exists(dir_ / cat(c.name, "_sharded") / "model.safetensors.index.json"));
  ASSERT_EQ(run_myriad(cat("import --hf ", (dir_ / cat(c.name, "_sharded")).string(), " --output ",
                           (dir_ / cat(c.name, "_from_shards")).string())).code, 0);
  EXPECT_EQ(weights(ckpt), weights((dir_ / cat(c.name, "_from_shards")).string()));
  // It trains on from the import.
  const Result r = run_myriad(train(dir_ / cat(c.name, "_on"), cat("--set train.steps=1 ", c.sets, " --resume ",
                                                                   (dir_ / cat(c.name, "_back")).string())));
  EXPECT_EQ(r.code, 0) << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    Families, HfFamilies,
    ::testing::Values(
        FamilyCase{"qwen3", "Qwen3ForCausalLM", kQwen3Sets,
                   {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                    "model.layers.1.self_attn.q_norm.weight", "model.layers.1.self_attn.o_proj.weight"},
                   {{64, 32}, {32, 32}, {16}, {32, 64}}},
        FamilyCase{"qwen3_moe", "Qwen3MoeForCausalLM",
                   "--set model.norm=rmsnorm --set model.position_encoding=rope --set model.mlp=swiglu "
                   "--set model.mlp_hidden=40 --set model.kv_heads=2 --set model.head_dim=16 --set model.qk_norm=head "
                   "--set model.bias=false --set model.dense_layers=1 --set model.experts=4 "
                   "--set model.experts_per_token=2 --set model.expert_hidden=12 --set model.tied_embeddings=false",
                   {"model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.gate.weight",
                    "model.layers.1.mlp.experts.3.up_proj.weight", "model.layers.1.mlp.experts.0.down_proj.weight"},
                   {{40, 32}, {4, 32}, {12, 32}, {32, 12}}},
        FamilyCase{"mixtral", "MixtralForCausalLM",
                   "--set model.norm=rmsnorm --set model.position_encoding=rope --set model.mlp=swiglu "
                   "--set model.mlp_hidden=12 --set model.kv_heads=1 --set model.bias=false --set model.experts=4 "
                   "--set model.experts_per_token=2 --set model.expert_hidden=12 --set model.tied_embeddings=false",
                   {"model.layers.0.block_sparse_moe.gate.weight", "model.layers.1.block_sparse_moe.experts.2.w1.weight",
                    "model.layers.1.block_sparse_moe.experts.2.w2.weight", "lm_head.weight"},
                   {{4, 32}, {12, 32}, {32, 12}, {256, 32}}}),
    [](const auto& info) { return std::string(info.param.name); });

// A model from the hub comes with its tokenizer. Qwen's own tokenizer.json (the one setup.sh
// fetches) beside a Qwen3 checkpoint is the built-in qwen3, by name. Another file of Qwen's form
// (here the same tokens written out again) is kept in the checkpoint and named hf:CHECKPOINT;
// `prepare` tokenizes with it, a run continues from the import on those ids, and its export
// carries the same tokenizer files, eos_token the document end. A tokenizer.json of a form
// Myriad does not read is said and left.
TEST_F(Interchange, AnImportKeepsItsTokenizerForContinuedPreTraining) {
  const fs::path rd = dir_ / "qwen_tok", hf = dir_ / "qwen_tok_hf", back = dir_ / "qwen_tok_back";
  const std::string qwen = myriad::data::qwen3_dir();
  const std::string sets = cat(kQwen3Sets, " --set model.vocab_size=151669");
  ASSERT_EQ(run_myriad(train(rd, cat("--set train.steps=1 ", sets))).code, 0);
  ASSERT_EQ(run_myriad(cat("export --checkpoint ", rd.string(), " --output ", hf.string())).code, 0);
  ASSERT_FALSE(fs::exists(hf / "tokenizer.json"));  // a byte-level run has none
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(fs::path(qwen) / f, hf / f);
  Result own = run_myriad(cat("import --hf ", hf.string(), " --output ", (dir_ / "qwen_tok_own").string()));
  ASSERT_EQ(own.code, 0) << own.output;
  EXPECT_EQ(myriad::checkpoint::read_meta((dir_ / "qwen_tok_own").string())["tokenizer"], "qwen3");
  EXPECT_FALSE(fs::exists(dir_ / "qwen_tok_own/tokenizer.json"));
  // The same tokens in other bytes: not the built-in file, so kept.
  const std::string rewritten = nlohmann::json::parse(read_file(fs::path(qwen) / "tokenizer.json")).dump(1);
  std::ofstream(hf / "tokenizer.json", std::ios::trunc) << rewritten;
  Result i = run_myriad(cat("import --hf ", hf.string(), " --output ", back.string()));
  ASSERT_EQ(i.code, 0) << i.output;
  const std::string name = "hf:" + back.string();
  EXPECT_EQ(myriad::checkpoint::read_meta(back.string())["tokenizer"], name);
  EXPECT_EQ(read_file(back / "tokenizer.json"), rewritten);
  EXPECT_EQ(read_file(back / "tokenizer_config.json"), read_file(fs::path(qwen) / "tokenizer_config.json"));
  EXPECT_EQ(run_myriad(cat("verify ", back.string())).code, 0);

  // Continued pre-training on the model's own ids.
  const std::string data = (dir_ / "qwen_tok_corpus").string();
  Result p = run_myriad(cat("prepare --input /usr/share/games/fortunes/science --tokenizer ", name, "/ --output ", data,
                            " --doc-separator %"));
  ASSERT_EQ(p.code, 0) << p.output;
  EXPECT_EQ(nlohmann::json::parse(read_file(data + ".json"))["eot"], 151643);
  const fs::path on = dir_ / "qwen_tok_on";
  Result t = run_myriad(train(on, cat("--set train.steps=1 ", sets, " --set data.tokenizer=", name, " --set data.train=",
                                      data, " --set checkpoint.init_from=", back.string())));
  ASSERT_EQ(t.code, 0) << t.output;
  // Its export carries the same tokenizer, and ends documents where Qwen's does.
  ASSERT_EQ(run_myriad(cat("export --checkpoint ", on.string(), " --output ", (dir_ / "qwen_tok_on_hf").string())).code, 0);
  EXPECT_EQ(read_file(dir_ / "qwen_tok_on_hf/tokenizer.json"), rewritten);
  auto exported = nlohmann::json::parse(read_file(dir_ / "qwen_tok_on_hf/tokenizer_config.json")),
       original = nlohmann::json::parse(read_file(fs::path(qwen) / "tokenizer_config.json"));
  EXPECT_EQ(exported["eos_token"], "<|endoftext|>");  // Qwen's says <|im_end|>, its chat turns' end
  exported.erase("eos_token"), original.erase("eos_token");
  EXPECT_EQ(exported, original);  // the rest as Qwen wrote it (its chat template among it)
  EXPECT_EQ(nlohmann::json::parse(read_file(dir_ / "qwen_tok_on_hf/config.json"))["eos_token_id"], 151643);
  // The byte tokenizer's ids are not the model's own: a run on them is refused, naming both.
  Result wrong = run_myriad(train(dir_ / "qwen_tok_wrong", cat("--set train.steps=1 ", sets, " --set checkpoint.init_from=",
                                                               back.string())));
  EXPECT_EQ(wrong.code, 2) << wrong.output;
  EXPECT_TRUE(contains(wrong.output, name)) << wrong.output;

  // A tokenizer.json of GPT-2's form is not one Myriad reads: said, and not kept.
  auto j = nlohmann::json::parse(read_file(hf / "tokenizer.json"));
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  std::ofstream(hf / "tokenizer.json", std::ios::trunc) << j.dump();
  Result g = run_myriad(cat("import --hf ", hf.string(), " --output ", (dir_ / "qwen_tok_gpt2form").string()));
  ASSERT_EQ(g.code, 0) << g.output;
  EXPECT_TRUE(contains(g.output, "is not kept")) << g.output;
  EXPECT_EQ(myriad::checkpoint::read_meta((dir_ / "qwen_tok_gpt2form").string())["tokenizer"], "byte");
  EXPECT_FALSE(fs::exists(dir_ / "qwen_tok_gpt2form/tokenizer.json"));
}

// What the three families cannot express, or a file that is not what its config says: one line
// naming the key or the tensor, exit 2, nothing written.
TEST_F(Interchange, WhatQwenOrMixtralCannotExpressIsRefused) {
  const char* moe = "--set model.norm=rmsnorm --set model.position_encoding=rope --set model.mlp=swiglu "
                    "--set model.mlp_hidden=12 --set model.kv_heads=2 --set model.bias=false --set model.experts=4 "
                    "--set model.experts_per_token=2 --set model.expert_hidden=12 --set model.tied_embeddings=false";
  for (const auto& [sets, what] : std::vector<std::pair<std::string, std::string>>{
           {" --set model.shared_experts=1", "model.shared_experts = 1"},
           {" --set model.router_score=sigmoid", "model.router_score = \"sigmoid\""},
           {" --set model.qk_norm=all", "model.qk_norm = \"all\""},
           {" --set model.moe_every=2", "every Mixtral layer"}}) {
    const fs::path rd = dir_ / cat("unfit", std::hash<std::string>()(sets));
    ASSERT_EQ(run_myriad(train(rd, cat("--set train.steps=1 ", moe, sets))).code, 0) << sets;
    const fs::path out = dir_ / cat("unfit_hf", std::hash<std::string>()(sets));
    expect_one_line_error(run_myriad(cat("export --checkpoint ", rd.string(), " --output ", out.string())), what);
    EXPECT_FALSE(fs::exists(out)) << sets;
  }
  // A Qwen3-MoE export, then its files broken one way at a time.
  const fs::path rd = dir_ / "qwen_moe_src", good = dir_ / "qwen_moe_good";
  ASSERT_EQ(run_myriad(train(rd, cat("--set train.steps=1 ", moe, " --set model.qk_norm=head --set model.head_dim=8"))).code, 0);
  ASSERT_EQ(run_myriad(cat("export --checkpoint ", rd.string(), " --dtype fp32 --output ", good.string())).code, 0);
  int n = 0;
  auto broken = [&](const std::function<void(nlohmann::json&, nlohmann::json&)>& change, const std::string& what) {
    const fs::path bad = dir_ / cat("qwen_moe_bad", n++);
    fs::create_directories(bad);
    auto config = nlohmann::json::parse(read_file(good / "config.json"));
    auto [header, data] = split_safetensors(read_file(good / "model.safetensors"));
    change(config, header);
    std::ofstream(bad / "config.json") << config.dump(2);
    std::ofstream(bad / "model.safetensors", std::ios::binary) << join_safetensors(header, data);
    const fs::path out = dir_ / cat("qwen_moe_out", n);
    expect_one_line_error(run_myriad(cat("import --hf ", bad.string(), " --output ", out.string())), what);
    EXPECT_FALSE(fs::exists(out)) << what;
  };
  broken([](nlohmann::json& c, nlohmann::json&) { c["num_experts"] = 8; },
         "holds 4 experts (indices 0 to 3) but config.json says num_experts = 8");
  broken([](nlohmann::json& c, nlohmann::json&) { c["num_local_experts"] = 3; },
         "num_experts = 4 but num_local_experts = 3");
  // (The safetensors reader refuses a header whose offsets leave a gap or overlap: tensors are
  // renamed or reshaped in place, never dropped.)
  auto rename = [](nlohmann::json& h, const std::string& from, const std::string& to) {
    h[to] = h[from];
    h.erase(from);
  };
  broken([&](nlohmann::json&, nlohmann::json& h) {
    rename(h, "model.layers.1.mlp.experts.2.up_proj.weight", "model.layers.1.mlp.experts.2.up_projection.weight");
  }, "tensor model.layers.1.mlp.experts.2.up_proj.weight is missing");
  broken([&](nlohmann::json&, nlohmann::json& h) {
    rename(h, "model.layers.0.mlp.experts.3.up_proj.weight", "model.layers.0.mlp.experts.4.up_proj.weight");
  }, "holds 5 experts (indices 0 to 4)");
  broken([](nlohmann::json&, nlohmann::json& h) { h["model.layers.0.self_attn.q_norm.weight"]["shape"] = {2, 4}; },
         "tensor model.layers.0.self_attn.q_norm.weight has shape [2, 4] but the config makes it [8]");
  broken([](nlohmann::json& c, nlohmann::json&) { c["use_sliding_window"] = true; }, "use_sliding_window = true");
  broken([](nlohmann::json& c, nlohmann::json&) { c["attention_bias"] = true; }, "attention_bias = true");
  broken([](nlohmann::json& c, nlohmann::json&) { c["mlp_only_layers"] = {1}; }, "mlp_only_layers = [1]");
  broken([](nlohmann::json& c, nlohmann::json&) { c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; },
         "rope_type = \"yarn\"");
  // transformers 5's names (num_local_experts, rope_parameters) are read as well.
  auto v5 = nlohmann::json::parse(read_file(good / "config.json"));
  v5["num_local_experts"] = v5["num_experts"];
  v5["rope_parameters"] = {{"rope_theta", v5["rope_theta"]}, {"rope_type", "default"}};
  v5.erase("num_experts"), v5.erase("rope_theta"), v5.erase("rope_scaling");
  const fs::path newer = dir_ / "qwen_moe_v5";
  fs::create_directories(newer);
  std::ofstream(newer / "config.json") << v5.dump(2);
  fs::copy_file(good / "model.safetensors", newer / "model.safetensors");
  const Result i = run_myriad(cat("import --hf ", newer.string(), " --output ", (dir_ / "qwen_moe_v5_ckpt").string()));
  ASSERT_EQ(i.code, 0) << i.output;
  EXPECT_EQ(weights(myriad::checkpoint::resolve(rd.string())), weights((dir_ / "qwen_moe_v5_ckpt").string()));
}

}  // namespace
