#include "core/log.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace myriad::log {
namespace {
std::mutex mu;
Level min_level = Level::kInfo;
std::string line_prefix;
}  // namespace

void set_level(Level level) {
  std::lock_guard<std::mutex> lock(mu);
  min_level = level;
}

void set_prefix(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu);
  line_prefix = prefix;
}

void write(Level level, const std::string& message) {
  std::lock_guard<std::mutex> lock(mu);
  if (level < min_level) return;
  static const char* names[] = {"D", "I", "W", "E"};
  std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  localtime_r(&now, &tm);
  char ts[32];
  std::strftime(ts, sizeof ts, "%H:%M:%S", &tm);
  std::fprintf(stderr, "%s %s %s%s%s\n", ts, names[static_cast<int>(level)], line_prefix.c_str(),
               line_prefix.empty() ? "" : " ", message.c_str());
  std::fflush(stderr);
}

}  // namespace myriad::log
