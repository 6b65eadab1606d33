// ggml block decoding on hand-made blocks, value by value from the format's definition (the
// real-file check against the gguf package is python/tests/test_gguf.py).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "attn/dtype.hpp"
#include "attn/gguf.hpp"
#include "quant/ggml_blocks.hpp"
#include "support/expect_error.hpp"

namespace attn::model {
namespace {

void put16(std::vector<uint8_t>& b, uint16_t v) { b.push_back(v & 0xFF), b.push_back(v >> 8); }

TEST(GgmlBlocks, Q8_0) {
  std::vector<uint8_t> b;
  put16(b, float_to_f16(0.5f));
  for (int i = 0; i < 32; ++i) b.push_back(static_cast<uint8_t>(static_cast<int8_t>(i - 16)));
  std::vector<float> x(32);
  dequantize_row(kGgmlQ8_0, b.data(), 32, x.data());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(x[i], 0.5f * static_cast<float>(i - 16)) << i;
}

TEST(GgmlBlocks, Q4_0AndQ4_1NibbleOrder) {
  // byte j: low nibble = value j, high nibble = value j + 16
  std::vector<uint8_t> q40, q41;
  put16(q40, float_to_f16(0.25f));
  put16(q41, float_to_f16(2.0f)), put16(q41, float_to_f16(-3.0f));
  for (int j = 0; j < 16; ++j) {
    const uint8_t byte = static_cast<uint8_t>(j | ((15 - j) << 4));
    q40.push_back(byte), q41.push_back(byte);
  }
  std::vector<float> a(32), c(32);
  dequantize_row(kGgmlQ4_0, q40.data(), 32, a.data());
  dequantize_row(kGgmlQ4_1, q41.data(), 32, c.data());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(a[j], 0.25f * static_cast<float>(j - 8));
    EXPECT_EQ(a[j + 16], 0.25f * static_cast<float>(15 - j - 8));
    EXPECT_EQ(c[j], 2.0f * static_cast<float>(j) - 3.0f);
    EXPECT_EQ(c[j + 16], 2.0f * static_cast<float>(15 - j) - 3.0f);
  }
}

TEST(GgmlBlocks, FloatTypesAndRefusals) {
  const float f[3] = {1.5f, -2.0f, 3.0f};
  std::vector<uint8_t> h, bf;
  for (float v : f) put16(h, float_to_f16(v)), put16(bf, float_to_bf16(v));
  std::vector<float> x(3);
  dequantize_row(kGgmlF32, reinterpret_cast<const uint8_t*>(f), 3, x.data());
  EXPECT_EQ(x, std::vector<float>(f, f + 3));
  dequantize_row(kGgmlF16, h.data(), 3, x.data());
  EXPECT_EQ(x, std::vector<float>(f, f + 3));
  dequantize_row(kGgmlBF16, bf.data(), 3, x.data());
  EXPECT_EQ(x, std::vector<float>(f, f + 3));
  EXPECT_FALSE(can_dequantize(12));
  testing::expect_error([&] { dequantize_row(12, bf.data(), 256, x.data()); }, "ggml type Q4_K is not decoded yet");
}

}  // namespace
}  // namespace attn::model
