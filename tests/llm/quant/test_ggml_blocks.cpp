// ggml block decoding on hand-made blocks, value by value from the format's definition (the
// real-file check against the gguf package is python/tests/test_gguf.py).
//
// Q5_0, Q5_1, Q4_K, Q5_K, Q6_K: the test packs blocks itself from chosen fields (scales, mins,
// the integer q of every value) following the byte layout, decodes them, and compares each value
// with the formula evaluated in float64 on those fields. Every product in these formulas is exact
// in float32 (a float16 times integers of at most 8 + 5 bits), so float32 decoding rounds at most
// once, as float(ref64) does: the comparison is bit for bit, signs of zero included.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
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

// ---- Q5_0, Q5_1, Q4_K, Q5_K, Q6_K: fields -> bytes (the test's own packer) -> decode ----

constexpr uint16_t kF16Inf = 0x7C00, kF16NegInf = 0xFC00, kF16NaN = 0x7E00;

double f16d(uint16_t bits) { return static_cast<double>(f16_to_float(bits)); }

// One block's fields. Q5_0/Q5_1: 32 values; K-quants: 256 values. q are the stored unsigned
// integers (4, 5 or 6 bits); sc/mn the Q4_K/Q5_K sub-block scales and mins (6 bits, 8 of each)
// or the Q6_K group scales (int8, 16 of them).
struct Fields {
  uint16_t d = 0, m = 0;  // d; Q5_1's m or the K-quants' dmin
  std::vector<int> q, sc, mn;
};

struct Format {
  const char* name;
  uint32_t type;
  int block;  // values per block
  int bytes;  // bytes per block
  int q_bits;
};
const Format kQ5_0{"Q5_0", kGgmlQ5_0, 32, 22, 5}, kQ5_1{"Q5_1", kGgmlQ5_1, 32, 24, 5},
    kQ4_K{"Q4_K", kGgmlQ4_K, 256, 144, 4}, kQ5_K{"Q5_K", kGgmlQ5_K, 256, 176, 5}, kQ6_K{"Q6_K", kGgmlQ6_K, 256, 210, 6};
const Format* const kNewFormats[] = {&kQ5_0, &kQ5_1, &kQ4_K, &kQ5_K, &kQ6_K};

void set16(uint8_t* p, uint16_t v) { p[0] = v & 0xFF, p[1] = v >> 8; }

// The block's bytes, written from the layout (ggml_blocks.hpp) one field at a time.
std::vector<uint8_t> pack(const Format& f, const Fields& x) {
  std::vector<uint8_t> b(static_cast<size_t>(f.bytes), 0);
  if (f.type == kGgmlQ5_0 || f.type == kGgmlQ5_1) {
    set16(&b[0], x.d);
    const int qh = f.type == kGgmlQ5_0 ? 2 : 4, nib = qh + 4;
    if (f.type == kGgmlQ5_1) set16(&b[2], x.m);
    for (int i = 0; i < 32; ++i) {
      b[nib + i % 16] |= static_cast<uint8_t>((x.q[i] & 15) << (i < 16 ? 0 : 4));
      b[qh + i / 8] |= static_cast<uint8_t>((x.q[i] >> 4) << (i % 8));  // uint32 bit i, little-endian
    }
  } else if (f.type == kGgmlQ4_K || f.type == kGgmlQ5_K) {
    set16(&b[0], x.d), set16(&b[2], x.m);
    uint8_t* s = &b[4];
    for (int j = 0; j < 4; ++j) {
      s[j] = static_cast<uint8_t>(x.sc[j] | ((x.sc[j + 4] >> 4) << 6));
      s[j + 4] = static_cast<uint8_t>(x.mn[j] | ((x.mn[j + 4] >> 4) << 6));
      s[j + 8] = static_cast<uint8_t>((x.sc[j + 4] & 15) | ((x.mn[j + 4] & 15) << 4));
    }
    uint8_t* qh = &b[16];
    uint8_t* nib = f.type == kGgmlQ4_K ? &b[16] : &b[48];
    for (int j = 0; j < 8; ++j)
      for (int l = 0; l < 32; ++l) {
        const int q = x.q[32 * j + l];
        nib[32 * (j / 2) + l] |= static_cast<uint8_t>((q & 15) << (j % 2 ? 4 : 0));
        if (f.type == kGgmlQ5_K) qh[l] |= static_cast<uint8_t>((q >> 4) << j);
      }
  } else {  // Q6_K: two halves of 128 values; ql 64 bytes and qh 32 bytes per half
    for (int half = 0; half < 2; ++half)
      for (int r = 0; r < 128; ++r) {
        const int q = x.q[128 * half + r];
        b[64 * half + r % 64] |= static_cast<uint8_t>((q & 15) << (r < 64 ? 0 : 4));
        b[128 + 32 * half + r % 32] |= static_cast<uint8_t>((q >> 4) << (2 * (r / 32)));
      }
    for (int g = 0; g < 16; ++g) b[192 + g] = static_cast<uint8_t>(static_cast<int8_t>(x.sc[g]));
    set16(&b[208], x.d);
  }
  return b;
}

