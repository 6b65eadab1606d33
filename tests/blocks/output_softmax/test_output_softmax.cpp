// Output-layer softmax variants: log_softmax, word2vec's hierarchical softmax and
// PyTorch's adaptive softmax, on worked cases with known answers and against float64 formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "attn/output_softmax.hpp"
#include "support/expect_error.hpp"

namespace attn {
namespace {

using testing::expect_error;
constexpr double kInf = std::numeric_limits<double>::infinity();

template <class T>
std::vector<T> normal(size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(d(gen));
  return v;
}

double logsumexp(const double* x, int64_t n) {
  double m = -kInf, s = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  for (int64_t i = 0; i < n; ++i) s += std::exp(x[i] - m);
  return m + std::log(s);
}

// ---- log_softmax ----------------------------------------------------------------------------

TEST(OutputLogSoftmax, RowsHaveLogSumExpZeroAndMatchFloat64) {
  const int64_t rows = 7, n = 97;
  const std::vector<double> x64 = normal<double>(rows * n, 1, 5.0);
  std::vector<float> x32(x64.begin(), x64.end());
  std::vector<double> y64(x64.size());
  std::vector<float> y32(x32.size());
  log_softmax(x64.data(), y64.data(), rows, n);
  log_softmax(x32.data(), y32.data(), rows, n);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_NEAR(logsumexp(y64.data() + r * n, n), 0.0, 1e-14);
    const double ref = logsumexp(x64.data() + r * n, n);  // x32 holds x64 rounded
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_NEAR(y64[r * n + i], x64[r * n + i] - ref, 1e-13);
      EXPECT_NEAR(y32[r * n + i], double(x32[r * n + i]) - logsumexp(std::vector<double>(x32.begin() + r * n,
                                                                   x32.begin() + (r + 1) * n).data(), n), 4e-6);
    }
  }
}

TEST(OutputLogSoftmax, ShiftInvariantAndNoOverflow) {
  const std::vector<double> x = normal<double>(50, 2);
  std::vector<double> shifted(x), a(50), b(50);
  for (double& v : shifted) v += 1234.5;
  log_softmax(x.data(), a.data(), 1, 50);
  log_softmax(shifted.data(), b.data(), 1, 50);
  for (int i = 0; i < 50; ++i) EXPECT_NEAR(a[i], b[i], 1e-11);
  for (double big : {1000.0, -1000.0, 1e30}) {
    const float xf[2] = {float(big), float(big)};
    float yf[2];
    log_softmax(xf, yf, 1, 2);
    EXPECT_FLOAT_EQ(yf[0], float(-std::log(2.0)));
    EXPECT_FLOAT_EQ(yf[1], float(-std::log(2.0)));
  }
}

TEST(OutputLogSoftmax, MinusInfinityRowsStayMinusInfinity) {
  // row 0 all -inf, row 1 partly -inf, row 2 in place
  std::vector<float> x = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, 0.0f, 0.0f, 1.0f, 2.0f, 3.0f};
  std::vector<float> y(9);
  log_softmax(x.data(), y.data(), 3, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(y[i], -INFINITY);
  EXPECT_EQ(y[3], -INFINITY);
  EXPECT_NEAR(y[4], -std::log(2.0), 1e-7);
  log_softmax(x.data(), x.data(), 3, 3);  // out may alias x
  for (int i = 0; i < 9; ++i) EXPECT_EQ(x[i], y[i]);
  const double nan_row[2] = {std::nan(""), 1.0};
  double out[2];
  log_softmax(nan_row, out, 1, 2);
  EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[1]));
  log_softmax(static_cast<const double*>(nullptr), nullptr, 0, 5);  // empty: nothing to do
}

// ---- Huffman tree and hierarchical softmax ----------------------------------------------------

