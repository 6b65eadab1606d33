// Attention-weight refinement (Liu et al. 2024, our reading [unverified]): the float form against
// the double reference, and the forms' invariants (rows sum to 1, causal zeros kept, W = 0 gives
// uniform weights, gamma = 0 gives A V, value-weighted with A^ = I gives A V).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "attn/refinement.hpp"
#include "support/expect_error.hpp"

namespace attn {
namespace {

using testing::expect_error;
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

// batch causal weight matrices (n, n): a masked softmax of random scores; with `diag` the
// diagonal holds at least half of each row (so A is well conditioned).
std::vector<double> causal_weights(int64_t batch, int64_t n, uint32_t seed, bool diag = false) {
  std::vector<double> a(static_cast<size_t>(batch * n * n), 0.0);
  const std::vector<double> s = normal<double>(a.size(), seed, 1.5);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < n; ++i) {
      double* row = a.data() + (b * n + i) * n;
      double sum = 0;
      for (int64_t j = 0; j <= i; ++j) sum += row[j] = std::exp(s[(b * n + i) * n + j]);
      for (int64_t j = 0; j <= i; ++j) row[j] /= sum;
      if (diag) {
        for (int64_t j = 0; j <= i; ++j) row[j] *= 0.5;
        row[i] += 0.5;
      }
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

RefineOptions opts(RefineForm form, double gamma = 0.5, int threads = 0) {
  RefineOptions o;
  o.form = form;
  o.gamma = gamma;
  o.threads = threads;
  return o;
}

// out (n, dv) = A V for one entry
std::vector<double> times_v(const double* a, const double* v, int64_t n, int64_t dv) {
  std::vector<double> o(static_cast<size_t>(n * dv), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t c = 0; c < dv; ++c) o[i * dv + c] += a[i * n + j] * v[j * dv + c];
  return o;
}

TEST(Refinement, FloatFormMatchesDoubleReference) {
  // n = 37 crosses the 32-row blocks of the float form
  const int64_t batch = 2, n = 37, dv = 5, r = 4;
  const std::vector<double> a = causal_weights(batch, n, 1), v = normal<double>(batch * n * dv, 2);
  for (RefineForm form : kForms) {
    SCOPED_TRACE(std::string(refine_form_name(form)));
    const double ws = form == RefineForm::stochastic ? 0.7 : 2.0;
    const std::vector<double> w1 = normal<double>(n * r, 3, ws), w2 = normal<double>(n * r, 4, ws);
    std::vector<double> want(static_cast<size_t>(batch * n * dv));
    refine_attention(a.data(), v.data(), batch, n, dv, ref(w1, n, r), ref(w2, n, r), want.data(), opts(form, 0.3));
    const auto af = as<float>(a), vf = as<float>(v), w1f = as<float>(w1), w2f = as<float>(w2);
    std::vector<float> got(want.size()), got1(want.size());
    refine_attention(af.data(), vf.data(), batch, n, dv, ref(w1f, n, r), ref(w2f, n, r), got.data(),
                     opts(form, 0.3, 2));
    refine_attention(af.data(), vf.data(), batch, n, dv, ref(w1f, n, r), ref(w2f, n, r), got1.data(),
                     opts(form, 0.3, 1));
    double worst = 0;
    for (size_t e = 0; e < want.size(); ++e) {
      worst = std::max(worst, std::fabs(got[e] - want[e]));
      ASSERT_EQ(got[e], got1[e]) << "thread count changed element " << e;
    }
    EXPECT_LT(worst, 2e-5);
    // the output is the refined weights times V
    std::vector<double> R(static_cast<size_t>(batch * n * n));
    refined_weights(a.data(), batch, n, ref(w1, n, r), ref(w2, n, r), R.data(), opts(form, 0.3));
    for (int64_t b = 0; b < batch; ++b) {
      const auto o = times_v(R.data() + b * n * n, v.data() + b * n * dv, n, dv);
      for (int64_t e = 0; e < n * dv; ++e) EXPECT_NEAR(o[e], want[b * n * dv + e], 1e-12);
    }
  }
}

TEST(Refinement, RefinedRowsSumToOneAndKeepCausalZeros) {
  const int64_t batch = 2, n = 9, r = 3;
  const std::vector<double> a = causal_weights(batch, n, 5);
  const std::vector<double> w1 = normal<double>(n * r, 6, 2.0), w2 = normal<double>(n * r, 7, 2.0);
  for (RefineForm form : kForms) {
    SCOPED_TRACE(std::string(refine_form_name(form)));
    std::vector<double> R(static_cast<size_t>(batch * n * n));
    refined_weights(a.data(), batch, n, ref(w1, n, r), ref(w2, n, r), R.data(), opts(form));
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < n; ++i) {
        const double* row = R.data() + (b * n + i) * n;
        double s = 0;
        for (int64_t j = 0; j < n; ++j) {
          if (j > i) EXPECT_EQ(row[j], 0.0) << "(" << i << ", " << j << ")";
          EXPECT_GE(row[j], 0.0);
          s += row[j];
        }
        EXPECT_NEAR(s, 1.0, 1e-12);
      }
  }
}

TEST(Refinement, ZeroWeightsGiveUniformRowsOverAllowedKeys) {
  const int64_t n = 6, r = 2, dv = 3;
  const std::vector<double> a = causal_weights(1, n, 8), v = normal<double>(n * dv, 9), w(n * r, 0.0);
  for (RefineForm form : {RefineForm::simple, RefineForm::stochastic}) {
    std::vector<double> R(static_cast<size_t>(n * n));
    refined_weights(a.data(), 1, n, ref(w, n, r), ref(w, n, r), R.data(), opts(form));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) EXPECT_DOUBLE_EQ(R[i * n + j], j <= i ? 1.0 / double(i + 1) : 0.0);
    // the float form: O_i = mean of v_0 .. v_i
    const auto af = as<float>(a), vf = as<float>(v), wf = as<float>(w);
    std::vector<float> out(static_cast<size_t>(n * dv));
    refine_attention(af.data(), vf.data(), 1, n, dv, ref(wf, n, r), ref(wf, n, r), out.data(), opts(form));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < dv; ++c) {
        double m = 0;
        for (int64_t j = 0; j <= i; ++j) m += v[j * dv + c] / double(i + 1);
        EXPECT_NEAR(out[i * dv + c], m, 1e-6);
      }
  }
}

