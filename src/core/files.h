// File-system checks the run makes at start, before anything trains.
#pragma once

#include <string>

namespace myriad {

// Creates `dir` when missing and checks that this process can create files in it (a probe
// file, so that read-only mounts and root's permission bypass are judged alike). Otherwise an
// input error: "<what> <dir>: cannot create it (...) | not writable (...): <advice>".
void require_writable_dir(const std::string& dir, const std::string& what, const std::string& advice);

// A whole file's bytes; "" when it cannot be read (the caller says what that means).
std::string read_file(const std::string& path);

}  // namespace myriad
