// Monotonic wall time, for step and phase timers and timeouts.
#pragma once

#include <chrono>

namespace myriad {

// Seconds on the steady clock (an arbitrary origin: take differences).
inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace myriad
