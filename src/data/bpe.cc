#include "data/bpe.h"

#include <algorithm>
#include <climits>
#include <fstream>
#include <queue>
#include <sstream>

#include "core/error.h"

namespace myriad::data::bpe {
namespace {

struct ByteAlphabet {
  int16_t byte_of[324];  // -1 where the code point spells no byte
  ByteAlphabet() {
    std::fill(std::begin(byte_of), std::end(byte_of), int16_t{-1});
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      byte_of[printable ? b : next++] = static_cast<int16_t>(b);
    }
  }
};

}  // namespace

bool spelled_bytes(std::string_view s, std::string& out) {
  static const ByteAlphabet alpha;
  out.clear();
  for (size_t i = 0; i < s.size();) {
    int32_t cp;
    i += decode_utf8(s, i, cp);
    if (cp < 0 || cp >= 324 || alpha.byte_of[cp] < 0) return false;
    out.push_back(static_cast<char>(alpha.byte_of[cp]));
  }
  return true;
}

int Tables::find_byte_ids() {
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    auto it = id_of.find(std::string_view(&c, 1));
    if (it == id_of.end()) return b;
    byte_id[b] = it->second;
  }
  return -1;
}

bool Tables::add_merge(const std::string& first, const std::string& second, int32_t rank,
                       MergeIds* ids) {
  const auto a = id_of.find(first), b = id_of.find(second), m = id_of.find(first + second);
  if (a == id_of.end() || b == id_of.end() || m == id_of.end()) return false;
  const uint64_t pair = (static_cast<uint64_t>(a->second) << 32) | static_cast<uint32_t>(b->second);
  merge_of_ids.emplace(pair, std::make_pair(rank, m->second));
  if (ids) *ids = {a->second, b->second, m->second};
  return true;
}

void merge_by_rank(const Tables& t, std::string_view piece, std::vector<int32_t>& out) {
  const int n = static_cast<int>(piece.size());
  std::vector<int32_t> id(n), prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    id[i] = t.byte_id[static_cast<unsigned char>(piece[i])];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  // A symbol is known by the position of its first byte, so "leftmost" is the smaller `left`.
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
    // Still good when both symbols are alive, adjacent and unchanged (a merged-away symbol's id
    // is -1): the pair is then present, whatever merged around it.
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

std::string decode_ids(const Tables& t, const std::vector<int32_t>& ids, const char* who) {
  std::string out;
  const auto size = static_cast<int64_t>(t.bytes_of.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= size)
      throw_input(who, ": token id ", ids[i], " at position ", i, " is outside [0, ", size, ")");
    out += t.bytes_of[ids[i]];
  }
  return out;
}

bool PieceCache::append(std::string_view piece, std::vector<int32_t>& out) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(piece);
  if (it == map_.end()) return false;
  out.insert(out.end(), it->second.begin(), it->second.end());
  return true;
}

void PieceCache::put(std::string_view piece, const int32_t* ids, size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (map_.size() >= kMaxCached) map_.clear();
  map_.emplace(std::string(piece), std::vector<int32_t>(ids, ids + n));
}

std::string read_file(const std::string& path, const char* who, const char* hint) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_input(who, ": cannot read ", path, ": ", hint);
  std::ostringstream os;
  os << in.rdbuf();
  if (in.bad()) throw_runtime(who, ": error reading ", path);
  return os.str();
}

}  // namespace myriad::data::bpe
