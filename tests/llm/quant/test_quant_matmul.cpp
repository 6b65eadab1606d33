// Products with ggml block-quantized weights (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), in place
// or packed, dequantized in registers (few input rows) or into a float panel (many), on every ISA this
// CPU runs, against the plain decoder (quant/ggml_blocks.cpp) followed by float64 sums; and with
// 8-bit activations, in place and packed (q8_packed.hpp), on every integer-dot variant.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "attn/dtype.hpp"
#include "attn/gguf.hpp"
#include "attn/isa.hpp"
#include "kernels/kernel_table.hpp"
#include "quant/q8_dot.hpp"
#include "quant/q8_packed.hpp"
#include "quant/ggml_blocks.hpp"
#include "model/ops.hpp"

namespace attn::model {
namespace {

using kernels::BlockQuant;

struct QuantType {
  BlockQuant quant;
  uint32_t ggml;
  int64_t block_bytes, values;  // a block's bytes and values
  const char* name;
};
const QuantType kTypes[] = {{BlockQuant::q4_0, kGgmlQ4_0, 18, 32, "Q4_0"},
                            {BlockQuant::q4_1, kGgmlQ4_1, 20, 32, "Q4_1"},
                            {BlockQuant::q8_0, kGgmlQ8_0, 34, 32, "Q8_0"},
                            {BlockQuant::q5_0, kGgmlQ5_0, 22, 32, "Q5_0"},
                            {BlockQuant::q5_1, kGgmlQ5_1, 24, 32, "Q5_1"},
                            {BlockQuant::q4_k, kGgmlQ4_K, 144, 256, "Q4_K"},
                            {BlockQuant::q5_k, kGgmlQ5_K, 176, 256, "Q5_K"},
                            {BlockQuant::q6_k, kGgmlQ6_K, 210, 256, "Q6_K"}};

// Row widths for a test: `of32` for the 32-value blocks, whole K-quant super-blocks (256, 768 and
// 2048, Gemma 3's ffn_down width) otherwise.
std::vector<int64_t> widths(const QuantType& t, std::vector<int64_t> of32) {
  return t.values == 32 ? of32 : std::vector<int64_t>{256, 768, 2048};
}
// One width: c, rounded up to whole blocks of t.
int64_t width(const QuantType& t, int64_t c) { return (c + t.values - 1) / t.values * t.values; }

// A rows x cols matrix of random blocks: scales in [2^-10, 2^-3] (Q4_K's, Q5_K's dmin too), Q4_1
// and Q5_1 minimums in [-1, 1] (all exactly representable in float16), random quants and random K-quant sub-block
// scales (Q4_K's and Q5_K's packed 6-bit scales and mins, Q6_K's int8 scales).
struct QuantMatrix {
  std::vector<uint8_t> bytes;
  Matrix m;
  std::vector<float> dense;  // the reference decoding, rows x cols
};

QuantMatrix random_matrix(const QuantType& t, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> scale(-10.0f, -3.0f), minimum(-1.0f, 1.0f);
  QuantMatrix q;
  const int64_t row_bytes = cols / t.values * t.block_bytes;
  q.bytes.resize(static_cast<size_t>(rows * row_bytes));
  for (int64_t b = 0; b < rows * cols / t.values; ++b) {
    uint8_t* p = q.bytes.data() + b * t.block_bytes;
    for (int64_t i = 0; i < t.block_bytes; ++i) p[i] = static_cast<uint8_t>(rng());
    const uint16_t d = float_to_f16(std::exp2(std::round(scale(rng) * 4) / 4));
    uint8_t* at = p + (t.quant == BlockQuant::q6_k ? 208 : 0);
    at[0] = d & 0xFF, at[1] = d >> 8;
    const bool k = t.quant == BlockQuant::q4_k || t.quant == BlockQuant::q5_k;  // dmin at byte 2
    if (t.quant == BlockQuant::q4_1 || t.quant == BlockQuant::q5_1 || k) {
      const uint16_t m = float_to_f16(k ? std::exp2(std::round(scale(rng) * 4) / 4) : minimum(rng));
      p[2] = m & 0xFF, p[3] = m >> 8;
    }
  }
  q.m = Matrix{DType::f32, t.quant, rows, cols, q.bytes.data(), {}, nullptr};
  for (int64_t r = 0; r < rows; ++r) q.m.row_ptrs.push_back(q.bytes.data() + r * row_bytes);
  q.dense.resize(static_cast<size_t>(rows * cols));
  dequantize_row(t.ggml, q.bytes.data(), rows * cols, q.dense.data());
  return q;
}

std::vector<float> random_rows(int64_t n, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g;
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (float& v : x) v = g(rng);
  return x;
}

// |y - exact| <= (cols + 1) u sum_c |x_c w_c|: the rounding bound of a float32 dot product of
// cols terms (u = 2^-24), one more u for Q4_1's fused q*d + m.
void expect_products(const QuantMatrix& q, const std::vector<float>& x, int64_t n, const std::vector<float>& y,
                     const std::string& what) {
  const int64_t cols = q.m.cols;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < q.m.rows; ++j) {
      double exact = 0, magnitude = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double p = static_cast<double>(x[i * cols + c]) * q.dense[j * cols + c];
        exact += p, magnitude += std::abs(p);
      }
      const double bound = static_cast<double>(cols + 1) * std::ldexp(1.0, -24) * magnitude;
      ASSERT_LE(std::abs(y[i * q.m.rows + j] - exact), bound) << what << " row " << i << " col " << j;
    }
}

