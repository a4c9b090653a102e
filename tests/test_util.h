// Helpers shared by the test binaries.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace myriad::test {

// The message of the input error that `fn` throws; fails the test when it throws anything else
// or a message of more than one line.
template <class F>
std::string input_error(F fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.cls(), ErrorClass::kInput) << e.what();
    std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << "error must be one line: " << what;
    return what;
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

// A file's bytes ("" when it cannot be read).
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The objects of a JSON-lines file (metrics.jsonl, events.jsonl).
inline std::vector<nlohmann::json> jsonl(const std::filesystem::path& p) {
  std::vector<nlohmann::json> out;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// `myriad ARGS`, run to its end with ENV ("NAME=value ...") and one OpenMP thread, the launcher's
// variables of an enclosing run unset; its stdout and stderr together.
struct Result {
  int code = -1;  // the exit code, or 128 + the signal
  std::string output;
};
inline Result run_myriad(const std::string& args, const std::string& env = "") {
  const std::string cmd = cat("env -u MYRIAD_RDZV -u MYRIAD_JOB -u MYRIAD_INJECT_FAULT OMP_NUM_THREADS=1 ", env, " ",
                              MYRIAD_BINARY_DIR, "/myriad ", args, " 2>&1");
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace myriad::test
