// The tile primitives of every ISA against plain loops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "base/aligned_buffer.hpp"
#include "attn/isa.hpp"
#include "kernels/bf16_tiles.hpp"
#include "kernels/kernel_table.hpp"

namespace attn::kernels {
namespace {

constexpr int L = kQueryTile;

TEST(TileKernels, QkAndPvMatchLoops) {
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (Isa isa : supported_isas())
    for (int64_t dim : {1, 5, 6, 7, 13, 64})
      for (int64_t bc : {1, 5, 6, 7, 64}) {
        const TileKernels& k = kernels_for(isa);
        AlignedFloats qt(dim * L), st(bc * L), ot(dim * L), alpha(L);
        std::vector<float> keys(bc * (dim + 3)), vals(bc * (dim + 3));
        for (int64_t i = 0; i < dim * L; ++i) qt.data()[i] = d(rng), ot.data()[i] = d(rng);
        for (auto& x : keys) x = d(rng);
        for (auto& x : vals) x = d(rng);
        for (int i = 0; i < L; ++i) alpha.data()[i] = 0.5f + i / 128.0f;
        k.qk(qt.data(), dim, keys.data(), dim + 3, bc, st.data(), 0, 64);
        for (int64_t j = 0; j < bc; ++j)
          for (int i = 0; i < L; ++i) {
            double s = 0;
            for (int64_t c = 0; c < dim; ++c) s += double(keys[j * (dim + 3) + c]) * qt.data()[c * L + i];
            ASSERT_NEAR(st.data()[j * L + i], s, 1e-4) << isa_name(isa) << " j" << j << " i" << i;
          }
        std::vector<float> ot0(ot.data(), ot.data() + dim * L);
        k.pv(st.data(), bc, vals.data(), dim + 3, dim, ot.data(), alpha.data(), 0, 64);
        for (int64_t c = 0; c < dim; ++c)
          for (int i = 0; i < L; ++i) {
            double s = double(ot0[c * L + i]) * alpha.data()[i];
            for (int64_t j = 0; j < bc; ++j) s += double(vals[j * (dim + 3) + c]) * st.data()[j * L + i];
            ASSERT_NEAR(ot.data()[c * L + i], s, 1e-3) << isa_name(isa) << " c" << c << " i" << i;
          }
      }
}

TEST(TileKernels, ExpAndTanhAccuracy) {
  for (Isa isa : supported_isas()) {
    const TileKernels& k = kernels_for(isa);
    AlignedFloats x(64 * L), sub(L);
    std::vector<double> want(64 * L);
    for (int64_t i = 0; i < 64 * L; ++i) {
      x.data()[i] = -87.0f + 95.0f * static_cast<float>(i) / (64 * L);
      want[i] = std::exp(static_cast<double>(x.data()[i]));
    }
    k.exp_rows(x.data(), 64 * L, sub.data());
    for (int64_t i = 0; i < 64 * L; ++i)
      ASSERT_NEAR(x.data()[i] / want[i], 1.0, 4e-7) << isa_name(isa) << " at " << i;
    // special values: -inf -> 0, huge negative -> 0, NaN stays NaN.
    // Regression: the first AVX-512 exp returned 2^-127 for -inf (scalef does not flush), so a
    // row that saw no key summed to l > 0 and returned a nonzero output instead of zeros.
    x.data()[0] = -INFINITY, x.data()[1] = -1000.0f, x.data()[2] = NAN, x.data()[3] = 0.0f;
    k.exp_rows(x.data(), L, sub.data());
    EXPECT_EQ(x.data()[0], 0.0f);
    EXPECT_EQ(x.data()[1], 0.0f);
    EXPECT_TRUE(std::isnan(x.data()[2]));
    EXPECT_EQ(x.data()[3], 1.0f);

    AlignedFloats tb(4001);  // tiles are 64-byte aligned; an odd length exercises the tail
    float* t = tb.data();
    for (size_t i = 0; i < 4001; ++i) t[i] = -20.0f + 40.0f * static_cast<float>(i) / 4000.0f;
    std::vector<float> t0(t, t + 4001);
    k.softcap(t, 4001, 2.0f);
    for (size_t i = 0; i < 4001; ++i) {
      const double w = 2.0 * std::tanh(t0[i] / 2.0);
      ASSERT_NEAR(t[i], w, 3e-7 * std::max(1e-3, std::abs(w)) + 1e-9) << isa_name(isa) << " x=" << t0[i];
    }
  }
}

TEST(TileKernels, SoftmaxUpdateMasksAndRescales) {
  for (Isa isa : supported_isas()) {
    const TileKernels& k = kernels_for(isa);
    AlignedFloats st(3 * L), m(L), l(L), alpha(L);
    for (int i = 0; i < L; ++i) {
      m.data()[i] = i == 0 ? -INFINITY : 1.0f;
      l.data()[i] = i == 0 ? 0.0f : 2.0f;
      for (int j = 0; j < 3; ++j) st.data()[j * L + i] = (i == 0) ? -INFINITY : float(j);
    }
    k.softmax_update(st.data(), 3, m.data(), l.data(), alpha.data(), 0, 64);
    // lane 0 saw only -inf: stays empty, no NaN
    EXPECT_EQ(m.data()[0], -INFINITY);
    EXPECT_EQ(l.data()[0], 0.0f);
    EXPECT_EQ(alpha.data()[0], 0.0f);
    EXPECT_EQ(st.data()[0], 0.0f);
    // lane 1: old max 1, new max 2: alpha = e^-1, l = 2e^-1 + e^-2 + e^-1 + 1
    EXPECT_NEAR(m.data()[1], 2.0f, 0);
    EXPECT_NEAR(alpha.data()[1], std::exp(-1.0), 1e-6);
    EXPECT_NEAR(l.data()[1], 3 * std::exp(-1.0) + std::exp(-2.0) + 1, 1e-6);
  }
}

}  // namespace
}  // namespace attn::kernels

