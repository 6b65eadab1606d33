// Seeded random tensors for tests: the harness's generator (harness/inputs.hpp), plus helpers
// for poisoning tokens.
#pragma once
#include <limits>

#include "harness/inputs.hpp"

namespace attn::testing {

using harness::Buffer;
using harness::random_tensor;

inline void fill_token(const TensorView& t, int64_t b, int64_t h, int64_t n, float value) {
  for (int64_t c = 0; c < t.dim(); ++c) store_from_float(t.data, t.dtype, t.offset(b, h, n, c), value);
}

inline float nan_f() { return std::numeric_limits<float>::quiet_NaN(); }

}  // namespace attn::testing