TEST(OutputHierarchicalSoftmax, SpecCodesAndTieRule) {
  const std::vector<int64_t> counts = {5, 3, 1, 1};
  const HuffmanTree t = HuffmanTree::from_counts(counts);
  EXPECT_EQ(t.code_string(0), "1");
  EXPECT_EQ(t.code_string(1), "01");
  EXPECT_EQ(t.code_string(2), "001");
  EXPECT_EQ(t.code_string(3), "000");
  // inner nodes in creation order: 0 = {3, 2}, 1 = {0, 1} ... root is V - 2 = 2
  EXPECT_EQ(std::vector<int32_t>(t.path(3).begin(), t.path(3).end()), (std::vector<int32_t>{2, 1, 0}));
  EXPECT_EQ(std::vector<int32_t>(t.path(0).begin(), t.path(0).end()), (std::vector<int32_t>{2}));
  // word ids are positions in counts: the same counts permuted give the same codes permuted
  const HuffmanTree p = HuffmanTree::from_counts(std::vector<int64_t>{1, 5, 1, 3});
  EXPECT_EQ(p.code_string(1), "1");
  EXPECT_EQ(p.code_string(3), "01");
  EXPECT_EQ(p.code_string(0), "001");  // the stable sort keeps word 0 before word 2
  EXPECT_EQ(p.code_string(2), "000");
  EXPECT_EQ(HuffmanTree::from_counts(std::vector<int64_t>{7}).code_string(0), "");
}

TEST(OutputHierarchicalSoftmax, KraftSumIsOne) {
  std::mt19937 gen(3);
  std::vector<int64_t> counts(1000);
  for (int64_t& c : counts) c = 1 + gen() % 5000;
  const HuffmanTree t = HuffmanTree::from_counts(counts);
  double kraft = 0;
  size_t longest = 0;
  for (int64_t w = 0; w < 1000; ++w) {
    kraft += std::ldexp(1.0, -static_cast<int>(t.code(w).size()));
    longest = std::max(longest, t.code(w).size());
  }
  EXPECT_NEAR(kraft, 1.0, 1e-15);
  EXPECT_LT(longest, 40u);
}

TEST(OutputHierarchicalSoftmax, ZeroThetaGivesPowersOfOneHalf) {
  const int64_t d = 3;
  const std::vector<double> theta(3 * d, 0.0), h = normal<double>(2 * d, 4);
  const auto hs = HierarchicalSoftmax<double>::from_counts(std::vector<int64_t>{5, 3, 1, 1}, theta, d);
  std::vector<double> all(8);
  hs.log_prob_all(h.data(), 2, all.data());
  const double want[4] = {0.5, 0.25, 0.125, 0.125};
  for (int r = 0; r < 2; ++r)
    for (int w = 0; w < 4; ++w) EXPECT_NEAR(std::exp(all[r * 4 + w]), want[w], 1e-15);
}

template <class T>
void check_random_tree(double sum_tol, double ref_tol) {
  const int64_t V = 300, d = 17, N = 9;
  std::mt19937 gen(5);
  std::vector<int64_t> counts(V);
  for (int64_t& c : counts) c = 1 + gen() % 100;
  const std::vector<T> theta = normal<T>((V - 1) * d, 6), h = normal<T>(N * d, 7, 2.0);
  const auto hs = HierarchicalSoftmax<T>::from_counts(counts, theta, d);
  std::vector<T> all(N * V), picked(N);
  std::vector<int64_t> targets(N);
  for (int64_t r = 0; r < N; ++r) targets[r] = (r * 37) % V;
  hs.log_prob_all(h.data(), N, all.data(), 2);
  hs.log_prob(h.data(), N, targets.data(), picked.data(), 2);
  for (int64_t r = 0; r < N; ++r) {
    double total = 0;
    for (int64_t w = 0; w < V; ++w) total += std::exp(double(all[r * V + w]));
    EXPECT_NEAR(total, 1.0, sum_tol);
    EXPECT_NEAR(picked[r], all[r * V + targets[r]], ref_tol);
    // float64 formula: product of sigmoid((1 - 2b) theta_n . h) along the path
    for (int64_t w : {int64_t{0}, targets[r], V - 1}) {
      double p = 1;
      for (size_t l = 0; l < hs.tree().path(w).size(); ++l) {
        double z = 0;
        for (int64_t k = 0; k < d; ++k) z += double(theta[hs.tree().path(w)[l] * d + k]) * double(h[r * d + k]);
        p *= 1 / (1 + std::exp(hs.tree().code(w)[l] ? z : -z));
      }
      EXPECT_NEAR(all[r * V + w], std::log(p), ref_tol);
    }
  }
}

