// Packing block-quantized rows into 16-row groups and back (the layout: q8_packed.hpp). One
// function moves a row either way, so unpacking is packing's exact inverse by construction.
#include "quant/q8_packed.hpp"

#include <algorithm>
#include <cstring>
#include <new>

namespace attn::kernels {

namespace {

bool five_bits(BlockQuant q) { return q == BlockQuant::q5_0 || q == BlockQuant::q5_1; }
bool has_minimums(BlockQuant q) { return q == BlockQuant::q4_1 || q == BlockQuant::q5_1; }
int64_t value_bytes(BlockQuant q) { return q == BlockQuant::q8_0 ? 512 : five_bits(q) ? 320 : 256; }
// A K-quant's unit bytes (0: not a K-quant).
int64_t k_unit(BlockQuant q) {
  return q == BlockQuant::q4_k ? packed_q4_k::unit : q == BlockQuant::q5_k ? packed_q5_k::unit
                                                     : q == BlockQuant::q6_k ? packed_q6_k::unit : 0;
}
int64_t header_bytes(BlockQuant q, int64_t blocks) {
  if (k_unit(q)) return 0;
  const int64_t raw = blocks * (has_minimums(q) ? 64 : 32);
  return (raw + 63) / 64 * 64;
}

// Moves the `bits`-bit field at bit `ps` of *p (packed) and the one at bit `gs` of *g (ggml)
// between the two: into *p when `pack`, into *g otherwise.
void move_bits(uint8_t* p, int ps, uint8_t* g, int gs, int bits, bool pack) {
  const int mask = (1 << bits) - 1;
  if (pack) *p = static_cast<uint8_t>((*p & ~(mask << ps)) | ((*g >> gs) & mask) << ps);
  else *g = static_cast<uint8_t>((*g & ~(mask << gs)) | ((*p >> ps) & mask) << gs);
}
void move_bytes(uint8_t* p, uint8_t* g, int64_t n, bool pack) { pack ? std::memcpy(p, g, n) : std::memcpy(g, p, n); }

// Q4_K's 12 bytes of 6-bit scales and mins (ggml_blocks.hpp) <-> lanes of bytes s_j, m_j.
void move_k_scales(uint8_t* unit, int64_t i, uint8_t* b, bool pack) {
  uint8_t* s = unit + packed_q4_k::scales + i;
  uint8_t* m = unit + packed_q4_k::mins + i;
  if (pack) {
    for (int j = 0; j < 4; ++j) {
      s[16 * j] = b[j] & 63, m[16 * j] = b[j + 4] & 63;
      s[16 * (j + 4)] = static_cast<uint8_t>((b[j + 8] & 0x0F) | (b[j] >> 6) << 4);
      m[16 * (j + 4)] = static_cast<uint8_t>((b[j + 8] >> 4) | (b[j + 4] >> 6) << 4);
    }
  } else {
    for (int j = 0; j < 4; ++j) {
      b[j] = static_cast<uint8_t>(s[16 * j] | (s[16 * (j + 4)] >> 4) << 6);
      b[j + 4] = static_cast<uint8_t>(m[16 * j] | (m[16 * (j + 4)] >> 4) << 6);
      b[j + 8] = static_cast<uint8_t>((s[16 * (j + 4)] & 0x0F) | (m[16 * (j + 4)] & 0x0F) << 4);
    }
  }
}

// Row i of `group` <-> the ggml row at `row` (into the group when `pack`).
void move_row(const PackedView& v, uint8_t* group, int64_t i, uint8_t* row, bool pack) {
  const BlockQuant q = v.q;
  const int64_t bb = ggml_block_bytes(q);
  if (q == BlockQuant::q4_k || q == BlockQuant::q5_k) {
    const bool five = q == BlockQuant::q5_k;
    const int64_t pair = five ? packed_q5_k::pair : packed_q4_k::pair, nibbles = five ? 48 : 16;
    for (int64_t s = 0; s < v.blocks / 8; ++s, row += bb) {
      uint8_t* unit = group + s * k_unit(q);
      move_bytes(unit + packed_q4_k::d + 2 * i, row, 2, pack);
      move_bytes(unit + packed_q4_k::dmin + 2 * i, row + 2, 2, pack);
      move_k_scales(unit, i, row + 4, pack);
      for (int64_t k = 0; k < 4; ++k)
        for (int64_t t = 0; t < 8; ++t)
          move_bytes(unit + packed_q4_k::values + pair * k + 64 * t + 4 * i, row + nibbles + 32 * k + 4 * t, 4, pack);
      if (five)  // value l of sub-block j: bit j of qh[l] <-> step 8 + j % 2 of pair j / 2, byte l % 4, bit l / 4
        for (int j = 0; j < 8; ++j)
          for (int l = 0; l < 32; ++l)
            move_bits(unit + packed_q4_k::values + pair * (j / 2) + 64 * (8 + j % 2) + 4 * i + l % 4, l / 4,
                      row + 16 + l, j, 1, pack);
    }
    return;
  }
  if (q == BlockQuant::q6_k) {
    for (int64_t s = 0; s < v.blocks / 8; ++s, row += bb) {
      uint8_t* unit = group + s * packed_q6_k::unit;
      move_bytes(unit + packed_q6_k::d + 2 * i, row + 208, 2, pack);
      for (int g = 0; g < 16; ++g) move_bytes(unit + packed_q6_k::scales + 16 * g + i, row + 192 + g, 1, pack);
      for (int a = 0; a < 256; ++a) {  // value a of the super-block: sub-block a / 32, index l within
        const int h = a / 128, r = a % 128, l = a % 32, t = l % 16 / 4, k = l % 4;
        uint8_t* block = unit + packed_q6_k::values + packed_q6_k::block * (a / 32);
        move_bits(block + 64 * t + 4 * i + k, 4 * (l / 16), row + 64 * h + r % 64, 4 * (r / 64), 4, pack);
        move_bits(block + 64 * (4 + l / 16) + 4 * i + k, 2 * t, row + 128 + 32 * h + r % 32, 2 * (r / 32), 2, pack);
      }
    }
    return;
  }
  const int64_t payload = q == BlockQuant::q4_1 ? 4 : q == BlockQuant::q5_0 ? 6 : q == BlockQuant::q5_1 ? 8 : 2;
  const int64_t steps = q == BlockQuant::q8_0 ? 8 : 4;
  for (int64_t b = 0; b < v.blocks; ++b, row += bb) {
    move_bytes(group + 32 * b + 2 * i, row, 2, pack);
    if (has_minimums(q)) move_bytes(group + 32 * (v.blocks + b) + 2 * i, row + 2, 2, pack);
    uint8_t* values = group + v.header_bytes + b * value_bytes(q) + 4 * i;
    for (int64_t t = 0; t < steps; ++t) {
      move_bytes(values + 64 * t, row + payload + 4 * t, 4, pack);
      if (q == BlockQuant::q8_0)  // int8 + 128 as unsigned bytes (the flip is its own inverse)
        for (int k = 0; k < 4; ++k) (pack ? values[64 * t + k] : row[payload + 4 * t + k]) ^= 0x80;
    }
    if (five_bits(q))  // value l's fifth bit: bit l of qh <-> byte l % 4, bit 4 (l / 16) + l % 16 / 4
      for (int l = 0; l < 32; ++l)
        move_bits(values + 256 + l % 4, 4 * (l / 16) + l % 16 / 4, row + payload - 4 + l / 8, l % 8, 1, pack);
  }
}

}  // namespace

void PackedMatrix::Free::operator()(uint8_t* p) const { ::operator delete(p, std::align_val_t{64}); }

PackedMatrix::PackedMatrix(const void* const* rows, BlockQuant q, int64_t n_rows, int64_t cols) : rows_(n_rows) {
  view_.q = q;
  view_.blocks = cols / 32;
  view_.header_bytes = header_bytes(q, view_.blocks);
  view_.group_bytes = k_unit(q) ? cols / 256 * k_unit(q) : view_.header_bytes + view_.blocks * value_bytes(q);
  const size_t total = static_cast<size_t>(std::max<int64_t>(groups() * view_.group_bytes, 64));
  data_.reset(static_cast<uint8_t*>(::operator new(total, std::align_val_t{64})));
  std::memset(data_.get(), 0, total);  // padding rows: scale 0, so every product with them is 0
  view_.data = data_.get();
  for (int64_t r = 0; r < n_rows; ++r)  // packing only reads the row (move_row's one signature serves both ways)
    move_row(view_, data_.get() + r / kPackedRows * view_.group_bytes, r % kPackedRows,
             const_cast<uint8_t*>(static_cast<const uint8_t*>(rows[r])), true);
}

void PackedMatrix::ggml_rows(int64_t r0, int64_t n, uint8_t* out, int64_t row_bytes) const {
  for (int64_t r = r0; r < r0 + n; ++r)  // writes only `out` (the group is read)
    move_row(view_, data_.get() + r / kPackedRows * view_.group_bytes, r % kPackedRows, out + (r - r0) * row_bytes,
             false);
}

}  // namespace attn::kernels