namespace attn::kernels {
namespace {

// Vector conversions round exactly like the scalar ones (nearest even, NaN stays NaN, inf, ties,
// subnormals), both ways, with unit and non-unit strides.
TEST(TileKernels, ConversionsMatchScalarRounding) {
  std::vector<float> src;
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 4000; ++i) {
    const uint32_t u = bits(rng);
    float x;
    std::memcpy(&x, &u, 4);
    src.push_back(x);
  }
  for (float x : {0.0f, -0.0f, 1.0f + std::ldexp(1.0f, -8), 65504.0f, 65520.0f, 1e-7f, 6e-8f, INFINITY, -INFINITY, NAN})
    src.push_back(x);
  const auto n = static_cast<int64_t>(src.size());
  for (Isa isa : supported_isas())
    for (DType dt : {DType::bf16, DType::f16, DType::f32})
      for (int64_t stride : {1, 3}) {
        const TileKernels& k = kernels_for(isa);
        std::vector<uint8_t> got(static_cast<size_t>(n * stride * 4)), want(got.size());
        k.from_float(src.data(), dt, stride, n, got.data());
        for (int64_t c = 0; c < n; ++c) store_from_float(want.data(), dt, c * stride, src[c]);
        ASSERT_EQ(got, want) << isa_name(isa) << " " << dtype_name(dt) << " stride " << stride;
        std::vector<float> back(static_cast<size_t>(n)), back_want(static_cast<size_t>(n));
        k.to_float(got.data(), dt, stride, n, back.data());
        for (int64_t c = 0; c < n; ++c) back_want[c] = load_as_float(got.data(), dt, c * stride);
        ASSERT_EQ(std::memcmp(back.data(), back_want.data(), back.size() * 4), 0) << isa_name(isa);
      }
}

// The transposes between query rows and lane-major tiles, on every ISA, for every count of
// queries and head dims that are and are not multiples of the vector width: exact products.
TEST(TileKernels, PackAndUnpackAreScaledTransposes) {
  std::mt19937 rng(4);
  std::normal_distribution<float> g;
  for (Isa isa : supported_isas())
    for (int n : {1, 7, 16, 33, 63, 64})
      for (int64_t d : {1, 5, 8, 16, 24, 64, 80}) {
        const TileKernels& k = kernels_for(isa);
        const int64_t stride = d + 3;
        std::vector<float> src(static_cast<size_t>(64 * stride));
        for (float& x : src) x = g(rng);
        AlignedFloats scale(64), qt(static_cast<size_t>(d * 64));
        for (int i = 0; i < 64; ++i) scale.data()[i] = g(rng);
        std::fill(qt.data(), qt.data() + d * 64, NAN);
        k.pack_qt(src.data(), stride, n, d, scale.data(), qt.data());
        for (int64_t c = 0; c < d; ++c)
          for (int i = 0; i < 64; ++i)
            ASSERT_EQ(qt.data()[c * 64 + i], i < n ? src[static_cast<size_t>(i * stride + c)] * scale.data()[i] : 0.0f)
                << isa_name(isa) << " n " << n << " d " << d << " c " << c << " i " << i;
        std::vector<float> out(static_cast<size_t>(64 * stride), -7.0f);
        k.unpack_ot(qt.data(), d, scale.data(), n, out.data(), stride);
        for (int i = 0; i < 64; ++i)
          for (int64_t c = 0; c < stride; ++c)
            ASSERT_EQ(out[static_cast<size_t>(i * stride + c)],
                      i < n && c < d ? qt.data()[c * 64 + i] * scale.data()[i] : -7.0f)
                << isa_name(isa) << " n " << n << " d " << d << " c " << c << " i " << i;
      }
}

TEST(TileKernels, GemmMatchesLoopsInBothOrientations) {
  std::mt19937 rng(21);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (Isa isa : supported_isas())
    for (auto [m, n, kk] : {std::tuple{1, 1, 1}, {7, 13, 5}, {6, 64, 128}, {17, 150, 33}, {64, 129, 64}})
      for (bool transposed : {false, true})
        for (bool accumulate : {false, true}) {
          const TileKernels& k = kernels_for(isa);
          const int64_t lda = transposed ? m + 3 : kk + 2, ldb = n + 5, ldc = n + 1;
          std::vector<float> a(static_cast<size_t>((transposed ? kk : m) * lda)), b(static_cast<size_t>(kk * ldb)),
              c(static_cast<size_t>(m * ldc));
          for (float& x : a) x = d(rng);
          for (float& x : b) x = d(rng);
          for (float& x : c) x = d(rng);
          std::vector<double> want(c.begin(), c.end());
          auto at = [&](int64_t i, int64_t p) { return transposed ? a[static_cast<size_t>(p * lda + i)] : a[static_cast<size_t>(i * lda + p)]; };
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              double acc = accumulate ? c[static_cast<size_t>(i * ldc + j)] : 0.0;
              for (int64_t p = 0; p < kk; ++p) acc += static_cast<double>(at(i, p)) * b[static_cast<size_t>(p * ldb + j)];
              want[static_cast<size_t>(i * ldc + j)] = acc;
            }
          if (transposed)
            k.gemm(m, n, kk, a.data(), 1, lda, b.data(), ldb, c.data(), ldc, accumulate);
          else
            k.gemm(m, n, kk, a.data(), lda, 1, b.data(), ldb, c.data(), ldc, accumulate);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < ldc; ++j)  // the columns past n are left as they were
              ASSERT_NEAR(c[static_cast<size_t>(i * ldc + j)], want[static_cast<size_t>(i * ldc + j)],
                          1e-5 * (1 + std::sqrt(static_cast<double>(kk))) * 4)
                  << isa_name(isa) << " " << m << "x" << n << "x" << kk << (transposed ? " At" : "") << " " << i << "," << j;
        }
}

