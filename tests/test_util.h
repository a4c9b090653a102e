// Helpers shared by the test binaries.
#pragma once

#include <gtest/gtest.h>

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

}  // namespace myriad::test