TEST(Refinement, AdditiveWithGammaZeroIsAV) {
  const int64_t n = 7, r = 3, dv = 4;
  const std::vector<double> a = causal_weights(1, n, 10), v = normal<double>(n * dv, 11);
  const std::vector<double> w1 = normal<double>(n * r, 12, 3.0), w2 = normal<double>(n * r, 13, 3.0);
  const auto want = times_v(a.data(), v.data(), n, dv);
  std::vector<double> out(want.size());
  refine_attention(a.data(), v.data(), 1, n, dv, ref(w1, n, r), ref(w2, n, r), out.data(),
                   opts(RefineForm::additive, 0.0));
  for (size_t e = 0; e < want.size(); ++e) EXPECT_NEAR(out[e], want[e], 1e-14);
  const auto af = as<float>(a), vf = as<float>(v), w1f = as<float>(w1), w2f = as<float>(w2);
  std::vector<float> outf(want.size());
  refine_attention(af.data(), vf.data(), 1, n, dv, ref(w1f, n, r), ref(w2f, n, r), outf.data(),
                   opts(RefineForm::additive, 0.0));
  for (size_t e = 0; e < want.size(); ++e) EXPECT_NEAR(outf[e], want[e], 1e-6);
  // gamma = 1 is the simple form
  std::vector<double> add1(want.size()), simple(want.size());
  refine_attention(a.data(), v.data(), 1, n, dv, ref(w1, n, r), ref(w2, n, r), add1.data(),
                   opts(RefineForm::additive, 1.0));
  refine_attention(a.data(), v.data(), 1, n, dv, ref(w1, n, r), ref(w2, n, r), simple.data(),
                   opts(RefineForm::simple));
  for (size_t e = 0; e < want.size(); ++e) EXPECT_NEAR(add1[e], simple[e], 1e-14);
}

