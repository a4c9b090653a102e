// Checkpoints: a directory per step, tensors stored as shards with their global shapes and
// offsets (so that a later layout can load what another layout saved), a checksum per shard,
// and a commit marker written last.
//
//   ROOT/step_00000120/meta.json     format, step, config, data position, tensor index
//   ROOT/step_00000120/shard_<rank>.bin  raw little-endian fp32 of each process's shards
//   ROOT/step_00000120/COMMITTED     written after everything else is durable
//
// A save goes to ROOT/step_X.partial first (every rank writes its shard file there, rank 0 then
// merges the ranks' indexes into meta.json) and is renamed into place only when complete,
// so a failed or killed save never touches the committed checkpoints; a failed save removes its
// partial directory. Only directories named step_<8 digits> that hold COMMITTED are ever
// loaded, and COMMITTED records the CRC32 of meta.json, as meta.json records each piece's.
// Errors about a checkpoint's content are input errors (Corrupt) naming the directory and the
// tensor; I/O failures while saving are runtime faults.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
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

// The processes that save one checkpoint together; barrier() returns once all have called it.
struct SaveGroup {
  int rank = 0;
  int world = 1;
  std::function<void()> barrier = [] {};
};

// Writes `shards` and `meta` (any JSON object; "step", "format" and "tensors" are added) as the
// committed checkpoint ROOT/step_<step>, replacing a committed one of the same step only once
// the new one is complete. Every rank of `group` calls it with its own shards (a region of a
// tensor must be written by one rank only); rank 0 commits. Returns the directory.
std::string save(const std::string& root, int64_t step, nlohmann::json meta,
                 const std::vector<Shard>& shards, const SaveGroup& group = {});

// The committed checkpoint with the highest step under root, if any.
std::optional<std::string> latest(const std::string& root);
// Every committed checkpoint under root, newest first.
std::vector<std::string> committed_newest_first(const std::string& root);

// Reads and checks DIR/meta.json of a committed checkpoint: every byte of it must match the
// CRC32 that COMMITTED records (Corrupt otherwise).
nlohmann::json read_meta(const std::string& dir);

// Fills each shard's data from the checkpoint: the tensor must exist with the same global
// shape, the stored pieces must cover the requested region, and every piece read must pass
// its checksum.
void load(const std::string& dir, const nlohmann::json& meta, const std::vector<Shard>& shards);

// Creates root when missing and checks that this process can create files in it: an input error
// naming the directory and checkpoint.dir otherwise (found at start, not at the first save).
void check_writable(const std::string& root);

// Deletes what failed or killed saves left under root (step_X.partial, step_X.replaced), so
// that their bytes do not keep a full disk full. Only while no save of this job is under way.
void remove_leftovers(const std::string& root);

// Deletes committed checkpoints beyond the newest keep_last (0 = keep all), except those whose
// step is a multiple of keep_every (> 0), and any leftovers of failed saves.
void prune(const std::string& root, int64_t keep_last, int64_t keep_every);

}  // namespace myriad::checkpoint
