// What the integer-dot variants share (q8_dot.hpp): rounding activations to 8-bit blocks, the
// float64 oracle, and the list of variants this CPU runs.
#include "quant/q8_dot.hpp"

#include <cmath>
#include <cstring>

#include "attn/dtype.hpp"
#include "base/cpu_features.hpp"
#include "quant/block_pieces.hpp"
#include "quant/float16_at.hpp"

namespace attn::kernels {

// Defined in q8_dot_isa.cpp, compiled once per variant.
#define ATTN_Q8_DECLARE(ns)                                                                                      \
  namespace ns {                                                                                                 \
  void q8_dot_rows(const Q8Block* x, int64_t R, int64_t blocks, const void* const* w, BlockQuant q, int64_t n,   \
                   float* y, int64_t ldy);                                                                       \
  void q8_packed_rows(const Q8Block* x, int64_t R, const PackedView& w, int64_t g0, int64_t n, float* y,        \
                      int64_t ldy);                                                                              \
  void quantize_rows(const float* x, int64_t R, int64_t cols, int64_t ld, Q8Block* out);                        \
  }
ATTN_Q8_DECLARE(q8_portable)
ATTN_Q8_DECLARE(q8_avx2)
ATTN_Q8_DECLARE(q8_avx_vnni)
ATTN_Q8_DECLARE(q8_avx512)
ATTN_Q8_DECLARE(q8_avx512_vnni)
#undef ATTN_Q8_DECLARE

void quantize_q8_rows(const float* x, int64_t R, int64_t cols, int64_t ld, Q8Block* out) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c0 = 0; c0 < cols; c0 += 32) {
      const float* v = x + r * ld + c0;
      Q8Block& b = *out++;
      float most = 0.0f;
      bool finite = true;
      for (int i = 0; i < 32; ++i) {
        most = std::fmax(most, std::fabs(v[i]));
        finite &= std::isfinite(v[i]);
      }
      if (!finite) {  // a NaN or infinity: the block's products are NaN
        b.d = NAN, b.s = NAN, b.sum = 0, b.low = 0;
        std::memset(b.q, 0, sizeof b.q);
        continue;
      }
      if (most < 0x1p-100f) most = 0.0f;  // 127 / most would overflow for a subnormal most: a zero block
      b.d = most / 127.0f;
      const float inv = most > 0.0f ? 127.0f / most : 0.0f;
      int32_t sum = 0;
      for (int i = 0; i < 32; ++i) {
        const int32_t q = static_cast<int32_t>(std::nearbyint(v[i] * inv));  // |q| <= 127
        b.q[i] = static_cast<int8_t>(q);
        sum += q;
        if (i == 15) b.low = static_cast<int16_t>(sum);
      }
      b.sum = static_cast<int16_t>(sum);
      b.s = b.d * static_cast<float>(sum);
    }
}

namespace {

// q8_dot_reference for the types decode multiplies only packed (Q5_0, Q5_1, K-quants), from their pieces
// (block_pieces.hpp): per 16-value half h, scale_h dx dot(v, q_x), plus offset dx sum(q_x). The
// kernels' integer sums and offsets are exact, so the rounding error scales with the sum of
// |scale_h dx| sum |v q_x| and |offset dx sum(q_x)|.
double piece_reference(const Q8Block* x, int64_t blocks, const uint8_t* row, BlockQuant q, double* magnitude) {
  double total = 0, size = 0;
  QuantPiece p;
  for (int64_t b = 0; b < blocks; ++b) {
    const Q8Block& xb = x[b];
    quant_piece(q, row, b, p);
    int64_t qsum = 0;
    for (int h = 0; h < 2; ++h) {
      int64_t dot = 0, adot = 0;
      for (int i = 16 * h; i < 16 * h + 16; ++i) {
        const int64_t prod = int64_t{p.v[i]} * xb.q[i];
        dot += prod, adot += prod < 0 ? -prod : prod, qsum += xb.q[i];
      }
      const double d = static_cast<double>(p.scale[h]) * xb.d;
      total += d * static_cast<double>(dot), size += std::fabs(d) * static_cast<double>(adot);
    }
    const double offset = static_cast<double>(p.offset) * xb.d * static_cast<double>(qsum);
    total += offset, size += std::fabs(offset);
    if (!std::isfinite(xb.d)) total = NAN;
  }
  if (magnitude) *magnitude = size;
  return total;
}

}  // namespace

