// 64-bit size arithmetic that reports overflow instead of wrapping.
#pragma once
#include <cstdint>
#include <string>

#include "attn/error.hpp"

namespace attn {

inline int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    fail(what, std::to_string(a) + " * " + std::to_string(b) + " overflows 64-bit sizes");
  return r;
}

inline int64_t checked_add(int64_t a, int64_t b, const std::string& what) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    fail(what, std::to_string(a) + " + " + std::to_string(b) + " overflows 64-bit sizes");
  return r;
}

}  // namespace attn