TEST(QuantMatmul, KernelsMatchTheReferenceDecodingOnEveryIsa) {
  for (Isa isa : supported_isas())
    for (const QuantType& t : kTypes)
      for (int64_t cols : widths(t, {32, 96, 576})) {
        const QuantMatrix q = random_matrix(t, 70, cols, 11);
        // the values the kernels multiply with: the reference decoding (Q4_1: q*d + m fused)
        std::vector<float> panel(q.dense.size());
        kernels::quant_kernels_for(isa).dequantize_rows(q.m.row_ptrs.data(), t.quant, 70, cols, panel.data(), cols);
        for (size_t i = 0; i < panel.size(); ++i) {
          if (t.quant == BlockQuant::q4_1) ASSERT_NEAR(panel[i], q.dense[i], 2e-7 * (std::abs(q.dense[i]) + 1)) << i;
          else ASSERT_EQ(panel[i], q.dense[i]) << t.name << " " << i;
        }
        for (int64_t n : {1, 2, 3, 4, 5, 7, 9, 15, 16, 17, 40, 64, 65, 130}) {  // in registers below 16 rows, tiles from 16
          const std::vector<float> x = random_rows(n, cols, static_cast<uint32_t>(n));
          std::vector<float> y(static_cast<size_t>(n * 70), NAN);
          matmul(x.data(), n, q.m, y.data(), 2, isa);
          expect_products(q, x, n, y, std::string(isa_name(isa)) + " " + t.name + " cols " + std::to_string(cols) +
                                          " n " + std::to_string(n));
        }
      }
}

TEST(QuantMatmul, BitwiseIndependentOfThreads) {
  for (const QuantType& t : kTypes) {
    const int64_t cols = width(t, 192);
    const QuantMatrix q = random_matrix(t, 300, cols, 5);
    for (int64_t n : {1, 3, 12, 70}) {
      const std::vector<float> x = random_rows(n, cols, 9);
      std::vector<float> one(static_cast<size_t>(n * 300)), two(one.size());
      matmul(x.data(), n, q.m, one.data(), 1, active_isa());
      matmul(x.data(), n, q.m, two.data(), 2, active_isa());
      EXPECT_EQ(one, two) << t.name << " n " << n;
    }
  }
}

TEST(QuantMatmul, EmbeddingRowLookup) {
  for (const QuantType& t : kTypes) {
    const int64_t cols = width(t, 64);
    const QuantMatrix q = random_matrix(t, 5, cols, 3);
    std::vector<float> row(static_cast<size_t>(cols));
    matrix_row(q.m, 3, row.data(), active_isa());
    for (int64_t c = 0; c < cols; ++c)
      EXPECT_NEAR(row[c], q.dense[3 * cols + c], 2e-7 * (std::abs(q.dense[3 * cols + c]) + 1));
  }
}

