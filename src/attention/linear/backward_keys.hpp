// What the fast linear backward forms share: one task's kv head as float32 rows (phi(k), phi'(k),
// u = [v, 1]), its dK and dV accumulated over the group's query heads in float32, and the
// per-head state gradients read and written.
#pragma once
#include <algorithm>
#include <vector>

#include "linear/feature_backward.hpp"
#include "linear/head_state.hpp"
#include "linear/linear_backward.hpp"
#include "linear/output_norm.hpp"

namespace attn::linear {

// out (n x F) = factor * phi(rows r0.. of q (query) or k) and aux (n x D) = what the features'
// backward keeps of them (feature_backward.hpp: phi'(x), or performer's s x), rows >= valid zero
// in both; raw: n x D scratch.
inline void load_features_and_aux(const kernels::TileKernels& kern, const LinearProblem& p, bool query, int64_t b,
                                  int64_t h, int64_t r0, int64_t n, int64_t valid, float factor, float* raw,
                                  float* out, float* aux) {
  load_rows(kern, query ? p.q : p.k, b, h, r0, n, valid, raw, p.D);
  fast_features(kern, p, query, raw, n, out);  // an elementwise map leaves raw as it was; performer's is s x
  if (p.omega_t.empty() && !p.polar())
    feature_slopes_from(p.mech.map, raw, out, n * p.F, aux);
  else
    std::copy(raw, raw + n * p.D, aux);
  for (int64_t r = 0; r < n; ++r) {
    float *row = out + r * p.F, *arow = aux + r * p.D;
    if (r0 + r >= valid) {
      std::fill(row, row + p.F, 0.0f);
      std::fill(arow, arow + p.D, 0.0f);
    } else if (factor != 1.0f) {
      for (int64_t f = 0; f < p.F; ++f) row[f] *= factor;
    }
  }
}

// The key side of one (batch entry, kv head), M rows each: features kf (M x F) and their aux ks
// (M x D), u (M x cols); dkf (the gradient of phi(k)) and du accumulate over the group's query
// heads. Sized before the parallel region; raw: rows x D scratch for loading; dk (M x D) and w
// (M x F): the features' backward; omega: feature_omega(p), the caller's. PolaFormer's learned
// params: dpower (D) and dcoef (its Dv) point into the task's partial sums, or are null.
struct KeySide {
  int64_t F, cols, rows;
  std::vector<float> kf, ks, u, dkf, du, raw, dk, w;
  const float* omega;
  float *dpower = nullptr, *dcoef = nullptr;
  KeySide(const LinearProblem& p, int64_t load_rows_at_once, const float* omega_rows)
      : F(p.F), cols(p.state_cols()), rows(load_rows_at_once), kf(static_cast<size_t>(p.M * p.F)),
        ks(static_cast<size_t>(p.M * p.D)), u(static_cast<size_t>(p.M * p.state_cols())),
        dkf(static_cast<size_t>(p.M * p.F)), du(static_cast<size_t>(p.M * p.state_cols())),
        raw(static_cast<size_t>(load_rows_at_once * p.D)), dk(static_cast<size_t>(p.M * p.D)),
        w(p.omega_t.empty() ? 0 : static_cast<size_t>(p.M * p.F)), omega(omega_rows) {}

  // Rows of kv head hk of batch b; keys past its length are zero rows (no feature, no value).
  void load(const kernels::TileKernels& kern, const LinearProblem& p, int64_t b, int64_t hk) {
    const int64_t len = p.kv_len[static_cast<size_t>(b)];
    for (int64_t j0 = 0; j0 < p.M; j0 += rows) {
      const int64_t n = std::min(rows, p.M - j0);
      load_features_and_aux(kern, p, false, b, hk, j0, n, len, 1.0f, raw.data(), kf.data() + j0 * F,
                            ks.data() + j0 * p.D);
    }
    for (int64_t j = 0; j < p.M; ++j) {
      float* row = u.data() + j * cols;
      load_rows(kern, p.v, b, hk, j, 1, len, row, cols);
      if (p.mech.normalize) row[p.Dv] = j < len ? 1.0f : 0.0f;
    }
    std::fill(dkf.begin(), dkf.end(), 0.0f);
    std::fill(du.begin(), du.end(), 0.0f);
  }

