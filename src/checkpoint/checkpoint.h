// Checkpoints: a directory per step, tensors stored as shards with their global shapes and
// offsets (so that a later layout can load what another layout saved), a checksum per shard,
// and a commit marker written last.
//
//   ROOT/step_00000120/meta.json     format, step, config, data position, tensor index
//   ROOT/step_00000120/shard_<rank>.bin  raw little-endian fp32 of each process's shards
//   ROOT/step_00000120/COMMITTED     written after everything else is durable
//
// A save goes to ROOT/step_X.<id>.partial first, <id> new at each start of the job: every rank
// writes its shard file there and then, by an atomic rename, its index; rank 0 waits for every
// rank's index, merges them into meta.json, and renames the directory into place. The ranks
// meet only through those files, never in a collective, so that a save can run on a thread of
// its own while training goes on (checkpoint::Writer). A failed or killed save never touches
// the committed checkpoints; a failed save removes its part. Only directories named
// step_<8 digits> that hold COMMITTED are ever loaded, and COMMITTED records the CRC32 of
// meta.json, as meta.json records each piece's.
// Errors about a checkpoint's content are input errors (Corrupt) naming the directory and the
// tensor; I/O failures while saving are runtime faults.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"

namespace myriad::checkpoint {

// A committed checkpoint whose files are damaged or incomplete: a checksum mismatch, a missing
// or truncated file, metadata that is not what was committed. An input error (a retry reads the
// same bytes) that `--resume auto` steps past to the next older checkpoint.
class Corrupt : public Error {
 public:
  explicit Corrupt(const std::string& what) : Error(ErrorClass::kInput, what) {}
};

// A piece of a global tensor held by this process: shape `shape` at `offset` (per dimension)
// inside `global_shape`, stored contiguously at `data`.
struct Shard {
  std::string name;                   // e.g. "model/h.0.attn.qkv.w", "optim/m/wte"
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offset;
  std::vector<int64_t> shape;
  float* data = nullptr;
  int64_t numel() const;
};

std::string step_dir_name(int64_t step);  // "step_00000120"

// The processes that save one checkpoint together.
struct SaveGroup {
  int rank = 0;
  int world = 1;
  std::string id = "0";     // the same on every rank, new at each start of the job
  double timeout_s = 300;   // rank 0's wait for the other ranks' parts (comm.timeout_s)
  const std::atomic<bool>* cancel = nullptr;  // when set, rank 0 stops waiting (the process ends)
};

// Writes `shards` and `meta` (any JSON object; "step", "format" and "tensors" are added) as the
// committed checkpoint ROOT/step_<step>, replacing a committed one of the same step only once
// the new one is complete. Every rank of `group` calls it with its own shards (a region of a
// tensor must be written by one rank only); the others return once their part is written,
// rank 0 once it has committed the whole. Returns the directory.
std::string save(const std::string& root, int64_t step, nlohmann::json meta,
                 const std::vector<Shard>& shards, const SaveGroup& group = {});

// save() by one process into `dir` itself (`myriad import`): DIR.partial-<pid>, then renamed.
// `dir` must not exist (an input error); it is never replaced, even if it appears meanwhile.
// `files` (name -> bytes) are written beside the tensors and commit with them (an imported
// model's tokenizer files).
void save_as(const std::string& dir, int64_t step, nlohmann::json meta, const std::vector<Shard>& shards,
             const std::map<std::string, std::string>& files = {});

// One save at a time on a thread of its own (the second stage of an asynchronous save: the
// first is the snapshot its shards point into, which must stay untouched until it ends).
class Writer {
 public:
  Writer() = default;
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;
  // Stops waiting for other ranks and joins: a save not finished stays a partial directory.
  ~Writer();
  bool busy() const { return thread_.joinable() && !done_; }
  // Runs `save` on the thread; waits for the one before first.
  void start(std::function<void()> save);
  // Until the running save ends; rethrows what it threw.
  void wait();
  // Rethrows what a save that has ended threw (the step after a failed save fails, not the
  // next save); does not wait.
  void poll();
  // Set while the writer is being destroyed; for SaveGroup::cancel.
  const std::atomic<bool>* cancelled() const { return &cancel_; }

 private:
  std::thread thread_;
  std::atomic<bool> done_{false}, cancel_{false};
  std::exception_ptr error_;
};

// The committed checkpoint with the highest step under root, if any.
std::optional<std::string> latest(const std::string& root);
// Every committed checkpoint under root, newest first.
std::vector<std::string> committed_newest_first(const std::string& root);

// A checkpoint directory (holding meta.json) as given, or else the latest committed one under
// `path` or `path`/checkpoints (a run directory); an input error naming `path` when none.
std::string resolve(const std::string& path);

// A committed checkpoint held for reading (export, sample, verify, a resume or init_from):
// while the hold lives, prune() and a save that replaces its step leave it where it is. It is a
// shared flock(2) on the checkpoint's COMMITTED, which they take exclusively before they move
// the checkpoint away; the kernel drops it when the process ends, however it ends.
// `path` is resolved as resolve() does; a checkpoint pruned between its choice and its hold is
// passed over for the next newest one, and the log says so.
class ReadHold {
 public:
  explicit ReadHold(const std::string& path);
  ~ReadHold();
  ReadHold(const ReadHold&) = delete;
  ReadHold& operator=(const ReadHold&) = delete;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int fd_ = -1;
};

// Reads and checks DIR/meta.json of a committed checkpoint: every byte of it must match the
// CRC32 that COMMITTED records (Corrupt otherwise).
nlohmann::json read_meta(const std::string& dir);

// Checks a whole committed checkpoint: meta.json against COMMITTED, then every piece of every
// tensor against its CRC32 (and that its file holds it). Corrupt names the file and the piece
// at the first damage; returns the number of pieces checked.
int64_t verify(const std::string& dir);

// Fills each shard's data from the checkpoint: the tensor must exist with the same global
// shape, the stored pieces must cover the requested region, and every piece read must pass
// its checksum.
void load(const std::string& dir, const nlohmann::json& meta, const std::vector<Shard>& shards);

// Creates root when missing and checks that this process can create files in it: an input error
// naming the directory and checkpoint.dir otherwise (found at start, not at the first save).
void check_writable(const std::string& root);

// Deletes what failed or killed saves and prunes left under root (step_X.<id>.partial,
// step_X.replaced, step_X.pruned),
// so that their bytes do not keep a full disk full. Only while no save of this job is under way.
void remove_leftovers(const std::string& root);

// Deletes committed checkpoints beyond the newest keep_last (0 = keep all), except those whose
// step is a multiple of keep_every (> 0) and those a reader holds (ReadHold: a later prune
// takes them), and the leftovers of failed saves: partial directories of another id than `id`
// (this start's), and of this id up to `committed_step`.
void prune(const std::string& root, int64_t keep_last, int64_t keep_every, const std::string& id,
           int64_t committed_step);

}  // namespace myriad::checkpoint