// ---- 8-bit activations and integer dot products (quant/q8_dot.hpp) ----------------------------

using kernels::Q8Block;

// Each block's values are d q to within d / 2, with |q| <= 127, s = d sum q, sum and low the sums
// of the 32 and of the first 16 q.
TEST(QuantActivations, BlocksRoundToNearestWithinHalfAStep) {
  std::vector<float> x = random_rows(3, 96, 4);
  x[40] = 0.0f;
  for (int i = 64; i < 96; ++i) x[i] = 0.0f;  // a zero block: d = 0, q = 0
  std::vector<Q8Block> b(9);
  kernels::quantize_q8_rows(x.data(), 3, 96, 96, b.data());
  for (int64_t blk = 0; blk < 9; ++blk) {
    int64_t sum = 0;
    for (int i = 0; i < 32; ++i) {
      const float v = x[static_cast<size_t>(blk * 32 + i)];
      ASSERT_LE(std::abs(b[blk].q[i]), 127);
      ASSERT_LE(std::abs(v - b[blk].d * b[blk].q[i]), b[blk].d * 0.5f * (1 + 1e-5f)) << blk << " " << i;
      sum += b[blk].q[i];
      if (i == 15) EXPECT_EQ(b[blk].low, sum) << blk;
    }
    EXPECT_EQ(b[blk].sum, sum) << blk;
    EXPECT_FLOAT_EQ(b[blk].s, b[blk].d * static_cast<float>(sum));
  }
  EXPECT_EQ(b[2].d, 0.0f);
  EXPECT_EQ(b[2].s, 0.0f);
}

// Every variant rounds activations to the bits of the plain quantize_q8_rows.
TEST(QuantActivations, EveryVariantRoundsToThePlainBlocks) {
  std::vector<float> x = random_rows(5, 160, 12);
  for (int i = 0; i < 32; ++i) x[static_cast<size_t>(32 + i)] = 0.0f;          // a zero block
  x[100] = 0.5f * 3, x[101] = -2.5f;                                              // ties
  for (int i = 0; i < 32; ++i) x[static_cast<size_t>(160 + i)] = (i - 16) * 0.5f;  // halves round to even
  x[400] = NAN, x[500] = INFINITY, x[600] = -INFINITY;
  x[700] = 1e-40f;  // a subnormal block maximum
  for (int i = 1; i < 32; ++i) x[static_cast<size_t>(704 + i)] = 0.0f;
  x[704] = 1e-40f;
  std::vector<Q8Block> plain(25);
  kernels::quantize_q8_rows(x.data(), 5, 160, 160, plain.data());
  for (const kernels::Q8DotVariant& v : kernels::q8_dot_variants()) {
    std::vector<Q8Block> b(25);
    v.quantize(x.data(), 5, 160, 160, b.data());
    for (size_t i = 0; i < b.size(); ++i) {
      EXPECT_EQ(std::memcmp(b[i].q, plain[i].q, 32), 0) << v.name << " block " << i;
      EXPECT_EQ(b[i].sum, plain[i].sum) << v.name << " block " << i;
      EXPECT_EQ(b[i].low, plain[i].low) << v.name << " block " << i;
      EXPECT_TRUE(b[i].d == plain[i].d || (std::isnan(b[i].d) && std::isnan(plain[i].d))) << v.name << " block " << i;
      EXPECT_TRUE(b[i].s == plain[i].s || (std::isnan(b[i].s) && std::isnan(plain[i].s))) << v.name << " block " << i;
    }
  }
}

TEST(QuantActivations, NonFiniteInputsMakeTheirProductsNaN) {
  const QuantMatrix q = random_matrix(kTypes[1], 8, 64, 2);
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> x = random_rows(2, 64, 6);
    x[64 + 40] = bad;  // row 1, block 1
    std::vector<float> y(16);
    matmul(x.data(), 2, q.m, y.data(), 2, active_isa(), Activations::q8);
    for (int64_t j = 0; j < 8; ++j) {
      EXPECT_TRUE(std::isfinite(y[static_cast<size_t>(j)])) << bad << " " << j;
      EXPECT_TRUE(std::isnan(y[static_cast<size_t>(8 + j)])) << bad << " " << j;
    }
  }
}

