// Helpers shared by the test binaries.
#pragma once

#include <gtest/gtest.h>

#include <string>

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

}  // namespace myriad::test
