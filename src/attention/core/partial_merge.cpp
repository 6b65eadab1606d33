#include "core/partial_merge.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace attn::core {

float merge_partials(int64_t count, const float* m, const float* l, int64_t stride, const float* acc,
                     int64_t acc_stride, int64_t dv, float* out) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float mx = kNegInf;
  bool nan = false;
  for (int64_t p = 0; p < count; ++p) mx = std::max(mx, m[p * stride]), nan |= std::isnan(l[p * stride]);
  if (nan) {  // a partial poisoned by a non-finite input poisons the row
    std::fill(out, out + dv, std::numeric_limits<float>::quiet_NaN());
    return std::numeric_limits<float>::quiet_NaN();
  }
  std::fill(out, out + dv, 0.0f);
  float sum = 0.0f;
  if (mx != kNegInf)
    for (int64_t p = 0; p < count; ++p) {
      const float lp = l[p * stride];
      if (lp == 0.0f) continue;  // saw no key: contributes nothing (and its acc is not read)
      const float w = std::exp(m[p * stride] - mx);
      sum += lp * w;
      const float* a = acc + p * acc_stride;
      for (int64_t c = 0; c < dv; ++c) out[c] += a[c] * w;
    }
  const float inv = sum > 0 ? 1.0f / sum : 0.0f;
  for (int64_t c = 0; c < dv; ++c) out[c] *= inv;
  return sum > 0 ? mx + std::log(sum) : kNegInf;
}

}  // namespace attn::core
