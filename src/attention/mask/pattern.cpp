#include "mask/pattern.hpp"

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "base/counter_random.hpp"

namespace attn::mask {
namespace {

constexpr int64_t kUnbounded = -1;

// Lag (query chunk - key chunk) in [lo, hi] against the band's allowed range: none, all, some.
Coverage lag_coverage(const Band& b, int64_t lo, int64_t hi) {
  if (hi < b.lag_min || (b.lag_max != kUnbounded && lo > b.lag_max)) return Coverage::hidden;
  return lo >= b.lag_min && (b.lag_max == kUnbounded || hi <= b.lag_max) ? Coverage::full : Coverage::partial;
}

// Positions [first, last) of the queries whose chunk lets key j through.
void chunk_positions(const Band& b, int64_t j, int64_t& first, int64_t& last) {
  const int64_t kc = floor_div(j, b.chunk);
  first = (kc + b.lag_min) * b.chunk;
  last = b.lag_max == kUnbounded ? std::numeric_limits<int64_t>::max() : (kc + b.lag_max + 1) * b.chunk;
}

bool in_band(const Band& b, int64_t p, int64_t j) {
  const int64_t d = p - j;
  if (b.left != kUnbounded && d > b.left) return false;
  if (b.right != kUnbounded && -d > b.right) return false;
  if (b.chunk > 0) {
    const int64_t lag = floor_div(p, b.chunk) - floor_div(j, b.chunk);
    if (lag_coverage(b, lag, lag) == Coverage::hidden) return false;
  }
  if (b.dilation > 1 && floor_mod(d, b.dilation) != 0) return false;
  if (b.stride > 0 && std::llabs(d) > b.stride && floor_mod(d, b.stride) != 0) return false;
  return true;
}

// A query before the first key (p < 0: N > M, bottom-right) is in no block (a < 0): it sees the
// global key blocks only, as every query does, and Longformer's global keys and sinks are seen.
bool block_visible(const Blocks& b, int64_t a, int64_t c) {
  if (c < 0) return false;
  if (c < b.global) return true;
  if (a < 0) return false;
  if (std::llabs(a - c) <= b.half_window || a < b.global) return true;
  if (a >= static_cast<int64_t>(b.random_of.size())) return false;
  const auto& r = b.random_of[static_cast<size_t>(a)];
  return std::binary_search(r.begin(), r.end(), c);
}

bool is_global(const std::vector<int64_t>& g, int64_t x) { return std::binary_search(g.begin(), g.end(), x); }

// Globals in [lo, hi].
int64_t globals_in(const std::vector<int64_t>& g, int64_t lo, int64_t hi) {
  if (hi < lo) return 0;
  return std::upper_bound(g.begin(), g.end(), hi) - std::lower_bound(g.begin(), g.end(), lo);
}

// Is there a multiple of m in [lo, hi]?
bool multiple_in(int64_t lo, int64_t hi, int64_t m) { return lo <= hi && floor_div(hi, m) * m >= lo; }

void fill(uint8_t* vis, int64_t a, int64_t b) {
  if (a < b) std::fill(vis + a, vis + b, uint8_t{1});
}

// Lanes [lo, hi) (query positions p0 + lane) cut to the queries whose chunk sees key j.
void clip_to_chunks(const Band& b, int64_t j, int64_t p0, int64_t& lo, int64_t& hi) {
  int64_t first, last;
  chunk_positions(b, j, first, last);
  lo = std::max(lo, first - p0);
  if (last != std::numeric_limits<int64_t>::max()) hi = std::min(hi, last - p0);
}

// Lanes of the band term for key j, within lanes [lo, hi).
void band_lanes(const Band& b, int64_t j, int64_t p0, int64_t lo, int64_t hi, uint8_t* vis) {
  // p - left <= j <= p + right  <=>  j - right <= p <= j + left
  if (b.right != kUnbounded) lo = std::max(lo, j - b.right - p0);
  if (b.left != kUnbounded) hi = std::min(hi, j + b.left - p0 + 1);
  if (b.chunk > 0) clip_to_chunks(b, j, p0, lo, hi);
  if (lo >= hi) return;
  // lanes i with (p0 + i - j) mod step = 0: i = first, first + step, ...
  auto every = [&](int64_t step) {
    for (int64_t i = lo + floor_mod(j - p0 - lo, step); i < hi; i += step) vis[i] = 1;
  };
  if (b.stride > 0) {
    fill(vis, std::max(lo, j - b.stride - p0), std::min(hi, j + b.stride - p0 + 1));
    every(b.stride);
  } else if (b.dilation > 1) {
    every(b.dilation);
  } else {
    fill(vis, lo, hi);
  }
}

Coverage band_coverage(const Band& b, int64_t p0, int64_t p1, int64_t j0, int64_t j1) {
  const int64_t dmin = p0 - j1, dmax = p1 - j0;  // p - j over the rectangle
  if (b.left != kUnbounded && dmin > b.left) return Coverage::hidden;
  if (b.right != kUnbounded && -dmax > b.right) return Coverage::hidden;
  bool full = (b.left == kUnbounded || dmax <= b.left) && (b.right == kUnbounded || -dmin <= b.right);
  if (b.chunk > 0) {
    const int64_t q0 = floor_div(p0, b.chunk), q1 = floor_div(p1, b.chunk);
    const int64_t k0 = floor_div(j0, b.chunk), k1 = floor_div(j1, b.chunk);
    const Coverage lags = lag_coverage(b, q0 - k1, q1 - k0);
    if (lags == Coverage::hidden) return Coverage::hidden;
    full = full && lags == Coverage::full;
  }
  if (b.dilation > 1) {
    if (!multiple_in(dmin, dmax, b.dilation)) return Coverage::hidden;
    full = false;
  }
  if (b.stride > 0) {
    const bool near_any = dmin <= b.stride && dmax >= -b.stride;
    const bool near_all = dmax <= b.stride && dmin >= -b.stride;
    if (!near_any && !multiple_in(dmin, dmax, b.stride)) return Coverage::hidden;
    full = full && near_all;
  }
  return full ? Coverage::full : Coverage::partial;
}

Coverage block_coverage(const Blocks& b, int64_t p0, int64_t p1, int64_t j0, int64_t j1) {
  bool any = false, all = true;  // a = -1 stands for every query before the first key
  for (int64_t a = std::max<int64_t>(floor_div(p0, b.size), -1); a <= std::max<int64_t>(floor_div(p1, b.size), -1); ++a)
    for (int64_t c = j0 / b.size; c <= j1 / b.size; ++c) {
      const bool v = block_visible(b, a, c);
      any |= v;
      all &= v;
    }
  return all ? Coverage::full : any ? Coverage::partial : Coverage::hidden;
}

}  // namespace

bool Pattern::visible(int64_t p, int64_t j) const {
  if (causal && j > p) return false;
  if (band && in_band(*band, p, j)) return true;
  if (j < sinks) return true;
  if (is_global(global, j) || (global_queries && is_global(global, p))) return true;
  if (blocks && block_visible(*blocks, floor_div(p, blocks->size), j / blocks->size)) return true;
  return false;
}

void Pattern::column(int64_t j, int64_t p0, int64_t n, uint8_t* vis) const {
  std::fill(vis, vis + n, uint8_t{0});
  const int64_t lo = causal ? std::clamp<int64_t>(j - p0, 0, n) : 0;  // lanes with p >= j
  if (lo >= n) return;
  if (j < sinks || is_global(global, j)) return fill(vis, lo, n);
  if (band) band_lanes(*band, j, p0, lo, n, vis);
  for (auto g = std::lower_bound(global.begin(), global.end(), p0 + lo); global_queries && g != global.end() && *g < p0 + n; ++g)
    vis[*g - p0] = 1;
  if (blocks) {
    const int64_t size = blocks->size, c = j / size;
    if (c < blocks->global) return fill(vis, lo, n);  // a global key block: every query sees it
    for (int64_t a = floor_div(std::max(p0 + lo, int64_t{0}), size); a * size < p0 + n; ++a)
      if (block_visible(*blocks, a, c)) fill(vis, std::max(lo, a * size - p0), std::min(n, (a + 1) * size - p0));
  }
}

bool Pattern::column_interval(int64_t j, int64_t p0, int64_t n, int64_t& lo, int64_t& hi) const {
  lo = causal ? std::clamp<int64_t>(j - p0, 0, n) : 0;
  hi = n;
  if (lo >= n || j < sinks) return true;
  if (blocks || is_global(global, j) || (global_queries && globals_in(global, p0, p0 + n - 1) > 0)) return false;
  if (!band) return hi = lo, true;
  if (band->dilation > 1 || band->stride > 0) return false;
  if (band->right != kUnbounded) lo = std::max(lo, j - band->right - p0);
  if (band->left != kUnbounded) hi = std::min(hi, j + band->left - p0 + 1);
  if (band->chunk > 0) clip_to_chunks(*band, j, p0, lo, hi);
  lo = std::clamp<int64_t>(lo, 0, n), hi = std::clamp<int64_t>(hi, lo, n);
  return true;
}

Coverage Pattern::classify(int64_t p0, int64_t p1, int64_t j0, int64_t j1) const {
  if (causal && j0 > p1) return Coverage::hidden;
  const bool causal_full = !causal || j1 <= p0;
  bool any_full = false, all_hidden = true;
  auto add = [&](Coverage c) {
    any_full |= c == Coverage::full;
    all_hidden &= c == Coverage::hidden;
  };
  if (band) add(band_coverage(*band, p0, p1, j0, j1));
  if (sinks > 0) add(j1 < sinks ? Coverage::full : j0 >= sinks ? Coverage::hidden : Coverage::partial);
  if (!global.empty()) {
    const int64_t gk = globals_in(global, j0, j1), gq = global_queries ? globals_in(global, p0, p1) : 0;
    add(gk == j1 - j0 + 1 || gq == p1 - p0 + 1 ? Coverage::full
        : gk + gq == 0                          ? Coverage::hidden
                                                : Coverage::partial);
  }
  if (blocks) add(block_coverage(*blocks, p0, p1, j0, j1));
  if (all_hidden) return Coverage::hidden;
  return any_full && causal_full ? Coverage::full : Coverage::partial;
}

std::vector<std::pair<int64_t, int64_t>> Pattern::candidates(int64_t p0, int64_t p1, int64_t M) const {
  std::vector<std::pair<int64_t, int64_t>> iv(16);
  int64_t n;
  while ((n = candidates_into(p0, p1, M, iv.data(), static_cast<int64_t>(iv.size()))) < 0) iv.resize(2 * iv.size());
  iv.resize(static_cast<size_t>(n));
  return iv;
}

int64_t Pattern::candidates_into(int64_t p0, int64_t p1, int64_t M, std::pair<int64_t, int64_t>* iv,
                                 int64_t capacity) const {
  int64_t count = 0;
  const int64_t end = causal ? std::min(M, p1 + 1) : M;
  if (end <= 0) return 0;
  auto add = [&](int64_t a, int64_t b) {
    a = std::max<int64_t>(a, 0), b = std::min(b, end);
    if (a < b && count++ < capacity) iv[count - 1] = {a, b};
  };
  if (band) {
    int64_t a = band->left == kUnbounded ? 0 : p0 - band->left;
    int64_t b = band->right == kUnbounded ? end : p1 + band->right + 1;
    if (band->chunk > 0) {  // key chunks q0 - lag_max .. q1 - lag_min
      const int64_t C = band->chunk;
      if (band->lag_max != kUnbounded) a = std::max(a, (floor_div(p0, C) - band->lag_max) * C);
      b = std::min(b, (floor_div(p1, C) - band->lag_min + 1) * C);
    }
    add(a, b);
  }
  add(0, sinks);
  if (global_queries && globals_in(global, p0, p1) > 0) add(0, end);
  for (int64_t g : global) add(g, g + 1);
  if (blocks) {
    const Blocks& bl = *blocks;
    add(0, bl.global * bl.size);  // global key blocks: every query, those before the first key too
    for (int64_t a = floor_div(std::max<int64_t>(p0, 0), bl.size); a <= floor_div(p1, bl.size); ++a) {
      if (a < bl.global) add(0, end);
      add((a - bl.half_window) * bl.size, (a + bl.half_window + 1) * bl.size);
      if (a < static_cast<int64_t>(bl.random_of.size()))
        for (int64_t c : bl.random_of[static_cast<size_t>(a)]) add(c * bl.size, (c + 1) * bl.size);
    }
  }
  if (count > capacity) return -1;
  std::sort(iv, iv + count);
  int64_t merged = 0;  // in place: iv[0..merged) are the merged intervals so far
  for (int64_t k = 0; k < count; ++k) {
    if (merged > 0 && iv[k].first <= iv[merged - 1].second)
      iv[merged - 1].second = std::max(iv[merged - 1].second, iv[k].second);
    else
      iv[merged++] = iv[k];
  }
  return merged;
}

bool Pattern::dense() const {
  return !causal && band && band->left == kUnbounded && band->right == kUnbounded && band->dilation <= 1 &&
         band->stride == 0 && band->chunk == 0;
}

void Pattern::draw_random_blocks(int64_t M) {
  if (!blocks) return;
  Blocks& b = *blocks;
  const int64_t nkb = (M + b.size - 1) / b.size;
  b.random_of.assign(static_cast<size_t>(nkb), {});
  if (b.random == 0) return;
  for (int64_t a = b.global; a < nkb; ++a) {
    // candidates: key blocks c in [0, range) outside the window and the global blocks
    const int64_t range = causal ? a + 1 : nkb;
    auto candidate = [&](int64_t c) { return std::llabs(a - c) > b.half_window && c >= b.global; };
    const int64_t win_lo = std::max(a - b.half_window, b.global), win_hi = std::min(a + b.half_window + 1, range);
    const int64_t count = range - std::min(b.global, range) - std::max<int64_t>(0, win_hi - win_lo);
    auto& chosen = b.random_of[static_cast<size_t>(a)];
    if (count <= b.random) {
      for (int64_t c = 0; c < range; ++c)
        if (candidate(c)) chosen.push_back(c);
      continue;
    }
    // rejection sampling from a counter-based stream: reproducible for (seed, a)
    for (uint64_t draw = 0; static_cast<int64_t>(chosen.size()) < b.random; ++draw) {
      const uint64_t h = splitmix64(splitmix64(splitmix64(b.seed) ^ static_cast<uint64_t>(a)) ^ draw);
      const auto c = static_cast<int64_t>(unit_uniform(h) * static_cast<double>(range));
      if (candidate(c) && std::find(chosen.begin(), chosen.end(), c) == chosen.end()) chosen.push_back(c);
    }
    std::sort(chosen.begin(), chosen.end());
  }
}

}  // namespace attn::mask