double q8_dot_reference(const Q8Block* x, int64_t blocks, const void* w, BlockQuant q, double* magnitude) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  if (q != BlockQuant::q4_0 && q != BlockQuant::q4_1 && q != BlockQuant::q8_0)
    return piece_reference(x, blocks, p, q, magnitude);
  auto half = [](const uint8_t* at) { return static_cast<double>(float16_at(at)); };
  double total = 0, size = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const Q8Block& xb = x[b];
    int64_t dot = 0, qsum = 0, adot = 0;  // adot: sum |w q|, the scale of the SIMD lanes' partial sums
    for (int i = 0; i < 32; ++i) qsum += xb.q[i];
    if (q == BlockQuant::q8_0) {
      for (int i = 0; i < 32; ++i) {
        const int64_t prod = int64_t{reinterpret_cast<const int8_t*>(p + 2)[i]} * xb.q[i];
        dot += prod, adot += prod < 0 ? -prod : prod;
      }
      const double d = half(p) * xb.d;
      total += d * static_cast<double>(dot), size += std::fabs(d) * static_cast<double>(adot);
      p += 34;
    } else {
      const uint8_t* nib = p + (q == BlockQuant::q4_1 ? 4 : 2);
      for (int i = 0; i < 16; ++i) {
        const int64_t lo = int64_t{nib[i] & 0x0F} * xb.q[i], hi = int64_t{nib[i] >> 4} * xb.q[i + 16];
        dot += lo + hi, adot += (lo < 0 ? -lo : lo) + (hi < 0 ? -hi : hi);
      }
      const double d = half(p) * xb.d, term = d * static_cast<double>(dot);
      const double offset = q == BlockQuant::q4_1 ? half(p + 2) * xb.d * static_cast<double>(qsum)
                                                  : -8.0 * d * static_cast<double>(qsum);
      total += term + offset, size += std::fabs(d) * static_cast<double>(adot) + std::fabs(offset);
      p += q == BlockQuant::q4_1 ? 20 : 18;
    }
    if (!std::isfinite(xb.d)) total = NAN;
  }
  if (magnitude) *magnitude = size;
  return total;
}

std::vector<Q8DotVariant> q8_dot_variants() {
  const Isa best = best_supported_isa();
  const CpuExtras& extras = cpu_extras();
  std::vector<Q8DotVariant> out;
  if (best >= Isa::avx512) {
    if (extras.avx512_vnni) out.push_back({"avx512-vnni", Isa::avx512, q8_avx512_vnni::q8_dot_rows, q8_avx512_vnni::q8_packed_rows, q8_avx512_vnni::quantize_rows});
    out.push_back({"avx512", Isa::avx512, q8_avx512::q8_dot_rows, q8_avx512::q8_packed_rows, q8_avx512::quantize_rows});
  }
  if (best >= Isa::avx2) {
    if (extras.avx_vnni) out.push_back({"avx-vnni", Isa::avx2, q8_avx_vnni::q8_dot_rows, q8_avx_vnni::q8_packed_rows, q8_avx_vnni::quantize_rows});
    out.push_back({"avx2", Isa::avx2, q8_avx2::q8_dot_rows, q8_avx2::q8_packed_rows, q8_avx2::quantize_rows});
  }
  out.push_back({"portable", Isa::portable, q8_portable::q8_dot_rows, q8_portable::q8_packed_rows, q8_portable::quantize_rows});
  return out;
}

}  // namespace attn::kernels
