// Attention-weight refinement's backward: the fast float form against the float64 reference
// (tolerance from the plain float32 implementation's error), the reference against central finite
// differences, 1 vs 3 threads bitwise, odd sizes across the 32-row blocks, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attn/refinement.hpp"
#include "blocks/gradient_check.hpp"
#include "refinement/refinement_internal.hpp"
#include "support/expect_error.hpp"

namespace attn {
namespace {

using testing::expect_error;
using testing::expect_finite_differences;
using testing::expect_gradient_close;
constexpr RefineForm kForms[] = {RefineForm::simple, RefineForm::value_weighted, RefineForm::additive,
                                 RefineForm::stochastic};

template <class T>
std::vector<T> normal(size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(d(gen));
  return v;
}

// batch causal weight matrices (n, n): a masked softmax of random scores
std::vector<double> causal_weights(int64_t batch, int64_t n, uint32_t seed) {
  std::vector<double> a(static_cast<size_t>(batch * n * n), 0.0);
  const std::vector<double> s = normal<double>(a.size(), seed, 1.5);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < n; ++i) {
      double* row = a.data() + (b * n + i) * n;
      double sum = 0;
      for (int64_t j = 0; j <= i; ++j) sum += row[j] = std::exp(s[(b * n + i) * n + j]);
      for (int64_t j = 0; j <= i; ++j) row[j] /= sum;
    }
  return a;
}

template <class T>
std::vector<T> as(const std::vector<double>& x) {
  return std::vector<T>(x.begin(), x.end());
}

template <class T>
MatrixRef<T> ref(const std::vector<T>& w, int64_t rows, int64_t cols) {
  return {w.data(), rows, cols};
}

RefineOptions opts(RefineForm form, double gamma = 0.3, int threads = 0) {
  RefineOptions o;
  o.form = form;
  o.gamma = gamma;
  o.threads = threads;
  return o;
}

template <class T>
struct Grads {
  std::vector<T> a, v, w1, w2;
  Grads(int64_t batch, int64_t n, int64_t dv, int64_t r)
      : a(static_cast<size_t>(batch * n * n)), v(static_cast<size_t>(batch * n * dv)), w1(static_cast<size_t>(n * r)),
        w2(w1.size()) {}
};

void fast_against_reference(int64_t batch, int64_t n, int64_t dv, int64_t r, uint32_t seed) {
  const std::vector<double> a = causal_weights(batch, n, seed), v = normal<double>(batch * n * dv, seed + 1);
  const std::vector<double> dout = normal<double>(batch * n * dv, seed + 2);
  for (RefineForm form : kForms) {
    SCOPED_TRACE(std::string(refine_form_name(form)) + " n=" + std::to_string(n));
    const double ws = form == RefineForm::stochastic ? 0.7 : 2.0;
    const std::vector<double> w1 = normal<double>(n * r, seed + 3, ws), w2 = normal<double>(n * r, seed + 4, ws);
    Grads<double> want(batch, n, dv, r);
    refine_attention_backward(dout.data(), a.data(), v.data(), batch, n, dv, ref(w1, n, r), ref(w2, n, r),
                              want.a.data(), want.v.data(), want.w1.data(), want.w2.data(), opts(form));
    const auto af = as<float>(a), vf = as<float>(v), w1f = as<float>(w1), w2f = as<float>(w2), df = as<float>(dout);
    Grads<float> got(batch, n, dv, r), got1(batch, n, dv, r), plain(batch, n, dv, r);
    refine_attention_backward(df.data(), af.data(), vf.data(), batch, n, dv, ref(w1f, n, r), ref(w2f, n, r),
                              got.a.data(), got.v.data(), got.w1.data(), got.w2.data(), opts(form, 0.3, 3));
    refine_attention_backward(df.data(), af.data(), vf.data(), batch, n, dv, ref(w1f, n, r), ref(w2f, n, r),
                              got1.a.data(), got1.v.data(), got1.w1.data(), got1.w2.data(), opts(form, 0.3, 1));
    refinement::backward_plain(df.data(), af.data(), vf.data(), batch, n, dv, w1f.data(), w2f.data(), r, opts(form),
                               plain.a.data(), plain.v.data(), plain.w1.data(), plain.w2.data());
    expect_gradient_close("grad_a", got.a, got1.a, want.a, plain.a);
    expect_gradient_close("grad_v", got.v, got1.v, want.v, plain.v);
    expect_gradient_close("grad_w1", got.w1, got1.w1, want.w1, plain.w1);
    expect_gradient_close("grad_w2", got.w2, got1.w2, want.w2, plain.w2);
  }
}

TEST(RefinementBackward, FastMatchesReferenceOddSizes) {
  // 37 rows: a full 32-row block and a ragged one; dv and r odd
  fast_against_reference(2, 37, 5, 3, 11);
  // 70 rows over three blocks, one entry, r = 1
  fast_against_reference(1, 70, 3, 1, 21);
  // a single position
  fast_against_reference(3, 1, 2, 2, 31);
}

TEST(RefinementBackward, ReferenceMatchesFiniteDifferences) {
  const int64_t batch = 2, n = 6, dv = 3, r = 2;
  for (RefineForm form : kForms) {
    SCOPED_TRACE(std::string(refine_form_name(form)));
    std::vector<double> a = causal_weights(batch, n, 5), v = normal<double>(batch * n * dv, 6);
    std::vector<double> w1 = normal<double>(n * r, 7, 0.8), w2 = normal<double>(n * r, 8, 0.8);
    const std::vector<double> dout = normal<double>(batch * n * dv, 9);
    RefineOptions o = opts(form);
    o.row_sum_tolerance = 1e-3;  // the differences move a row's sum by 1e-6
    Grads<double> g(batch, n, dv, r);
    refine_attention_backward(dout.data(), a.data(), v.data(), batch, n, dv, ref(w1, n, r), ref(w2, n, r), g.a.data(),
                              g.v.data(), g.w1.data(), g.w2.data(), o);
    std::vector<double> out(dout.size());
    const auto loss = [&] {
      refine_attention(a.data(), v.data(), batch, n, dv, ref(w1, n, r), ref(w2, n, r), out.data(), o);
      double s = 0;
      for (size_t e = 0; e < out.size(); ++e) s += dout[e] * out[e];
      return s;
    };
    // a's entries above the diagonal must stay exactly 0 (the forward refuses anything else): their
    // gradient is checked against torch autograd in python/tests/test_block_gradients_refinement_sana.py
    const auto above = [&](size_t e) { return static_cast<int64_t>(e % n) > static_cast<int64_t>((e / n) % n); };
    expect_finite_differences("grad_a", a, g.a, loss, 1e-6, above);
    expect_finite_differences("grad_v", v, g.v, loss);
    expect_finite_differences("grad_w1", w1, g.w1, loss);
    expect_finite_differences("grad_w2", w2, g.w2, loss);
  }
}

TEST(RefinementBackward, ZeroBatchGivesZeroWeightGradients) {
  const int64_t n = 4, r = 2;
  const std::vector<float> w = normal<float>(n * r, 1);
  std::vector<float> g1(n * r, 7.0f), g2(n * r, 7.0f);
  refine_attention_backward(static_cast<const float*>(nullptr), nullptr, nullptr, 0, n, 3, ref(w, n, r), ref(w, n, r),
                            nullptr, nullptr, g1.data(), g2.data(), opts(RefineForm::simple));
  for (size_t e = 0; e < g1.size(); ++e) {
    EXPECT_EQ(g1[e], 0.0f);
    EXPECT_EQ(g2[e], 0.0f);
  }
}

TEST(RefinementBackward, BadInputNamesTheArgument) {
  const int64_t batch = 1, n = 3, dv = 2, r = 2;
  const std::vector<float> a = as<float>(causal_weights(batch, n, 1)), v = normal<float>(batch * n * dv, 2);
  const std::vector<float> w = normal<float>(n * r, 3), bad = normal<float>((n + 1) * r, 4);
  Grads<float> g(batch, n, dv, r);
  const auto call = [&](const std::vector<float>& w2, int64_t w2_rows, float* ga, float* gw2, RefineForm form) {
    refine_attention_backward(v.data(), a.data(), v.data(), batch, n, dv, ref(w, n, r), ref(w2, w2_rows, r), ga,
                              g.v.data(), g.w1.data(), gw2, opts(form));
  };
  expect_error([&] { call(bad, n + 1, g.a.data(), g.w2.data(), RefineForm::simple); },
               "refine_attention_backward: w2 must have the shape of w1, (3, 2), got (4, 2)");
  expect_error([&] { call(bad, n + 1, g.a.data(), g.w2.data(), RefineForm::stochastic); }, "w_sigma must have");
  expect_error([&] { call(w, n, nullptr, g.w2.data(), RefineForm::simple); }, "grad_a is null");
  expect_error([&] { call(w, n, g.a.data(), nullptr, RefineForm::simple); }, "grad_w2 is null");
  std::vector<float> not_causal = a;
  not_causal[1] = 0.5f;
  expect_error(
      [&] {
        refine_attention_backward(v.data(), not_causal.data(), v.data(), batch, n, dv, ref(w, n, r), ref(w, n, r),
                                  g.a.data(), g.v.data(), g.w1.data(), g.w2.data(), opts(RefineForm::simple));
      },
      "a must be causal");
}

}  // namespace
}  // namespace attn
