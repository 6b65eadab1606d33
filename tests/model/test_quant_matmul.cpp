// Products with ggml block-quantized weights (Q4_0, Q4_1, Q8_0), read in place and dequantized in
// registers (few input rows) or into a float panel (many), on every ISA this CPU runs, against the
// plain decoder (model/ggml_blocks.cpp) followed by float64 sums.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "attn/dtype.hpp"
#include "attn/gguf.hpp"
#include "attn/isa.hpp"
#include "kernels/kernel_table.hpp"
#include "model/ggml_blocks.hpp"
#include "model/ops.hpp"

namespace attn::model {
namespace {

using kernels::BlockQuant;

struct QuantType {
  BlockQuant quant;
  uint32_t ggml;
  int64_t block_bytes;
  const char* name;
};
const QuantType kTypes[] = {{BlockQuant::q4_0, kGgmlQ4_0, 18, "Q4_0"},
                            {BlockQuant::q4_1, kGgmlQ4_1, 20, "Q4_1"},
                            {BlockQuant::q8_0, kGgmlQ8_0, 34, "Q8_0"}};

// A rows x cols matrix of random blocks: scales in [2^-10, 2^-3], Q4_1 minimums in [-1, 1]
// (both exactly representable in float16), random quants.
struct QuantMatrix {
  std::vector<uint8_t> bytes;
  Matrix m;
  std::vector<float> dense;  // the reference decoding, rows x cols
};

QuantMatrix random_matrix(const QuantType& t, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> scale(-10.0f, -3.0f), minimum(-1.0f, 1.0f);
  QuantMatrix q;
  const int64_t row_bytes = cols / 32 * t.block_bytes;
  q.bytes.resize(static_cast<size_t>(rows * row_bytes));
  for (int64_t b = 0; b < rows * cols / 32; ++b) {
    uint8_t* p = q.bytes.data() + b * t.block_bytes;
    for (int64_t i = 0; i < t.block_bytes; ++i) p[i] = static_cast<uint8_t>(rng());
    const uint16_t d = float_to_f16(std::exp2(std::round(scale(rng) * 4) / 4));
    p[0] = d & 0xFF, p[1] = d >> 8;
    if (t.quant == BlockQuant::q4_1) {
      const uint16_t m = float_to_f16(minimum(rng));
      p[2] = m & 0xFF, p[3] = m >> 8;
    }
  }
  q.m = Matrix{DType::f32, t.quant, rows, cols, q.bytes.data(), {}};
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
      for (int64_t cols : {32, 96, 576}) {
        const QuantMatrix q = random_matrix(t, 70, cols, 11);
        // the values the kernels multiply with: the reference decoding (Q4_1: q*d + m fused)
        std::vector<float> panel(q.dense.size());
        kernels::kernels_for(isa).dequantize_rows(q.m.row_ptrs.data(), t.quant, 70, cols, panel.data(), cols);
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
    const QuantMatrix q = random_matrix(t, 300, 192, 5);
    for (int64_t n : {1, 3, 12, 70}) {
      const std::vector<float> x = random_rows(n, 192, 9);
      std::vector<float> one(static_cast<size_t>(n * 300)), two(one.size());
      matmul(x.data(), n, q.m, one.data(), 1, active_isa());
      matmul(x.data(), n, q.m, two.data(), 2, active_isa());
      EXPECT_EQ(one, two) << t.name << " n " << n;
    }
  }
}

TEST(QuantMatmul, EmbeddingRowLookup) {
  for (const QuantType& t : kTypes) {
    const QuantMatrix q = random_matrix(t, 5, 64, 3);
    std::vector<float> row(64);
    matrix_row(q.m, 3, row.data(), active_isa());
    for (int64_t c = 0; c < 64; ++c) EXPECT_NEAR(row[c], q.dense[3 * 64 + c], 2e-7 * (std::abs(q.dense[3 * 64 + c]) + 1));
  }
}

}  // namespace
}  // namespace attn::model
