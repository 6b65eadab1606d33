// The tiled form of exact attention: online softmax over blocks of 64 queries and kKeyTile
// keys, never storing an N x M matrix. ISA-independent: it calls the tile primitives of the
// kernel table in the context.
#pragma once
#include "core/form.hpp"
#include "kernels/bf16_tiles.hpp"
#include "softmax/problem.hpp"
#include "softmax/score_tile.hpp"  // kKeyTile

namespace attn::exact {

void softmax_tiled(const Problem& p, const core::Outputs& o, const core::Context& ctx);
// The same with both products on bf16 operands (AttendOptions::precision; kernels/bf16_tiles.hpp):
// vdpbf16ps where the CPU has AVX512-BF16, else the float32 kernels on rounded operands. The
// global rows of a pattern that run apart (Longformer) keep float32 products.
void softmax_tiled_bf16(const Problem& p, const core::Outputs& o, const core::Context& ctx);

// How the tiled forms' products run (AttendOptions::precision), forward and backward: float32;
// bf16 operands on the float32 kernels (every product exact, so only the sums' rounding differs
// from the instruction); bf16 pairs on vdpbf16ps (kernels/bf16_tiles.hpp).
enum class Products { f32, bf16_on_f32, bf16_dot };
// The products of a tiled_bf16 (bf16) or tiled call on `isa`, and the bf16 kernels (bf16_dot only).
inline Products products_for(bool bf16, Isa isa, const kernels::Bf16TileKernels*& dot) {
  dot = bf16 ? kernels::bf16_kernels_for(isa) : nullptr;
  return !bf16 ? Products::f32 : dot ? Products::bf16_dot : Products::bf16_on_f32;
}

// Why a call's products are not bf16's (precision f32, or auto with an input that is not
// bfloat16): the tiled_bf16 forms' refusal, forward and backward (softmax_forms.cpp).
void refuse_unless_bf16_products(const Problem& p, core::Reasons& why);

}  // namespace attn::exact
