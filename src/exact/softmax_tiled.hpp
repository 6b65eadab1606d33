// The fast exact-attention path: tiled online softmax over blocks of 64 queries and
// kKeyTile keys, never storing an N x M matrix. ISA-independent: it calls the tile
// primitives of the kernel table it is given.
#pragma once
#include "exact/problem.hpp"
#include "kernels/kernel_table.hpp"

namespace attn::exact {

constexpr int64_t kKeyTile = 64;

void softmax_tiled(const Problem& p, const kernels::TileKernels& kern, const TensorView& out,
                   const TensorView* lse, const TensorView* probs, int threads);

}  // namespace attn::exact