// Every variant this CPU runs against the float64 oracle: the integer dots are exact, so the
// error is float32's in the per-block scale products and the sum of the block terms.
TEST(QuantActivations, EveryIntegerDotVariantMatchesTheReference) {
  for (const kernels::Q8DotVariant& v : kernels::q8_dot_variants())
    for (const QuantType& t : kTypes)
      for (int64_t cols : widths(t, {32, 96, 576, 1536})) {
        const int64_t rows = 70, blocks = cols / 32;
        const QuantMatrix q = random_matrix(t, rows, cols, 13);
        for (int64_t R : {1, 2, 3, 4, 5, 7, 15}) {
          const std::vector<float> x = random_rows(R, cols, static_cast<uint32_t>(R + cols));
          std::vector<Q8Block> xb(static_cast<size_t>(R * blocks));
          kernels::quantize_q8_rows(x.data(), R, cols, cols, xb.data());
          std::vector<float> y(static_cast<size_t>(R * rows), NAN);
          v.rows(xb.data(), R, blocks, q.m.row_ptrs.data(), t.quant, rows, y.data(), rows);
          for (int64_t r = 0; r < R; ++r)
            for (int64_t j = 0; j < rows; ++j) {
              double size = 0;
              const double exact = kernels::q8_dot_reference(xb.data() + r * blocks, blocks, q.m.row(j), t.quant, &size);
              ASSERT_LE(std::abs(y[static_cast<size_t>(r * rows + j)] - exact),
                        static_cast<double>(blocks + 4) * std::ldexp(1.0, -24) * size)
                  << v.name << " " << t.name << " cols " << cols << " R " << R << " row " << r << " col " << j
                  << " y " << y[static_cast<size_t>(r * rows + j)] << " exact " << exact << " size " << size;
            }
        }
      }
}

// The oracle itself: for every type, the float64 product of the plainly decoded weights
// (ggml_blocks.cpp, independent of block_pieces.hpp) with the activations d q, to float64's
// rounding; where a decoded value is a sum (Q4_1's d n + m, Q4_K's d s n - dmin m, Q5_1, Q5_K) it is rounded
// to float32 once, which moves the product by at most 2^-24 of the sum of its |terms|.
TEST(QuantActivations, TheReferenceIsTheProductOfTheDecodedValues) {
  for (const QuantType& t : kTypes)
    for (int64_t cols : widths(t, {32, 576})) {
      const int64_t blocks = cols / 32;
      const QuantMatrix q = random_matrix(t, 9, cols, 41);
      const std::vector<float> x = random_rows(2, cols, 3);
      std::vector<Q8Block> xb(static_cast<size_t>(2 * blocks));
      kernels::quantize_q8_rows(x.data(), 2, cols, cols, xb.data());
      for (int64_t r = 0; r < 2; ++r)
        for (int64_t j = 0; j < 9; ++j) {
          double want = 0, size = 0;
          for (int64_t c = 0; c < cols; ++c) {
            const Q8Block& b = xb[static_cast<size_t>(r * blocks + c / 32)];
            const double p = static_cast<double>(q.dense[j * cols + c]) * b.d * b.q[c % 32];
            want += p, size += std::abs(p);
          }
          const double got = kernels::q8_dot_reference(xb.data() + r * blocks, blocks, q.m.row(j), t.quant);
          const bool sums = t.quant == BlockQuant::q4_1 || t.quant == BlockQuant::q5_1 || t.quant == BlockQuant::q4_k ||
                            t.quant == BlockQuant::q5_k;
          ASSERT_NEAR(got, want, (sums ? std::ldexp(1.0, -24) : 0.0) * size + 1e-12 * size)
              << t.name << " cols " << cols << " " << r << " " << j;
        }
    }
}

