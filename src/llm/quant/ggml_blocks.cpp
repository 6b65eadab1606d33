#include "quant/ggml_blocks.hpp"

#include <cstring>

#include "attn/dtype.hpp"
#include "attn/error.hpp"
#include "attn/gguf.hpp"

namespace attn::model {
namespace {

uint16_t u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

float f16(const uint8_t* p) { return f16_to_float(u16(p)); }

// Bit i of the 4 bytes at p read as a little-endian uint32 (byte order spelt out, not assumed).
int bit32(const uint8_t* p, int i) { return (p[i / 8] >> (i % 8)) & 1; }

// Q5_0 / Q5_1 (32 values): the 5-bit q_i from the 4 qh bytes and the 16 nibble bytes.
int q5(const uint8_t* qh, const uint8_t* nibbles, int i) {
  const int low = i < 16 ? nibbles[i] & 0x0F : nibbles[i - 16] >> 4;
  return low | (bit32(qh, i) << 4);
}

// Sub-block j's 6-bit scale and min from a Q4_K / Q5_K super-block's 12 packed bytes.
void k_scale_min(const uint8_t* b, int j, int& scale, int& min) {
  if (j < 4) {
    scale = b[j] & 63;
    min = b[j + 4] & 63;
  } else {
    scale = (b[j + 4] & 0x0F) | ((b[j - 4] >> 6) << 4);
    min = (b[j + 4] >> 4) | ((b[j] >> 6) << 4);
  }
}

// Q4_K (qh == nullptr) and Q5_K: one super-block of 256 values.
void q45_k_block(const uint8_t* block, const uint8_t* qh, const uint8_t* nibbles, float* dst) {
  const float d = f16(block), dmin = f16(block + 2);
  for (int j = 0; j < 8; ++j, dst += 32) {
    int s, m;
    k_scale_min(block + 4, j, s, m);
    const float ds = d * static_cast<float>(s), dm = dmin * static_cast<float>(m);
    const uint8_t* q = nibbles + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      const int high = qh ? ((qh[l] >> j) & 1) << 4 : 0;
      dst[l] = ds * static_cast<float>(((q[l] >> shift) & 0x0F) | high) - dm;
    }
  }
}

void q6_k_block(const uint8_t* block, float* dst) {
  const uint8_t* ql = block;
  const uint8_t* qh = block + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(block + 192);
  const float d = f16(block + 208);
  for (int i = 0; i < 256; ++i) {
    const int h = i / 128, r = i % 128;
    const int low = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
    const int high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 0x03;
    dst[i] = (d * static_cast<float>(scales[i / 16])) * static_cast<float>((low | (high << 4)) - 32);
  }
}

}  // namespace

bool can_dequantize(uint32_t t) {
  switch (t) {
    case kGgmlF32: case kGgmlF16: case kGgmlBF16: case kGgmlQ4_0: case kGgmlQ4_1: case kGgmlQ8_0:
    case kGgmlQ5_0: case kGgmlQ5_1: case kGgmlQ4_K: case kGgmlQ5_K: case kGgmlQ6_K: return true;
    default: return false;
  }
}

void dequantize_row(uint32_t type, const uint8_t* src, int64_t n, float* dst) {
  const GgmlTypeInfo* info = ggml_type_info(type);
  if (!can_dequantize(type))
    fail("dequantize", std::string("ggml type ") + (info ? info->name : std::to_string(type)) +
                           " is not decoded yet (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)");
  if (n < 0 || n % info->block_elements != 0)
    fail("dequantize", std::to_string(n) + " values are not whole " + info->name + " blocks of " +
                           std::to_string(info->block_elements));
  const int64_t blocks = n / info->block_elements, bytes = info->block_bytes;
  switch (type) {
    case kGgmlF32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case kGgmlF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_float(u16(src + 2 * i));
      return;
    case kGgmlBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(u16(src + 2 * i));
      return;
    case kGgmlQ8_0:
      for (int64_t b = 0; b < blocks; ++b, src += bytes, dst += 32) {
        const float d = f16(src);
        for (int i = 0; i < 32; ++i) dst[i] = static_cast<float>(static_cast<int8_t>(src[2 + i])) * d;
      }
      return;
    case kGgmlQ4_0:
      for (int64_t b = 0; b < blocks; ++b, src += bytes, dst += 32) {
        const float d = f16(src);
        for (int j = 0; j < 16; ++j) {
          dst[j] = static_cast<float>((src[2 + j] & 0x0F) - 8) * d;
          dst[j + 16] = static_cast<float>((src[2 + j] >> 4) - 8) * d;
        }
      }
      return;
    case kGgmlQ4_1:
      for (int64_t b = 0; b < blocks; ++b, src += bytes, dst += 32) {
        const float d = f16(src), m = f16(src + 2);
        for (int j = 0; j < 16; ++j) {
          dst[j] = d * static_cast<float>(src[4 + j] & 0x0F) + m;
          dst[j + 16] = d * static_cast<float>(src[4 + j] >> 4) + m;
        }
      }
      return;
    case kGgmlQ5_0:
      for (int64_t b = 0; b < blocks; ++b, src += bytes, dst += 32) {
        const float d = f16(src);
        for (int i = 0; i < 32; ++i) dst[i] = static_cast<float>(q5(src + 2, src + 6, i) - 16) * d;
      }
      return;
    case kGgmlQ5_1:
      for (int64_t b = 0; b < blocks; ++b, src += bytes, dst += 32) {
        const float d = f16(src), m = f16(src + 2);
        for (int i = 0; i < 32; ++i) dst[i] = d * static_cast<float>(q5(src + 4, src + 8, i)) + m;
      }
      return;
    case kGgmlQ4_K:
      for (int64_t b = 0; b < blocks; ++b, src += bytes, dst += 256) q45_k_block(src, nullptr, src + 16, dst);
      return;
    case kGgmlQ5_K:
      for (int64_t b = 0; b < blocks; ++b, src += bytes, dst += 256) q45_k_block(src, src + 16, src + 48, dst);
      return;
    case kGgmlQ6_K:
      for (int64_t b = 0; b < blocks; ++b, src += bytes, dst += 256) q6_k_block(src, dst);
      return;
    default: return;  // refused above
  }
}

}  // namespace attn::model
