// Streamed row statistics (core/row_stats.hpp): summaries built piece by piece and merged in any
// order give the whole row's statistics, against the float64 measures of attn/concentration.hpp;
// and attend(..., return_stats) on the reference form against its own probabilities.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "attn/attn.hpp"
#include "attn/concentration.hpp"
#include "core/row_stats.hpp"

namespace attn::core {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Row {
  RowSummary s;
  std::vector<float> top;
  Row(RowKind kind, int32_t k) : top(static_cast<size_t>(k)) { s = RowSummary::empty(kind, k, top.data()); }
};

std::vector<double> finished(const RowSummary& r) {
  std::vector<double> v(4);
  RowSummary copy = r;
  std::vector<float> top(r.top, r.top + r.count);
  copy.top = top.data();
  copy.sort_top();
  finish(copy, v.data());
  return v;
}

// The four measures of a weight row by attn::concentration (float64), NaN entropy for signed rows.
std::vector<double> measured(const std::vector<double>& a, int64_t k) {
  bool neg = false;
  for (double x : a) neg |= x < 0;
  return {concentration::sparsity(a.data(), static_cast<int64_t>(a.size())),
          neg ? kNaN : concentration::entropy(a.data(), static_cast<int64_t>(a.size())),
          concentration::max_weight(a.data(), static_cast<int64_t>(a.size())),
          k >= static_cast<int64_t>(a.size()) ? 1.0 : concentration::topk_mass(a.data(), static_cast<int64_t>(a.size()), k)};
}

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want, double tol, const char* what) {
  for (int s = 0; s < 4; ++s) {
    if (std::isnan(want[s])) {
      EXPECT_TRUE(std::isnan(got[s])) << what << " stat " << s << " = " << got[s] << ", want NaN";
      continue;
    }
    EXPECT_NEAR(got[s], want[s], tol * std::max(1.0, std::abs(want[s]))) << what << " stat " << s;
  }
}

std::vector<float> random_scores(std::mt19937& g, int64_t n, float spread) {
  std::normal_distribution<float> d(0, spread);
  std::vector<float> s(static_cast<size_t>(n));
  for (float& x : s) x = d(g);
  return s;
}

std::vector<double> softmax_of(const std::vector<float>& s) {
  double mx = -INFINITY, sum = 0;
  for (float x : s)
    if (x > -INFINITY) mx = std::max(mx, static_cast<double>(x));
  std::vector<double> p;
  for (float x : s)
    if (x > -INFINITY) p.push_back(std::exp(x - mx)), sum += p.back();
  for (double& x : p) x /= sum;
  return p;
}

TEST(RowStats, ScoresStreamedInPiecesAndMergedEqualTheWholeRow) {
  std::mt19937 g(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(g() % 700);
    const int32_t k = 1 + static_cast<int32_t>(g() % 20);
    std::vector<float> s = random_scores(g, n, trial % 3 == 0 ? 30.0f : 2.0f);
    for (int64_t j = 0; j < n; j += 7) s[static_cast<size_t>(j)] = -INFINITY;  // hidden keys are not counted
    if (std::all_of(s.begin(), s.end(), [](float x) { return x == -INFINITY; })) s[0] = 0.5f;
    const std::vector<double> want = measured(softmax_of(s), k);

    Row whole(RowKind::softmax, k);
    stream_scores(whole.s, s.data(), n);
    expect_near_all(finished(whole.s), want, 1e-6, "whole");

    // random pieces, each its own summary, merged in a shuffled order
    std::vector<int64_t> cuts = {0, n};
    for (int c = 0; c < 5; ++c) cuts.push_back(static_cast<int64_t>(g() % (n + 1)));
    std::sort(cuts.begin(), cuts.end());
    std::vector<Row> parts;
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      parts.emplace_back(RowKind::softmax, k);
      parts.back().s.top = parts.back().top.data();
    }
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      parts[c].s.top = parts[c].top.data();
      stream_scores(parts[c].s, s.data() + cuts[c], cuts[c + 1] - cuts[c]);
    }
    std::shuffle(parts.begin(), parts.end(), g);
    Row merged(RowKind::softmax, k);
    for (Row& p : parts) {
      p.s.top = p.top.data();
      merge_into(merged.s, p.s);
    }
    expect_near_all(finished(merged.s), want, 1e-6, "merged");
    // the top k is the same multiset, so bitwise the same once sorted
    std::vector<float> a(whole.s.top, whole.s.top + whole.s.count), b(merged.s.top, merged.s.top + merged.s.count);
    std::sort(a.begin(), a.end()), std::sort(b.begin(), b.end());
    EXPECT_EQ(a, b);
  }
}