TEST(OutputHierarchicalSoftmax, RandomRowsSumToOneAndMatchTheFormula) {
  check_random_tree<double>(1e-12, 1e-12);
  check_random_tree<float>(1e-6, 2e-5);
}

TEST(OutputHierarchicalSoftmax, LargeScoresStayFinite) {
  // |theta . h| = 1e4: sigmoid underflows, log sigmoid = -softplus(-z) does not
  const std::vector<double> theta = {1e4}, h = {1.0};
  const auto hs = HierarchicalSoftmax<double>::from_counts(std::vector<int64_t>{2, 1}, theta, 1);
  std::vector<double> all(2);
  hs.log_prob_all(h.data(), 1, all.data());
  EXPECT_EQ(hs.tree().code_string(0), "1");  // the rarer word is taken first: bit 0
  EXPECT_EQ(all[0], -1e4);  // code "1": log sigmoid(-1e4)
  EXPECT_EQ(all[1], 0.0);   // code "0": log sigmoid(1e4)
}

TEST(OutputHierarchicalSoftmax, BadInputNamesTheArgument) {
  expect_error([] { HuffmanTree::from_counts(std::vector<int64_t>{3, 1, 0}); }, "counts[2] = 0 must be positive");
  expect_error([] { HuffmanTree::from_counts(std::vector<int64_t>{}); }, "counts must hold at least one");
  expect_error([] { HierarchicalSoftmax<float>::from_counts(std::vector<int64_t>{3, 1, 2}, std::vector<float>(5), 3); },
               "theta must have (V - 1) * d = 2 * 3 values, got 5");
  const auto hs = HierarchicalSoftmax<float>::from_counts(std::vector<int64_t>{3, 1, 2}, std::vector<float>(6), 3);
  const std::vector<float> h(6);
  const std::vector<int64_t> targets = {0, 3};
  std::vector<float> out(2);
  expect_error([&] { hs.log_prob(h.data(), 2, targets.data(), out.data()); }, "targets[1] = 3 is outside [0, 3)");
  expect_error([&] { hs.tree().code(-1); }, "word -1 is outside [0, 3)");
}

// ---- adaptive softmax --------------------------------------------------------------------------

template <class T>
struct AdaptiveWeights {
  int64_t d, V;
  std::vector<int64_t> cutoffs;
  std::vector<T> head, bias;
  std::vector<std::vector<T>> proj, out;
  std::vector<int64_t> hidden;

  AdaptiveWeights(int64_t d_, int64_t V_, std::vector<int64_t> c, double scale, uint32_t seed, bool with_bias)
      : d(d_), V(V_), cutoffs(std::move(c)) {
    const int64_t m = static_cast<int64_t>(cutoffs.size());
    head = normal<T>((cutoffs[0] + m) * d, seed, scale);
    if (with_bias) bias = normal<T>(cutoffs[0] + m, seed + 1, scale);
    int64_t div = 4;
    for (int64_t i = 0; i < m; ++i, div *= 4) {
      const int64_t size = (i + 1 < m ? cutoffs[i + 1] : V) - cutoffs[i];
      hidden.push_back(d / div);
      proj.push_back(normal<T>(hidden.back() * d, seed + 10 + i, scale));
      out.push_back(normal<T>(size * hidden.back(), seed + 20 + i, scale));
    }
  }
  AdaptiveLogSoftmaxWithLoss<T> build() const {
    const int64_t m = static_cast<int64_t>(cutoffs.size());
    std::vector<std::pair<MatrixRef<T>, MatrixRef<T>>> tail;
    for (int64_t i = 0; i < m; ++i) {
      const int64_t size = (i + 1 < m ? cutoffs[i + 1] : V) - cutoffs[i];
      tail.push_back({{proj[i].data(), hidden[i], d}, {out[i].data(), size, hidden[i]}});
    }
    return AdaptiveLogSoftmaxWithLoss<T>(V, cutoffs, {head.data(), cutoffs[0] + m, d}, bias, tail);
  }
  // the float64 formula (attn/output_softmax.hpp) for one row
  std::vector<double> reference(const T* x) const {
    const int64_t m = static_cast<int64_t>(cutoffs.size()), hs = cutoffs[0] + m;
    std::vector<double> H(hs), lp(V);
    for (int64_t j = 0; j < hs; ++j) {
      H[j] = bias.empty() ? 0.0 : double(bias[j]);
      for (int64_t k = 0; k < d; ++k) H[j] += double(head[j * d + k]) * double(x[k]);
    }
    const double lh = logsumexp(H.data(), hs);
    for (int64_t y = 0; y < cutoffs[0]; ++y) lp[y] = H[y] - lh;
    for (int64_t i = 0; i < m; ++i) {
      const int64_t lo = cutoffs[i], size = (i + 1 < m ? cutoffs[i + 1] : V) - lo;
      std::vector<double> p(hidden[i], 0.0), z(size, 0.0);
      for (int64_t a = 0; a < hidden[i]; ++a)
        for (int64_t k = 0; k < d; ++k) p[a] += double(proj[i][a * d + k]) * double(x[k]);
      for (int64_t b = 0; b < size; ++b)
        for (int64_t a = 0; a < hidden[i]; ++a) z[b] += double(out[i][b * hidden[i] + a]) * p[a];
      const double lz = logsumexp(z.data(), size);
      for (int64_t b = 0; b < size; ++b) lp[lo + b] = H[cutoffs[0] + i] - lh + z[b] - lz;
    }
    return lp;
  }
};

