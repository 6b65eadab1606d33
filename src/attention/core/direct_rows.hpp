// Row statistics of direct (non-softmax) weights, shared by GAU and the linear and efficient
// second passes: up to 64 query rows of one block, each streamed in segments of its weights. The
// sums and signs go through kernels.weight_row_stats, which also marks the |a| above the row's
// top-k threshold; only those marked values reach the row's heap (RowSummary::offer), so most
// weights cost one vector compare. A row ends as a RowSummary of kind direct for the sink.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/row_stats.hpp"
#include "kernels/kernel_table.hpp"

namespace attn::core {

class DirectRows {
 public:
  static constexpr int64_t kRows = kernels::kQueryTile;
  static constexpr int64_t kSegment = 64;  // the longest segment add() takes (one word of candidate bits)

  DirectRows(const kernels::TileKernels& kern, int64_t k)
      : kern_(kern), k_(static_cast<int32_t>(k)), acc_(kRows), n_(kRows), rows_(kRows),
        tops_(static_cast<size_t>(kRows * k)) {
    start();
  }

  // Empty rows again, for a new block.
  void start() {
    for (int64_t r = 0; r < kRows; ++r) {
      acc_[r] = kernels::WeightRowAcc{};
      n_[r] = 0;
      rows_[r] = core::RowSummary::empty(core::RowKind::direct, k_, tops_.data() + r * k_);
    }
  }

  // Weights a[0..n) of row r (n <= kSegment; zeros count as keys of the row).
  void add(int64_t r, const float* a, int64_t n) {
    if (n <= 0) return;
    kernels::WeightRowAcc& acc = acc_[r];
    core::RowSummary& top = rows_[r];
    uint64_t cand;
    kern_.weight_row_stats(a, n, acc, &cand);
    n_[r] += n;
    for (uint64_t w = cand; w != 0; w &= w - 1) top.offer(std::fabs(a[__builtin_ctzll(w)]));
    acc.thr = top.threshold();  // the marks were against the threshold at the call's start
  }

  // Row r's summary. `flip`: the applied weights are these times a negative number (a linear
  // row's negative normaliser), which swaps the signs seen; the statistics are otherwise scale-free.
  core::RowSummary summary(int64_t r, bool flip = false) const {
    const kernels::WeightRowAcc& acc = acc_[r];
    core::RowSummary s = rows_[r];
    s.ref = acc.c, s.a1 = acc.a1, s.a2 = acc.a2, s.e = acc.e, s.n = n_[r];
    s.neg = flip ? acc.pos : acc.neg, s.pos = flip ? acc.neg : acc.pos, s.nan = acc.nan;
    return s;
  }

 private:
  const kernels::TileKernels& kern_;
  int32_t k_;
  std::vector<kernels::WeightRowAcc> acc_;
  std::vector<int64_t> n_;
  std::vector<core::RowSummary> rows_;
  std::vector<float> tops_;
};

}  // namespace attn::core
