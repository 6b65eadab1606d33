// A pattern compiled for one call: for each tile of query rows, the runs of key positions some
// row may see, each marked full (every pair visible: no element test) or partial (the kernel
// asks Pattern::column). Keys outside every run are never touched. Both softmax forms walk it
// (tiled: 64-row tiles; rows: one tile of all N rows), so cost follows the pattern.
// Key padding is applied by the walker (runs are cut at the batch's valid length; cutting keeps
// a full run full), and so is the user's element mask (it turns every run partial).
#pragma once
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "mask/pattern.hpp"

namespace attn::mask {

struct Run {
  int64_t begin, end;  // keys [begin, end)
  bool full;
};

class BlockMask {
 public:
  // Query rows i in [0, N) at positions i + offset, grouped in tiles of `query_tile` rows; key
  // runs classified in pieces of at most `key_tile` keys.
  BlockMask(const Pattern& pattern, int64_t N, int64_t M, int64_t offset, int64_t query_tile, int64_t key_tile);
  // fn(i0, rows, j, vis) for every key j < len of every run, vis[i] = query i0 + i sees key j.
  template <class Fn>
  void for_each_column(const Pattern& pattern, int64_t N, int64_t offset, int64_t len, Fn&& fn) const;

  int64_t tiles() const { return static_cast<int64_t>(first_.size()) - 1; }
  std::span<const Run> runs(int64_t tile) const {
    return {runs_.data() + first_[static_cast<size_t>(tile)],
            static_cast<size_t>(first_[static_cast<size_t>(tile) + 1] - first_[static_cast<size_t>(tile)])};
  }

 private:
  int64_t query_tile_;
  std::vector<uint8_t> ones_;  // query_tile ones: the column of a full run
  std::vector<Run> runs_;
  std::vector<int64_t> first_;  // runs of tile t: runs_[first_[t] .. first_[t + 1])
};

template <class Fn>
void BlockMask::for_each_column(const Pattern& pattern, int64_t N, int64_t offset, int64_t len, Fn&& fn) const {
  std::vector<uint8_t> vis(static_cast<size_t>(query_tile_));
  for (int64_t t = 0; t < tiles(); ++t) {
    const int64_t i0 = t * query_tile_, rows = std::min(N - i0, query_tile_);
    for (const Run& r : runs(t))
      for (int64_t j = r.begin; j < std::min(r.end, len); ++j) {
        if (!r.full) pattern.column(j, i0 + offset, rows, vis.data());
        fn(i0, rows, j, r.full ? ones_.data() : vis.data());
      }
  }
}

// (query, key) pairs the pattern lets through for rows [0, N) against keys [0, len).
double visible_pairs(const Pattern& pattern, int64_t N, int64_t M, int64_t offset, int64_t len);

}  // namespace attn::mask