TEST(OutputAdaptiveSoftmax, ZeroWeightsGiveTheSpecProbabilities) {
  AdaptiveWeights<float> w(16, 10, {4, 8}, 1.0, 1, false);
  for (auto* v : {&w.head}) std::fill(v->begin(), v->end(), 0.0f);
  for (auto& v : w.proj) std::fill(v.begin(), v.end(), 0.0f);
  for (auto& v : w.out) std::fill(v.begin(), v.end(), 0.0f);
  EXPECT_EQ(w.hidden, (std::vector<int64_t>{4, 1}));
  const auto a = w.build();
  EXPECT_EQ(a.head_size(), 6);
  EXPECT_EQ(a.cutoffs(), (std::vector<int64_t>{4, 8, 10}));
  const std::vector<float> x = normal<float>(2 * 16, 9);
  std::vector<float> lp(20), out(2);
  a.log_prob(x.data(), 2, lp.data());
  for (int r = 0; r < 2; ++r)
    for (int y = 0; y < 10; ++y)
      EXPECT_NEAR(std::exp(lp[r * 10 + y]), y < 4 ? 1.0 / 6 : y < 8 ? 1.0 / 24 : 1.0 / 12, 1e-7) << y;
  const std::vector<int64_t> target = {5, 9};
  const float loss = a.forward(x.data(), 2, target.data(), out.data());
  EXPECT_NEAR(out[0], std::log(1.0 / 24), 1e-6);
  EXPECT_NEAR(out[1], std::log(1.0 / 12), 1e-6);
  EXPECT_NEAR(loss, -(out[0] + out[1]) / 2, 1e-6);
}

template <class T>
void check_random_adaptive(double tol) {
  const int64_t d = 37, V = 53, N = 45;  // float: two blocks of the gemm path, the last partial; hidden (9, 2, 0)
  for (bool with_bias : {false, true}) {
    const AdaptiveWeights<T> w(d, V, {5, 20, 41}, 0.5, 3, with_bias);
    const auto a = w.build();
    const std::vector<T> x = normal<T>(N * d, 8, 1.5);
    std::vector<T> lp(N * V), out(N);
    std::vector<int64_t> target(N), pred(N);
    for (int64_t r = 0; r < N; ++r) target[r] = (r * 13 + 2) % V;
    a.log_prob(x.data(), N, lp.data(), 2);
    a.predict(x.data(), N, pred.data(), 2);
    const T loss = a.forward(x.data(), N, target.data(), out.data(), 2);
    double mean = 0;
    for (int64_t r = 0; r < N; ++r) {
      const std::vector<double> ref = w.reference(x.data() + r * d);
      double total = 0;
      int64_t best = 0;
      for (int64_t y = 0; y < V; ++y) {
        EXPECT_NEAR(lp[r * V + y], ref[y], tol);
        total += std::exp(double(lp[r * V + y]));
        if (ref[y] > ref[best]) best = y;
      }
      EXPECT_NEAR(total, 1.0, tol);
      EXPECT_EQ(pred[r], best);
      EXPECT_NEAR(out[r], lp[r * V + target[r]], tol);
      mean -= double(out[r]) / N;
    }
    EXPECT_NEAR(loss, mean, tol);
  }
}

