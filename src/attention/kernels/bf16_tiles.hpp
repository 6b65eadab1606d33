// Tile primitives of exact attention computed in bfloat16: both products (Q K^T and P V) take
// bf16 operands in pairs and accumulate in float32, as AVX512-BF16's vdpbf16ps does (a float32
// lane += a.lo * b.lo + a.hi * b.hi, each product exact in float32). The online softmax between
// them stays float32 (kernel_table.hpp's softmax_update); only P is rounded to bf16 for its
// product with V, as flash-attention does on GPUs.
//
// Tiles are query-lane major like the float32 ones (kernel_table.hpp), with one 32-bit word per
// lane holding a pair of bf16 values (element 2t in the low half, 2t + 1 in the high half):
//   Qt2 (ceil(d/2), 64)    Qt2[t][i] = (q_i[2t], q_i[2t+1])   (lanes >= n and c >= d: 0)
//   Vp  (ceil(bc/2), dv)   Vp[t][c]  = (V[2t][c], V[2t+1][c]) (a missing row 2t+1: 0)
//   P2  (ceil(bc/2), 64)   P2[t][i]  = (P[2t][i], P[2t+1][i])
// K rows are read in place as bf16 (unit stride): a pair of a row is one 32-bit broadcast.
//
// Where the CPU lacks AVX512-BF16 the tiled form computes the same thing with the float32
// kernels on operands rounded to bf16 (softmax_tiled.cpp): every product is exact either way, so
// the two differ only in how the float32 sums round (and the instruction flushes subnormals).
#pragma once
#include <cstdint>
#include <cstring>

#include "attn/dtype.hpp"
#include "attn/isa.hpp"

namespace attn::kernels {

struct Bf16TileKernels {
  const char* name;  // "avx512-bf16"
  // Qt2 from n <= 64 float rows (row i at src + i * src_stride), each value rounded to bf16
  // (nearest even); lanes n..63 and the odd d's last high half are 0. qt2 64-byte aligned.
  void (*pack_qt)(const float* src, int64_t src_stride, int n, int64_t d, uint32_t* qt2);
  // dst[r * d + c] = bf16(src[r * src_stride + c]) for r < rows, c < d.
  void (*round_rows)(const float* src, int64_t src_stride, int64_t rows, int64_t d, uint16_t* dst);
  // St[j][i] = scale[i] * sum_t Qt2[t][i] . K_j pair t, for j < bc, lo <= i < hi (multiples of
  // kLaneGroup); K row j at k + j * k_stride (bf16, unit stride, d values read: never past the
  // row). A score of +-inf becomes NaN (as the float32 qk does). scale and st 64-byte aligned.
  void (*qk)(const uint32_t* qt2, int64_t d, const uint16_t* k, int64_t k_stride, int64_t bc, const float* scale,
             float* st, int lo, int hi);
  // Vp from bc rows of dv values (vt f32: rounded to bf16; bf16: copied), row j at
  // v + j * v_stride elements, unit inner stride.
  void (*pack_v)(const void* v, DType vt, int64_t v_stride, int64_t bc, int64_t dv, uint32_t* vp);
  // Ot[c][i] = alpha[i] * Ot[c][i] + sum_t P2[t][i] . Vp[t][c] for c < dv, lo <= i < hi, with P2
  // made from Pt (bc, 64) floats into `p2` (ceil(bc/2) * 64 words, 64-byte aligned) first.
  void (*pv)(const float* pt, int64_t bc, const uint32_t* vp, int64_t dv, float* ot, const float* alpha, uint32_t* p2,
             int lo, int hi);
  // The backward's dV and dK products, a sum over the lanes:
  //   out[j * ldo + c] += sum_{t in [lo/2, hi/2)} (A[j][2t], A[j][2t+1]) . bp[t * n + c]   j < bc, c < n
  // with A[j][i] = bf16(at[j][i] * (scale ? scale[i] : 1)) from a lane-major tile at (bc, 64), and
  // bp 32 pairs of rows (pack_v's layout of the 64 lane rows, n values each). a2: bc * 32 words.
  void (*rows_gemm)(const float* at, int64_t bc, const float* scale, int lo, int hi, const uint32_t* bp, int64_t n,
                    float* out, int64_t ldo, uint32_t* a2);
};

// The bf16 kernel set for `isa`: vdpbf16ps when isa is avx512 and the CPU has AVX512-BF16, else
// null (the caller rounds operands and uses kernels_for(isa)).
const Bf16TileKernels* bf16_kernels_for(Isa isa);

// x rounded to the nearest bf16 (ties to even; NaN stays a NaN), as a float: float_to_bf16's
// bits, inline and branch-free so that loops over tiles vectorise.
inline float round_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const uint32_t nan = (u | 0x00400000u) & 0xffff0000u;
  u = x != x ? nan : rounded;
  std::memcpy(&x, &u, sizeof u);
  return x;
}
inline void round_to_bf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_to_bf16(x[i]);
}
// dst[r * dim + c] = round_to_bf16(src[r * src_stride + c]) for r < rows, c < dim (dst may be src
// when src_stride is dim).
inline void round_rows_to_bf16(const float* src, int64_t src_stride, int64_t rows, int64_t dim, float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < dim; ++c) dst[r * dim + c] = round_to_bf16(src[r * src_stride + c]);
}

}  // namespace attn::kernels
