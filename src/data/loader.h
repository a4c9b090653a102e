// Training samples from token files: a deterministic, resumable order and a prefetching batch
// loader over a blend of sources (data/blend.h; one file is the blend of one).
//
// A token stream of N tokens and sequence length T holds (N - 1) / T samples; sample s is the
// tokens [s*T, s*T + T + 1): T inputs and, shifted by one, their T targets. The order of samples
// depends only on (seed, number of samples consumed), so a run that restarts from a checkpoint
// with its `consumed` count sees exactly the batches it would have seen without the restart.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "data/blend.h"
#include "data/indexed_dataset.h"

namespace myriad::data {

// (num_tokens - 1) / seq_len; an input error naming the file and T when it is below one.
int64_t num_samples(const IndexedDataset& data, int64_t seq_len);

// The counter-based generator behind the shuffle: a splitmix64 finalizer of the input.
uint64_t mix64(uint64_t x);
// Epoch `epoch`'s permutation of [0, n): a Fisher-Yates shuffle whose i-th draw is
// mix64 of a key of (seed, epoch) and i, so it is the same on every machine and every run.
std::vector<uint32_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

// Global sample number k -> sample index. k is read as epoch e = k / n, position i = k % n,
// and maps to perm_e(i) (identity without shuffle). Each epoch's permutation is computed once
// and the last two are kept (a batch may straddle an epoch boundary).
// Not thread-safe (the cache); one Sampler per thread.
class Sampler {
 public:
  // n < 2^32 samples (an input error otherwise).
  Sampler(int64_t num_samples, uint64_t seed, bool shuffle);
  int64_t sample(int64_t k);
  int64_t num_samples() const { return n_; }

 private:
  const std::vector<uint32_t>& permutation(int64_t epoch);

  int64_t n_;
  uint64_t seed_;
  bool shuffle_;
  std::map<int64_t, std::vector<uint32_t>> perms_;  // epoch -> [n]
};

struct Batch {
  int64_t B = 0;  // rows: this process's slice of the global batch
  int64_t T = 0;  // sequence length
  // [B, T + 1] row-major; row b's inputs are tokens[b][0, T) and its targets tokens[b][1, T].
  std::vector<int32_t> tokens;
  // [B, T + 1] with documents (data.document_mask), else empty: where the document of token
  // b, i begins within its row (0 when it began before the row); laid out as tokens.
  std::vector<int32_t> doc_starts;
  int64_t first_sample = 0;  // global sample number where this step's global batch starts
  // The blend's place after the global batch's samples: the Trainer's data position once the
  // step is trained (the loader's walk is the only one).
  BlendPosition position;
};

// Where the document of each of the T tokens from stream position `begin` begins, relative to
// `begin` and at least 0, into out[T]: non-decreasing, out[i] <= i.
void document_starts(const IndexedDataset& data, int64_t begin, int64_t T, int32_t* out);

// Whether some sample of `data` (seq_len T) has a target that does not begin a document: one
// that data.document_end_loss = false counts. False only when every document a sample reaches
// is one token long.
bool has_counted_target(const IndexedDataset& data, int64_t T);

// The seed of a source's own order (data/blend.h's SourceOrder): the run's seed, or the run's
// seed mixed with the source's name.
uint64_t source_seed(int64_t seed, const std::string& name, SourceOrder order);

// One source of a loader: its file and the seed of its order.
struct SourceFile {
  const IndexedDataset* data = nullptr;
  uint64_t seed = 0;
};

// Yields, step after step, this process's share of each global batch: a step takes the
// global_batch samples numbered [consumed, consumed + global_batch) of the blend's stream and
// this process reads those at [slice_begin, slice_begin + slice_len) of them (a data-parallel
// rank's rows; one process: 0, global_batch). A background thread builds the next batch while
// the caller's step runs. The files must outlive the loader. next() and consumed() are for one
// caller thread.
class BatchLoader {
 public:
  // `blend` as it stands at the first sample to read (its position's consumed); sources[s] is
  // its source s. documents: the batches carry their rows' document starts too.
  BatchLoader(std::vector<SourceFile> sources, const Blend& blend, int64_t seq_len, bool shuffle,
              int64_t global_batch, int64_t slice_begin, int64_t slice_len, bool documents = false);
  // One file, from sample `consumed` on.
  BatchLoader(const IndexedDataset& data, int64_t seq_len, int64_t seed, bool shuffle,
              int64_t global_batch, int64_t slice_begin, int64_t slice_len, int64_t consumed,
              bool documents = false);
  // Stops and joins the thread (waiting at most for the batch it is building).
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // The next step's batch; rethrows an exception raised while building it.
  Batch next();
  // Samples taken through next(), i.e. the `consumed` to resume after the last step taken:
  // prefetched batches do not count.
  int64_t consumed() const { return consumed_; }

 private:
  void run();
  Batch build(Blend& blend, std::vector<Sampler>& samplers) const;

  std::vector<SourceFile> sources_;
  const Blend blend_;  // as it stands at the first batch
  int64_t T_;
  bool shuffle_;
  bool documents_;
  int64_t global_batch_, slice_begin_, slice_len_;
  int64_t consumed_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Batch> ready_;  // the prefetched batch, guarded by mu_
  std::exception_ptr error_;    // guarded by mu_
  bool stop_ = false;           // guarded by mu_
  std::thread worker_;
};

}  // namespace myriad::data
