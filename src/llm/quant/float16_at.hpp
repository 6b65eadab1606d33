// A float16 stored at any address (ggml's block scales sit at odd offsets), as float32.
#pragma once
#include <cstdint>
#include <cstring>

#include "attn/dtype.hpp"

namespace attn::kernels {

inline float float16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_float(h);
}

}  // namespace attn::kernels
