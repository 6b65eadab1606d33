// Which keys a query sees (key padding, the pattern, an optional boolean mask), plus bias and
// ALiBi. The kernels walk a compiled mask::BlockMask instead; this is the definition.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "base/counter_random.hpp"
#include "softmax/problem.hpp"
#include "mask/block_mask.hpp"

namespace attn::exact {

bool Problem::visible(int64_t b, int64_t h, int64_t i, int64_t j) const {
  if (j < 0 || j >= kv_len[b] || !pattern.visible(i + offset, j)) return false;
  if (mask && static_cast<const uint8_t*>(mask->data)[mask->offset(b, h, i, j)] == 0) return false;
  if (block_mask && static_cast<const uint8_t*>(block_mask->data)[block_mask->offset(b, h, i / bq, j / bk)] == 0)
    return false;
  return !mask_mod || mask_mod(b, h, i, j);
}

void Problem::user_mask_column(int64_t b, int64_t h, int64_t i0, int64_t n, int64_t j, uint8_t* vis) const {
  if (mask) {
    const auto* m = static_cast<const uint8_t*>(mask->data) + mask->offset(b, h, i0, j);
    for (int64_t i = 0; i < n; ++i) vis[i] &= m[i * mask->strides[2]] != 0;
  }
  if (block_mask) {
    const auto* m = static_cast<const uint8_t*>(block_mask->data);
    for (int64_t i = 0; i < n; ++i) vis[i] &= m[block_mask->offset(b, h, (i0 + i) / bq, j / bk)] != 0;
  }
  if (mask_mod)
    for (int64_t i = 0; i < n; ++i) vis[i] = vis[i] && mask_mod(b, h, i0 + i, j);
}

bool Problem::user_blocks_hide(int64_t b, int64_t h, int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
  if (!block_mask) return false;
  const auto* m = static_cast<const uint8_t*>(block_mask->data);
  for (int64_t bi = i0 / bq; bi <= i1 / bq; ++bi)
    for (int64_t bj = j0 / bk; bj <= j1 / bk; ++bj)
      if (m[block_mask->offset(b, h, bi, bj)]) return false;
  return true;
}

float Problem::additive_bias(int64_t b, int64_t h, int64_t i, int64_t j) const {
  float s = 0.0f;
  if (bias) s += bias->at(b, h, i, j);
  if (!alibi.empty()) s -= alibi[b * H + h] * static_cast<float>(std::llabs(i + offset - j));
  return s;
}

// Called inside parallel regions (row_scale), so it must not allocate: the candidate intervals
// go on the stack, and a pattern needing more of them (many global tokens) counts every key.
int64_t Problem::visible_count(int64_t b, int64_t h, int64_t i) const {
  std::pair<int64_t, int64_t> iv[64];
  const int64_t count = pattern.candidates_into(i + offset, i + offset, kv_len[b], iv, 64);
  int64_t n = 0;
  const bool pattern_only = !mask && pattern.intervals_exact();  // the intervals are the visible keys
  if (count < 0) {  // the same count, key by key
    for (int64_t j = 0; j < kv_len[b]; ++j) n += pattern_only ? pattern.visible(i + offset, j) : visible(b, h, i, j);
    return n;
  }
  for (int64_t k = 0; k < count; ++k) {
    const auto [lo, hi] = iv[k];
    if (pattern_only) {
      n += hi - lo;
      continue;
    }
    for (int64_t j = lo; j < hi; ++j) n += visible(b, h, i, j);
  }
  return n;
}

double Problem::structural_pairs() const {
  double pairs = 0, last = 0;
  for (int64_t b = 0; b < B; ++b) {
    // consecutive batch entries with the same valid length count the same
    if (b == 0 || kv_len[b] != kv_len[b - 1]) last = mask::visible_pairs(pattern, N, M, offset, kv_len[b]);
    pairs += last;
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
