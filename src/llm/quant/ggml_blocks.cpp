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

}  // namespace

bool can_dequantize(uint32_t t) {
  return t == kGgmlF32 || t == kGgmlF16 || t == kGgmlBF16 || t == kGgmlQ4_0 || t == kGgmlQ4_1 || t == kGgmlQ8_0;
}

void dequantize_row(uint32_t type, const uint8_t* src, int64_t n, float* dst) {
  switch (type) {
    case kGgmlF32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case kGgmlF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_float(u16(src + 2 * i));
      return;
    case kGgmlBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(u16(src + 2 * i));
      return;
    case kGgmlQ8_0:
      for (int64_t b = 0; b < n / 32; ++b, src += 34, dst += 32) {
        const float d = f16_to_float(u16(src));
        for (int i = 0; i < 32; ++i) dst[i] = static_cast<float>(static_cast<int8_t>(src[2 + i])) * d;
      }
      return;
    case kGgmlQ4_0:
      for (int64_t b = 0; b < n / 32; ++b, src += 18, dst += 32) {
        const float d = f16_to_float(u16(src));
        for (int j = 0; j < 16; ++j) {
          dst[j] = static_cast<float>((src[2 + j] & 0x0F) - 8) * d;
          dst[j + 16] = static_cast<float>((src[2 + j] >> 4) - 8) * d;
        }
      }
      return;
    case kGgmlQ4_1:
      for (int64_t b = 0; b < n / 32; ++b, src += 20, dst += 32) {
        const float d = f16_to_float(u16(src)), m = f16_to_float(u16(src + 2));
        for (int j = 0; j < 16; ++j) {
          dst[j] = d * static_cast<float>(src[4 + j] & 0x0F) + m;
          dst[j + 16] = d * static_cast<float>(src[4 + j] >> 4) + m;
        }
      }
      return;
    default: {
      const GgmlTypeInfo* info = ggml_type_info(type);
      fail("dequantize", std::string("ggml type ") + (info ? info->name : std::to_string(type)) +
                             " is not decoded yet (F32, F16, BF16, Q4_0, Q4_1, Q8_0)");
    }
  }
}

}  // namespace attn::model
