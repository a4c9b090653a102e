// The last values of a series and their median: the step times behind the heartbeat's stall
// allowance, the own step times behind the straggler check, the losses behind the spike check.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace myriad {

class RollingWindow {
 public:
  explicit RollingWindow(size_t capacity) : capacity_(capacity) {}
  // Appends `v`, dropping the oldest value past the capacity.
  void push(double v) {
    values_.push_back(v);
    if (values_.size() > capacity_) values_.erase(values_.begin());
  }
  // The median: the middle value, or of an even count the upper of the two middle ones; 0 when
  // there is none.
  double median() const {
    if (values_.empty()) return 0;
    std::vector<double> sorted = values_;
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    return sorted[sorted.size() / 2];
  }
  size_t size() const { return values_.size(); }
  bool empty() const { return values_.empty(); }
  void clear() { values_.clear(); }
  // Oldest first: what a checkpoint keeps of the losses, and restores.
  std::vector<double>& values() { return values_; }

 private:
  size_t capacity_;
  std::vector<double> values_;
};

}  // namespace myriad