// Value i of the block by its formula, in float64.
double formula(const Format& f, const Fields& x, int i) {
  const double d = f16d(x.d), m = f16d(x.m), q = x.q[i];
  switch (f.type) {
    case kGgmlQ5_0: return (q - 16) * d;
    case kGgmlQ5_1: return d * q + m;
    case kGgmlQ6_K: return d * x.sc[i / 16] * (q - 32);
    default: return d * x.sc[i / 32] * q - m * x.mn[i / 32];  // Q4_K, Q5_K
  }
}

// Equal bits, or both NaN.
bool same(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint32_t ua, ub;
  std::memcpy(&ua, &a, 4), std::memcpy(&ub, &b, 4);
  return ua == ub;
}

// Decodes `blocks` packed one after another as one row and checks every value.
void expect_decodes(const Format& f, const std::vector<Fields>& blocks) {
  std::vector<uint8_t> bytes;
  for (const Fields& x : blocks) {
    const std::vector<uint8_t> b = pack(f, x);
    bytes.insert(bytes.end(), b.begin(), b.end());
  }
  const int64_t n = static_cast<int64_t>(blocks.size()) * f.block;
  std::vector<float> out(static_cast<size_t>(n), 12345.0f);
  dequantize_row(f.type, bytes.data(), n, out.data());
  for (size_t k = 0; k < blocks.size(); ++k)
    for (int i = 0; i < f.block; ++i) {
      const float want = static_cast<float>(formula(f, blocks[k], i)), got = out[k * f.block + i];
      ASSERT_TRUE(same(got, want)) << f.name << " block " << k << " value " << i << ": got " << got << ", want " << want;
    }
}

uint16_t random_finite_f16(std::mt19937& rng) {
  for (;;) {
    const auto bits = static_cast<uint16_t>(rng());
    if ((bits & 0x7C00) != 0x7C00) return bits;  // every finite pattern: zeros, subnormals, both signs
  }
}

Fields random_fields(const Format& f, std::mt19937& rng) {
  Fields x;
  x.d = random_finite_f16(rng), x.m = random_finite_f16(rng);
  for (int i = 0; i < f.block; ++i) x.q.push_back(static_cast<int>(rng() % (1u << f.q_bits)));
  if (f.type == kGgmlQ6_K)
    for (int g = 0; g < 16; ++g) x.sc.push_back(static_cast<int>(rng() % 256) - 128);
  else if (f.block == 256)
    for (int j = 0; j < 8; ++j) x.sc.push_back(static_cast<int>(rng() % 64)), x.mn.push_back(static_cast<int>(rng() % 64));
  return x;
}

TEST(GgmlBlocks, NewFormatsOnRandomBlocks) {
  std::mt19937 rng(20250301);
  for (const Format* f : kNewFormats)
    for (int rep = 0; rep < 40; ++rep) {
      std::vector<Fields> blocks;
      for (int k = 0; k < 1 + rep % 4; ++k) blocks.push_back(random_fields(*f, rng));
      expect_decodes(*f, blocks);
    }
}

// Extreme fields: every q at its largest or zero, the largest scales and mins, the largest float16.
TEST(GgmlBlocks, NewFormatsOnExtremeBlocks) {
  std::mt19937 rng(7);
  for (const Format* f : kNewFormats)
    for (uint16_t d : {uint16_t{0x7BFF}, uint16_t{0xFBFF}, uint16_t{0x0001}, uint16_t{0x8000}, uint16_t{0x3C00}})
      for (int qv : {0, (1 << f->q_bits) - 1}) {
        Fields x = random_fields(*f, rng);
        x.d = d, x.m = 0x7BFF;
        for (int& q : x.q) q = qv;
        for (int& s : x.sc) s = f->type == kGgmlQ6_K ? -128 : 63;
        for (int& m : x.mn) m = 63;
        expect_decodes(*f, {x});
      }
}

