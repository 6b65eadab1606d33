// "(2, 3)", "(5,)": a shape as error messages print it (one helper for every family and the model).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace attn::core {

// Built with += (GCC 12 warns, wrongly, of an overlapping memcpy on "(" + std::to_string(x)).
inline std::string shape_text(const int64_t* dims, size_t n) {
  std::string s = "(";
  for (size_t i = 0; i < n; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  s += n == 1 ? ",)" : ")";
  return s;
}
inline std::string shape_text(const std::vector<int64_t>& s) { return shape_text(s.data(), s.size()); }
inline std::string shape_text(std::initializer_list<int64_t> s) { return shape_text(s.begin(), s.size()); }

}  // namespace attn::core
