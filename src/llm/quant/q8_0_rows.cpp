#include "quant/q8_0_rows.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attn/dtype.hpp"
#include "attn/error.hpp"
#include "attn/gguf.hpp"
#include "quant/ggml_blocks.hpp"

namespace attn::model {
namespace {

void put_d(uint8_t* block, float d) {
  const uint16_t h = float_to_f16(d);
  std::memcpy(block, &h, 2);
}

// 32 floats rounded to one Q8_0 block as ggml's reference quantizer does.
void round_block(const float* x, uint8_t* block) {
  float amax = 0.0f;
  bool finite = true;
  for (int i = 0; i < 32; ++i) {
    finite &= std::isfinite(x[i]);
    amax = std::fmax(amax, std::fabs(x[i]));
  }
  auto* q = reinterpret_cast<int8_t*>(block + 2);
  if (!finite) {
    put_d(block, std::numeric_limits<float>::quiet_NaN());
    std::memset(q, 0, 32);
    return;
  }
  const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  put_d(block, d);
  for (int i = 0; i < 32; ++i) q[i] = static_cast<int8_t>(std::round(x[i] * id));
}

}  // namespace

bool converts_exactly_to_q8_0(uint32_t t) { return t == kGgmlQ8_0 || t == kGgmlQ4_0 || t == kGgmlQ5_0; }

void to_q8_0_row(uint32_t type, const uint8_t* src, int64_t n, uint8_t* dst) {
  if (n % 32 != 0) fail("to_q8_0_row", std::to_string(n) + " values are not whole Q8_0 blocks of 32");
  if (!converts_exactly_to_q8_0(type)) {
    std::vector<float> x(static_cast<size_t>(n));
    dequantize_row(type, src, n, x.data());  // checks the type and n
    for (int64_t b = 0; b < n / 32; ++b) round_block(x.data() + 32 * b, dst + kQ8_0BlockBytes * b);
    return;
  }
  const GgmlTypeInfo* info = ggml_type_info(type);
  const int64_t blocks = n / 32, bytes = info->block_bytes;
  for (int64_t b = 0; b < blocks; ++b, src += bytes, dst += kQ8_0BlockBytes) {
    std::memcpy(dst, src, 2);  // d
    auto* q = reinterpret_cast<int8_t*>(dst + 2);
    if (type == kGgmlQ8_0) {
      std::memcpy(q, src + 2, 32);
    } else if (type == kGgmlQ4_0) {
      for (int j = 0; j < 16; ++j) {
        q[j] = static_cast<int8_t>((src[2 + j] & 0x0F) - 8);
        q[j + 16] = static_cast<int8_t>((src[2 + j] >> 4) - 8);
      }
    } else {  // Q5_0: d, qh (4 bytes), 16 nibble bytes
      for (int i = 0; i < 32; ++i) {
        const int low = i < 16 ? src[6 + i] & 0x0F : src[6 + i - 16] >> 4;
        const int high = (src[2 + i / 8] >> (i % 8)) & 1;
        q[i] = static_cast<int8_t>((low | (high << 4)) - 16);
      }
    }
  }
}

}  // namespace attn::model
