// Byte-level BPE read from a Hugging Face tokenizer.json: Llama 3's and Qwen's (Qwen2, 2.5 and 3
// share one), and any file of the same form.
//
// What a file may say, and what Myriad does with it:
//  - the pre-tokenizer: Split on tiktoken's pattern, then ByteLevel without its own split. The
//    pattern is Llama 3's (digits in runs of up to three, `\p{N}{1,3}`) or Qwen's (one digit a
//    piece, `\p{N}`); either is implemented by hand below. \s is Unicode's White_Space, as in
//    Hugging Face's tokenizers (Rust) and tiktoken, which the models were trained with: it holds
//    U+0085 and not U+FEFF, where JavaScript's \s (the JavaScript reference encoders', npm
//    llama3-tokenizer-js and transformers.js) has it the other way round. The contractions' case
//    is folded in ASCII only;
//  - the normalizer: none (Llama 3) or NFC (Qwen), through ICU. Runs of well-formed UTF-8 are
//    normalized; a byte that starts no character passes through as it is, so arbitrary bytes
//    still round-trip once they are in NFC;
//  - ignore_merges: a piece that is a token as a whole is that token, before any merge;
//  - added tokens decode to their text. A special one ("special": true) is never made from text:
//    text that looks like one is ordinary text, so a document cannot forge a document end. A
//    non-special one (Qwen's <think>, <tool_call>, <|fim_prefix|>, ...) is matched in the text
//    before anything else, leftmost and longest first, as Hugging Face's tokenizers match it
//    (on the raw text, its flags lstrip, rstrip, single_word and normalized all false: other
//    flags are refused). The document end is "<|end_of_text|>" (Llama 3) or "<|endoftext|>"
//    (Qwen, GPT-2's spelling).
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/bpe.h"
#include "data/tokenizer.h"

