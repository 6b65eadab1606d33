// A validated, normalised exact-attention problem: what the reference and the tiled kernel
// both read. Built once by validate_softmax() at the entry point; kernels never re-check.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "attn/attend.hpp"

namespace attn::exact {

struct Problem {
  TensorView q, k, v;
  int64_t B = 0, H = 0, Hkv = 0, N = 0, M = 0, D = 0, Dv = 0;
  int64_t group = 1;        // query heads per kv head: kv head of h is h / group
  Softmax mech;             // causal folded into window_right (see below)
  double base_scale = 1.0;  // resolved user scale or default
  int64_t left = -1;        // structural window relative to the diagonal i + offset
  int64_t right = -1;       // (-1 = unbounded); causal means right = 0
  int64_t offset = 0;       // M - N: bottom-right alignment
  std::vector<int64_t> kv_len;           // per batch, M when no padding is given
  std::optional<TensorView> mask, bias;  // broadcast dims carry stride 0
  std::vector<float> alibi;              // B*H slopes, empty when unused
  const AdditiveWeights* additive = nullptr;
  int64_t A = 0;                         // additive hidden size

  int64_t kv_head(int64_t h) const { return h / group; }

  // Key range [lo, hi) that any of the queries i0..i1 (inclusive) may see structurally.
  void key_range(int64_t b, int64_t i0, int64_t i1, int64_t& lo, int64_t& hi) const;
  // Queries [lo, hi] (inclusive, unclipped) whose window contains key j (ignores padding).
  void query_range(int64_t j, int64_t& lo, int64_t& hi) const;
  bool structurally_visible(int64_t b, int64_t i, int64_t j) const;
  bool visible(int64_t b, int64_t h, int64_t i, int64_t j) const;
  // True when every (i, j) in [i0, i1] x [j0, j1] is visible without looking at a mask.
  bool tile_fully_visible(int64_t b, int64_t i0, int64_t i1, int64_t j0, int64_t j1) const;
  // bias + ALiBi added to score (i, j) after scale and softcap.
  float additive_bias(int64_t b, int64_t h, int64_t i, int64_t j) const;
  bool has_bias() const { return bias.has_value() || !alibi.empty(); }
  // Scale of query row i: base_scale, times log(n)/log(train_len) for entropy-invariant scaling.
  double row_scale(int64_t b, int64_t h, int64_t i) const;
  int64_t visible_count(int64_t b, int64_t h, int64_t i) const;
};

Problem validate_softmax(const TensorView& q, const TensorView& k, const TensorView& v,
                         const Softmax& mech, const AttendOptions& options, const TensorView& out,
                         const TensorView* lse, const TensorView* probs);

// Dropout decision for weight (b, h, i, j): a counter-based hash of the seed and the position,
// so the mask does not depend on how the work is split across threads.
bool dropout_keep(uint64_t seed, double p, int64_t b, int64_t h, int64_t i, int64_t j);

}  // namespace attn::exact
