// Llama 3's byte-level BPE.
//
// The tables come from a Hugging Face tokenizer.json: scripts/setup.sh writes one from the npm
// package llama3-tokenizer-js, and Meta's own file reads the same way. The reference is that
// package's encoder, which this file reproduces id for id:
//  - the pre-tokenizer is Llama 3's (tiktoken's) pattern, with JavaScript's \s and with the
//    contractions' case folded in ASCII only, as the package's regex spells them;
//  - a piece that is a token as a whole is that token, before any merge (ignore_merges);
//  - text that looks like a special token is ordinary text: only the ids stand for special
//    tokens, so a document cannot forge a document end.
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/bpe.h"
#include "data/tokenizer.h"

namespace myriad::data {
namespace {

constexpr const char* kWho = "llama3 tokenizer";
constexpr const char* kSetupHint = "run scripts/setup.sh to fetch the Llama 3 vocabulary";
constexpr const char* kEndOfText = "<|end_of_text|>";
// The only split pattern this pre-tokenizer implements, as tokenizer.json spells it.
constexpr const char* kPattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

using bpe::Char;
using bpe::char_at;
using bpe::CharClass;

// ---- Pre-tokenizer ---------------------------------------------------------------------------

inline bool is_newline(int32_t cp) { return cp == '\r' || cp == '\n'; }

// Length of a contraction ('s 't 're 've 'm 'll 'd, either case) at s[i], or 0.
inline size_t contraction(std::string_view s, size_t i) {
  if (s[i] != '\'' || i + 1 >= s.size()) return 0;
  const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; };
  const char a = lower(s[i + 1]);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= s.size()) return 0;
  const char b = lower(s[i + 2]);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// End of the run of characters of class `cls` from s[i], at most `limit` of them.
inline size_t run_end(std::string_view s, size_t i, CharClass cls, int limit = INT32_MAX) {
  for (int k = 0; i < s.size() && k < limit; ++k) {
    const Char c = char_at(s, i);
    if (c.cls != cls) break;
    i += c.len;
  }
  return i;
}

// Calls piece(begin, end) for each pre-token, in order. Each branch is one alternative of the
// pattern, tried in the pattern's order.
template <class F>
void pretokenize(std::string_view s, F&& piece) {
  const size_t n = s.size();
  size_t p = 0;
  while (p < n) {
    size_t end = 0;
    const Char c0 = char_at(s, p);
    const size_t p1 = p + c0.len;
    const Char c1 = p1 < n ? char_at(s, p1) : Char{CharClass::kSpace, -1, 0};
    if (const size_t k = contraction(s, p)) {
      end = p + k;
    } else if (c0.cls == CharClass::kLetter) {  // [^\r\n\p{L}\p{N}]?\p{L}+
      end = run_end(s, p1, CharClass::kLetter);
    } else if (c0.cls != CharClass::kNumber && !is_newline(c0.cp) && p1 < n &&
               c1.cls == CharClass::kLetter) {
      end = run_end(s, p1, CharClass::kLetter);
    } else if (c0.cls == CharClass::kNumber) {  // \p{N}{1,3}
      end = run_end(s, p, CharClass::kNumber, 3);
    } else if (c0.cls == CharClass::kOther ||
               (c0.cp == ' ' && p1 < n && c1.cls == CharClass::kOther)) {
      // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
      end = run_end(s, c0.cls == CharClass::kOther ? p : p1, CharClass::kOther);
      while (end < n && is_newline(static_cast<unsigned char>(s[end]))) ++end;
    } else {
      // A run of whitespace. `\s*[\r\n]+` takes it through its last line break; without one,
      // `\s+(?!\S)` leaves the last character to lead what follows, and a lone character before
      // a non-space is `\s+` on its own.
      size_t q = p, last = p, after_newline = 0;
      int count = 0;
      while (q < n) {
        const Char c = char_at(s, q);
        if (c.cls != CharClass::kSpace) break;
        last = q;
        q += c.len;
        ++count;
        if (is_newline(c.cp)) after_newline = q;
      }
      end = after_newline ? after_newline : (q == n || count == 1) ? q : last;
    }
    piece(p, end);
    p = end;
  }
}

// ---- Vocabulary ------------------------------------------------------------------------------

struct Tables : bpe::Tables {
  int32_t eot = -1;
  bool whole_pieces = false;  // ignore_merges: a piece that is a token is taken whole
};

// The input error for a malformed tokenizer.json.
[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw_input(kWho, ": ", path, ": ", what, ": ", kSetupHint);
}

// A JSON string as JSON spells it, so that any character stays on the error's one line.
std::string quoted(const std::string& s) { return nlohmann::json(s).dump(); }

// Accepts only the pre-tokenizer this file implements: Split on Llama 3's pattern, then
// ByteLevel without its own (GPT-2's) split.
void check_pre_tokenizer(const std::string& path, const nlohmann::json& j) {
  const auto& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : nlohmann::json();
  bool ok = pre.is_object() && pre.value("type", "") == "Sequence" &&
            pre.contains("pretokenizers") && pre["pretokenizers"].is_array() &&
            pre["pretokenizers"].size() == 2;
  if (ok) {
    const auto& split = pre["pretokenizers"][0];
    const auto& level = pre["pretokenizers"][1];
    ok = split.is_object() && split.value("type", "") == "Split" && split.contains("pattern") &&
         split["pattern"].is_object() && split["pattern"].value("Regex", "") == kPattern &&
         split.value("behavior", "") == "Isolated" && !split.value("invert", false) &&
         level.is_object() && level.value("type", "") == "ByteLevel" &&
         !level.value("use_regex", true) && !level.value("add_prefix_space", false);
  }
  if (!ok)
    bad(path,
        "the pre-tokenizer is not Llama 3's (Split on its pattern, then ByteLevel without "
        "use_regex), the only one Myriad implements");
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    bad(path, "a normalizer is set; Myriad's llama3 tokenizer has none");
}

std::shared_ptr<const Tables> load_tables(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  if (!std::filesystem::exists(path)) throw_input(kWho, ": ", path, " not found: ", kSetupHint);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(bpe::read_file(path, kWho, kSetupHint));
  } catch (const nlohmann::json::exception& e) {
    bad(path, std::string("not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    bad(path, "no \"model\" object");
  const auto& model = j["model"];
  if (model.value("type", "BPE") != "BPE") bad(path, "the model is not BPE");
  if (!model.contains("vocab") || !model["vocab"].is_object() || !model.contains("merges") ||
      !model["merges"].is_array())
    bad(path, "the model lacks \"vocab\" or \"merges\"");
  check_pre_tokenizer(path, j);

  auto t = std::make_shared<Tables>();
  t->whole_pieces = model.value("ignore_merges", false);
  // Ids are checked to be 0..size-1, each once, across the BPE tokens and the added ones.
  std::map<int64_t, std::pair<std::string, bool>> by_id;  // id -> {bytes, special}
  std::string bytes;
  for (const auto& [key, value] : model["vocab"].items()) {
    if (!value.is_number_integer()) bad(path, "the id of " + quoted(key) + " is not an integer");
    if (!bpe::spelled_bytes(key, bytes))
      bad(path, "token " + quoted(key) + " is not in the byte-level alphabet");
    if (!by_id.emplace(value.get<int64_t>(), std::make_pair(bytes, false)).second)
      bad(path, "id " + std::to_string(value.get<int64_t>()) + " is given twice");
  }
  if (j.contains("added_tokens")) {
    if (!j["added_tokens"].is_array()) bad(path, "\"added_tokens\" is not an array");
    for (const auto& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string())
        bad(path, "an added token lacks an integer \"id\" or a \"content\" string");
      // Meta's file keeps special tokens out of the vocab; some files repeat them there, and
      // then the added token wins: it decodes to its text and is never produced from text.
      by_id[a["id"].get<int64_t>()] = {a["content"].get<std::string>(), true};
    }
  }
  if (by_id.empty() || by_id.begin()->first != 0 ||
      by_id.rbegin()->first != static_cast<int64_t>(by_id.size()) - 1)
    bad(path, "ids are not 0..N-1 each once");
  t->bytes_of.reserve(by_id.size());
  for (auto& [id, entry] : by_id) {
    const auto id32 = static_cast<int32_t>(id);
    if (entry.second) {
      if (entry.first == kEndOfText) t->eot = id32;
    } else {
      t->id_of.emplace(entry.first, id32);
    }
    t->bytes_of.push_back(std::move(entry.first));
  }
  if (t->eot < 0) bad(path, std::string("no added token ") + kEndOfText);
  if (const int b = t->find_byte_ids(); b >= 0) bad(path, "no token for byte " + std::to_string(b));

  // Merges, by rank: "first second" strings in older files, [first, second] pairs in newer ones.
  std::string first, second;
  int32_t rank = 0;
  for (const auto& m : model["merges"]) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        bad(path, "merge " + std::to_string(rank) + " " + quoted(s) + " is not two tokens");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      bad(path, "merge " + std::to_string(rank) + " is neither \"a b\" nor [a, b]");
    }
    if (!bpe::spelled_bytes(a, first) || !bpe::spelled_bytes(b, second) ||
        !t->add_merge(first, second, rank))
      bad(path, "merge " + std::to_string(rank) + " " + quoted(a + " " + b) +
                    " joins tokens missing from the vocab");
    ++rank;
  }
  return t;
}

