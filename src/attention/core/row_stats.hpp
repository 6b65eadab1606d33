// Streamed row statistics (AttendOptions::return_stats; the design: docs/plans/streamed-statistics.md).
//
// Every form summarises each query's row of weights as it streams by, in one shape for every
// family: a reference value (softmax: the running max score m; direct weights: the running max
// |a| = c), and with u_j = e^(s_j - m) or |a_j| / c (so u <= 1, the maximum has u = 1)
//   a1 = sum u, a2 = sum u^2, e = sum u log u, n = the keys of the row, signs seen,
//   top = the k largest raw values (scores, or |a|), never rescaled.
// When the reference grows from m to m' (alpha = e^(m - m') = c / c'):
//   a1' = alpha a1, a2' = alpha^2 a2, e' = alpha (e + a1 (m - m')).
// Summaries of disjoint key sets merge with the same rule in a fixed order, so split work
// (split-K chunks, LSH rounds, DCA parts) gives the whole row's summary. finish() turns one into
//   sparsity = a1 / sqrt(a2 n), entropy = log a1 - e / a1, max_weight = g(top_0) / a1,
//   topk_mass = sum_t g(top_t) / a1,   g(s) = e^(s - m) or g(x) = x / c,
// each unchanged when a row is multiplied by a positive constant.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "attn/attend.hpp"

namespace attn::core {

constexpr int64_t kMaxStatsTopk = 1024;

enum class RowKind : uint8_t { softmax, direct };

struct RowSummary {
  RowKind kind = RowKind::softmax;
  // softmax: the max score m (-inf: no key yet); direct: the max |a| c (0: none yet)
  float ref = -std::numeric_limits<float>::infinity();
  float a1 = 0, a2 = 0, e = 0;
  int64_t n = 0;
  bool neg = false, pos = false, nan = false;
  int32_t k = 0, count = 0;  // top holds `count` <= k values (a min-heap until sorted)
  float* top = nullptr;      // k slots, owned by whoever made the summary

  static RowSummary empty(RowKind kind, int32_t k, float* top_slots);
  // Values above it may enter the top k: its smallest once full; before that -inf (scores) or 0
  // (magnitudes, so zeros never enter).
  float threshold() const {
    if (count < k) return kind == RowKind::softmax ? -std::numeric_limits<float>::infinity() : 0.0f;
    return top[0];
  }
  // Offers a raw value to the top k (a strict >: a tie with the smallest leaves the multiset of
  // the k largest values unchanged). A binary min-heap: sift up while filling, then replace the
  // root and sift down (the hot path of the streaming forms: inline, one pass).
  void offer(float x) {
    if (count < k) {
      int32_t i = count++;
      while (i > 0) {
        const int32_t parent = (i - 1) / 2;
        if (!(x < top[parent])) break;
        top[i] = top[parent];
        i = parent;
      }
      top[i] = x;
      return;
    }
    if (!(x > top[0])) return;
    int32_t i = 0;
    for (;;) {
      int32_t c = 2 * i + 1;
      if (c >= k) break;
      if (c + 1 < k && top[c + 1] < top[c]) ++c;
      if (!(top[c] < x)) break;
      top[i] = top[c];
      i = c;
    }
    top[i] = x;
  }
  void sort_top();  // descending; the heap order is gone after this
  // This summary takes s's values, s's top copied into this one's own slots.
  void keep(const RowSummary& s) {
    float* slots = top;
    *this = s;
    top = slots;
    std::copy(s.top, s.top + s.count, slots);
  }
};

// Adds a row segment by plain scalar code (the reference of the kernels, and small paths):
// scores s (-inf: a hidden key, not counted) for softmax rows, weights a for direct rows.
void stream_scores(RowSummary& r, const float* s, int64_t n);
void stream_weights(RowSummary& r, const float* a, int64_t n);

// r += part (disjoint keys, same kind); part's top is read only.
void merge_into(RowSummary& r, const RowSummary& part);

// sparsity, entropy, max_weight, topk_mass of a summary (NaN x 4 for no key, all zeros or NaN).
void finish(const RowSummary& r, double out[4]);

// The statistics of a row held in memory, in double (the references' version): w[j] the weight of
// key j, counted where seen[j] (every key when seen is null). Same contract as finish().
void reference_row_stats(const double* w, const uint8_t* seen, int64_t m, int64_t k, double out[4]);

// Where forms put their rows' statistics: finished into the caller's float32 views, or kept as
// summaries (B, H, N) for a caller that merges parts (a form that runs others on key subsets).
// Distinct rows may be put from different threads.
class StatsSink {
 public:
  StatsSink(const RowStatsViews& views, int64_t k);
  StatsSink(int64_t B, int64_t H, int64_t N, int64_t k);
  StatsSink(const StatsSink&) = delete;  // kept summaries point into the sink's own storage
  StatsSink(StatsSink&&) = default;
  int64_t topk() const { return k_; }
  bool keeps_summaries() const { return !finishing_; }
  void put(int64_t b, int64_t h, int64_t i, RowSummary s) const;  // sorts s's top in place
  void put_values(int64_t b, int64_t h, int64_t i, const double v[4]) const;  // finished values
  // A kept summary (keeps_summaries()): its top points into this sink.
  RowSummary summary(int64_t b, int64_t h, int64_t i) const;
  // For a sub-call whose query row 0 is row i here (a finishing sink only).
  StatsSink from_row(int64_t i) const;

 private:
  int64_t index(int64_t b, int64_t h, int64_t i) const { return (b * H_ + h) * N_ + i; }
  bool finishing_ = false;
  RowStatsViews views_;
  int64_t k_ = 0, H_ = 0, N_ = 0, row0_ = 0;
  mutable std::vector<RowSummary> rows_;
  mutable std::vector<float> tops_;
};

}  // namespace attn::core