// Fixed bytes, expected values worked out by hand from the layout.
TEST(GgmlBlocks, Q5_0AndQ5_1ByHand) {
  // qh = 0x80000001: values 0 and 31 have the high bit. Nibble byte j = j | (15 - j) << 4.
  std::vector<uint8_t> q50, q51;
  put16(q50, float_to_f16(0.5f));
  put16(q51, float_to_f16(0.5f)), put16(q51, float_to_f16(-1.0f));
  for (uint8_t byte : {0x01, 0x00, 0x00, 0x80}) q50.push_back(byte), q51.push_back(byte);
  for (int j = 0; j < 16; ++j) q50.push_back(static_cast<uint8_t>(j | (15 - j) << 4)), q51.push_back(q50.back());
  std::vector<float> a(32), c(32);
  dequantize_row(kGgmlQ5_0, q50.data(), 32, a.data());
  dequantize_row(kGgmlQ5_1, q51.data(), 32, c.data());
  EXPECT_EQ(a[0], 0.0f);    // (0 + 16 - 16) * 0.5
  EXPECT_EQ(a[1], -7.5f);   // (1 - 16) * 0.5
  EXPECT_EQ(a[16], -0.5f);  // (15 - 16) * 0.5
  EXPECT_EQ(a[31], 0.0f);   // (0 + 16 - 16) * 0.5
  EXPECT_EQ(a[30], -7.5f);  // (1 - 16) * 0.5
  EXPECT_EQ(c[0], 7.0f);    // 16 * 0.5 - 1
  EXPECT_EQ(c[15], 6.5f);   // 15 * 0.5 - 1
  EXPECT_EQ(c[17], 6.0f);   // 14 * 0.5 - 1
  EXPECT_EQ(c[31], 7.0f);   // 16 * 0.5 - 1
}

TEST(GgmlBlocks, KQuantScalesAndMinsByHand) {
  // d = 1, dmin = 1, every nibble 1 (and no high bits): sub-block j decodes to s_j - m_j.
  // Scale bytes: 0xC1 02 03 04 | 0x85 06 07 08 | 9A BC DE F0. s_0..3 = 1 2 3 4, m_0..3 = 5 6 7 8;
  // s_4 = 0xA | 3 << 4 = 58 (top bits of 0xC1), m_4 = 9 | 2 << 4 = 41 (top bits of 0x85);
  // s_5..7 = 0xC 0xE 0x0, m_5..7 = 0xB 0xD 0xF.
  const int s[8] = {1, 2, 3, 4, 58, 12, 14, 0}, m[8] = {5, 6, 7, 8, 41, 11, 13, 15};
  for (const Format* f : {&kQ4_K, &kQ5_K}) {
    std::vector<uint8_t> b(static_cast<size_t>(f->bytes), 0);
    set16(&b[0], 0x3C00), set16(&b[2], 0x3C00);
    const uint8_t scales[12] = {0xC1, 0x02, 0x03, 0x04, 0x85, 0x06, 0x07, 0x08, 0x9A, 0xBC, 0xDE, 0xF0};
    std::memcpy(&b[4], scales, 12);
    for (int i = f->bytes - 128; i < f->bytes; ++i) b[static_cast<size_t>(i)] = 0x11;
    std::vector<float> x(256);
    dequantize_row(f->type, b.data(), 256, x.data());
    for (int i = 0; i < 256; ++i) EXPECT_EQ(x[i], static_cast<float>(s[i / 32] - m[i / 32])) << f->name << " " << i;
  }
}

TEST(GgmlBlocks, Q6_KByHand) {
  // d = 0.25, group scales g + 1; one bit set at a time in ql and qh, the rest 0 (q = 0 -> -32).
  std::vector<uint8_t> b(210, 0);
  for (int g = 0; g < 16; ++g) b[192 + g] = static_cast<uint8_t>(g + 1);
  set16(&b[208], float_to_f16(0.25f));
  b[64 + 5] = 0x30;   // second half, ql byte 5: low nibble 0, high nibble 3 -> value 128 + 64 + 5 gets q = 3
  b[128 + 7] = 0x08;  // first half, qh byte 7, bits 2-3 = 2 -> value 32 + 7 gets q = 2 << 4 = 32
  std::vector<float> x(256);
  dequantize_row(kGgmlQ6_K, b.data(), 256, x.data());
  for (int i = 0; i < 256; ++i) {
    const int q = i == 197 ? 3 : i == 39 ? 32 : 0;
    EXPECT_EQ(x[i], 0.25f * static_cast<float>(i / 16 + 1) * static_cast<float>(q - 32)) << i;
  }
}

