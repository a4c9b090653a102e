#include "ops/cpu/reduce.h"

#include <algorithm>
#include <vector>

namespace myriad::cpu {

double sum_squares(const float* x, int64_t n) {
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0;
    for (int64_t i = c * kChunk, end = std::min(n, i + kChunk); i < end; ++i) s += double(x[i]) * x[i];
    partial[c] = s;
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace myriad::cpu
