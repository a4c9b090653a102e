// Logging to stderr: one line per message, prefixed by time and level. Thread-safe.
#pragma once

#include <string>

#include "core/error.h"

namespace myriad::log {

enum class Level { kDebug, kInfo, kWarn, kError };

void set_level(Level level);
// A prefix for every line, e.g. "[rank 3]" in multi-process runs.
void set_prefix(const std::string& prefix);
void write(Level level, const std::string& message);

template <class... Args>
void info(const Args&... args) { write(Level::kInfo, cat(args...)); }
template <class... Args>
void warn(const Args&... args) { write(Level::kWarn, cat(args...)); }
template <class... Args>
void error(const Args&... args) { write(Level::kError, cat(args...)); }
template <class... Args>
void debug(const Args&... args) { write(Level::kDebug, cat(args...)); }

}  // namespace myriad::log
