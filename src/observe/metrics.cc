#include "observe/metrics.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace myriad {

MetricsWriter::MetricsWriter(const std::string& path, int64_t keep_through_step, const std::string& tensorboard_dir)
    : path_(path) {
  if (!tensorboard_dir.empty()) tensorboard_ = std::make_unique<TensorBoardWriter>(tensorboard_dir, keep_through_step + 1);
  std::vector<std::string> kept;
  {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_discarded() && j.value("step", int64_t(0)) <= keep_through_step) kept.push_back(line);
    }
  }
  f_ = std::fopen(path.c_str(), "w");
  if (!f_) throw_runtime("metrics: cannot write ", path);
  for (const auto& line : kept) std::fprintf(f_, "%s\n", line.c_str());
  std::fflush(f_);
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  std::fprintf(f_, "%s\n", record.dump().c_str());
  std::fflush(f_);
  if (!tensorboard_) return;
  // metrics.jsonl's key -> TensorBoard's tag, and the factor to its unit.
  static const struct {
    const char *key, *tag;
    double scale;
  } kTags[] = {{"loss", "lm loss", 1},
               {"val_loss", "lm loss validation", 1},
               {"lr", "learning-rate", 1},
               {"grad_norm", "grad-norm", 1},
               {"step_ms", "iteration-time", 1e-3},
               {"tokens_per_s", "throughput/tokens_per_s", 1},
               {"mfu", "throughput/mfu", 1},
               {"forward_ms", "phase/forward_ms", 1},
               {"backward_ms", "phase/backward_ms", 1},
               {"bubble_ms", "phase/bubble_ms", 1},
               {"dp_wait_ms", "phase/dp_wait_ms", 1},
               {"optimizer_ms", "phase/optimizer_ms", 1},
               {"peak_memory_gib", "memory/peak_gib", 1},
               {"moe_aux_loss", "moe/aux_loss", 1},
               {"moe_z_loss", "moe/z_loss", 1},
               {"moe_dropped", "moe/dropped_rows", 1},
               {"cp_imbalance", "context_parallel/imbalance", 1}};
  std::vector<std::pair<std::string, double>> scalars;
  for (const auto& t : kTags)
    if (record.contains(t.key) && record[t.key].is_number()) scalars.emplace_back(t.tag, record[t.key].get<double>() * t.scale);
  // Per data source: val_loss/<name> and epochs/<name>.
  for (const auto& [key, value] : record.items()) {
    if (!value.is_number()) continue;
    if (key.rfind("val_loss/", 0) == 0) scalars.emplace_back("lm loss validation/" + key.substr(9), value.get<double>());
    if (key.rfind("epochs/", 0) == 0) scalars.emplace_back("data/epochs/" + key.substr(7), value.get<double>());
    if (key.rfind("expert_imbalance/", 0) == 0)
      scalars.emplace_back("moe/imbalance/layer_" + key.substr(17), value.get<double>());
  }
  tensorboard_->write(record.value("step", int64_t(0)), scalars);
}

}  // namespace myriad
