// The pieces of the float64 reference models the architecture tests write from their formulas
// (test_minimax.cpp, test_gemma3.cpp): the saved weights read as float64, y = x W^T, RMSNorm,
// rotate-half RoPE, seeded token ids, and the logits check.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/model.hpp"
#include "attn/safetensors.hpp"

namespace attn::float64_model {

using Vec = std::vector<double>;

// The tensors of a saved model as float64.
struct Tensors {
  SafetensorsFile file;
  Vec get(const std::string& name) const {
    const SafetensorsTensor& t = file.at(name);
    Vec v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_float(t.data, t.float_dtype(name), static_cast<int64_t>(i));
    return v;
  }
};

// y (n, rows) = x (n, cols) W^T, W (rows, cols).
inline Vec linear(const Vec& x, const Vec& w, int64_t rows, int64_t cols) {
  const int64_t n = static_cast<int64_t>(x.size()) / cols;
  Vec y(static_cast<size_t>(n * rows), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t c = 0; c < cols; ++c) s += x[static_cast<size_t>(i * cols + c)] * w[static_cast<size_t>(r * cols + c)];
      y[static_cast<size_t>(i * rows + r)] = s;
    }
  return y;
}

// RMSNorm over each run of weight.size() values (rows, or heads of rows).
inline Vec rms_norm(const Vec& x, const Vec& weight, double eps) {
  const int64_t cols = static_cast<int64_t>(weight.size()), n = static_cast<int64_t>(x.size()) / cols;
  Vec y(x.size());
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t c = 0; c < cols; ++c) ss += x[static_cast<size_t>(i * cols + c)] * x[static_cast<size_t>(i * cols + c)];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(cols) + eps);
    for (int64_t c = 0; c < cols; ++c)
      y[static_cast<size_t>(i * cols + c)] = x[static_cast<size_t>(i * cols + c)] * inv * weight[static_cast<size_t>(c)];
  }
  return y;
}

// Rotate-half RoPE over all hd channels of each head, token i at position i.
inline void rope(Vec& x, int64_t n, int64_t heads, int64_t hd, double theta) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t c = 0; c < hd / 2; ++c) {
        const double angle = static_cast<double>(i) * std::pow(theta, -2.0 * static_cast<double>(c) / static_cast<double>(hd));
        double& a = x[static_cast<size_t>((i * heads + h) * hd + c)];
        double& b = x[static_cast<size_t>((i * heads + h) * hd + c + hd / 2)];
        const double a0 = a, b0 = b;
        a = a0 * std::cos(angle) - b0 * std::sin(angle);
        b = a0 * std::sin(angle) + b0 * std::cos(angle);
      }
}

inline std::vector<int32_t> tokens_of(int64_t n, uint32_t seed, int64_t vocab) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = id(rng);
  return t;
}

// got within tol x max(1, largest |want|) of want, every value finite.
inline void expect_close(const std::vector<float>& got, const Vec& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << i;
    worst = std::max(worst, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  EXPECT_LE(worst, tol * std::max(scale, 1.0)) << "largest |logit| " << scale;
}

// The logits of `tokens` fed as a prompt of `prompt` tokens, then one at a time (a decoder's caches
// and states step by step), all rows one after another as a prefill's.
inline std::vector<float> stepwise_logits(Decoder& d, const std::vector<int32_t>& tokens, size_t prompt) {
  d.reset();
  std::vector<float> out = d.forward({tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(prompt)}, 0, true);
  for (size_t i = prompt; i < tokens.size(); ++i) {
    const std::vector<float>& row = d.forward({tokens[i]}, static_cast<int64_t>(i));
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

}  // namespace attn::float64_model
