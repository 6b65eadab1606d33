// A validated, normalised exact-attention problem: what the reference and every fast form
// read. Built once by validate_softmax() at the entry point; kernels never re-check.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "attn/attend.hpp"
#include "core/io_checks.hpp"

namespace attn::exact {

struct Problem : core::Dims {
  Softmax mech;             // as given (causal is folded into `right` below, not into mech)
  double base_scale = 1.0;  // resolved user scale or default
  int64_t left = -1;        // structural window relative to the diagonal i + offset
  int64_t right = -1;       // (-1 = unbounded); causal means right = min(right, 0)
  int64_t offset = 0;       // M - N: bottom-right alignment
  std::optional<TensorView> mask, bias;  // broadcast dims carry stride 0
  std::vector<float> alibi;              // B*H slopes, empty when unused
  // score=additive: w^T tanh(Wq q + Wk k), from params wq (A, D), wk (A, D), w (A)
  std::vector<float> wq, wk, w;
  int64_t A = 0;

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
  // (query, key) pairs the structural masks let through (for FLOP counts).
  double structural_pairs() const;
};

// Validates everything softmax-specific on top of core::check_io. `outs` may hold no views
// (explain()).
Problem validate_softmax(const TensorView& q, const TensorView& k, const TensorView& v, const Softmax& mech,
                         const AttendOptions& options, const core::Outputs& outs);

// Dropout decision for weight (b, h, i, j): a counter-based hash of the seed and the position,
// so the mask does not depend on how the work is split across threads.
bool dropout_keep(uint64_t seed, double p, int64_t b, int64_t h, int64_t i, int64_t j);

}  // namespace attn::exact