// The product of the 8-bit path is close to the float one: the rounding of x to 8 bits is at most
// d / 2 = max|x| / 254 per value.
TEST(QuantActivations, MatmulAgreesWithTheFloatPathToTheRounding) {
  for (Isa isa : supported_isas())
    for (const QuantType& t : kTypes) {
      const int64_t cols = width(t, 576);
      const QuantMatrix q = random_matrix(t, 70, cols, 21);
      const std::vector<float> x = random_rows(3, cols, 8);
      std::vector<float> exact(3 * 70), y(3 * 70);
      matmul(x.data(), 3, q.m, exact.data(), 2, isa, Activations::f32);
      matmul(x.data(), 3, q.m, y.data(), 2, isa, Activations::q8);
      for (int64_t r = 0; r < 3; ++r)
        for (int64_t j = 0; j < 70; ++j) {
          double bound = 0;  // sum over blocks of (max|x| / 254) sum |w|
          for (int64_t b = 0; b < cols / 32; ++b) {
            float most = 0;
            double wsum = 0;
            for (int64_t c = b * 32; c < b * 32 + 32; ++c)
              most = std::max(most, std::abs(x[r * cols + c])), wsum += std::abs(q.dense[j * cols + c]);
            bound += most / 254.0 * wsum;
          }
          ASSERT_LE(std::abs(y[r * 70 + j] - exact[r * 70 + j]), bound * 1.01 + 1e-5)
              << isa_name(isa) << " " << t.name << " " << r << " " << j;
        }
    }
}

TEST(QuantActivations, BitwiseIndependentOfThreads) {
  for (const QuantType& t : kTypes) {
    const int64_t cols = width(t, 192);
    const QuantMatrix q = random_matrix(t, 300, cols, 5);
    const std::vector<float> x = random_rows(2, cols, 9);
    std::vector<float> one(600), two(600);
    matmul(x.data(), 2, q.m, one.data(), 1, active_isa(), Activations::q8);
    matmul(x.data(), 2, q.m, two.data(), 2, active_isa(), Activations::q8);
    EXPECT_EQ(one, two) << t.name;
  }
}

TEST(QuantActivations, TheTablePicksTheBestVariantOfEachLevel) {
  const std::vector<kernels::Q8DotVariant> variants = kernels::q8_dot_variants();
  for (Isa isa : supported_isas()) {
    const kernels::QuantKernels& k = kernels::quant_kernels_for(isa);
    const auto first = std::find_if(variants.begin(), variants.end(), [&](const auto& v) { return v.isa == isa; });
    ASSERT_NE(first, variants.end()) << isa_name(isa);
    EXPECT_EQ(k.q8_dot_rows, first->rows) << isa_name(isa);
    EXPECT_STREQ(k.q8_dot_name, first->name);
    EXPECT_EQ(k.q8_packed_rows, first->packed) << isa_name(isa);
  }
}

// ---- matrices packed in 16-row groups (quant/q8_packed.hpp) ------------------------------------

// ggml_rows gives the packed bytes back, float_rows the plain decoding's values, bit for bit.
TEST(QuantPacked, RowsComeBackBitForBit) {
  for (const QuantType& t : kTypes)
    for (int64_t rows : {1, 16, 37}) {
      const int64_t cols = t.values == 32 ? 96 : 512;
      const QuantMatrix q = random_matrix(t, rows, cols, 31);
      const kernels::PackedMatrix p(q.m.row_ptrs.data(), t.quant, rows, cols);
      EXPECT_EQ(p.view().group_bytes % 64, 0) << t.name;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p.view().data) % 64, 0u) << t.name;
      const int64_t row_bytes = cols / t.values * t.block_bytes;
      std::vector<uint8_t> back(static_cast<size_t>(rows * row_bytes));
      p.ggml_rows(0, rows, back.data(), row_bytes);
      EXPECT_EQ(back, q.bytes) << t.name << " rows " << rows;
      std::vector<uint8_t> one(static_cast<size_t>(row_bytes));  // a row from the middle of a group
      p.ggml_rows(rows - 1, 1, one.data(), row_bytes);
      EXPECT_TRUE(std::equal(one.begin(), one.end(), q.bytes.end() - row_bytes)) << t.name;
      std::vector<float> floats(static_cast<size_t>(rows * cols));  // decoded straight from the groups
      p.float_rows(0, rows, floats.data(), cols);
      EXPECT_EQ(floats, q.dense) << t.name << " rows " << rows;
    }
}

