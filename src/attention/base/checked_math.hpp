// 64-bit size arithmetic that reports overflow instead of wrapping.
#pragma once
#include <cstdint>
#include <string>

#include "attn/error.hpp"
#include "base/lazy_text.hpp"

namespace attn {

// `what` names the size for the message, made only on overflow.
inline int64_t checked_mul(int64_t a, int64_t b, LazyText what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    fail(what.str(), std::to_string(a) + " * " + std::to_string(b) + " overflows 64-bit sizes");
  return r;
}

inline int64_t checked_add(int64_t a, int64_t b, LazyText what) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    fail(what.str(), std::to_string(a) + " + " + std::to_string(b) + " overflows 64-bit sizes");
  return r;
}

}  // namespace attn
