// What the fast linear backward forms share: one task's kv head as float32 rows (phi(k), phi'(k),
// u = [v, 1]), its dK and dV accumulated over the group's query heads in float32, and the
// per-head state gradients read and written.
#pragma once
#include <algorithm>
#include <vector>

#include "linear/head_state.hpp"
#include "linear/linear_backward.hpp"

namespace attn::linear {

// The key side of one (batch entry, kv head), M rows each: features kf and slopes ks (M x F), u
// (M x cols); dkf (the gradient of phi(k)) and du accumulate over the group's query heads. Sized
// before the parallel region; raw: rows x D scratch for loading.
struct KeySide {
  int64_t F, cols, rows;
  std::vector<float> kf, ks, u, dkf, du, raw;
  KeySide(const LinearProblem& p, int64_t load_rows_at_once)
      : F(p.F), cols(p.state_cols()), rows(load_rows_at_once), kf(static_cast<size_t>(p.M * p.F)),
        ks(static_cast<size_t>(p.M * p.F)), u(static_cast<size_t>(p.M * p.state_cols())),
        dkf(static_cast<size_t>(p.M * p.F)), du(static_cast<size_t>(p.M * p.state_cols())),
        raw(static_cast<size_t>(load_rows_at_once * p.D)) {}

  // Rows of kv head hk of batch b; keys past its length are zero rows (no feature, no value).
  void load(const kernels::TileKernels& kern, const LinearProblem& p, int64_t b, int64_t hk) {
    const int64_t len = p.kv_len[static_cast<size_t>(b)];
    for (int64_t j0 = 0; j0 < p.M; j0 += rows) {
      const int64_t n = std::min(rows, p.M - j0);
      load_features(kern, p, false, b, hk, j0, n, len, 1.0f, raw.data(), kf.data() + j0 * F);
      for (int64_t j = 0; j < n; ++j)  // raw holds the rows before the map (zeros past len)
        for (int64_t c = 0; c < p.D; ++c)
          ks[static_cast<size_t>((j0 + j) * F + c)] =
              j0 + j < len ? feature_slope(p.mech.map, raw[static_cast<size_t>(j * p.D + c)]) : 0.0f;
    }
    for (int64_t j = 0; j < p.M; ++j) {
      float* row = u.data() + j * cols;
      load_rows(kern, p.v, b, hk, j, 1, len, row, cols);
      if (p.mech.normalize) row[p.Dv] = j < len ? 1.0f : 0.0f;
    }
    std::fill(dkf.begin(), dkf.end(), 0.0f);
    std::fill(du.begin(), du.end(), 0.0f);
  }

  // dk = phi'(k) o dkf and dv = du[:, :Dv] into the caller's tensors (zeros past the length).
  void store(const kernels::TileKernels& kern, const LinearProblem& p, const BackwardViews& g, int64_t b, int64_t hk) {
    for (int64_t j = 0; j < p.M; ++j) {
      float* dk = dkf.data() + j * F;
      for (int64_t c = 0; c < p.D; ++c) dk[c] *= ks[static_cast<size_t>(j * F + c)];
      if (j >= p.kv_len[static_cast<size_t>(b)]) {  // keys past the padding length: no gradient
        std::fill(dk, dk + p.D, 0.0f);
        std::fill(du.data() + j * cols, du.data() + j * cols + p.Dv, 0.0f);
      }
      kern.from_float(dk, g.dk.dtype, g.dk.strides[3], p.D, g.dk.ptr(b, hk, j));
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
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ld + r] = src[r * cols + c];
}

// Row r of y = g_r = dL/dy_r from dout's row (Dv values) and y_r (normalize: Dv + 1 values).
inline void output_gradient(const LinearProblem& p, const float* dout, const float* y, float* g) {
  if (!p.mech.normalize) {
    std::copy(dout, dout + p.Dv, g);
    return;
  }
  const float den = y[p.Dv] + static_cast<float>(p.eps);
  float dot = 0;
  for (int64_t c = 0; c < p.Dv; ++c) dot += dout[c] * y[c];
  for (int64_t c = 0; c < p.Dv; ++c) g[c] = den != 0.0f ? dout[c] / den : 0.0f;
  g[p.Dv] = den != 0.0f ? -dot / (den * den) : 0.0f;
}

}  // namespace attn::linear
