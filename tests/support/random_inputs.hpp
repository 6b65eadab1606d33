// Seeded random tensors for tests: values drawn in float, stored in the requested dtype and
// layout (and optionally inside a larger buffer, so strides are not the packed ones).
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "attn/attn.hpp"

namespace attn::testing {

struct Buffer {
  std::vector<uint8_t> bytes;
  TensorView view;
};

// (B, H, N, D) in `layout`; `pad` extra elements per token row make the token stride larger
// than the packed one (a sliced/packed-QKV-like view).
inline Buffer random_tensor(std::mt19937& rng, DType dtype, int64_t B, int64_t H, int64_t N, int64_t D,
                            Layout layout = Layout::bhnd, float magnitude = 1.0f, int64_t pad = 0) {
  Buffer buf;
  const int64_t row = D + pad;
  const int64_t total = B * H * N * row;
  buf.bytes.assign(static_cast<size_t>(std::max<int64_t>(total, 1) * dtype_size(dtype)), 0);
  TensorView v;
  v.data = buf.bytes.data();
  v.dtype = dtype;
  v.shape = {B, H, N, D};
  if (layout == Layout::bhnd)
    v.strides = {H * N * row, N * row, row, 1};
  else
    v.strides = {N * H * row, row, H * row, 1};
  std::normal_distribution<float> dist(0.0f, magnitude);
  for (int64_t i = 0; i < total; ++i) store_from_float(v.data, dtype, i, dist(rng));
  buf.view = v;
  return buf;
}

inline void fill_token(const TensorView& t, int64_t b, int64_t h, int64_t n, float value) {
  for (int64_t c = 0; c < t.dim(); ++c) store_from_float(t.data, t.dtype, t.offset(b, h, n, c), value);
}

inline float nan_f() { return std::numeric_limits<float>::quiet_NaN(); }

}  // namespace attn::testing
