// What the fast linear forms share: float32 rows of q, k, v with the feature map applied, and
// the state (S, z) of one (batch, head), read from initial_state and written to final_state.
#pragma once
#include <algorithm>
#include <vector>

#include "core/rows.hpp"
#include "linear/feature_map.hpp"
#include "linear/linear.hpp"
#include "linear/output_norm.hpp"

namespace attn::linear {

using core::dot;
using core::load_rows;

// out (n x F) = factor * phi(rows r0.. of q (query) or k), rows >= valid zero; raw: n x D scratch.
inline void load_features(const kernels::TileKernels& kern, const LinearProblem& p, bool query, int64_t b, int64_t h,
                          int64_t r0, int64_t n, int64_t valid, float factor, float* raw, float* out) {
  load_rows(kern, query ? p.q : p.k, b, h, r0, n, valid, raw, p.D);
  fast_features(kern, p, query, raw, n, out);
  for (int64_t r = 0; r < n; ++r) {
    float* row = out + r * p.F;
    if (r0 + r >= valid)
      std::fill(row, row + p.F, 0.0f);
    else if (factor != 1.0f)
      for (int64_t f = 0; f < p.F; ++f) row[f] *= factor;
  }
}

// The state of one head: S (F x Dv, row-major) and z (F), the normaliser (normalize only).
struct HeadState {
  std::vector<float> S, z;

  HeadState(const LinearProblem& p) : S(static_cast<size_t>(p.F * p.Dv)), z(static_cast<size_t>(p.F)) {}

  // The initial state of (b, h), or zeros.
  void load(const LinearProblem& p, int64_t b, int64_t h) {
    if (!p.initial) {
      std::fill(S.begin(), S.end(), 0.0f);
      std::fill(z.begin(), z.end(), 0.0f);
      return;
    }
    const ArrayView& a = *p.initial;
    const bool rows = a.dtype == DType::f32 && a.strides[3] == 1;  // copy rows as they are
    for (int64_t f = 0; f < p.F; ++f) {
      float* dst = S.data() + f * p.Dv;
      if (rows) {
        const float* src = static_cast<const float*>(a.data) + b * a.strides[0] + h * a.strides[1] + f * a.strides[2];
        std::copy(src, src + p.Dv, dst);
      } else {
        for (int64_t c = 0; c < p.Dv; ++c) dst[c] = p.initial_at(b, h, f, c);
      }
      z[static_cast<size_t>(f)] = p.mech.normalize ? p.initial_at(b, h, f, p.Dv) : 0.0f;
    }
  }

  // Into final_state[b, h] (if asked for).
  void store(const LinearProblem& p, const core::Outputs& o, int64_t b, int64_t h) const {
    if (!o.final_state) return;
    const TensorView& t = *o.final_state;
    float* base = static_cast<float*>(t.data);
    for (int64_t f = 0; f < p.F; ++f) {
      float* row = base + t.offset(b, h, f, 0);
      const float* src = S.data() + f * p.Dv;
      if (t.strides[3] == 1)
        std::copy(src, src + p.Dv, row);
      else
        for (int64_t c = 0; c < p.Dv; ++c) row[c * t.strides[3]] = src[c];
      if (p.mech.normalize) row[p.Dv * t.strides[3]] = z[static_cast<size_t>(f)];
    }
  }

  void decay(float factor) {
    if (factor == 1.0f) return;
    for (float& x : S) x *= factor;
    for (float& x : z) x *= factor;
  }
};

// Row r of the numerators `num` (Dv floats) divided by its denominator (normalize: a zero
// denominator gives a zero row; eps is added first), normalised (normattn), written to out[b, h, i].
inline void write_row(const kernels::TileKernels& kern, const LinearProblem& p, const core::Outputs& o, int64_t b,
                      int64_t h, int64_t i, float* num, float den) {
  if (p.mech.normalize) {
    const float d = den + static_cast<float>(p.eps);
    for (int64_t c = 0; c < p.Dv; ++c) num[c] = d != 0.0f ? num[c] / d : 0.0f;
  }
  if (p.norm != OutputNorm::none) normalise_row(p.norm, num, p.Dv);
  if (!p.coef.empty())
    for (int64_t c = 0; c < p.Dv; ++c) num[c] *= p.coef[static_cast<size_t>(c)];
  // a non-finite input gives +-inf in an unnormalised row (+inf k . q v): NaN, as everywhere
  for (int64_t c = 0; c < p.Dv; ++c) num[c] += num[c] - num[c];
  kern.from_float(num, o.out->dtype, o.out->strides[3], p.Dv, o.out->ptr(b, h, i));
}

}  // namespace attn::linear