// A packed matrix takes about its ggml rows' bytes: the same for Q4_0, Q4_1, Q8_0, Q5_0 (header
// padding aside), 2368 / 2304 for Q4_K and 2880 / 2816 for Q5_K (unpacked 6-bit scales), 3392 / 3360
// for Q6_K.
TEST(QuantPacked, TakesAboutTheFilesBytes) {
  for (const QuantType& t : kTypes)
    for (int64_t cols : {width(t, 640), int64_t{2048}}) {
      const int64_t rows = 640;
      const QuantMatrix q = random_matrix(t, rows, cols, 7);
      const kernels::PackedMatrix p(q.m.row_ptrs.data(), t.quant, rows, cols);
      const double file = static_cast<double>(q.bytes.size()), ratio = static_cast<double>(p.bytes()) / file;
      EXPECT_LE(ratio, t.quant == BlockQuant::q4_k || t.quant == BlockQuant::q5_k ? 1.03 : 1.01)
          << t.name << " cols " << cols;
      EXPECT_EQ(kernels::ggml_row_bytes(t.quant, cols) * rows, static_cast<int64_t>(q.bytes.size())) << t.name;
    }
}

// Every variant's packed kernel against the float64 oracle on the ggml rows, for any run of groups
// (g0 > 0) and a last group with fewer than 16 rows; prompts of 8 rows and more take groups unpacked
// to bytes (VNNI variants, up to 2304 columns: 2400 does not fit and falls back).
TEST(QuantPacked, EveryVariantMatchesTheReference) {
  for (const kernels::Q8DotVariant& v : kernels::q8_dot_variants())
    for (const QuantType& t : kTypes)
      for (int64_t cols : widths(t, {32, 96, 576, 640, 2400})) {
        const int64_t rows = 70, blocks = cols / 32;
        const QuantMatrix q = random_matrix(t, rows, cols, 17);
        const kernels::PackedMatrix p(q.m.row_ptrs.data(), t.quant, rows, cols);
        for (int64_t R : {1, 2, 3, 4, 5, 7, 8, 13})
          for (int64_t g0 : {0, 1, 4}) {
            const int64_t n = rows - 16 * g0;
            const std::vector<float> x = random_rows(R, cols, static_cast<uint32_t>(R * 7 + cols));
            std::vector<Q8Block> xb(static_cast<size_t>(R * blocks));
            kernels::quantize_q8_rows(x.data(), R, cols, cols, xb.data());
            std::vector<float> y(static_cast<size_t>(R * n + 1), NAN);
            v.packed(xb.data(), R, p.view(), g0, n, y.data(), n);
            EXPECT_TRUE(std::isnan(y.back())) << v.name << ": wrote past its rows";
            for (int64_t r = 0; r < R; ++r)
              for (int64_t j = 0; j < n; ++j) {
                double size = 0;
                const double exact =
                    kernels::q8_dot_reference(xb.data() + r * blocks, blocks, q.m.row(16 * g0 + j), t.quant, &size);
                ASSERT_LE(std::abs(y[static_cast<size_t>(r * n + j)] - exact),
                          static_cast<double>(blocks + 4) * std::ldexp(1.0, -24) * size)
                    << v.name << " " << t.name << " cols " << cols << " R " << R << " g0 " << g0 << " row " << r
                    << " col " << j;
              }
          }
      }
}