TEST(OutputAdaptiveSoftmax, RandomWeightsMatchTheFloat64Formula) {
  check_random_adaptive<double>(1e-12);
  check_random_adaptive<float>(2e-5);
}

TEST(OutputAdaptiveSoftmax, BadInputNamesTheArgument) {
  using A = AdaptiveWeights<float>;
  const A w(16, 10, {4, 8}, 1.0, 1, false);
  const auto build = [&](int64_t V, std::vector<int64_t> cutoffs) {
    std::vector<std::pair<MatrixRef<float>, MatrixRef<float>>> tail = {
        {{w.proj[0].data(), 4, 16}, {w.out[0].data(), 4, 4}}, {{w.proj[1].data(), 1, 16}, {w.out[1].data(), 2, 1}}};
    AdaptiveLogSoftmaxWithLoss<float>(V, cutoffs, {w.head.data(), 6, 16}, {}, tail);
  };
  expect_error([&] { build(10, {8, 4}); },
               "cutoffs[1] = 4 must be greater than cutoffs[0] = 8 (cutoffs must be increasing)");
  expect_error([&] { build(10, {4, 4}); }, "cutoffs[1] = 4 repeats cutoffs[0] (duplicates)");
  expect_error([&] { build(10, {4, 10}); }, "cutoffs[1] = 10 must be in [1, n_classes - 1] = [1, 9]");
  expect_error([&] { build(10, {0, 8}); }, "cutoffs[0] = 0 must be in [1, n_classes - 1]");
  expect_error([&] { build(10, {3, 8}); }, "head_weight must have shape (c_1 + n_clusters, d) = (5, 16), got (6, 16)");
  expect_error([&] { build(11, {4, 8}); },
               "tail_weights[1][1] (output) must have shape (c_3 - c_2, hidden) = (3, 1), got (2, 1)");
  expect_error([&] { build(10, {4}); }, "head_weight must have shape (c_1 + n_clusters, d) = (5, 16), got (6, 16)");
  const auto a = w.build();
  const std::vector<float> x(32);
  const std::vector<int64_t> target = {3, 10};
  std::vector<float> out(2);
  expect_error([&] { a.forward(x.data(), 2, target.data(), out.data()); },
               "target[1] = 10 is outside [0, n_classes) = [0, 10)");
}

// Rows are independent: any thread count gives the same bits.
TEST(OutputSoftmaxDeterminism, SameBitsForAnyThreadCount) {
  const int64_t V = 257, d = 19, N = 61;
  std::vector<int64_t> counts(V);
  for (int64_t w = 0; w < V; ++w) counts[w] = 1 + (w * 7919) % 101;
  const std::vector<float> theta = normal<float>((V - 1) * d, 11), h = normal<float>(N * d, 12);
  const auto hs = HierarchicalSoftmax<float>::from_counts(counts, theta, d);
  const AdaptiveWeights<float> w(d, V, {20, 100}, 0.5, 13, true);
  const auto a = w.build();
  std::vector<float> ref_hs(N * V), ref_a(N * V), ref_ls(N * V);
  hs.log_prob_all(h.data(), N, ref_hs.data(), 1);
  a.log_prob(h.data(), N, ref_a.data(), 1);
  log_softmax(ref_a.data(), ref_ls.data(), N, V, 1);
  for (int threads : {2, 3, 8}) {
    std::vector<float> x(N * V, NAN), y(N * V, NAN), z(N * V, NAN);  // NaN: an unwritten value shows
    hs.log_prob_all(h.data(), N, x.data(), threads);
    a.log_prob(h.data(), N, y.data(), threads);
    log_softmax(ref_a.data(), z.data(), N, V, threads);
    EXPECT_EQ(0, std::memcmp(x.data(), ref_hs.data(), x.size() * sizeof(float))) << threads;
    EXPECT_EQ(0, std::memcmp(y.data(), ref_a.data(), y.size() * sizeof(float))) << threads;
    EXPECT_EQ(0, std::memcmp(z.data(), ref_ls.data(), z.size() * sizeof(float))) << threads;
  }
}

}  // namespace
}  // namespace attn
