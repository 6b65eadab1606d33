// What both tiled forms (the forward's online softmax and the backward) do to a tile of scores
// St (bc keys x 64 query lanes, kernels/kernel_table.hpp) after the product, and which tiles they
// visit, so that forward and backward see exactly the same scores and the same keys.
#pragma once
#include <algorithm>
#include <cstdint>
#include <span>

#include "softmax/problem.hpp"
#include "kernels/kernel_table.hpp"
#include "mask/block_mask.hpp"

namespace attn::exact {

constexpr int64_t kKeyTile = 64;

// The caller's bias and ALiBi added to St (after scale and softcap) for lanes [0, nq) of the
// query tile starting at row i0 of head (b, h), keys [j0, j0 + bc).
void add_score_terms(const Problem& p, int64_t b, int64_t h, int64_t i0, int64_t nq, int64_t j0, int64_t bc,
                     float* st);

// A partial tile: (i, j) that padding, the pattern or the caller's masks hide become -inf.
// live[j]: some lane sees key j (vis: scratch of 64 bytes). Returns whether every key is live.
bool mask_scores(const Problem& p, int64_t b, int64_t h, int64_t i0, int64_t nq, int64_t j0, int64_t bc, float* st,
                 uint8_t* vis, uint8_t* live);

// The lane groups [lo, hi) (multiples of kernels::kLaneGroup) of the query tile at row i0 that
// see any of keys [j0, j0 + n): the whole tile when the pattern gives no intervals or a caller's
// mask is on; lo = hi when no lane does.
void lane_groups(const Problem& p, int64_t i0, int64_t nq, int64_t j0, int64_t n, int& lo, int& hi);

// A partial tile in groups of kLaneGroup keys, each over just the lane groups that see one of its
// keys (a band's edge tiles are triangles: this skips ~3/8 of their work); consecutive groups with
// the same lanes go together: fn(j0, n, lo, hi) for each with lo < hi.
template <class Fn>
void for_each_lane_group(const Problem& p, int64_t i0, int64_t nq, int64_t j0, int64_t bc, Fn&& fn) {
  constexpr int G = kernels::kLaneGroup;
  int64_t a = j0;
  int lo = 0, hi = static_cast<int>(kernels::kQueryTile);
  for (int64_t g = j0; g < j0 + bc; g += G) {
    int glo, ghi;
    lane_groups(p, i0, nq, g, std::min<int64_t>(G, j0 + bc - g), glo, ghi);
    if (g > a && (glo != lo || ghi != hi)) {
      if (lo < hi) fn(a, g - a, lo, hi);
      a = g;
    }
    lo = glo, hi = ghi;
  }
  if (lo < hi) fn(a, j0 + bc - a, lo, hi);
}

// fn(j0, bc, full) for each key tile of a query tile's runs (the compiled block mask), cut at
// the batch's valid length (which keeps a full run full); the caller's masks make every tile
// partial, and tiles their block mask hides are skipped.
template <class Fn>
void for_each_key_tile(const Problem& p, std::span<const mask::Run> runs, int64_t b, int64_t h, int64_t i0,
                       int64_t nq, Fn&& fn) {
  for (const mask::Run& r : runs) {
    const int64_t end = std::min(r.end, p.kv_len[static_cast<size_t>(b)]);
    const bool full = r.full && !p.has_user_mask();
    for (int64_t j0 = r.begin; j0 < end;) {
      const int64_t bc = std::min(kKeyTile, end - j0);
      if (!p.user_blocks_hide(b, h, i0, i0 + nq - 1, j0, j0 + bc - 1)) fn(j0, bc, full);
      j0 += bc;
    }
  }
}

}  // namespace attn::exact
