// Views of one sequence of a batch or a packed tensor, for the calls that run one attend() per
// sequence (KV cache, varlen). No copies: pointer offsets and shapes.
#pragma once
#include <cstdint>
#include <cstring>

#include "attn/tensor.hpp"

namespace attn::cache_view {

// Batch entry b of t, as a batch of one.
inline TensorView entry(TensorView t, int64_t b) {
  t.data = t.ptr(b, 0, 0, 0);
  t.shape[0] = 1;
  return t;
}

// Tokens [from, from + n) of t.
inline TensorView tokens(TensorView t, int64_t from, int64_t n) {
  t.data = t.ptr(0, 0, from, 0);
  t.shape[2] = n;
  return t;
}

// dst = src element by element (same dtype and shape, any strides).
inline void copy(const TensorView& src, const TensorView& dst) {
  const auto size = static_cast<size_t>(dtype_size(src.dtype));
  for (int64_t b = 0; b < src.shape[0]; ++b)
    for (int64_t h = 0; h < src.shape[1]; ++h)
      for (int64_t n = 0; n < src.shape[2]; ++n)
        for (int64_t c = 0; c < src.shape[3]; ++c) std::memcpy(dst.ptr(b, h, n, c), src.ptr(b, h, n, c), size);
}

}  // namespace attn::cache_view
