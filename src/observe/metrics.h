// RUN_DIR/metrics.jsonl: one JSON object per logged step. Appends and flushes each line, so a
// crash loses at most the line being written. With a TensorBoard directory the same records go
// there as scalars too (observe/tensorboard.h), under the tags Megatron-LM's users know:
//   lm loss, lm loss validation, learning-rate, grad-norm, iteration-time (s),
//   throughput/tokens_per_s, throughput/mfu, phase/<forward|backward|bubble|dp_wait|optimizer>_ms,
//   memory/peak_gib; a mixture of experts' moe/aux_loss, moe/z_loss, moe/imbalance/layer_<l>.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <memory>
#include <string>

#include "observe/tensorboard.h"

namespace myriad {

class MetricsWriter {
 public:
  // Opens path for appending; first drops lines with "step" > keep_through_step, which a run
  // that crashed after its last checkpoint left behind (they are about to be recomputed).
  // `tensorboard_dir`: where the TensorBoard event file goes; empty = none.
  MetricsWriter(const std::string& path, int64_t keep_through_step, const std::string& tensorboard_dir = "");
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

}  // namespace myriad