TEST(TileKernels, SquaredReluRows) {
  for (Isa isa : supported_isas()) {
    const TileKernels& k = kernels_for(isa);
    std::vector<float> x(37);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.25f - 4.0f;
    std::vector<float> y = x;
    k.relu2_rows(y.data(), 37, 0.5f, 0.75f, 0.1f);
    for (size_t i = 0; i < x.size(); ++i) {
      const float r = std::max(x[i] * 0.5f + 0.75f, 0.0f);
      EXPECT_FLOAT_EQ(y[i], r * r * 0.1f) << isa_name(isa) << " " << i;
    }
  }
}

// silu_gate, gelu_tanh_gate: act(x) * u against float64 on every ISA, over [-30, 30] (both
// tanh branches, silu's saturation), 203 values (vectors and a tail); non-finite inputs stay so.
TEST(TileKernels, GatedActivationsAgainstFloat64) {
  const int n = 203;
  std::vector<float> x(n), up(n);
  for (int i = 0; i < n; ++i) x[i] = -30.0f + 60.0f * static_cast<float>(i) / (n - 1), up[i] = 0.5f + 0.01f * i;
  x[7] = 0.3f, x[8] = -0.49f, x[9] = 1e-20f;  // the small-|x| tanh series
  for (Isa isa : supported_isas()) {
    const TileKernels& k = kernels_for(isa);
    for (bool gelu : {false, true}) {
      std::vector<float> y = x;
      (gelu ? k.gelu_tanh_gate : k.silu_gate)(y.data(), up.data(), n);
      for (int i = 0; i < n; ++i) {
        const double v = x[i];
        const double act = gelu ? 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)))
                                : v / (1 + std::exp(-v));
        const double want = act * up[i];
        // float32 evaluation: a few ulps of the result plus the tanh/exp argument's rounding
        EXPECT_NEAR(y[i], want, 4e-7 * (std::abs(v) * up[i]) + 1e-30)
            << isa_name(isa) << (gelu ? " gelu" : " silu") << " x=" << x[i];
      }
      std::vector<float> bad = {NAN, INFINITY, NAN, NAN};
      const std::vector<float> u4 = {1, 1, 1, 1};
      (gelu ? k.gelu_tanh_gate : k.silu_gate)(bad.data(), u4.data(), 4);
      EXPECT_TRUE(std::isnan(bad[0])) << isa_name(isa);
      EXPECT_EQ(bad[1], INFINITY) << isa_name(isa);
    }
  }
}

}  // namespace
}  // namespace attn::kernels

