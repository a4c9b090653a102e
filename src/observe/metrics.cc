#include "observe/metrics.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace myriad {

MetricsWriter::MetricsWriter(const std::string& path, int64_t keep_through_step) : path_(path) {
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
}

}  // namespace myriad