namespace myriad::data {
namespace {

// The split patterns this pre-tokenizer implements, as tokenizer.json spells them; they differ
// only in how many digits a piece holds.
struct SplitPattern {
  const char* regex;
  int digits;  // the most digits in one piece
};
constexpr SplitPattern kSplitPatterns[] = {
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
     " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     3},  // Llama 3
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
     " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     1},  // Qwen2, 2.5, 3
};
// The added tokens that end a document, in the order they are looked for.
constexpr const char* kEndsOfText[] = {"<|end_of_text|>", "<|endoftext|>"};

using bpe::Char;
using bpe::CharClass;

// The character at s[i], classed as these files' \s reads it: bpe's classes are JavaScript's,
// which differ from Unicode's White_Space at two characters.
inline Char char_at(std::string_view s, size_t i) {
  Char c = bpe::char_at(s, i);
  if (c.cp == 0x85) c.cls = CharClass::kSpace;    // NEXT LINE: White_Space, not in JavaScript's \s
  if (c.cp == 0xFEFF) c.cls = CharClass::kOther;  // ZERO WIDTH NO-BREAK SPACE (a BOM): the reverse
  return c;
}

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

// Calls piece(begin, end) for each pre-token, in order, pieces of digits holding at most
// `digits`. Each branch is one alternative of the pattern, tried in the pattern's order.
template <class F>
void pretokenize(std::string_view s, int digits, F&& piece) {
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
    } else if (c0.cls == CharClass::kNumber) {  // \p{N}{1,3} or \p{N}
      end = run_end(s, p, CharClass::kNumber, digits);
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
  // The non-special added tokens, matched in text: (text, id), longest first.
  std::vector<std::pair<std::string, int32_t>> matched;
  bool starts_match[256] = {};  // the first bytes of `matched`
  bool whole_pieces = false;  // ignore_merges: a piece that is a token is taken whole
  int digits = 3;             // the split pattern's longest run of digits
  bool nfc = false;           // the normalizer is NFC
};

// The input error for a malformed tokenizer.json; the caller adds what to do about it.
[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw_input("tokenizer ", path, ": ", what);
}

// A JSON string as JSON spells it, so that any character stays on the error's one line.
std::string quoted(const std::string& s) { return nlohmann::json(s).dump(); }

// Reads the pre-tokenizer and normalizer into `t`, accepting only what this file implements:
// Split on one of kSplitPatterns, then ByteLevel without its own (GPT-2's) split; no normalizer
// or NFC.
void read_pre_tokenizer(const std::string& path, const nlohmann::json& j, Tables& t) {
  const auto& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : nlohmann::json();
  bool ok = pre.is_object() && pre.value("type", "") == "Sequence" &&
            pre.contains("pretokenizers") && pre["pretokenizers"].is_array() &&
            pre["pretokenizers"].size() == 2;
  const SplitPattern* pattern = nullptr;
  if (ok) {
    const auto& split = pre["pretokenizers"][0];
    const auto& level = pre["pretokenizers"][1];
    ok = split.is_object() && split.value("type", "") == "Split" && split.contains("pattern") &&
         split["pattern"].is_object() && split.value("behavior", "") == "Isolated" &&
         !split.value("invert", false) && level.is_object() &&
         level.value("type", "") == "ByteLevel" && !level.value("use_regex", true) &&
         !level.value("add_prefix_space", false);
    for (const SplitPattern& p : kSplitPatterns)
      if (ok && split["pattern"].value("Regex", "") == p.regex) pattern = &p;
  }
  if (!pattern)
    bad(path,
        "the pre-tokenizer is neither Llama 3's nor Qwen's (Split on tiktoken's pattern with "
        "\\p{N}{1,3} or \\p{N}, then ByteLevel without use_regex), the two Myriad implements");
  t.digits = pattern->digits;
  const auto& norm = j.contains("normalizer") ? j["normalizer"] : nlohmann::json();
  if (norm.is_object() && norm.value("type", "") == "NFC" && norm.size() == 1)
    t.nfc = true;
  else if (!norm.is_null())
    bad(path, "the normalizer " + norm.dump() + " is not one Myriad implements (none, or NFC)");
}

// The file's added tokens into by_id (id -> {text, added}), and its non-special ones into
// t.matched, longest first. Meta's file keeps special tokens out of the vocab; some files repeat
// them there, and then the added token wins: it decodes to its text and is never produced from
// text unless it is non-special.
void read_added_tokens(const std::string& path, const nlohmann::json& j,
                       std::map<int64_t, std::pair<std::string, bool>>& by_id, Tables& t) {
  if (!j.contains("added_tokens")) return;
  if (!j["added_tokens"].is_array()) bad(path, "\"added_tokens\" is not an array");
  for (const auto& a : j["added_tokens"]) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        !a.contains("content") || !a["content"].is_string())
      bad(path, "an added token lacks an integer \"id\" or a \"content\" string");
    const std::string content = a["content"].get<std::string>();
    by_id[a["id"].get<int64_t>()] = {content, true};
    if (a.value("special", true)) continue;
    for (const char* flag : {"lstrip", "rstrip", "single_word", "normalized"})
      if (a.value(flag, false))
        bad(path, cat("the added token ", quoted(content), " has ", flag,
                      " = true; Myriad matches non-special added tokens with those flags false"));
    if (content.empty()) bad(path, "an added token is empty");
    t.matched.emplace_back(content, static_cast<int32_t>(a["id"].get<int64_t>()));
    t.starts_match[static_cast<unsigned char>(content[0])] = true;
  }
  std::stable_sort(t.matched.begin(), t.matched.end(),
                   [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
}

std::shared_ptr<const Tables> load_tables(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  if (!std::filesystem::exists(path)) throw_input("tokenizer ", path, " not found");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(bpe::read_file(path, "tokenizer", "it is not readable"));
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
  auto t = std::make_shared<Tables>();
  read_pre_tokenizer(path, j, *t);
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
  read_added_tokens(path, j, by_id, *t);
  if (by_id.empty() || by_id.begin()->first != 0 ||
      by_id.rbegin()->first != static_cast<int64_t>(by_id.size()) - 1)
    bad(path, "ids are not 0..N-1 each once");
  t->bytes_of.reserve(by_id.size());
  std::map<std::string, int32_t> special;  // text -> id
  for (auto& [id, entry] : by_id) {
    const auto id32 = static_cast<int32_t>(id);
    if (entry.second)
      special.emplace(entry.first, id32);
    else
      t->id_of.emplace(entry.first, id32);
    t->bytes_of.push_back(std::move(entry.first));
  }
  for (const char* end : kEndsOfText)
    if (t->eot < 0 && special.count(end)) t->eot = special[end];
  if (t->eot < 0)
    bad(path, cat("no added token ", kEndsOfText[0], " or ", kEndsOfText[1], " to end documents with"));
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

// NFC of `text`: each run of well-formed UTF-8 through ICU, every other byte as it is. Text
// with no byte from 0xCC up is NFC already (U+0300, the first character NFC can change, is CC 80
// in UTF-8), which is most text: it is returned untouched.
std::string_view nfc(std::string_view text, std::string& storage) {
  if (std::none_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) >= 0xCC; }))
    return text;
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status)) throw_runtime("tokenizer: ICU has no NFC normalizer: ", u_errorName(status));
  storage.clear();
  icu::StringByteSink<std::string> sink(&storage);
  size_t run = 0;  // start of the current well-formed run
  const auto flush = [&](size_t end) {
    if (end > run)
      n->normalizeUTF8(0, icu::StringPiece(text.data() + run, static_cast<int32_t>(end - run)), sink,
                       nullptr, status);
  };
  for (size_t i = 0; i < text.size();) {
    const bpe::Char c = bpe::char_at(text, i);
    if (c.cp < 0) {
      flush(i);
      storage.push_back(text[i]);
      run = i + 1;
    }
    i += c.len;
  }
  flush(text.size());
  if (U_FAILURE(status)) throw_runtime("tokenizer: ICU's NFC failed: ", u_errorName(status));
  return storage;
}

