// Rows of every decodable ggml type as Q8_0 blocks: exact where the type is a float16 times small
// integers (the decoded values equal bit for bit), within ggml's Q8_0 rounding otherwise (each
// value within d/2 of the decoded original, plus d's float16 rounding), NaN blocks kept NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "attn/dtype.hpp"
#include "attn/gguf.hpp"
#include "quant/ggml_blocks.hpp"
#include "quant/q8_0_rows.hpp"
#include "support/expect_error.hpp"

namespace attn::model {
namespace {

struct Type {
  uint32_t ggml;
  std::vector<int> scale_offsets;  // byte offsets (in a block) of its float16 scales and minimums
};

const Type kTypes[] = {{kGgmlQ8_0, {0}}, {kGgmlQ4_0, {0}}, {kGgmlQ5_0, {0}},   {kGgmlQ4_1, {0, 2}},
                       {kGgmlQ5_1, {0, 2}}, {kGgmlQ4_K, {0, 2}}, {kGgmlQ5_K, {0, 2}}, {kGgmlQ6_K, {208}}};

// A row of n values of type t: random bytes, with every float16 scale set to a finite value of
// either sign drawn over a few octaves.
std::vector<uint8_t> random_row(const Type& t, int64_t n, std::mt19937& rng) {
  const GgmlTypeInfo* info = ggml_type_info(t.ggml);
  const int64_t blocks = n / info->block_elements;
  std::vector<uint8_t> row(static_cast<size_t>(blocks * info->block_bytes));
  for (uint8_t& b : row) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> mag(-6.0f, 2.0f);
  for (int64_t b = 0; b < blocks; ++b)
    for (int off : t.scale_offsets) {
      const float s = std::exp2(mag(rng)) * (rng() % 2 ? 1.0f : -1.0f);
      const uint16_t h = float_to_f16(s);
      std::memcpy(row.data() + b * info->block_bytes + off, &h, 2);
    }
  return row;
}

std::vector<float> decoded(uint32_t type, const uint8_t* src, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  dequantize_row(type, src, n, x.data());
  return x;
}

TEST(Q8_0Rows, ExactTypesKeepEveryValueBitForBit) {
  std::mt19937 rng(1);
  for (const Type& t : kTypes) {
    if (!converts_exactly_to_q8_0(t.ggml)) continue;
    const int64_t n = 256;
    const std::vector<uint8_t> row = random_row(t, n, rng);
    std::vector<uint8_t> q8(static_cast<size_t>(n / 32 * kQ8_0BlockBytes));
    to_q8_0_row(t.ggml, row.data(), n, q8.data());
    const std::vector<float> want = decoded(t.ggml, row.data(), n), got = decoded(kGgmlQ8_0, q8.data(), n);
    for (int64_t i = 0; i < n; ++i)
      EXPECT_EQ(std::memcmp(&want[i], &got[i], 4), 0) << ggml_type_info(t.ggml)->name << " value " << i << ": "
                                                      << want[i] << " vs " << got[i];
  }
}

TEST(Q8_0Rows, OtherTypesRoundAsGgmlQ8_0) {
  std::mt19937 rng(2);
  int checked = 0;
  for (const Type& t : kTypes) {
    if (converts_exactly_to_q8_0(t.ggml)) continue;
    for (int rep = 0; rep < 8; ++rep) {
      const int64_t n = 512;
      const std::vector<uint8_t> row = random_row(t, n, rng);
      std::vector<uint8_t> q8(static_cast<size_t>(n / 32 * kQ8_0BlockBytes));
      to_q8_0_row(t.ggml, row.data(), n, q8.data());
      const std::vector<float> x = decoded(t.ggml, row.data(), n), y = decoded(kGgmlQ8_0, q8.data(), n);
      for (int64_t b = 0; b < n / 32; ++b) {
        double amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(static_cast<double>(x[32 * b + i])));
        const double d = amax / 127.0;  // the exact scale; stored as float16 (relative error <= 2^-11)
        for (int i = 0; i < 32; ++i) {
          const double err = std::fabs(static_cast<double>(y[32 * b + i]) - x[32 * b + i]);
          ASSERT_LE(err, d * (0.5 + 1e-6) + 127.0 * d * std::exp2(-11.0))
              << ggml_type_info(t.ggml)->name << " block " << b << " value " << i;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 5 * 8 * 512);
}

TEST(Q8_0Rows, FloatRowsAndNonFiniteBlocks) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = 0.01f * static_cast<float>(i - 20);
  x[40] = std::nanf("");
  std::vector<uint8_t> q8(2 * kQ8_0BlockBytes);
  to_q8_0_row(kGgmlF32, reinterpret_cast<const uint8_t*>(x.data()), 64, q8.data());
  const std::vector<float> y = decoded(kGgmlQ8_0, q8.data(), 64);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(y[i], x[i], 0.2 / 254 * 1.01) << i;  // block 0: amax 0.2, d/2 = 0.2/254
  for (int i = 32; i < 64; ++i) EXPECT_TRUE(std::isnan(y[i])) << i;  // the NaN poisons its block only
  const std::vector<float> zeros(32, 0.0f);
  to_q8_0_row(kGgmlF32, reinterpret_cast<const uint8_t*>(zeros.data()), 32, q8.data());
  for (float v : decoded(kGgmlQ8_0, q8.data(), 32)) EXPECT_EQ(v, 0.0f);
}

TEST(Q8_0Rows, RefusesWhatItCannotRead) {
  std::vector<uint8_t> buf(1024), out(1024);
  testing::expect_error([&] { to_q8_0_row(kGgmlQ8_0, buf.data(), 48, out.data()); },
                        "48 values are not whole Q8_0 blocks of 32");
  testing::expect_error([&] { to_q8_0_row(kGgmlQ4_K, buf.data(), 32, out.data()); }, "not whole Q4_K blocks of 256");
  testing::expect_error([&] { to_q8_0_row(9999, buf.data(), 32, out.data()); }, "is not decoded yet");
}

}  // namespace
}  // namespace attn::model
