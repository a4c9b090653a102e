// TensorBoard's event files, written and read without TensorFlow or a protobuf library: the
// logged steps' scalars go to RUN_DIR/tensorboard/events.out.tfevents.<time>.<host>.<pid>, and
// `tensorboard --logdir RUN_DIR/tensorboard` plots them.
//
// The format: a file is a sequence of TFRecords, each
//   uint64 length | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked CRC-32C of data
// (little-endian; masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8), each data an Event
// protobuf message:
//   1 wall_time (double), 2 step (int64), 3 file_version (string; the first record's is
//   "brain.Event:2"), 5 summary { repeated 1 value { 1 tag (string), 2 simple_value (float) } },
//   7 session_log { 1 status (enum; 1 = START) }.
// Each file's second record is a session START at the first step the run will write: a restart
// resumed from a checkpoint thus tells TensorBoard to drop what the files before it hold from
// that step on (the steps the crash made it recompute), as metrics.jsonl drops them.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace myriad {

class TensorBoardWriter {
 public:
  // Creates `dir` and a new event file in it, for steps from `first_step` on; a runtime fault
  // naming it when it cannot.
  TensorBoardWriter(const std::string& dir, int64_t first_step);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event holding these scalars at `step`, flushed at once.
  void write(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& data);
  std::string path_;
  std::FILE* f_ = nullptr;
};

struct TensorBoardScalar {
  double wall_time = 0;
  int64_t step = 0;
  std::string tag;
  float value = 0;
};

// Every scalar of an event file, in order; each record's checksums are checked (a runtime fault
// naming the file and the record's offset).
std::vector<TensorBoardScalar> read_tensorboard(const std::string& path);

// CRC-32C (Castagnoli), as TFRecord frames use it.
uint32_t crc32c(const void* data, size_t n);

}  // namespace myriad
