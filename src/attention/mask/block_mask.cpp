#include "mask/block_mask.hpp"

#include <algorithm>

namespace attn::mask {

BlockMask::BlockMask(const Pattern& pattern, int64_t N, int64_t M, int64_t offset, int64_t query_tile,
                     int64_t key_tile)
    : query_tile_(query_tile), ones_(static_cast<size_t>(query_tile), uint8_t{1}) {
  const int64_t tiles = (N + query_tile - 1) / query_tile;
  first_.reserve(static_cast<size_t>(tiles) + 1);
  first_.push_back(0);
  const bool dense = pattern.dense();
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t p0 = t * query_tile + offset, p1 = std::min(N, (t + 1) * query_tile) - 1 + offset;
    if (dense) {  // the common case, without classifying every tile
      if (M > 0) runs_.push_back({0, M, true});
    } else {
      for (const auto& [a, b] : pattern.candidates(p0, p1, M))
        for (int64_t j0 = a; j0 < b; j0 += key_tile) {
          const int64_t j1 = std::min(b, j0 + key_tile);
          const Coverage c = pattern.classify(p0, p1, j0, j1 - 1);
          if (c == Coverage::hidden) continue;
          const bool full = c == Coverage::full;
          if (runs_.size() > static_cast<size_t>(first_.back()) && runs_.back().end == j0 && runs_.back().full == full)
            runs_.back().end = j1;
          else
            runs_.push_back({j0, j1, full});
        }
    }
    first_.push_back(static_cast<int64_t>(runs_.size()));
  }
}

double visible_pairs(const Pattern& pattern, int64_t N, int64_t M, int64_t offset, int64_t len) {
  constexpr int64_t kTile = 64;
  double pairs = 0;
  BlockMask(pattern, N, M, offset, kTile, kTile)
      .for_each_column(pattern, N, offset, len, [&](int64_t, int64_t rows, int64_t, const uint8_t* vis) {
        pairs += static_cast<double>(std::count(vis, vis + rows, uint8_t{1}));
      });
  return pairs;
}

}  // namespace attn::mask