TEST(RowStats, SignedWeightsUseMagnitudesAndHaveNoEntropy) {
  std::mt19937 g(3);
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(g() % 500);
    const int32_t k = 1 + static_cast<int32_t>(g() % 12);
    std::vector<float> a = random_scores(g, n, trial % 2 ? 1.0f : 1e-20f);  // tiny rows must not underflow
    if (trial % 3 == 0)
      for (float& x : a) x = std::abs(x);
    if (trial % 5 == 0) std::fill(a.begin(), a.begin() + n / 2, 0.0f);  // zeros count in n
    std::vector<double> ad(a.begin(), a.end());
    if (std::all_of(ad.begin(), ad.end(), [](double x) { return x == 0; })) continue;
    const std::vector<double> want = measured(ad, k);
    Row merged(RowKind::direct, k);
    for (int64_t j = 0; j < n;) {  // pieces whose maximum grows and shrinks
      const int64_t len = std::min<int64_t>(n - j, 1 + static_cast<int64_t>(g() % 60));
      Row piece(RowKind::direct, k);
      stream_weights(piece.s, a.data() + j, len);
      merge_into(merged.s, piece.s);
      j += len;
    }
    expect_near_all(finished(merged.s), want, 1e-6, "direct");
    Row whole(RowKind::direct, k);
    stream_weights(whole.s, a.data(), n);
    expect_near_all(finished(whole.s), want, 1e-6, "direct whole");
  }
}

TEST(RowStats, DegenerateRows) {
  Row none(RowKind::softmax, 4);
  const float hidden[3] = {-INFINITY, -INFINITY, -INFINITY};
  stream_scores(none.s, hidden, 3);
  for (double x : finished(none.s)) EXPECT_TRUE(std::isnan(x));

  Row one(RowKind::softmax, 4);
  const float single[2] = {-INFINITY, 3.5f};
  stream_scores(one.s, single, 2);
  EXPECT_EQ(finished(one.s), (std::vector<double>{1, 0, 1, 1}));

  Row zeros(RowKind::direct, 2);
  const float z[4] = {0, 0, 0, 0};
  stream_weights(zeros.s, z, 4);
  for (double x : finished(zeros.s)) EXPECT_TRUE(std::isnan(x));

  Row nan(RowKind::direct, 2);
  const float with_nan[3] = {1, NAN, 2};
  stream_weights(nan.s, with_nan, 3);
  for (double x : finished(nan.s)) EXPECT_TRUE(std::isnan(x));

  Row uniform(RowKind::softmax, 16);  // k >= n: the top k hold the whole row, exactly 1
  const float flat[5] = {2, 2, 2, 2, 2};
  stream_scores(uniform.s, flat, 5);
  const std::vector<double> u = finished(uniform.s);
  EXPECT_DOUBLE_EQ(u[0], 1.0);
  EXPECT_NEAR(u[1], std::log(5.0), 1e-12);
  EXPECT_DOUBLE_EQ(u[3], 1.0);

  double ref[4];
  const double w[3] = {0.0, 0.0, 0.0};
  reference_row_stats(w, nullptr, 3, 2, ref);
  for (double x : ref) EXPECT_TRUE(std::isnan(x));
  reference_row_stats(w, nullptr, 0, 2, ref);
  for (double x : ref) EXPECT_TRUE(std::isnan(x));
}

TEST(RowStats, SinkKeepsSummariesForCallersThatMerge) {
  StatsSink sink(1, 2, 3, 4);
  EXPECT_TRUE(sink.keeps_summaries());
  Row r(RowKind::softmax, 4);
  const float s[6] = {1, 5, 3, 2, 4, 0};
  stream_scores(r.s, s, 6);
  sink.put(0, 1, 2, r.s);
  const RowSummary kept = sink.summary(0, 1, 2);
  ASSERT_EQ(kept.count, 4);
  EXPECT_EQ(std::vector<float>(kept.top, kept.top + 4), (std::vector<float>{5, 4, 3, 2}));
  EXPECT_EQ(kept.n, 6);
  EXPECT_EQ(sink.summary(0, 0, 0).count, 0);
  const double v[4] = {1, 2, 3, 4};
  EXPECT_THROW(sink.put_values(0, 0, 0, v), Error);
}

}  // namespace
}  // namespace attn::core

