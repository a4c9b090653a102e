#include "runtime/heartbeat.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace myriad {

Heartbeat::Heartbeat(double startup_s) {
  allowance_s_ = startup_s;
  const char* p = std::getenv("MYRIAD_HEARTBEAT");
  if (!p || !*p) return;
  path_ = p;
  beat();
  thread_ = std::thread([this] {
    while (!stop_.load()) {
      for (int i = 0; i < 10 && !stop_.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      beat();
    }
  });
}

Heartbeat::~Heartbeat() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void Heartbeat::set(int64_t step, const char* phase, double allowance_s) {
  step_ = step, phase_ = phase, allowance_s_ = allowance_s;
}

// Written to a temporary name and renamed, so the launcher never reads half a line. A failed
// write only skips a beat: the launcher waits several before it calls a worker frozen.
void Heartbeat::beat() {
  if (path_.empty()) return;
  const std::string tmp = path_ + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return;
  std::fprintf(f, "%lld %lld %s %.3f %.3f\n", static_cast<long long>(++beats_),
               static_cast<long long>(step_.load()), phase_.load(), allowance_s_.load(), own_ms_.load());
  if (std::fclose(f) == 0) std::rename(tmp.c_str(), path_.c_str());
}

}  // namespace myriad
