// Block-quantized rows as 32-value pieces (block_pieces.hpp); the layouts are ggml's
// (ggml_blocks.hpp).
#include "quant/block_pieces.hpp"

#include <cstring>

#include "attn/dtype.hpp"
#include "quant/float16_at.hpp"

namespace attn::kernels {
namespace {

float f16(const uint8_t* p) { return float16_at(p); }

}  // namespace

int64_t ggml_block_values(BlockQuant q) {
  return q == BlockQuant::q4_k || q == BlockQuant::q5_k || q == BlockQuant::q6_k ? 256 : 32;
}

int64_t ggml_block_bytes(BlockQuant q) {
  switch (q) {
    case BlockQuant::q4_0: return 18;
    case BlockQuant::q4_1: return 20;
    case BlockQuant::q8_0: return 34;
    case BlockQuant::q5_0: return 22;
    case BlockQuant::q5_1: return 24;
    case BlockQuant::q4_k: return 144;
    case BlockQuant::q5_k: return 176;
    case BlockQuant::q6_k: return 210;
  }
  return 0;
}

int64_t ggml_row_bytes(BlockQuant q, int64_t cols) { return cols / ggml_block_values(q) * ggml_block_bytes(q); }

void quant_piece(BlockQuant q, const uint8_t* row, int64_t p, QuantPiece& out) {
  const int64_t per_block = ggml_block_values(q) / 32, j = p % per_block;  // j: piece within its block
  const uint8_t* b = row + p / per_block * ggml_block_bytes(q);
  out.has_offset = q == BlockQuant::q4_1 || q == BlockQuant::q5_1 || q == BlockQuant::q4_k || q == BlockQuant::q5_k;
  out.offset = 0;
  switch (q) {
    case BlockQuant::q8_0:
      out.scale[0] = f16(b);
      std::memcpy(out.v, b + 2, 32);
      break;
    case BlockQuant::q4_0:
    case BlockQuant::q4_1: {
      const uint8_t* nib = b + (q == BlockQuant::q4_1 ? 4 : 2);
      const int sub = q == BlockQuant::q4_1 ? 0 : 8;
      out.scale[0] = f16(b);
      if (q == BlockQuant::q4_1) out.offset = f16(b + 2);
      for (int i = 0; i < 16; ++i)
        out.v[i] = static_cast<int8_t>((nib[i] & 0x0F) - sub), out.v[i + 16] = static_cast<int8_t>((nib[i] >> 4) - sub);
      break;
    }
    case BlockQuant::q5_0:
    case BlockQuant::q5_1: {  // d, (Q5_1: m,) 4 bytes of fifth bits, 16 nibble bytes
      const uint8_t* qh = b + (q == BlockQuant::q5_1 ? 4 : 2);
      out.scale[0] = f16(b);
      if (q == BlockQuant::q5_1) out.offset = f16(b + 2);
      for (int i = 0; i < 32; ++i) {
        const int low = i < 16 ? qh[4 + i] & 0x0F : qh[4 + i - 16] >> 4, high = (qh[i / 8] >> (i % 8)) & 1;
        out.v[i] = static_cast<int8_t>((low | high << 4) - (q == BlockQuant::q5_0 ? 16 : 0));
      }
      break;
    }
    case BlockQuant::q4_k:
    case BlockQuant::q5_k: {  // sub-block j: 6-bit scale s and min m from the 12 bytes at b + 4
      const uint8_t* s = b + 4;
      const int scale = j < 4 ? s[j] & 63 : (s[j + 4] & 0x0F) | (s[j - 4] >> 6) << 4;
      const int min = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | (s[j] >> 6) << 4;
      out.scale[0] = f16(b) * static_cast<float>(scale);
      out.offset = -(f16(b + 2) * static_cast<float>(min));
      const uint8_t* nib = b + (q == BlockQuant::q5_k ? 48 : 16) + 32 * (j / 2);
      for (int i = 0; i < 32; ++i) {
        const int high = q == BlockQuant::q5_k ? (b[16 + i] >> j) & 1 : 0;  // Q5_K: bit j of qh[i]
        out.v[i] = static_cast<int8_t>(((nib[i] >> (4 * (j % 2))) & 0x0F) | high << 4);
      }
      break;
    }
    case BlockQuant::q6_k: {  // values 32 j .. 32 j + 31 of the super-block
      const float d = f16(b + 208);
      const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
      out.scale[0] = d * static_cast<float>(scales[2 * j]);
      out.scale[1] = d * static_cast<float>(scales[2 * j + 1]);
      for (int i = 0; i < 32; ++i) {
        const int at = 32 * static_cast<int>(j) + i, h = at / 128, r = at % 128;
        const int low = (b[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
        const int high = (b[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 0x03;
        out.v[i] = static_cast<int8_t>((low | high << 4) - 32);
      }
      return;
    }
  }
  out.scale[1] = out.scale[0];
}

}  // namespace attn::kernels