// ---- streamed row statistics (docs/plans/streamed-statistics.md, step 2) ----------------------
namespace attn::kernels {
namespace {

constexpr float kNegInf = -INFINITY;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// |got - want| within rel of the sum of the terms' magnitudes plus an absolute floor.
::testing::AssertionResult near_sum(double got, double want, double mag, double rel = 1e-5, double abs = 1e-6) {
  if (std::abs(got - want) <= rel * mag + abs) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << got << " want " << want << " (|terms| " << mag << ")";
}

// softmax_update_stats over a sequence of tiles: St, m, l, alpha bitwise as softmax_update's; a2, e
// against double sums over every score seen so far relative to the final m; cnt exact; lanes
// outside [lo, hi) untouched. Lanes: 0 mod 8 all -inf, 1 mod 8 -inf for the first calls, the rest
// normal scores with masked keys, scores far below the max (x < -87 and x in the pz cut), and a
// per-call offset so the maxima grow, stay and shrink.
TEST(TileKernels, SoftmaxUpdateStatsMatchesPlainAndDouble) {
  std::mt19937 rng(31);
  std::normal_distribution<float> g(0.0f, 2.0f);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  const std::vector<std::pair<int, int>> ranges = {{0, 64}, {16, 48}, {48, 64}, {0, 16}, {32, 64}};
  const std::vector<int64_t> bcs = {1, 5, 64, 17, 3, 64, 33, 2};
  const std::vector<float> offsets = {0.0f, 3.0f, 3.0f, -2.0f, 12.0f, -40.0f, 1.0f, 60.0f};
  constexpr float kSentinel = 12345.0f;
  for (Isa isa : supported_isas())
    for (auto [lo, hi] : ranges) {
      const TileKernels& k = kernels_for(isa);
      AlignedFloats st(64 * L), st2(64 * L), m(L), l(L), alpha(L), m2(L), l2(L), alpha2(L), a2(L), e(L), cnt(L);
      for (int i = 0; i < L; ++i) {
        const bool in = lo <= i && i < hi;
        m.data()[i] = m2.data()[i] = in ? kNegInf : kSentinel;
        l.data()[i] = l2.data()[i] = in ? 0.0f : kSentinel;
        alpha.data()[i] = alpha2.data()[i] = kSentinel;
        a2.data()[i] = in ? 0.0f : kSentinel;
        e.data()[i] = in ? 0.0f : kSentinel;
        cnt.data()[i] = kSentinel;
      }
      std::vector<std::vector<float>> seen(L);  // finite scores per lane so far
      for (size_t call = 0; call < bcs.size(); ++call) {
        const int64_t bc = bcs[call];
        std::vector<int> want_cnt(L, 0);
        for (int64_t j = 0; j < bc; ++j)
          for (int i = 0; i < L; ++i) {
            float s = g(rng) + offsets[call];
            const float r = u01(rng);
            if (i % 8 == 0 || (i % 8 == 1 && call < 3) || r < 0.15f) s = kNegInf;
            else if (r < 0.25f) s = offsets[call] - 95.0f;  // x < -87: p = 0
            else if (r < 0.32f) s = offsets[call] - 60.0f;  // in the pz cut: p > 0, pz = 0
            st.data()[j * L + i] = st2.data()[j * L + i] = s;
            if (lo <= i && i < hi && s > kNegInf) seen[i].push_back(s), ++want_cnt[i];
          }
        k.softmax_update(st2.data(), bc, m2.data(), l2.data(), alpha2.data(), lo, hi);
        k.softmax_update_stats(st.data(), bc, m.data(), l.data(), alpha.data(), a2.data(), e.data(), cnt.data(), lo, hi);
        const std::string at = isa_name(isa) + " lanes [" + std::to_string(lo) + "," + std::to_string(hi) + ") call " +
                               std::to_string(call);
        for (int i = lo; i < hi; ++i)
          for (int64_t j = 0; j < bc; ++j)
            ASSERT_TRUE(same_bits(st.data()[j * L + i], st2.data()[j * L + i])) << at << " St " << j << "," << i;
        for (int i = 0; i < L; ++i) {
          ASSERT_TRUE(same_bits(m.data()[i], m2.data()[i])) << at << " m lane " << i;
          ASSERT_TRUE(same_bits(l.data()[i], l2.data()[i])) << at << " l lane " << i;
          ASSERT_TRUE(same_bits(alpha.data()[i], alpha2.data()[i])) << at << " alpha lane " << i;
          if (i < lo || i >= hi) {
            ASSERT_EQ(a2.data()[i], kSentinel) << at << " lane " << i;
            ASSERT_EQ(e.data()[i], kSentinel) << at << " lane " << i;
            ASSERT_EQ(cnt.data()[i], kSentinel) << at << " lane " << i;
            ASSERT_EQ(m.data()[i], kSentinel) << at << " lane " << i;
            continue;
          }
          ASSERT_EQ(cnt.data()[i], static_cast<float>(want_cnt[i])) << at << " lane " << i;
          if (seen[i].empty()) {  // no term yet: everything stays empty and finite
            ASSERT_EQ(m.data()[i], kNegInf) << at << " lane " << i;
            ASSERT_EQ(l.data()[i], 0.0f) << at << " lane " << i;
            ASSERT_EQ(a2.data()[i], 0.0f) << at << " lane " << i;
            ASSERT_EQ(e.data()[i], 0.0f) << at << " lane " << i;
            continue;
          }
          const double mf = m.data()[i];
          double q = 0, t = 0, sum = 0;
          for (float s : seen[i]) {
            const double x = s - mf, p = std::exp(x);
            q += p * p, t += p * x, sum += p;
          }
          ASSERT_TRUE(near_sum(l.data()[i], sum, sum)) << at << " l lane " << i;
          ASSERT_TRUE(near_sum(a2.data()[i], q, q)) << at << " a2 lane " << i;
          ASSERT_TRUE(near_sum(e.data()[i], t, std::abs(t))) << at << " e lane " << i;
        }
      }
    }
}

// One call from an empty state with whole -inf lanes and a first tile whose maximum is far below
// a later one: alpha^2 underflows (the old a2 is dropped), e stays finite.
TEST(TileKernels, SoftmaxUpdateStatsEmptyLanesAndHugeJumps) {
  for (Isa isa : supported_isas()) {
    const TileKernels& k = kernels_for(isa);
    AlignedFloats st(2 * L), m(L), l(L), alpha(L), a2(L), e(L), cnt(L);
    for (int i = 0; i < L; ++i) m.data()[i] = kNegInf;
    for (int i = 0; i < L; ++i) st.data()[i] = i < 16 ? kNegInf : 0.0f, st.data()[L + i] = i < 16 ? kNegInf : -1.0f;
    k.softmax_update_stats(st.data(), 2, m.data(), l.data(), alpha.data(), a2.data(), e.data(), cnt.data(), 0, 64);
    for (int i = 0; i < L; ++i) {
      if (i < 16) {
        EXPECT_EQ(m.data()[i], kNegInf);
        EXPECT_EQ(l.data()[i], 0.0f);
        EXPECT_EQ(alpha.data()[i], 0.0f);
        EXPECT_EQ(a2.data()[i], 0.0f);
        EXPECT_EQ(e.data()[i], 0.0f);
        EXPECT_EQ(cnt.data()[i], 0.0f);
      } else {
        EXPECT_NEAR(a2.data()[i], 1 + std::exp(-2.0), 1e-6) << isa_name(isa);
        EXPECT_NEAR(e.data()[i], -std::exp(-1.0), 1e-6) << isa_name(isa);
        EXPECT_EQ(cnt.data()[i], 2.0f);
      }
    }
    // a new maximum 100 above: alpha = e^-100 -> 0, the old terms vanish
    for (int i = 0; i < L; ++i) st.data()[i] = i < 16 ? kNegInf : 100.0f;
    k.softmax_update_stats(st.data(), 1, m.data(), l.data(), alpha.data(), a2.data(), e.data(), cnt.data(), 0, 64);
    for (int i = 16; i < L; ++i) {
      EXPECT_EQ(a2.data()[i], 1.0f) << isa_name(isa);
      EXPECT_TRUE(std::isfinite(e.data()[i]) && std::abs(e.data()[i]) < 1e-30f) << isa_name(isa) << " " << e.data()[i];
      EXPECT_EQ(l.data()[i], 1.0f);
    }
    // a NaN score: softmax_update's St/m/l unchanged by stats; stats may be NaN in that lane only
    for (int i = 0; i < L; ++i) st.data()[i] = i == 20 ? NAN : 99.0f;
    k.softmax_update_stats(st.data(), 1, m.data(), l.data(), alpha.data(), a2.data(), e.data(), cnt.data(), 0, 64);
    for (int i = 17; i < L; ++i)
      if (i != 20) EXPECT_TRUE(std::isfinite(e.data()[i]) && std::isfinite(a2.data()[i])) << isa_name(isa) << " " << i;
    EXPECT_EQ(cnt.data()[20], 0.0f);
  }
}

TEST(TileKernels, AboveBitsMatchLoop) {
  std::mt19937 rng(32);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  const std::vector<std::pair<int, int>> ranges = {{0, 64}, {16, 48}, {48, 64}, {0, 16}, {16, 32}};
  for (Isa isa : supported_isas())
    for (int64_t bc : {1, 2, 7, 16, 33, 64})
      for (auto [lo, hi] : ranges) {
        const TileKernels& k = kernels_for(isa);
        AlignedFloats st(bc * L), thr(L);
        for (int i = 0; i < L; ++i) thr.data()[i] = i % 5 == 0 ? kNegInf : g(rng);
        for (int64_t j = 0; j < bc; ++j)
          for (int i = 0; i < L; ++i) {
            const float r = u01(rng);
            st.data()[j * L + i] = r < 0.1f ? kNegInf : r < 0.15f ? NAN : r < 0.2f ? thr.data()[i] : g(rng);
          }
        std::vector<uint64_t> bits(bc + 1, 0xdeadbeefdeadbeefull);
        k.above_bits(st.data(), bc, thr.data(), lo, hi, bits.data());
        for (int64_t j = 0; j < bc; ++j) {
          uint64_t want = 0;
          for (int i = lo; i < hi; ++i) want |= static_cast<uint64_t>(st.data()[j * L + i] > thr.data()[i]) << i;
          ASSERT_EQ(bits[j], want) << isa_name(isa) << " bc " << bc << " [" << lo << "," << hi << ") j " << j;
        }
        ASSERT_EQ(bits[bc], 0xdeadbeefdeadbeefull) << "wrote past bc";
      }
}

// topk_lanes keeps, per lane, exactly the k largest scores seen (a multiset: ties and -inf
// included), in descending order, over several calls and lane ranges.
TEST(TileKernels, TopkLanesKeepTheLargestScoresPerLane) {
  std::mt19937 rng(34);
  std::normal_distribution<float> g(0.0f, 2.0f);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  for (Isa isa : supported_isas())
    for (int k : {1, 3, 8, 16})
      for (auto [lo, hi] : std::vector<std::pair<int, int>>{{0, 64}, {16, 48}}) {
        const TileKernels& kern = kernels_for(isa);
        AlignedFloats list(static_cast<size_t>(k * L));
        std::fill(list.data(), list.data() + k * L, kNegInf);
        std::vector<std::vector<float>> seen(L);
        for (int call = 0; call < 4; ++call) {
          const int64_t bc = call == 0 ? 3 : 40 + call;  // a first call shorter than k
          AlignedFloats st(bc * L);
          for (int64_t j = 0; j < bc; ++j)
            for (int i = 0; i < L; ++i) {
              const float r = u01(rng);
              float x = r < 0.2f ? kNegInf : r < 0.3f ? 1.5f : g(rng);  // hidden keys, ties
              if (call == 3) x += 3.0f;                                 // a later call with larger scores
              st.data()[j * L + i] = x;
              if (i >= lo && i < hi) seen[i].push_back(x);
            }
          kern.topk_lanes(st.data(), bc, list.data(), k, lo, hi);
        }
        for (int i = 0; i < L; ++i) {
          std::vector<float> want = seen[i];
          std::sort(want.begin(), want.end(), std::greater<>());
          want.resize(static_cast<size_t>(k), kNegInf);
          for (int t = 0; t < k; ++t) {
            const float got = list.data()[t * L + i];
            const float expect = i >= lo && i < hi ? want[static_cast<size_t>(t)] : kNegInf;  // other lanes untouched
            ASSERT_EQ(got, expect) << isa_name(isa) << " k " << k << " lane " << i << " slot " << t;
          }
        }
      }
}

TEST(TileKernels, ExpShiftStatsMatchesSumAndDouble) {
  std::mt19937 rng(33);
  std::normal_distribution<float> g(0.0f, 3.0f);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  for (Isa isa : supported_isas())
    for (int64_t n : {0, 1, 7, 8, 15, 16, 17, 33, 100, 1003})
      for (float lift : {0.0f, 2.5f}) {
        const TileKernels& k = kernels_for(isa);
        std::vector<float> x(static_cast<size_t>(n) + 1);  // x.data() + 1: unaligned
        float mx = kNegInf;
        for (int64_t i = 1; i <= n; ++i) {
          const float r = u01(rng);
          x[i] = r < 0.15f ? kNegInf : r < 0.22f ? -100.0f : r < 0.28f ? -60.0f : g(rng);
          mx = std::max(mx, x[i]);
        }
        if (n > 0 && mx == kNegInf) x[1] = mx = 0.5f;
        const float sub = n == 0 ? 0.0f : mx + lift;
        std::vector<float> y = x, z = x;
        const float total = k.exp_shift_sum(y.data() + 1, n, sub);
        float out[4] = {-1, -1, -1, -1};
        k.exp_shift_stats(z.data() + 1, n, sub, out);
        const std::string at = isa_name(isa) + " n " + std::to_string(n) + " lift " + std::to_string(lift);
        ASSERT_TRUE(same_bits(out[0], total)) << at << ": " << out[0] << " vs " << total;
        ASSERT_EQ(std::memcmp(y.data(), z.data(), y.size() * 4), 0) << at;
        double q = 0, t = 0;
        int cnt = 0;
        for (int64_t i = 1; i <= n; ++i) {
          if (x[i] == kNegInf) continue;
          ++cnt;
          const double d = static_cast<double>(x[i]) - sub, p = std::exp(d);
          q += p * p, t += p * d;
        }
        EXPECT_EQ(out[3], static_cast<float>(cnt)) << at;
        EXPECT_TRUE(near_sum(out[1], q, q)) << at << " a2";
        EXPECT_TRUE(near_sum(out[2], t, std::abs(t))) << at << " e";
      }
}

// row_max equals a plain loop's maximum exactly, at every length around the vector widths,
// from an unaligned start, with -inf entries, an init above or below the row, and reports a NaN
// wherever it sits (the first element, a vector's middle, the scalar tail).
TEST(TileKernels, RowMaxIsExactAndFlagsNaN) {
  std::mt19937 rng(35);
  std::normal_distribution<float> g(0.0f, 3.0f);
  for (Isa isa : supported_isas())
    for (int64_t n : {0, 1, 7, 15, 16, 17, 31, 32, 33, 47, 64, 100, 257})
      for (float init : {kNegInf, 0.25f, 100.0f})
        for (int64_t nan_at : {int64_t{-1}, int64_t{0}, n / 2, n - 1}) {
          if (n == 0 && nan_at >= 0) continue;
          std::vector<float> x(static_cast<size_t>(n + 1));
          for (float& v : x) v = g(rng);
          for (int64_t i = 1; i <= n; i += 5) x[static_cast<size_t>(i)] = kNegInf;
          if (nan_at >= 0) x[static_cast<size_t>(nan_at + 1)] = std::numeric_limits<float>::quiet_NaN();
          float want = init;
          for (int64_t i = 1; i <= n; ++i)
            if (x[static_cast<size_t>(i)] > want) want = x[static_cast<size_t>(i)];
          bool nan = nan_at < 0;  // the opposite of what is expected: the kernel must set it
          const float got = kernels_for(isa).row_max(x.data() + 1, n, init, &nan);
          const std::string at = isa_name(isa) + " n " + std::to_string(n) + " init " + std::to_string(init) +
                                 " nan at " + std::to_string(nan_at);
          EXPECT_EQ(nan, nan_at >= 0) << at;
          if (nan_at < 0) EXPECT_TRUE(same_bits(got, want)) << at << ": " << got << " vs " << want;
        }
}

// A row of direct weights in random pieces: the first all zeros, then regions whose magnitude
// grows and shrinks, signed or not; a1, a2, e against double sums relative to the final max;
// candidate bits of each piece exact.
TEST(TileKernels, WeightRowStatsInPiecesMatchesDouble) {
  std::mt19937 rng(34);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  for (Isa isa : supported_isas())
    for (int64_t n : {0, 1, 2, 15, 16, 17, 63, 64, 65, 200, 1000, 4099})
      for (int variant = 0; variant < 4; ++variant) {  // 0: >= 0, 1: signed, 2: signed + zeros, 3: a NaN
        const TileKernels& k = kernels_for(isa);
        std::vector<float> a(static_cast<size_t>(n));
        const int64_t zeros = n / 7;  // a leading run of zeros
        for (int64_t i = 0; i < n; ++i) {
          const double pos = static_cast<double>(i) / std::max<int64_t>(n, 1);
          const float scale = static_cast<float>(std::exp(6.0 * std::sin(9.0 * pos)));  // grows and shrinks
          float v = i < zeros ? 0.0f : g(rng) * scale;
          if (variant == 0) v = std::fabs(v) * std::fabs(v);
          if (variant == 2 && u01(rng) < 0.3f) v = 0.0f;
          a[i] = v;
        }
        if (variant == 3 && n > 0) a[n / 2] = NAN;
        std::vector<float> mags(a.size());
        for (size_t i = 0; i < a.size(); ++i) mags[i] = std::fabs(a[i]);
        std::vector<float> sorted = mags;
        std::sort(sorted.begin(), sorted.end());
        WeightRowAcc acc;
        acc.thr = n > 0 && variant != 3 ? sorted[static_cast<size_t>(n * 3 / 4)] : 0.0f;
        const std::string at = isa_name(isa) + " n " + std::to_string(n) + " variant " + std::to_string(variant);
        int64_t i0 = 0;
        while (i0 < n || (n == 0 && i0 == 0)) {
          int64_t len = i0 == 0 && zeros > 0 ? zeros : 1 + static_cast<int64_t>(u01(rng) * 150);
          len = std::min(len, n - i0);
          const int64_t words = (len + 63) / 64;
          std::vector<uint64_t> cand(static_cast<size_t>(words) + 1, 0xabababababababab);
          k.weight_row_stats(a.data() + i0, len, acc, cand.data());
          for (int64_t w = 0; w < words; ++w) {
            uint64_t want = 0;
            for (int64_t j = w * 64; j < std::min(len, w * 64 + 64); ++j)
              want |= static_cast<uint64_t>(mags[i0 + j] > acc.thr) << (j - w * 64);
            ASSERT_EQ(cand[w], want) << at << " piece at " << i0 << " word " << w;
          }
          ASSERT_EQ(cand[words], 0xabababababababab) << at << " wrote past the words";
          if (n == 0) break;
          i0 += len;
        }
        bool neg = false, pos = false, nan = false;
        float c = 0;
        for (float v : a) {
          neg |= v < 0, pos |= v > 0, nan |= std::isnan(v);
          if (std::fabs(v) > c) c = std::fabs(v);
        }
        EXPECT_EQ(acc.neg, neg) << at;
        EXPECT_EQ(acc.pos, pos) << at;
        EXPECT_EQ(acc.nan, nan) << at;
        EXPECT_EQ(acc.c, c) << at;
        if (nan) {  // a NaN after a nonzero value makes the sums NaN (a row of NaN alone keeps c = 0)
          if (c > 0) EXPECT_TRUE(std::isnan(acc.a1) && std::isnan(acc.a2)) << at;
          continue;
        }
        double a1 = 0, a2 = 0, e = 0;
        for (float v : a) {
          const double u = std::fabs(static_cast<double>(v)) / c;
          a1 += u, a2 += u * u, e += u > 0 ? u * std::log(u) : 0.0;
        }
        if (c == 0) {
          EXPECT_EQ(acc.a1, 0.0f) << at;
          EXPECT_EQ(acc.a2, 0.0f) << at;
          EXPECT_EQ(acc.e, 0.0f) << at;
          continue;
        }
        EXPECT_TRUE(near_sum(acc.a1, a1, a1)) << at << " a1";
        EXPECT_TRUE(near_sum(acc.a2, a2, a2)) << at << " a2";
        EXPECT_TRUE(near_sum(acc.e, e, std::abs(e))) << at << " e";
      }
}

// Rows whose values are all tiny (denormal included, as a decayed linear row's far keys are):
// 1 / c would overflow, so the kernel scales first; the sums must still be those of |a| / c,
// alone and after a larger value arrives (the rescale).
TEST(TileKernels, WeightRowStatsTinyRows) {
  for (Isa isa : supported_isas()) {
    const TileKernels& k = kernels_for(isa);
    for (float c : {1e-30f, 1e-38f, 3e-40f, 1e-44f}) {
      std::vector<float> a(100);
      for (size_t i = 0; i < a.size(); ++i) a[i] = c * static_cast<float>((i * 37) % 100) / 99.0f;
      WeightRowAcc acc;
      uint64_t cand[2];
      k.weight_row_stats(a.data(), 100, acc, cand);
      const float most = *std::max_element(a.begin(), a.end());
      double a1 = 0, a2 = 0, e = 0;
      for (float v : a) {
        const double u = static_cast<double>(v) / most;
        a1 += u, a2 += u * u, e += u > 0 ? u * std::log(u) : 0.0;
      }
      const std::string at = isa_name(isa) + " c " + std::to_string(c);
      EXPECT_EQ(acc.c, most) << at;
      EXPECT_TRUE(near_sum(acc.a1, a1, a1)) << at << " a1 " << acc.a1 << " want " << a1;
      EXPECT_TRUE(near_sum(acc.a2, a2, a2)) << at << " a2 " << acc.a2 << " want " << a2;
      EXPECT_TRUE(near_sum(acc.e, e, std::abs(e))) << at << " e " << acc.e << " want " << e;
      const float one = 1.0f;  // then a value of 1: the tiny terms rescale to ~0
      k.weight_row_stats(&one, 1, acc, cand);
      EXPECT_EQ(acc.c, 1.0f) << at;
      EXPECT_NEAR(acc.a1, 1.0, 1e-6) << at;
      EXPECT_NEAR(acc.a2, 1.0, 1e-6) << at;
      EXPECT_NEAR(acc.e, 0.0, 1e-6) << at;
    }
  }
}

// vlog (inside weight_row_stats) against std::log: a row [1, x, 0, ...] of two vectors has
// c = 1, u = x, and e = x * vlog(x) (the 1 contributes 1 * log 1 = 0, the zeros are masked), so
// e / x measures vlog(x) up to the rounding of one product. A dense sweep of [1e-38, 1], values
// just below 1, and denormals.
TEST(TileKernels, VlogAccuracy) {
  std::vector<float> xs;
  for (int i = 0; i <= 200000; ++i) xs.push_back(static_cast<float>(std::exp(-87.5 * i / 200000.0)));  // 1 .. 1e-38
  for (int i = 0; i <= 20000; ++i) xs.push_back(0.5f + 0.5f * static_cast<float>(i) / 20000.0f);
  for (int i = 1; i <= 64; ++i) xs.push_back(1.0f - static_cast<float>(i) * 0x1p-24f);
  for (float x = 0.7f; x < 0.72f; x = std::nextafter(x, 1.0f)) xs.push_back(x);  // around the sqrt(1/2) split
  std::vector<float> denormals;
  for (float x : {1e-39f, 5e-40f, 1e-41f, 1e-43f, 1.4e-45f}) denormals.push_back(x);
  for (Isa isa : supported_isas()) {
    const TileKernels& k = kernels_for(isa);
    std::vector<float> row(64, 0.0f);
    row[0] = 1.0f;
    uint64_t cand[1];
    double worst_rel = 0, worst_x = 0;
    for (float x : xs) {
      row[1] = x;
      WeightRowAcc acc;
      k.weight_row_stats(row.data(), 64, acc, cand);
      const double got = static_cast<double>(acc.e) / x, want = std::log(static_cast<double>(x));
      const double err = std::abs(got - want);
      ASSERT_LE(err, 2e-7 * std::abs(want) + 1e-7 * std::abs(want) + 1e-9) << isa_name(isa) << " x " << x;
      if (want != 0 && err / std::abs(want) > worst_rel) worst_rel = err / std::abs(want), worst_x = x;
    }
    std::printf("[ vlog     ] %s: worst |x vlog(x) - x log x| / |x log x| = %.3g at x = %.9g\n", isa_name(isa).c_str(),
                worst_rel, worst_x);
    for (float x : denormals) {  // the product x log x is denormal itself: checks the scale step only
      row[1] = x;
      WeightRowAcc acc;
      k.weight_row_stats(row.data(), 64, acc, cand);
      const double want = x * std::log(static_cast<double>(x));
      EXPECT_NEAR(acc.e, want, std::abs(want) * 1e-3 + 3e-45) << isa_name(isa) << " x " << x;
    }
  }
}

// The bf16 kernels (vdpbf16ps) against float64 loops on the same bf16-rounded operands, odd sizes
// (an odd head dim's lone last value, an odd tile's unpaired last key, channel tails) and partial
// lane ranges; lanes outside the range untouched. Present exactly where the CPU has AVX512-BF16.
TEST(Bf16TileKernels, QkPvAndRowsGemmMatchLoopsOnRoundedOperands) {
  const Bf16TileKernels* k = bf16_kernels_for(best_supported_isa());
  const bool has = best_supported_isa() == Isa::avx512 && __builtin_cpu_supports("avx512bf16");
  ASSERT_EQ(k != nullptr, has);
  EXPECT_EQ(bf16_kernels_for(Isa::portable), nullptr);
  if (!k) return;  // nothing more runs these kernels on this CPU (the emulation is the case list's)
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const auto r = [](float x) { return round_to_bf16(x); };
  for (int64_t dim : {1, 7, 17, 64})
    for (int64_t bc : {1, 6, 13, 64})
      for (auto [lo, hi] : {std::pair{0, 64}, {16, 48}, {48, 64}}) {
        SCOPED_TRACE("d " + std::to_string(dim) + " bc " + std::to_string(bc) + " lanes " + std::to_string(lo));
        std::vector<float> q(L * dim), keys(bc * dim), vals(bc * dim), a(bc * L), scale(L);
        for (auto* v : {&q, &keys, &vals, &a})
          for (float& x : *v) x = r(nd(rng));
        for (int i = 0; i < L; ++i) scale[i] = 0.25f + i / 256.0f;
        AlignedFloats qt2((dim + 1) / 2 * L), st(bc * L), sc(L), ot(dim * L), alpha(L), vp((bc + 1) / 2 * dim),
            p2((bc + 1) / 2 * L), at(bc * L), a2(bc * 32), bp(32 * dim), out(bc * dim);
        std::copy(scale.begin(), scale.end(), sc.data());
        std::vector<uint16_t> k16(bc * dim);
        k->pack_qt(q.data(), dim, L, dim, qt2.data_u32());
        k->round_rows(keys.data(), dim, bc, dim, k16.data());
        std::fill(st.data(), st.data() + bc * L, -7.0f);
        k->qk(qt2.data_u32(), dim, k16.data(), dim, bc, sc.data(), st.data(), lo, hi);
        for (int64_t j = 0; j < bc; ++j)
          for (int i = 0; i < L; ++i) {
            double s = 0;
            for (int64_t c = 0; c < dim; ++c) s += double(q[i * dim + c]) * keys[j * dim + c];
            const float got = st.data()[j * L + i];
            if (i < lo || i >= hi) ASSERT_EQ(got, -7.0f) << "lane " << i << " outside the range was written";
            else ASSERT_NEAR(got, s * scale[i], 1e-5 * (1 + std::abs(s))) << "qk j" << j << " i" << i;
          }
        // pv: Ot = alpha Ot + sum_j bf16(P[j][i]) V[j][c]
        std::vector<float> p(bc * L), ot0(dim * L);
        for (float& x : p) x = std::abs(nd(rng));
        for (int64_t e = 0; e < dim * L; ++e) ot.data()[e] = ot0[e] = nd(rng);
        for (int i = 0; i < L; ++i) alpha.data()[i] = 0.5f + i / 128.0f;
        std::copy(p.begin(), p.end(), st.data());
        k->pack_v(vals.data(), DType::f32, dim, bc, dim, vp.data_u32());
        k->pv(st.data(), bc, vp.data_u32(), dim, ot.data(), alpha.data(), p2.data_u32(), lo, hi);
        for (int64_t c = 0; c < dim; ++c)
          for (int i = 0; i < L; ++i) {
            double want = ot0[c * L + i];
            if (i >= lo && i < hi) {
              want *= alpha.data()[i];
              for (int64_t j = 0; j < bc; ++j) want += double(r(p[j * L + i])) * vals[j * dim + c];
            }
            ASSERT_NEAR(ot.data()[c * L + i], want, 1e-5 * (1 + std::abs(want))) << "pv c" << c << " i" << i;
          }
        // rows_gemm: out[j][c] += sum_{i in [lo, hi)} bf16(a[j][i] scale[i]) B[i][c], B 64 rows
        std::vector<float> b(L * dim), out0(bc * dim);
        for (float& x : b) x = r(nd(rng));
        std::copy(a.begin(), a.end(), at.data());
        for (int64_t e = 0; e < bc * dim; ++e) out.data()[e] = out0[e] = nd(rng);
        k->pack_v(b.data(), DType::f32, dim, L, dim, bp.data_u32());
        k->rows_gemm(at.data(), bc, sc.data(), lo, hi, bp.data_u32(), dim, out.data(), dim, a2.data_u32());
        for (int64_t j = 0; j < bc; ++j)
          for (int64_t c = 0; c < dim; ++c) {
            double want = out0[j * dim + c];
            for (int i = lo; i < hi; ++i) want += double(r(a[j * L + i] * scale[i])) * b[i * dim + c];
            ASSERT_NEAR(out.data()[j * dim + c], want, 1e-5 * (1 + std::abs(want))) << "rows_gemm j" << j << " c" << c;
          }
      }
}

}  // namespace
}  // namespace attn::kernels
