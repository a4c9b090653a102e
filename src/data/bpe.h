// What the byte-level BPE tokenizers (gpt2, llama3) share: UTF-8 decoding with the character
// classes their pre-tokenizers split on, GPT-2's printable spelling of bytes in which both
// vocabularies are written, the merge tables and the merge loop, and the cache of encoded pieces.
// Internal to src/data.
#pragma once

#include <unicode/uchar.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace myriad::data::bpe {

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

// \s is JavaScript's, as GPT-2's reference encoder (npm gpt-3-encoder) reads it: WhiteSpace
// (TAB, VT, FF, ZWNBSP, any Zs) and LineTerminator (LF, CR, LS, PS); not U+0085. (The
// tokenizer.json files take Unicode's White_Space instead: hf_bpe_tokenizer.cc moves the two
// characters that differ.) A byte that starts no valid character is kOther.
inline CharClass classify_slow(int32_t cp) {
  if (cp < 0) return CharClass::kOther;
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

// ---- Vocabulary ------------------------------------------------------------------------------

// GPT-2 spells byte b as a printable character (printable Latin-1 stands for itself, the other
// 68 bytes take U+0100 onwards in byte order); Llama 3's vocabulary uses the same spelling. The
// bytes that `s` spells go to `out`; false when `s` uses a character outside that alphabet.
bool spelled_bytes(std::string_view s, std::string& out);

// A byte-level BPE vocabulary and its merges, all in raw bytes.
struct Tables {
  std::vector<std::string> bytes_of;  // id -> the bytes it stands for
  StringMap<int32_t> id_of;           // bytes -> id, BPE tokens only (special tokens are not text)
  int32_t byte_id[256];               // id of each single byte
  // Merges by id pair ((first << 32) | second) -> {rank, merged id}.
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merge_of_ids;

  // Fills byte_id from id_of; returns the first byte without a token, or -1.
  int find_byte_ids();
  struct MergeIds {
    int32_t first, second, merged;
  };
  // Adds the merge of `first` and `second` (bytes) at `rank`; false when either part or the
  // merged token is not in the vocabulary. The first rank given for a pair wins.
  bool add_merge(const std::string& first, const std::string& second, int32_t rank,
                 MergeIds* ids = nullptr);
};

// Byte-level BPE of one piece: starting from single bytes, repeatedly merges the adjacent pair
// of lowest rank, the leftmost when the same pair occurs more than once, until no pair merges.
// O(n log n) with a heap.
void merge_by_rank(const Tables& t, std::string_view piece, std::vector<int32_t>& out);

// The bytes `ids` stand for (special tokens: their text); an id outside the vocabulary is an
// input error that `who` begins.
std::string decode_ids(const Tables& t, const std::vector<int32_t>& ids, const char* who);

// The ids of pieces already encoded, shared across threads. Bounded: a large corpus can hold
// more distinct pieces than are worth keeping, while natural text repeats a few most of the time.
class PieceCache {
 public:
  // Appends the cached ids of `piece` to `out`; false when it is not cached.
  bool append(std::string_view piece, std::vector<int32_t>& out) const;
  void put(std::string_view piece, const int32_t* ids, size_t n);

 private:
  static constexpr size_t kMaxCached = 1 << 20;
  mutable std::mutex mu_;
  StringMap<std::vector<int32_t>> map_;
};

// The tables `load` reads from `dir`, loaded once and shared by every tokenizer of the same
// directory while one is alive.
template <class T>
std::shared_ptr<const T> shared_tables(const std::string& dir,
                                       std::shared_ptr<const T> (*load)(const std::string&)) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<const T>> loaded;
  std::lock_guard<std::mutex> lock(mu);
  if (auto t = loaded[dir].lock()) return t;
  auto t = load(dir);
  loaded[dir] = t;
  return t;
}

// The whole of a file, or an input error that names it and ends with `hint`.
std::string read_file(const std::string& path, const char* who, const char* hint);

}  // namespace myriad::data::bpe
