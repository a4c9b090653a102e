#include "data/loader.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "core/error.h"

namespace myriad::data {

int64_t num_samples(const IndexedDataset& data, int64_t seq_len) {
  if (seq_len < 1) throw_input("seq_len ", seq_len, " must be at least 1");
  const int64_t n = data.num_tokens() > 0 ? (data.num_tokens() - 1) / seq_len : 0;
  if (n < 1)
    throw_input(data.bin_path(), ": ", data.num_tokens(), " tokens make no sample of seq_len ",
                seq_len, " (one needs ", seq_len + 1, " tokens)");
  return n;
}

uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::vector<uint32_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<uint32_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), uint32_t{0});
  // Two rounds of mixing so that nearby (seed, epoch) pairs give unrelated keys.
  const uint64_t key =
      mix64(mix64(seed) ^ mix64(static_cast<uint64_t>(epoch) + 0x5851F42D4C957F2Dull));
  for (int64_t i = n - 1; i > 0; --i) {
    const uint64_t r = mix64(key + static_cast<uint64_t>(i) * 0xD1B54A32D192ED03ull);
    // Multiply-shift maps r onto [0, i] with a bias below 2^-32 for any n < 2^32.
    const auto j = static_cast<int64_t>(
        (static_cast<unsigned __int128>(r) * static_cast<uint64_t>(i + 1)) >> 64);
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

Sampler::Sampler(int64_t num_samples, uint64_t seed, bool shuffle)
    : n_(num_samples), seed_(seed), shuffle_(shuffle) {
  if (n_ < 1) throw_input("sampler: ", n_, " samples; at least one is needed");
  if (n_ > int64_t{UINT32_MAX})
    throw_input("sampler: ", n_,
                " samples is more than the 2^32 - 1 supported: use a longer seq_len "
                "or split the data");
}

const std::vector<uint32_t>& Sampler::permutation(int64_t epoch) {
  auto it = perms_.find(epoch);
  if (it != perms_.end()) return it->second;
  while (perms_.size() >= 2) perms_.erase(perms_.begin());  // keep the newest epochs
  return perms_.emplace(epoch, epoch_permutation(n_, seed_, epoch)).first->second;
}

int64_t Sampler::sample(int64_t k) {
  MYRIAD_CHECK(k >= 0, "sample number ", k);
  const int64_t i = k % n_;
  return shuffle_ ? permutation(k / n_)[i] : i;
}

uint64_t source_seed(int64_t seed, const std::string& name, SourceOrder order) {
  if (order == SourceOrder::kRunSeed) return static_cast<uint64_t>(seed);
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a of the name
  for (unsigned char c : name) h = (h ^ c) * 0x100000001B3ull;
  return mix64(static_cast<uint64_t>(seed) ^ mix64(h));
}

namespace {
// The blend of one file, at sample `consumed` (an input error naming the file when it holds no
// sample, as the blend's own check would).
Blend lone_blend(const IndexedDataset& data, int64_t seq_len, int64_t consumed) {
  if (consumed < 0) throw_input("consumed samples ", consumed, " is negative");
  DataSource d = source_of_prefix(data.bin_path());
  Blend b({d}, {num_samples(data, seq_len)});
  BlendPosition at = b.position();
  at.consumed = at.taken[0] = consumed;
  b.resume(at);
  return b;
}
}  // namespace

BatchLoader::BatchLoader(const IndexedDataset& data, int64_t seq_len, int64_t seed, bool shuffle,
                         int64_t global_batch, int64_t slice_begin, int64_t slice_len, int64_t consumed,
                         bool documents)
    : BatchLoader({{&data, static_cast<uint64_t>(seed)}}, lone_blend(data, seq_len, consumed), seq_len, shuffle,
                  global_batch, slice_begin, slice_len, documents) {}

BatchLoader::BatchLoader(std::vector<SourceFile> sources, const Blend& blend, int64_t seq_len, bool shuffle,
                         int64_t global_batch, int64_t slice_begin, int64_t slice_len, bool documents)
    : sources_(std::move(sources)),
      blend_(blend),
      T_(seq_len),
      shuffle_(shuffle),
      documents_(documents),
      global_batch_(global_batch),
      slice_begin_(slice_begin),
      slice_len_(slice_len),
      consumed_(blend.position().consumed) {
  if (global_batch < 1) throw_input("global batch ", global_batch, " must be at least 1");
  if (slice_begin < 0 || slice_len < 1 || slice_begin + slice_len > global_batch)
    throw_input("batch slice [", slice_begin, ", ", slice_begin + slice_len,
                ") is not a non-empty part of the global batch of ", global_batch);
  MYRIAD_CHECK(static_cast<int>(sources_.size()) == blend_.size(), sources_.size(), " files for a blend of ",
               blend_.size());
  for (int s = 0; s < blend_.size(); ++s)  // validates the sizes now
    Sampler probe(blend_.samples(s), sources_[s].seed, shuffle);
  worker_ = std::thread([this] { run(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void document_starts(const IndexedDataset& data, int64_t begin, int64_t T, int32_t* out) {
  const int64_t docs = data.num_documents();
  int64_t d = data.document_of(begin);
  int64_t start = data.document_begin(d), next = data.document_begin(d + 1);
  for (int64_t i = 0; i < T; ++i) {
    while (begin + i >= next && d + 1 < docs) start = next, next = data.document_begin(++d + 1);
    out[i] = static_cast<int32_t>(std::max<int64_t>(0, start - begin));
  }
}

bool has_counted_target(const IndexedDataset& data, int64_t T) {
  // The samples read tokens [0, n T + 1): a target there is counted when the token before it is
  // of its own document, i.e. some document there holds two tokens.
  const int64_t end = num_samples(data, T) * T + 1;
  for (int64_t d = 0; d < data.num_documents() && data.document_begin(d) + 1 < end; ++d)
    if (data.document_begin(d + 1) - data.document_begin(d) >= 2) return true;
  return false;
}

// The next global batch's samples, all drawn from the blend (every rank walks the same stream),
// of which this process reads its slice.
Batch BatchLoader::build(Blend& blend, std::vector<Sampler>& samplers) const {
  Batch b;
  b.B = slice_len_;
  b.T = T_;
  b.first_sample = blend.position().consumed;
  b.tokens.resize(static_cast<size_t>(slice_len_ * (T_ + 1)));
  if (documents_) b.doc_starts.resize(static_cast<size_t>(slice_len_ * (T_ + 1)));
  for (int64_t g = 0; g < global_batch_; ++g) {
    const Blend::Pick p = blend.next();
    const int64_t r = g - slice_begin_;
    if (r < 0 || r >= slice_len_) continue;
    const int64_t s = samplers[p.source].sample(p.sample);
    sources_[p.source].data->read(s * T_, T_ + 1, b.tokens.data() + r * (T_ + 1));
    if (documents_) document_starts(*sources_[p.source].data, s * T_, T_ + 1, b.doc_starts.data() + r * (T_ + 1));
  }
  b.position = blend.position();
  return b;
}

void BatchLoader::run() {
  try {
    Blend blend = blend_;
    std::vector<Sampler> samplers;
    for (int s = 0; s < blend.size(); ++s) samplers.emplace_back(blend.samples(s), sources_[s].seed, shuffle_);
    for (;;) {
      Batch b = build(blend, samplers);
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !ready_; });
      if (stop_) return;
      ready_ = std::move(b);
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    cv_.notify_all();
  }
}

Batch BatchLoader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return ready_ || error_; });
  if (!ready_) std::rethrow_exception(error_);
  Batch b = std::move(*ready_);
  ready_.reset();
  lock.unlock();
  cv_.notify_all();
  consumed_ += global_batch_;
  return b;
}

}  // namespace myriad::data