class HfBpeTokenizer final : public Tokenizer {
 public:
  HfBpeTokenizer(std::shared_ptr<const Tables> t, std::string name) : t_(std::move(t)), name_(std::move(name)) {}

  std::string name() const override { return name_; }
  int64_t vocab_size() const override { return static_cast<int64_t>(t_->bytes_of.size()); }
  int32_t eot() const override { return t_->eot; }

  std::vector<int32_t> encode(std::string_view raw) const override {
    std::vector<int32_t> out;
    out.reserve(raw.size() / 3 + 8);
    // The text between the non-special added tokens, each part on its own, as the library does.
    size_t from = 0;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (!t_->starts_match[static_cast<unsigned char>(raw[i])]) continue;
      for (const auto& [token, id] : t_->matched)
        if (raw.compare(i, token.size(), token) == 0) {
          encode_text(raw.substr(from, i - from), out);
          out.push_back(id);
          from = i + token.size();
          i = from - 1;
          break;
        }
    }
    encode_text(raw.substr(from), out);
    return out;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    return bpe::decode_ids(*t_, ids, name_.c_str());
  }
 private:
  // Text with no added token in it: normalized, pre-tokenized, each piece through BPE.
  void encode_text(std::string_view raw, std::vector<int32_t>& out) const {
    if (raw.empty()) return;
    std::string storage;
    const std::string_view text = t_->nfc ? nfc(raw, storage) : raw;
    pretokenize(text, t_->digits, [&](size_t b, size_t e) { encode_piece(text.substr(b, e - b), out); });
  }

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
  std::string name_;
  mutable bpe::PieceCache cache_;  // piece bytes -> ids
};

}  // namespace

std::unique_ptr<Tokenizer> make_hf_bpe_tokenizer(const std::string& dir, const std::string& name,
                                                 const std::string& hint) {
  try {
    return std::make_unique<HfBpeTokenizer>(bpe::shared_tables(dir, &load_tables), name);
  } catch (const Error& e) {
    if (e.cls() != ErrorClass::kInput) throw;
    if (hint.empty()) throw;
    throw_input(e.what(), ": ", hint);
  }
}

std::vector<std::string_view> bpe_pretokenize(std::string_view text, int digits) {
  std::vector<std::string_view> pieces;
  pretokenize(text, digits, [&](size_t b, size_t e) { pieces.push_back(text.substr(b, e - b)); });
  return pieces;
}

}  // namespace myriad::data
