// Packing block-quantized rows into 16-row groups and back (the layout: q8_packed.hpp).
#include "quant/q8_packed.hpp"

#include <algorithm>
#include <cstring>
#include <new>

namespace attn::kernels {

namespace {

// Where a ggml block keeps its parts: scale at 0, Q4_1's minimum at 2, values after.
int64_t payload_offset(BlockQuant q) { return q == BlockQuant::q4_1 ? 4 : 2; }
int64_t value_bytes(BlockQuant q) { return q == BlockQuant::q8_0 ? 512 : 256; }
int64_t header_bytes(BlockQuant q, int64_t blocks) {
  const int64_t raw = blocks * (q == BlockQuant::q4_1 ? 64 : 32);
  return (raw + 63) / 64 * 64;
}

}  // namespace

int64_t ggml_block_bytes(BlockQuant q) { return q == BlockQuant::q8_0 ? 34 : q == BlockQuant::q4_1 ? 20 : 18; }

void PackedMatrix::Free::operator()(uint8_t* p) const { ::operator delete(p, std::align_val_t{64}); }

PackedMatrix::PackedMatrix(const void* const* rows, BlockQuant q, int64_t n_rows, int64_t cols) : rows_(n_rows) {
  view_.q = q;
  view_.blocks = cols / 32;
  view_.header_bytes = header_bytes(q, view_.blocks);
  view_.group_bytes = view_.header_bytes + view_.blocks * value_bytes(q);
  const size_t total = static_cast<size_t>(std::max<int64_t>(groups() * view_.group_bytes, 64));
  data_.reset(static_cast<uint8_t*>(::operator new(total, std::align_val_t{64})));
  std::memset(data_.get(), 0, total);  // padding rows: scale 0, so every product with them is 0
  view_.data = data_.get();
  const int64_t bb = ggml_block_bytes(q), payload = payload_offset(q), steps = value_bytes(q) / 64;
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t i = r % kPackedRows;
    uint8_t* group = data_.get() + r / kPackedRows * view_.group_bytes;
    const uint8_t* src = static_cast<const uint8_t*>(rows[r]);
    for (int64_t b = 0; b < view_.blocks; ++b, src += bb) {
      std::memcpy(group + 32 * b + 2 * i, src, 2);
      if (q == BlockQuant::q4_1) std::memcpy(group + 32 * (view_.blocks + b) + 2 * i, src + 2, 2);
      uint8_t* values = group + view_.header_bytes + b * value_bytes(q) + 4 * i;
      for (int64_t t = 0; t < steps; ++t)
        for (int k = 0; k < 4; ++k) {
          const uint8_t v = src[payload + 4 * t + k];
          values[64 * t + k] = q == BlockQuant::q8_0 ? static_cast<uint8_t>(v ^ 0x80) : v;  // int8 + 128
        }
    }
  }
}

void PackedMatrix::ggml_rows(int64_t r0, int64_t n, uint8_t* out, int64_t row_bytes) const {
  const BlockQuant q = view_.q;
  const int64_t bb = ggml_block_bytes(q), payload = payload_offset(q), steps = value_bytes(q) / 64;
  for (int64_t r = r0; r < r0 + n; ++r) {
    const int64_t i = r % kPackedRows;
    const uint8_t* group = view_.data + r / kPackedRows * view_.group_bytes;
    uint8_t* dst = out + (r - r0) * row_bytes;
    for (int64_t b = 0; b < view_.blocks; ++b, dst += bb) {
      std::memcpy(dst, group + 32 * b + 2 * i, 2);
      if (q == BlockQuant::q4_1) std::memcpy(dst + 2, group + 32 * (view_.blocks + b) + 2 * i, 2);
      const uint8_t* values = group + view_.header_bytes + b * value_bytes(q) + 4 * i;
      for (int64_t t = 0; t < steps; ++t)
        for (int k = 0; k < 4; ++k) {
          const uint8_t v = values[64 * t + k];
          dst[payload + 4 * t + k] = q == BlockQuant::q8_0 ? static_cast<uint8_t>(v ^ 0x80) : v;
        }
    }
  }
}

}  // namespace attn::kernels
