// Helpers of the comm tests: a private redis-server per test suite, temporary directories, the
// messages of expected errors, and ranks run as threads.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/local_redis.h"
#include "comm/store.h"
#include "core/error.h"

namespace myriad::comm::testing {

// A directory removed with the object.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = (std::filesystem::temp_directory_path() /
             ("myriad-comm-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++)))
                .string();
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A job name unique within this process: tests share a server, never keys.
inline std::string unique_job(const std::string& base) {
  static std::atomic<int> counter{0};
  return base + "-" + std::to_string(counter++);
}

// Runs `fn` and returns the message of the Error of class `cls` it throws; fails otherwise.
template <class F>
std::string error_of(ErrorClass cls, F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(static_cast<int>(e.cls()), static_cast<int>(cls)) << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a myriad::Error: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs fn(rank) on n threads and rethrows the first failure (as a test failure).
inline void run_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace myriad::comm::testing
