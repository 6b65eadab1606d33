// Which keys a query sees: key padding, the structural window (causal is right = 0, aligned
// bottom-right through offset = M - N), an optional boolean mask; plus bias and ALiBi.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "base/counter_random.hpp"
#include "exact/problem.hpp"

namespace attn::exact {

void Problem::key_range(int64_t b, int64_t i0, int64_t i1, int64_t& lo, int64_t& hi) const {
  lo = left < 0 ? 0 : std::max<int64_t>(0, i0 + offset - left);
  hi = right < 0 ? kv_len[b] : std::min<int64_t>(kv_len[b], i1 + offset + right + 1);
  if (hi < lo) hi = lo;
}

void Problem::query_range(int64_t j, int64_t& lo, int64_t& hi) const {
  // j >= i + offset - left  <=>  i <= j - offset + left;   j <= i + offset + right  <=>  i >= j - offset - right
  lo = right < 0 ? std::numeric_limits<int64_t>::min() / 4 : j - offset - right;
  hi = left < 0 ? std::numeric_limits<int64_t>::max() / 4 : j - offset + left;
}

bool Problem::structurally_visible(int64_t b, int64_t i, int64_t j) const {
  if (j < 0 || j >= kv_len[b]) return false;
  if (left >= 0 && j < i + offset - left) return false;
  if (right >= 0 && j > i + offset + right) return false;
  return true;
}

bool Problem::visible(int64_t b, int64_t h, int64_t i, int64_t j) const {
  if (!structurally_visible(b, i, j)) return false;
  if (mask) {
    const auto* m = static_cast<const uint8_t*>(mask->data);
    return m[mask->offset(b, h, i, j)] != 0;
  }
  return true;
}

bool Problem::tile_fully_visible(int64_t b, int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
  if (mask) return false;
  if (j0 < 0 || j1 >= kv_len[b]) return false;
  if (left >= 0 && j0 < i1 + offset - left) return false;
  if (right >= 0 && j1 > i0 + offset + right) return false;
  return true;
}

float Problem::additive_bias(int64_t b, int64_t h, int64_t i, int64_t j) const {
  float s = 0.0f;
  if (bias) s += bias->at(b, h, i, j);
  if (!alibi.empty()) s -= alibi[b * H + h] * static_cast<float>(std::llabs(i + offset - j));
  return s;
}

int64_t Problem::visible_count(int64_t b, int64_t h, int64_t i) const {
  int64_t lo, hi;
  key_range(b, i, i, lo, hi);
  if (!mask) return hi - lo;
  int64_t n = 0;
  for (int64_t j = lo; j < hi; ++j) n += visible(b, h, i, j);
  return n;
}

double Problem::structural_pairs() const {
  double pairs = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < N; ++i) {
      int64_t lo, hi;
      key_range(b, i, i, lo, hi);
      pairs += static_cast<double>(hi - lo);
    }
  return pairs * static_cast<double>(H);
}

double Problem::row_scale(int64_t b, int64_t h, int64_t i) const {
  if (mech.entropy_train_len <= 1) return base_scale;
  const int64_t n = visible_count(b, h, i);
  if (n <= 1) return 0.0;  // log(1) = 0; a row with no key is masked anyway
  return base_scale * std::log(static_cast<double>(n)) /
         std::log(static_cast<double>(mech.entropy_train_len));
}

bool dropout_keep(uint64_t seed, double p, int64_t b, int64_t h, int64_t i, int64_t j) {
  uint64_t x = splitmix64(seed);
  x = splitmix64(x ^ static_cast<uint64_t>(b));
  x = splitmix64(x ^ static_cast<uint64_t>(h));
  x = splitmix64(x ^ static_cast<uint64_t>(i));
  x = splitmix64(x ^ static_cast<uint64_t>(j));
  return unit_uniform(x) >= p;
}

}  // namespace attn::exact