namespace attn {
namespace {

Tensor random_tensor(std::array<int64_t, 4> shape, uint32_t seed, float spread = 1.0f) {
  Tensor t(DType::f32, shape);
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0, spread);
  float* p = static_cast<float*>(t.view().data);
  for (int64_t e = 0; e < t.view().numel(); ++e) p[e] = d(g);
  return t;
}

// The statistics of the reference form against the measures of its own probabilities, for a
// family with masked keys (causal: row i sees i + M - N + 1 keys).
TEST(AttendStats, ReferenceStatsAreTheMeasuresOfItsProbabilities) {
  const Tensor q = random_tensor({1, 2, 5, 8}, 1, 2.0f), k = random_tensor({1, 2, 9, 8}, 2, 2.0f),
               v = random_tensor({1, 2, 9, 8}, 3);
  for (const char* text : {"softmax:causal", "gau", "linear:map=identity", "softmax:window=2:1"}) {
    AttendOptions o;
    o.form = "reference";
    o.return_probs = true;
    o.return_stats = true;
    o.stats_topk = 3;
    const AttendResult r = attend(q.view(), k.view(), v.view(), parse_mechanism(text), o);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 5; ++i) {
        std::vector<double> row;
        const bool causal = std::string(text).find("causal") != std::string::npos;
        const bool window = std::string(text).find("window") != std::string::npos;
        for (int64_t j = 0; j < 9; ++j) {
          const int64_t pos = i + 4;
          if (causal && j > pos) continue;
          if (window && (j < i + 4 - 2 || j > i + 4 + 1)) continue;
          row.push_back(r.probs.at(0, h, i, j));
        }
        bool neg = false;
        for (double x : row) neg |= x < 0;
        const int64_t n = static_cast<int64_t>(row.size());
        EXPECT_NEAR(r.sparsity.at(0, h, i, 0), concentration::sparsity(row.data(), n), 1e-6) << text;
        if (neg)
          EXPECT_TRUE(std::isnan(r.entropy.at(0, h, i, 0))) << text;
        else
          EXPECT_NEAR(r.entropy.at(0, h, i, 0), concentration::entropy(row.data(), n), 1e-6) << text;
        EXPECT_NEAR(r.max_weight.at(0, h, i, 0), concentration::max_weight(row.data(), n), 1e-6) << text;
        EXPECT_NEAR(r.topk_mass.at(0, h, i, 0), concentration::topk_mass(row.data(), n, 3), 1e-6) << text;
      }
  }
}

TEST(AttendStats, BadStatsViewsAndCallsAreErrors) {
  const Tensor q = random_tensor({1, 2, 5, 8}, 1), k = random_tensor({1, 2, 9, 8}, 2), v = random_tensor({1, 2, 9, 8}, 3);
  Tensor out(DType::f32, {1, 2, 5, 8}), good(DType::f32, {1, 2, 5, 1}), wide(DType::f32, {1, 2, 6, 1}),
      half(DType::f16, {1, 2, 5, 1});
  AttendOptions o;
  o.form = "reference";
  const RowStatsViews wrong_shape{good.view(), good.view(), wide.view(), good.view()};
  try {
    attend_into(q.view(), k.view(), v.view(), Softmax{}, o, out.view(), nullptr, nullptr, nullptr, &wrong_shape);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_weight"), std::string::npos) << e.what();
  }
  const RowStatsViews wrong_dtype{good.view(), half.view(), good.view(), good.view()};
  EXPECT_THROW(attend_into(q.view(), k.view(), v.view(), Softmax{}, o, out.view(), nullptr, nullptr, nullptr, &wrong_dtype),
               Error);
  AttendOptions with_stats;
  with_stats.return_stats = true, with_stats.stats_topk = 0;
  EXPECT_THROW(attend(q.view(), k.view(), v.view(), parse_mechanism("efficient"), with_stats), Error);
}

// A linear row whose normaliser is negative (relu features, so every w_ij >= 0, against an
// initial state with negative sums) applies negative weights: entropy NaN, the other three those
// of |a|, in the fast forms' second pass as in the reference.
TEST(AttendStats, NegativeNormaliserFlipsLinearRows) {
  const Tensor q = random_tensor({1, 2, 5, 8}, 1), k = random_tensor({1, 2, 9, 8}, 2), v = random_tensor({1, 2, 9, 8}, 3);
  std::vector<float> state(2 * 8 * 9, 0.0f);
  for (size_t e = 8; e < state.size(); e += 9) state[e] = -50.0f;  // z, the last column
  AttendOptions o;
  o.return_stats = true, o.stats_topk = 2;
  o.params["initial_state"] = make_array_view(state.data(), DType::f32, {1, 2, 8, 9});
  const Mechanism m = parse_mechanism("linear:map=relu");
  const AttendResult fast = attend(q.view(), k.view(), v.view(), m, o);
  o.form = "reference";
  const AttendResult ref = attend(q.view(), k.view(), v.view(), m, o);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 5; ++i) {
      EXPECT_TRUE(std::isnan(fast.entropy.at(0, h, i, 0))) << h << " " << i;
      EXPECT_TRUE(std::isnan(ref.entropy.at(0, h, i, 0))) << h << " " << i;
      EXPECT_NEAR(fast.sparsity.at(0, h, i, 0), ref.sparsity.at(0, h, i, 0), 1e-5) << h << " " << i;
      EXPECT_NEAR(fast.max_weight.at(0, h, i, 0), ref.max_weight.at(0, h, i, 0), 1e-5) << h << " " << i;
      EXPECT_NEAR(fast.topk_mass.at(0, h, i, 0), ref.topk_mass.at(0, h, i, 0), 1e-5) << h << " " << i;
    }
}

}  // namespace
}  // namespace attn
