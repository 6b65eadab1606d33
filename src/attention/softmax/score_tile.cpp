// Score terms and masks of a tile (exact/score_tile.hpp), shared by the forward and backward
// tiled forms.
#include "softmax/score_tile.hpp"

#include <cmath>
#include <limits>

#include "kernels/kernel_table.hpp"

namespace attn::exact {

namespace {
constexpr int64_t L = kernels::kQueryTile;
}  // namespace

void add_score_terms(const Problem& p, int64_t b, int64_t h, int64_t i0, int64_t nq, int64_t j0, int64_t bc,
                     float* st) {
  if (p.bias) {
    const TensorView& bv = *p.bias;
    const int64_t si = bv.strides[2], sj = bv.strides[3], base = bv.offset(b, h, i0, j0);
    if (bv.dtype == DType::f32) {
      const float* bp = static_cast<const float*>(bv.data) + base;
      for (int64_t j = 0; j < bc; ++j)
        for (int64_t i = 0; i < nq; ++i) st[j * L + i] += bp[i * si + j * sj];
    } else {
      for (int64_t j = 0; j < bc; ++j)
        for (int64_t i = 0; i < nq; ++i) st[j * L + i] += load_as_float(bv.data, bv.dtype, base + i * si + j * sj);
    }
  }
  if (!p.alibi.empty()) {  // -slope * |i + M - N - j|, exact in float below 2^24
    const float slope = p.alibi[static_cast<size_t>(b * p.H + h)];
    for (int64_t j = 0; j < bc; ++j) {
      const float d0 = static_cast<float>(i0 + p.offset - (j0 + j));
      float* row = st + j * L;
      for (int64_t i = 0; i < nq; ++i) row[i] -= slope * std::fabs(d0 + static_cast<float>(i));
    }
  }
}

void lane_groups(const Problem& p, int64_t i0, int64_t nq, int64_t j0, int64_t n, int& lo, int& hi) {
  constexpr int G = kernels::kLaneGroup;
  lo = 0, hi = static_cast<int>(L);
  if (p.has_user_mask()) return;
  int64_t a = L, b = 0;
  for (int64_t j = j0; j < j0 + n; ++j) {
    int64_t jl, jh;
    if (!p.pattern.column_interval(j, i0 + p.offset, nq, jl, jh)) return;
    if (jl < jh) a = std::min(a, jl), b = std::max(b, jh);
  }
  if (a >= b) return void(hi = lo);
  lo = static_cast<int>(a / G * G), hi = static_cast<int>((b + G - 1) / G * G);
}

bool mask_scores(const Problem& p, int64_t b, int64_t h, int64_t i0, int64_t nq, int64_t j0, int64_t bc, float* st,
                 uint8_t* vis, uint8_t* live) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const bool user = p.has_user_mask();
  bool all_live = true;
  for (int64_t j = 0; j < bc; ++j) {
    float* row = st + j * L;
    int64_t a, e;  // visible lanes [a, e); keys past the valid length never get here
    if (!user && p.pattern.column_interval(j0 + j, i0 + p.offset, nq, a, e)) {
      std::fill(row, row + a, neg_inf);
      std::fill(row + e, row + nq, neg_inf);
      live[j] = a < e;
      all_live &= a < e;
      continue;
    }
    p.pattern.column(j0 + j, i0 + p.offset, nq, vis);
    if (user) p.user_mask_column(b, h, i0, nq, j0 + j, vis);
    bool any = false;
    for (int64_t i = 0; i < nq; ++i) {
      row[i] = vis[i] ? row[i] : neg_inf;
      any |= vis[i] != 0;
    }
    live[j] = any;
    all_live &= any;
  }
  return all_live;
}

}  // namespace attn::exact