TEST(Refinement, ValueWeightedWithIdentityRefinementIsAV) {
  // W_1 = W_2 = c A^-1 (r = n): A W = c I, scores c^2 I / sqrt(n), so A^ = I to double precision
  const int64_t n = 6, r = n, dv = 3;
  const double c = 30.0;
  const std::vector<double> a = causal_weights(1, n, 14, /*diag=*/true), v = normal<double>(n * dv, 15);
  std::vector<double> inv(static_cast<size_t>(n * n), 0.0);  // lower triangular, forward substitution
  for (int64_t col = 0; col < n; ++col)
    for (int64_t i = col; i < n; ++i) {
      double s = i == col ? 1.0 : 0.0;
      for (int64_t k = col; k < i; ++k) s -= a[i * n + k] * inv[k * n + col];
      inv[i * n + col] = s / a[i * n + i];
    }
  std::vector<double> w(inv.size());
  for (size_t e = 0; e < w.size(); ++e) w[e] = c * inv[e];
  std::vector<double> R(static_cast<size_t>(n * n));
  refined_weights(a.data(), 1, n, ref(w, n, r), ref(w, n, r), R.data(), opts(RefineForm::simple));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) EXPECT_NEAR(R[i * n + j], i == j ? 1.0 : 0.0, 1e-12);
  const auto want = times_v(a.data(), v.data(), n, dv);
  std::vector<double> out(want.size());
  refine_attention(a.data(), v.data(), 1, n, dv, ref(w, n, r), ref(w, n, r), out.data(),
                   opts(RefineForm::value_weighted));
  for (size_t e = 0; e < want.size(); ++e) EXPECT_NEAR(out[e], want[e], 1e-12);
  const auto af = as<float>(a), vf = as<float>(v), wf = as<float>(w);
  std::vector<float> outf(want.size());
  refine_attention(af.data(), vf.data(), 1, n, dv, ref(wf, n, r), ref(wf, n, r), outf.data(),
                   opts(RefineForm::value_weighted));
  for (size_t e = 0; e < want.size(); ++e) EXPECT_NEAR(outf[e], want[e], 1e-5);
}

TEST(Refinement, NonFiniteValuesPropagateOnlyForward) {
  const int64_t n = 8, r = 2, dv = 2;
  auto a = as<float>(causal_weights(1, n, 16));
  auto v = normal<float>(n * dv, 17);
  const auto w1 = normal<float>(n * r, 18), w2 = normal<float>(n * r, 19);
  v[3 * dv + 1] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(static_cast<size_t>(n * dv));
  refine_attention(a.data(), v.data(), 1, n, dv, ref(w1, n, r), ref(w2, n, r), out.data(), opts(RefineForm::simple));
  for (int64_t i = 0; i < 3; ++i) EXPECT_TRUE(std::isfinite(out[i * dv + 1])) << i;
  EXPECT_TRUE(std::isnan(out[3 * dv + 1]));
  // a NaN in a row of A is not a row-sum error: it propagates
  a[4 * n + 2] = std::numeric_limits<float>::quiet_NaN();
  refine_attention(a.data(), v.data(), 1, n, dv, ref(w1, n, r), ref(w2, n, r), out.data(), opts(RefineForm::simple));
  EXPECT_TRUE(std::isfinite(out[0]));
  EXPECT_TRUE(std::isnan(out[4 * dv]));
  // across the 32-row blocks: a NaN in V or W at position 35 (second block) reaches no earlier row
  const int64_t m = 40;
  const auto a2 = as<float>(causal_weights(1, m, 23));
  for (RefineForm form : {RefineForm::value_weighted, RefineForm::additive, RefineForm::stochastic}) {
    auto v2 = normal<float>(m * dv, 24);
    auto w1b = normal<float>(m * r, 25, 0.5), w2b = normal<float>(m * r, 26, 0.5);
    std::vector<float> o2(static_cast<size_t>(m * dv));
    v2[35 * dv] = std::numeric_limits<float>::infinity();
    w1b[35 * r] = std::numeric_limits<float>::quiet_NaN();
    refine_attention(a2.data(), v2.data(), 1, m, dv, ref(w1b, m, r), ref(w2b, m, r), o2.data(), opts(form));
    for (int64_t i = 0; i < 35; ++i)
      for (int64_t c = 0; c < dv; ++c) ASSERT_TRUE(std::isfinite(o2[i * dv + c])) << i << ", " << c;
    EXPECT_FALSE(std::isfinite(o2[35 * dv]));
  }
}

