// RUN_DIR/metrics.jsonl: one JSON object per logged step. Appends and flushes each line, so a
// crash loses at most the line being written.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace myriad {

class MetricsWriter {
 public:
  // Opens path for appending; first drops lines with "step" > keep_through_step, which a run
  // that crashed after its last checkpoint left behind (they are about to be recomputed).
  MetricsWriter(const std::string& path, int64_t keep_through_step);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace myriad
