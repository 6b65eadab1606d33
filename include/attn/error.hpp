// One error type for every bad input: the message names the argument, what was expected and
// what was given ("attend: k has 6 heads, which does not divide q's 32").
#pragma once
#include <stdexcept>
#include <string>

namespace attn {

class Error : public std::invalid_argument {
 public:
  explicit Error(const std::string& message) : std::invalid_argument(message) {}
};

// Throws Error("<where>: <argument> <problem>") — keeps call sites to one line.
[[noreturn]] void fail(const std::string& where, const std::string& what);

}  // namespace attn