TEST(Refinement, BadInputNamesTheArgument) {
  const int64_t n = 4, r = 2, dv = 2;
  std::vector<double> a = causal_weights(1, n, 20), v(n * dv, 1.0), w(n * r, 0.1), out(n * dv);
  const auto call = [&](const std::vector<double>& aa, MatrixRef<double> w1, MatrixRef<double> w2, RefineOptions o) {
    refine_attention(aa.data(), v.data(), 1, n, dv, w1, w2, out.data(), o);
  };
  auto upper = a;
  upper[1] = 0.25;
  expect_error([&] { call(upper, ref(w, n, r), ref(w, n, r), {}); },
               "a must be causal (zero above the diagonal), got a[0][1] = 0.25");
  auto sums = a;
  sums[2 * n + 0] += 0.1;
  expect_error([&] { call(sums, ref(w, n, r), ref(w, n, r), {}); }, "every row of a must sum to 1");
  expect_error([&] { call(sums, ref(w, n, r), ref(w, n, r), {}); }, "got sum of a[2] = 1.1");
  expect_error([&] { call(a, ref(w, n, r), ref(w, n, r), opts(RefineForm::additive, 1.5)); },
               "gamma must be in [0, 1], got 1.5");
  expect_error([&] { call(a, ref(w, n, r), ref(w, n, r), opts(RefineForm::additive, std::nan(""))); },
               "gamma must be in [0, 1]");
  expect_error([&] { call(a, ref(w, n - 1, r), ref(w, n - 1, r), {}); }, "w1 must have N = 4 rows");
  expect_error([&] { call(a, ref(w, n, r), ref(w, n, 1), {}); }, "w2 must have the shape of w1, (4, 2), got (4, 1)");
  expect_error([&] { call(a, ref(w, n, r), ref(w, n, 1), opts(RefineForm::stochastic)); },
               "w_sigma must have the shape of w_mu");
  expect_error([&] { call(a, ref(w, n, 0), ref(w, n, 0), {}); }, "w1 must have at least one column (r >= 1), got 0");
  expect_error([&] { call(a, ref(w, n, r), ref(w, n, r), opts(RefineForm::simple, 0.5, -1)); }, "threads must be in");
  expect_error([] { parse_refine_form("fancy"); },
               "form must be one of simple, value_weighted, additive, stochastic, got \"fancy\"");
  EXPECT_EQ(parse_refine_form("value_weighted"), RefineForm::value_weighted);
  // a looser tolerance accepts the row; zero rows of batch are fine
  RefineOptions loose;
  loose.row_sum_tolerance = 0.2;
  call(sums, ref(w, n, r), ref(w, n, r), loose);
  refine_attention(a.data(), v.data(), 0, n, dv, ref(w, n, r), ref(w, n, r), out.data());
}

}  // namespace
}  // namespace attn