// A float16 scale that is inf or NaN is not clamped: it gives inf or NaN values as IEEE arithmetic
// does (inf * 0 = NaN), as Q8_0 does.
TEST(GgmlBlocks, InfAndNaNScalesPropagate) {
  {
    std::vector<uint8_t> b;
    put16(b, kF16Inf);
    for (int i = 0; i < 32; ++i) b.push_back(static_cast<uint8_t>(i - 1));
    std::vector<float> x(32);
    dequantize_row(kGgmlQ8_0, b.data(), 32, x.data());
    EXPECT_EQ(x[0], -INFINITY);
    EXPECT_TRUE(std::isnan(x[1]));
    EXPECT_EQ(x[2], INFINITY);
  }
  std::mt19937 rng(5);
  for (const Format* f : kNewFormats)
    for (uint16_t bad : {kF16Inf, kF16NegInf, kF16NaN})
      for (bool in_d : {true, false}) {
        if (!in_d && (f->type == kGgmlQ5_0 || f->type == kGgmlQ6_K)) continue;  // no second float16
        Fields x = random_fields(*f, rng);
        (in_d ? x.d : x.m) = bad;
        x.q[0] = 0, x.q[1] = 1, x.q[2] = (1 << f->q_bits) - 1;  // a zero factor for the formats without an offset
        if (!x.sc.empty()) x.sc[0] = 5;
        if (!x.mn.empty()) x.mn[0] = 0, x.mn[1] = 3;
        expect_decodes(*f, {x});
        std::vector<uint8_t> bytes = pack(*f, x);
        std::vector<float> out(static_cast<size_t>(f->block));
        dequantize_row(f->type, bytes.data(), f->block, out.data());
        int nans = 0, infs = 0;
        for (float v : out) nans += std::isnan(v), infs += std::isinf(v);
        if (bad == kF16NaN) {
          EXPECT_EQ(nans, f->block) << f->name << (in_d ? " d" : " m");  // NaN * 0 is NaN too
        } else {
          EXPECT_GT(infs, 0) << f->name << (in_d ? " d" : " m");
        }
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
  for (uint32_t t : {kGgmlQ5_0, kGgmlQ5_1, kGgmlQ4_K, kGgmlQ5_K, kGgmlQ6_K}) EXPECT_TRUE(can_dequantize(t)) << t;
  EXPECT_FALSE(can_dequantize(10));  // Q2_K
  std::vector<uint8_t> zeros(1024);
  std::vector<float> out(512);
  testing::expect_error([&] { dequantize_row(10, zeros.data(), 256, out.data()); }, "ggml type Q2_K is not decoded yet");
  testing::expect_error([&] { dequantize_row(99, zeros.data(), 256, out.data()); }, "ggml type 99 is not decoded yet");
}

// A length that is not whole blocks is an Error, for the old types as for the new.
TEST(GgmlBlocks, PartialBlocksAreRefused) {
  std::vector<uint8_t> zeros(1024);
  std::vector<float> out(600);
  struct Case {
    uint32_t type;
    int64_t n;
    const char* message;
  };
  for (const Case& c : {Case{kGgmlQ8_0, 33, "33 values are not whole Q8_0 blocks of 32"},
                        Case{kGgmlQ4_0, 16, "16 values are not whole Q4_0 blocks of 32"},
                        Case{kGgmlQ4_1, 48, "48 values are not whole Q4_1 blocks of 32"},
                        Case{kGgmlQ5_0, 31, "31 values are not whole Q5_0 blocks of 32"},
                        Case{kGgmlQ5_1, 65, "65 values are not whole Q5_1 blocks of 32"},
                        Case{kGgmlQ4_K, 32, "32 values are not whole Q4_K blocks of 256"},
                        Case{kGgmlQ5_K, 257, "257 values are not whole Q5_K blocks of 256"},
                        Case{kGgmlQ6_K, 384, "384 values are not whole Q6_K blocks of 256"},
                        Case{kGgmlQ6_K, -256, "-256 values are not whole Q6_K blocks of 256"}})
    testing::expect_error([&] { dequantize_row(c.type, zeros.data(), c.n, out.data()); }, c.message);
  dequantize_row(kGgmlQ6_K, zeros.data(), 0, out.data());  // no blocks: nothing to do
}

}  // namespace
}  // namespace attn::model
