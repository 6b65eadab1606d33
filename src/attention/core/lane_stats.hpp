// Row statistics (core/row_stats.hpp) of the 64 query lanes of a tile form, streamed through its
// online softmax (the tiled softmax form, LSH's chunks): per lane the summary's sums ride in the
// update's exp pass (kernel softmax_update_stats), and the top k scores are taken before the
// update turns scores into probabilities: for k <= 16 by per-lane sorted lists merged with vector
// compare-exchanges (kernel topk_lanes), beyond that by a heap per lane fed with the scores above
// its threshold (kernel above_bits). The heap's branchy inserts cost 12-19 % of a call at k = 8;
// the lists cost 1-3 %.
#pragma once
#include <cstdint>
#include <limits>
#include <vector>

#include "base/aligned_buffer.hpp"
#include "core/row_stats.hpp"
#include "kernels/kernel_table.hpp"

namespace attn::core {

class LaneStats {
 public:
  static constexpr int L = kernels::kQueryTile;
  static constexpr int64_t kMaxListTopk = kernels::kMaxTopkLanes;

  // Allocates for k (call before any parallel region: no allocation afterwards).
  void reserve(int64_t k) {
    k_ = static_cast<int32_t>(k);
    a2_.resize(L), e_.resize(L), cnt_.resize(L), thr_.resize(L);
    n_.resize(L);
    rows_.resize(L);
    tops_.resize(static_cast<size_t>(L * k));
    if (k <= kMaxListTopk) list_.resize(static_cast<size_t>(k * L));
    else bits_.resize(L);  // one word per row of St (bc <= 64)
  }

  // Every lane empty.
  void start() {
    constexpr float neg_inf = -std::numeric_limits<float>::infinity();
    std::fill(a2_.data(), a2_.data() + L, 0.0f);
    std::fill(e_.data(), e_.data() + L, 0.0f);
    std::fill(thr_.data(), thr_.data() + L, neg_inf);
    std::fill(n_.begin(), n_.end(), 0);
    for (int i = 0; i < L; ++i) rows_[i] = RowSummary::empty(RowKind::softmax, k_, tops_.data() + i * k_);
    if (k_ <= kMaxListTopk) std::fill(list_.data(), list_.data() + k_ * L, neg_inf);
  }

  // One online softmax step over bc <= 64 rows of St (kernel softmax_update's contract) that
  // also streams the statistics of lanes [lo, hi).
  void update(const kernels::TileKernels& kern, float* st, int64_t bc, float* m, float* l, float* alpha, int lo,
              int hi) {
    if (k_ <= kMaxListTopk) {
      kern.topk_lanes(st, bc, list_.data(), k_, lo, hi);
    } else {
      float* thr = thr_.data();
      kern.above_bits(st, bc, thr, lo, hi, bits_.data());
      for (int64_t j = 0; j < bc; ++j)
        for (uint64_t w = bits_[j]; w != 0; w &= w - 1) {
          const int i = __builtin_ctzll(w);
          rows_[i].offer(st[j * L + i]);
          thr[i] = rows_[i].threshold();
        }
    }
    kern.softmax_update_stats(st, bc, m, l, alpha, a2_.data(), e_.data(), cnt_.data(), lo, hi);
    for (int i = lo; i < hi; ++i) n_[i] += static_cast<int64_t>(cnt_.data()[i]);
  }

  // Lane i's summary given its final max m and sum l (its top points into this object).
  RowSummary summary(int i, float m, float l) {
    RowSummary r = rows_[i];
    if (k_ <= kMaxListTopk)  // the lane's list, descending, up to its first -inf
      for (r.count = 0; r.count < k_ && list_.data()[r.count * L + i] > -std::numeric_limits<float>::infinity();
           ++r.count)
        r.top[r.count] = list_.data()[r.count * L + i];
    r.ref = m, r.a1 = l, r.a2 = a2_.data()[i], r.e = e_.data()[i], r.n = n_[i];
    r.nan = l != l;
    return r;
  }

 private:
  int32_t k_ = 0;
  AlignedFloats a2_, e_, cnt_, thr_, list_;
  std::vector<int64_t> n_;
  std::vector<RowSummary> rows_;
  std::vector<float> tops_;
  std::vector<uint64_t> bits_;
};

}  // namespace attn::core