  // dk from dkf through the features' backward and dv = du[:, :Dv] into the caller's tensors
  // (zeros past the length).
  void store(const kernels::TileKernels& kern, const LinearProblem& p, const BackwardViews& g, int64_t b, int64_t hk) {
    const int64_t len = p.kv_len[static_cast<size_t>(b)];
    feature_backward(p, false, len, ks.data(), kf.data(), dkf.data(), 1.0f, dk.data(), w.data(), &kern, omega,
                     dpower);
    for (int64_t j = 0; j < p.M; ++j) {
      float* dkj = dk.data() + j * p.D;
      if (j >= len) {  // keys past the padding length: no gradient
        std::fill(dkj, dkj + p.D, 0.0f);
        std::fill(du.data() + j * cols, du.data() + j * cols + p.Dv, 0.0f);
      }
      kern.from_float(dkj, g.dk.dtype, g.dk.strides[3], p.D, g.dk.ptr(b, hk, j));
      kern.from_float(du.data() + j * cols, g.dv.dtype, g.dv.strides[3], p.Dv, g.dv.ptr(b, hk, j));
    }
  }
};

// The gradient with respect to the final state of (b, h), F x cols, or zeros.
inline void load_dfinal_state(const LinearProblem& p, const BackwardViews& g, int64_t b, int64_t h, float* dst) {
  const int64_t cols = p.state_cols();
  for (int64_t f = 0; f < p.F; ++f)
    for (int64_t c = 0; c < cols; ++c)
      dst[f * cols + c] = g.dfinal_state.empty() ? 0.0f : g.dfinal_state.at(b, h, f, c);
}

// dS0 of (b, h) into d_initial_state (when the call has an initial state).
inline void store_d_initial_state(const LinearProblem& p, const BackwardViews& g, int64_t b, int64_t h,
                                  const float* ds0) {
  if (g.d_initial_state.empty()) return;
  const int64_t cols = p.state_cols();
  float* base = static_cast<float*>(g.d_initial_state.data);
  for (int64_t f = 0; f < p.F; ++f)
    for (int64_t c = 0; c < cols; ++c) base[g.d_initial_state.offset(b, h, f, c)] = ds0[f * cols + c];
}

// The initial state of (b, h) as F x cols floats (zeros without one).
inline void load_initial_state(const LinearProblem& p, int64_t b, int64_t h, float* dst) {
  const int64_t cols = p.state_cols();
  for (int64_t f = 0; f < p.F; ++f)
    for (int64_t c = 0; c < cols; ++c) dst[f * cols + c] = p.initial_at(b, h, f, c);
}

// dst (cols x rows, leading dimension ld) = src (rows x cols)^T.
inline void transpose(const float* src, int64_t rows, int64_t cols, float* dst, int64_t ld) {
  // in 16 x 16 tiles: a row at a time would store a column of dst with a stride of ld floats
  // (256 or 512 bytes: the same few cache sets for every store)
  constexpr int64_t kTile = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r = r0; r < r1; ++r) dst[c * ld + r] = src[r * cols + c];
    }
}

// Row r of y = g_r = dL/dy_r from dout's row (Dv values) and y_r (normalize: Dv + 1 values).
// PolaFormer's coefficients (o = coef y[:Dv] / den) scale dout first; dcoef (Dv values, or null)
// gains dout o y[:Dv] / den.
inline void output_gradient(const LinearProblem& p, const float* dout, const float* y, float* g,
                            float* dcoef = nullptr) {
  if (!p.mech.normalize) {  // normattn: through its output norm (no denominator then)
    normalise_row_backward(p.norm, y, dout, g, p.Dv);
    return;
  }
  const float den = y[p.Dv] + static_cast<float>(p.eps);
  float dot = 0;
  for (int64_t c = 0; c < p.Dv; ++c) {
    const float d = p.coef.empty() ? dout[c] : dout[c] * p.coef[static_cast<size_t>(c)];
    dot += d * y[c];
    g[c] = den != 0.0f ? d / den : 0.0f;
    if (dcoef) dcoef[c] += den != 0.0f ? dout[c] * (y[c] / den) : 0.0f;
  }
  g[p.Dv] = den != 0.0f ? -dot / (den * den) : 0.0f;
}

// PolaFormer's learned params: per task, D partial sums of dpower and the stream's Dv of dcoef,
// added after the parallel region in task order into g.dparams["power"] and ["coefficients"]
// (the stream's half), so the sums do not depend on the thread count. Empty without them.
struct ParamPartials {
  int64_t D = 0, width = 0;
  std::vector<float> sums;
  ParamPartials(const LinearProblem& p, const BackwardViews& g, int64_t tasks)
      : D(p.D), width(p.polar() && !g.dparams.empty() ? p.D + p.Dv : 0), sums(static_cast<size_t>(tasks * width)) {}
  // The task's slices, for its key side and its query rows (null without the params).
  void point(KeySide& keys, int64_t task) {
    keys.dpower = width ? sums.data() + task * width : nullptr;
    keys.dcoef = width ? sums.data() + task * width + D : nullptr;
  }
  void add_to(const BackwardViews& g) const {
    if (!width) return;
    for (const bool power : {true, false}) {
      const auto it = g.dparams.find(power ? "power" : "coefficients");
      if (it == g.dparams.end()) continue;
      const int64_t off = power ? 0 : D, n = power ? D : width - D;
      float* dst = static_cast<float*>(it->second.data);  // (1, 1, 1, n) float32, contiguous
      for (int64_t task = 0; task < static_cast<int64_t>(sums.size()) / width; ++task)
        for (int64_t c = 0; c < n; ++c) dst[c] += sums[static_cast<size_t>(task * width + off + c)];
    }
  }
};

}  // namespace attn::linear
