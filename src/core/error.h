// Typed errors that carry what a supervisor should do with the process that raised them.
//
// Library code throws; only src/cli turns an Error into an exit code (the codes are listed in
// the README). Input errors are the user's to fix and are never retried; runtime and
// communication faults are worth a restart.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace myriad {

enum class ErrorClass : int {
  kInternal = 1,   // a bug in Myriad: report it
  kInput = 2,      // bad config, data, checkpoint or command line: fix the input, never retry
  kRuntime = 3,    // I/O failure, out of memory, killed worker: retry (from the last checkpoint)
  kComm = 4,       // lost peer, collective timeout: retry, maybe without the named node
  kNumerics = 5,   // loss or gradients not finite: retry from an earlier checkpoint
  kPreempted = 6,  // stopped by a signal from outside (SIGTERM) after saving: resume, not a fault
};

// Process exit code of each class (the README's table); 0 is success.
inline int exit_code(ErrorClass c) { return static_cast<int>(c); }
const char* class_name(ErrorClass c);
// The class of class_name(c) (a runtime fault for a name it does not know).
ErrorClass class_from_name(const std::string& name);

class Error : public std::runtime_error {
 public:
  Error(ErrorClass cls, const std::string& what) : std::runtime_error(what), cls_(cls) {}
  ErrorClass cls() const { return cls_; }

 private:
  ErrorClass cls_;
};

// Concatenates anything streamable: cat("step ", 3, ": ", x).
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <class... Args>
[[noreturn]] void throw_input(const Args&... args) {
  throw Error(ErrorClass::kInput, cat(args...));
}
template <class... Args>
[[noreturn]] void throw_runtime(const Args&... args) {
  throw Error(ErrorClass::kRuntime, cat(args...));
}

}  // namespace myriad

// An internal invariant; its failure is a bug, so the message carries file:line.
#define MYRIAD_CHECK(cond, ...)                                                          \
  do {                                                                                   \
    if (!(cond))                                                                         \
      throw ::myriad::Error(::myriad::ErrorClass::kInternal,                             \
                            ::myriad::cat(__FILE__, ":", __LINE__, ": check failed: " #cond " ", \
                                          ##__VA_ARGS__));                               \
  } while (0)