// A row's outputs are the same bits whatever rows share the call (a prompt's rows, a batch of
// sequences): every variant, row by row against 1, 4, 8 and 13 rows at once.
TEST(QuantPacked, ARowsBitsDoNotDependOnTheRowsBesideIt) {
  for (const kernels::Q8DotVariant& v : kernels::q8_dot_variants())
    for (const QuantType& t : kTypes)
      for (int64_t cols : widths(t, {256, 640})) {
        const int64_t rows = 40, blocks = cols / 32;
        const QuantMatrix q = random_matrix(t, rows, cols, 29);
        const kernels::PackedMatrix p(q.m.row_ptrs.data(), t.quant, rows, cols);
        const int64_t R = 13;
        const std::vector<float> x = random_rows(R, cols, static_cast<uint32_t>(cols + 5));
        std::vector<Q8Block> xb(static_cast<size_t>(R * blocks));
        kernels::quantize_q8_rows(x.data(), R, cols, cols, xb.data());
        std::vector<float> alone(static_cast<size_t>(R * rows));
        for (int64_t r = 0; r < R; ++r) v.packed(xb.data() + r * blocks, 1, p.view(), 0, rows, alone.data() + r * rows, rows);
        for (int64_t together : {4, 8, 13}) {
          std::vector<float> y(static_cast<size_t>(together * rows));
          v.packed(xb.data(), together, p.view(), 0, rows, y.data(), rows);
          for (int64_t i = 0; i < together * rows; ++i)
            ASSERT_EQ(y[static_cast<size_t>(i)], alone[static_cast<size_t>(i)])
                << v.name << " " << t.name << " cols " << cols << " " << together << " rows: row " << i / rows << " col "
                << i % rows;
        }
      }
}

// A packed matrix serves every path: float activations and prefill read its rows rebuilt (the same
// bits as in place), 8-bit activations the packed kernel (within the reference's rounding, and
// NaN where the input is), the embedding lookup one row; the same bits for any thread count.
TEST(QuantPacked, EveryPathOfAPackedMatrix) {
  for (Isa isa : supported_isas())
    for (const QuantType& t : kTypes) {
      const int64_t cols = width(t, 192), blocks = cols / 32;
      const QuantMatrix q = random_matrix(t, 100, cols, 23);
      const Matrix packed = packed_matrix(q.m);
      ASSERT_TRUE(packed.row_ptrs.empty());
      for (int64_t n : {1, 3, 20}) {
        const std::vector<float> x = random_rows(n, cols, static_cast<uint32_t>(n));
        std::vector<float> a(static_cast<size_t>(n * 100)), b(a.size());
        matmul(x.data(), n, q.m, a.data(), 2, isa, Activations::f32);
        matmul(x.data(), n, packed, b.data(), 2, isa, Activations::f32);
        EXPECT_EQ(a, b) << isa_name(isa) << " " << t.name << " n " << n;
        if (n >= 16) continue;
        std::vector<Q8Block> xb(static_cast<size_t>(n * blocks));
        kernels::quantize_q8_rows(x.data(), n, cols, cols, xb.data());
        matmul(x.data(), n, packed, a.data(), 2, isa, Activations::q8);
        matmul(x.data(), n, packed, b.data(), 1, isa, Activations::q8);
        EXPECT_EQ(a, b) << isa_name(isa) << " " << t.name << ": threads";
        for (int64_t r = 0; r < n; ++r)
          for (int64_t j = 0; j < 100; ++j) {
            double size = 0;
            const double exact = kernels::q8_dot_reference(xb.data() + r * blocks, blocks, q.m.row(j), t.quant, &size);
            ASSERT_LE(std::abs(a[static_cast<size_t>(r * 100 + j)] - exact),
                      static_cast<double>(blocks + 4) * std::ldexp(1.0, -24) * size)
                << isa_name(isa) << " " << t.name << " " << r << " " << j;
          }
      }
      std::vector<float> x = random_rows(2, cols, 4);
      x[static_cast<size_t>(cols + 70)] = NAN;
      std::vector<float> y(200);
      matmul(x.data(), 2, packed, y.data(), 2, isa, Activations::q8);
      for (int64_t j = 0; j < 100; ++j) {
        EXPECT_TRUE(std::isfinite(y[static_cast<size_t>(j)])) << j;
        EXPECT_TRUE(std::isnan(y[static_cast<size_t>(100 + j)])) << j;
      }
      std::vector<float> row(static_cast<size_t>(cols)), in_place(row.size());
      matrix_row(packed, 37, row.data(), isa);
      matrix_row(q.m, 37, in_place.data(), isa);
      EXPECT_EQ(row, in_place) << t.name;
    }
}

}  // namespace
}  // namespace attn::model
