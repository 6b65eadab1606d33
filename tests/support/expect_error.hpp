// Asserts that f throws attn::Error with `fragment` in its message (the messages are the contract:
// they name the argument, the expected and the actual value).
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "attn/error.hpp"

namespace attn::testing {

inline void expect_error(const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "expected an Error containing '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << "message: " << e.what();
  }
}

}  // namespace attn::testing
