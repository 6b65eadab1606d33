// A packed matrix's rows (q8_packed.hpp) decoded straight to float32, for prefill's panels and
// single-row reads: the values of the plain decoding (ggml_blocks.cpp) bit for bit, since each is
// the same formula of exact float32 products (scale times small integers) with at most one sum,
// without rebuilding the ggml rows first.
#include <cstring>
#include <type_traits>

#include "attn/dtype.hpp"
#include "quant/float16_at.hpp"
#include "quant/q8_packed.hpp"

namespace attn::kernels {
namespace {

float half_at(const uint8_t* p) { return float16_at(p); }

// Blocks of 32 values: row i of `group` into dst[0 .. 32 blocks).
template <BlockQuant Q>
void block_row(const PackedView& v, const uint8_t* group, int64_t i, float* dst) {
  constexpr bool five = Q == BlockQuant::q5_0 || Q == BlockQuant::q5_1;
  constexpr bool minimums = Q == BlockQuant::q4_1 || Q == BlockQuant::q5_1;
  constexpr int64_t value_bytes = Q == BlockQuant::q8_0 ? 512 : five ? 320 : 256;
  for (int64_t b = 0; b < v.blocks; ++b, dst += 32) {
    const float d = half_at(group + 32 * b + 2 * i);
    const float m = minimums ? half_at(group + 32 * (v.blocks + b) + 2 * i) : 0.0f;
    const uint8_t* values = group + v.header_bytes + b * value_bytes + 4 * i;
    if constexpr (Q == BlockQuant::q8_0) {
      for (int t = 0; t < 8; ++t)
        for (int k = 0; k < 4; ++k)
          dst[4 * t + k] = static_cast<float>(static_cast<int8_t>(values[64 * t + k] ^ 0x80)) * d;
      continue;
    }
    for (int t = 0; t < 4; ++t)
      for (int k = 0; k < 4; ++k) {
        int lo = values[64 * t + k] & 0x0F, hi = values[64 * t + k] >> 4;
        if constexpr (five) lo |= ((values[256 + k] >> t) & 1) << 4, hi |= ((values[256 + k] >> (4 + t)) & 1) << 4;
        if constexpr (minimums) {
          dst[4 * t + k] = d * static_cast<float>(lo) + m;
          dst[16 + 4 * t + k] = d * static_cast<float>(hi) + m;
        } else {
          constexpr int offset = five ? 16 : 8;
          dst[4 * t + k] = static_cast<float>(lo - offset) * d;
          dst[16 + 4 * t + k] = static_cast<float>(hi - offset) * d;
        }
      }
  }
}

// Q4_K, Q5_K: x = (d s_j) q - dmin m_j per 32-value sub-block j.
template <BlockQuant Q>
void k45_row(const PackedView& v, const uint8_t* group, int64_t i, float* dst) {
  using L = std::conditional_t<Q == BlockQuant::q5_k, packed_q5_k, packed_q4_k>;
  for (int64_t s = 0; s < v.blocks / 8; ++s) {
    const uint8_t* u = group + s * L::unit;
    const float d = half_at(u + L::d + 2 * i), dmin = half_at(u + L::dmin + 2 * i);
    for (int j = 0; j < 8; ++j, dst += 32) {
      const float ds = d * static_cast<float>(u[L::scales + 16 * j + i]);
      const float dm = dmin * static_cast<float>(u[L::mins + 16 * j + i]);
      const uint8_t* values = u + L::values + L::pair * (j / 2) + 4 * i;
      for (int t = 0; t < 8; ++t)
        for (int k = 0; k < 4; ++k) {
          int q = (values[64 * t + k] >> (4 * (j % 2))) & 0x0F;
          if constexpr (Q == BlockQuant::q5_k) q |= ((values[64 * (8 + j % 2) + k] >> t) & 1) << 4;
          dst[4 * t + k] = ds * static_cast<float>(q) - dm;
        }
    }
  }
}

// Q6_K: x = (d s_g) (q - 32) per 16-value group g.
void q6_k_row(const PackedView& v, const uint8_t* group, int64_t i, float* dst) {
  for (int64_t s = 0; s < v.blocks / 8; ++s) {
    const uint8_t* u = group + s * packed_q6_k::unit;
    const float d = half_at(u + packed_q6_k::d + 2 * i);
    for (int b = 0; b < 8; ++b, dst += 32) {
      const uint8_t* values = u + packed_q6_k::values + packed_q6_k::block * b + 4 * i;
      for (int h = 0; h < 2; ++h) {
        const float ds = d * static_cast<float>(static_cast<int8_t>(u[packed_q6_k::scales + 16 * (2 * b + h) + i]));
        for (int t = 0; t < 4; ++t)
          for (int k = 0; k < 4; ++k) {
            const int q = ((values[64 * t + k] >> (4 * h)) & 0x0F) | ((values[64 * (4 + h) + k] >> (2 * t)) & 3) << 4;
            dst[16 * h + 4 * t + k] = ds * static_cast<float>(q - 32);
          }
      }
    }
  }
}

}  // namespace

void PackedMatrix::float_rows(int64_t r0, int64_t n, float* dst, int64_t ldd) const {
  for (int64_t r = r0; r < r0 + n; ++r) {
    const uint8_t* group = view_.data + r / kPackedRows * view_.group_bytes;
    const int64_t i = r % kPackedRows;
    float* out = dst + (r - r0) * ldd;
    switch (view_.q) {
      case BlockQuant::q4_0: block_row<BlockQuant::q4_0>(view_, group, i, out); break;
      case BlockQuant::q4_1: block_row<BlockQuant::q4_1>(view_, group, i, out); break;
      case BlockQuant::q8_0: block_row<BlockQuant::q8_0>(view_, group, i, out); break;
      case BlockQuant::q5_0: block_row<BlockQuant::q5_0>(view_, group, i, out); break;
      case BlockQuant::q5_1: block_row<BlockQuant::q5_1>(view_, group, i, out); break;
      case BlockQuant::q4_k: k45_row<BlockQuant::q4_k>(view_, group, i, out); break;
      case BlockQuant::q5_k: k45_row<BlockQuant::q5_k>(view_, group, i, out); break;
      case BlockQuant::q6_k: q6_k_row(view_, group, i, out); break;
    }
  }
}

}  // namespace attn::kernels
