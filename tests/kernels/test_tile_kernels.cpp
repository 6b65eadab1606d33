// The tile primitives of every ISA against plain loops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "base/aligned_buffer.hpp"
#include "attn/isa.hpp"
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

}  // namespace
}  // namespace attn::kernels