class Llama3Tokenizer final : public Tokenizer {
 public:
  explicit Llama3Tokenizer(std::shared_ptr<const Tables> t) : t_(std::move(t)) {}

  std::string name() const override { return "llama3"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(t_->bytes_of.size()); }
  int32_t eot() const override { return t_->eot; }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 8);
    pretokenize(text, [&](size_t b, size_t e) { encode_piece(text.substr(b, e - b), out); });
    return out;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    return bpe::decode_ids(*t_, ids, kWho);
  }

 private:
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
    if (piece.size() == 1) {
      out.push_back(t_->byte_id[static_cast<unsigned char>(piece[0])]);
      return;
    }
    if (t_->whole_pieces) {
      auto it = t_->id_of.find(piece);
      if (it != t_->id_of.end()) {
        out.push_back(it->second);
        return;
      }
    }
    if (cache_.append(piece, out)) return;
    const size_t start = out.size();
    bpe::merge_by_rank(*t_, piece, out);
    cache_.put(piece, out.data() + start, out.size() - start);
  }

  std::shared_ptr<const Tables> t_;
  mutable bpe::PieceCache cache_;  // piece bytes -> ids
};

}  // namespace

std::unique_ptr<Tokenizer> make_llama3_tokenizer(const std::string& dir) {
  return std::make_unique<Llama3Tokenizer>(bpe::shared_tables(dir, &load_tables));
}

std::vector<std::string_view> llama3_pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  pretokenize(text, [&](size_t b, size_t e) { pieces.push_back(text.substr(b, e - b)); });
  return pieces;
}

}  // namespace myriad::data
