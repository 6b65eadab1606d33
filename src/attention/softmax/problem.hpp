// A validated, normalised exact-attention problem: what the reference and every fast form
// read. Built once by validate_softmax() at the entry point; kernels never re-check.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "attn/attend.hpp"
#include "core/io_checks.hpp"
#include "mask/pattern.hpp"

namespace attn::exact {

struct Problem : core::Dims {
  Softmax mech;             // score options (Longformer and BigBird arrive as a Softmax + pattern)
  double base_scale = 1.0;  // resolved user scale or default
  int64_t offset = 0;       // M - N: query i sits at position i + offset (bottom-right alignment)
  mask::Pattern pattern;  // which keys each position sees, bounds normalised (src/sparse/)
  std::optional<TensorView> mask, bias;  // broadcast dims carry stride 0
  std::optional<TensorView> block_mask;  // (B, H, ceil(N / bq), ceil(M / bk)), broadcast dims stride 0
  int64_t bq = 1, bk = 1;
  std::function<bool(int64_t, int64_t, int64_t, int64_t)> mask_mod;
  std::vector<float> alibi;              // B*H slopes, empty when unused
  // score=additive: w^T tanh(Wq q + Wk k), from params wq (A, D), wk (A, D), w (A)
  std::vector<float> wq, wk, w;
  int64_t A = 0;
  Precision precision = Precision::automatic;  // the caller's (AttendOptions::precision)

  // Whether the products run in bf16: asked for, or automatic with q, k and v all bfloat16.
  bool bf16_products() const {
    return precision == Precision::bf16 ||
           (precision == Precision::automatic && q.dtype == DType::bf16 && k.dtype == DType::bf16 &&
            v.dtype == DType::bf16);
  }

  // The definition the reference uses: padding, the pattern, the user's masks.
  bool visible(int64_t b, int64_t h, int64_t i, int64_t j) const;
  // Any mask of the caller's (boolean, block, mask_mod): every tile needs the element test.
  bool has_user_mask() const { return mask || block_mask || mask_mod; }
  // The caller's masks for key j and queries i0 .. i0 + n - 1: vis[i] &= visible to them.
  void user_mask_column(int64_t b, int64_t h, int64_t i0, int64_t n, int64_t j, uint8_t* vis) const;
  // Whether the caller's block mask hides all of [i0, i1] x [j0, j1] (then it is skipped).
  bool user_blocks_hide(int64_t b, int64_t h, int64_t i0, int64_t i1, int64_t j0, int64_t j1) const;
  // bias + ALiBi added to score (i, j) after scale and softcap.
  float additive_bias(int64_t b, int64_t h, int64_t i, int64_t j) const;
  bool has_bias() const { return bias.has_value() || !alibi.empty(); }
  // Scale of query row i: base_scale, times log(n)/log(train_len) for entropy-invariant scaling.
  double row_scale(int64_t b, int64_t h, int64_t i) const;
  int64_t visible_count(int64_t b, int64_t h, int64_t i) const;
  // (query, key) pairs padding and the pattern let through (for FLOP counts).
  double structural_pairs() const;
};

// Validates everything softmax-specific on top of core::check_io. `outs` may hold no views
// (explain()).
Problem validate_softmax(const TensorView& q, const TensorView& k, const TensorView& v, const Softmax& mech,
                         const AttendOptions& options, const core::Outputs& outs);
// Longformer and BigBird are exact softmax attention over their pattern.
Problem validate_softmax(const TensorView& q, const TensorView& k, const TensorView& v, const Longformer& mech,
                         const AttendOptions& options, const core::Outputs& outs);
Problem validate_softmax(const TensorView& q, const TensorView& k, const TensorView& v, const BigBird& mech,
                         const AttendOptions& options, const core::Outputs& outs);

// Dropout decision for weight (b, h, i, j): a counter-based hash of the seed and the position,
// so the mask does not depend on how the work is split across threads.
bool dropout_keep(uint64_t seed, double p, int64_t b, int64_t h, int64_t i, int64_t j);

}  // namespace attn::exact
