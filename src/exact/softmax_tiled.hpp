// The fast exact-attention path: tiled online softmax over blocks of 64 queries and
// kKeyTile keys, never storing an N x M matrix. ISA-independent: it calls the tile
// primitives of the kernel table it is given.
#pragma once
#include "exact/problem.hpp"
#include "kernels/kernel_table.hpp"

namespace attn::exact {

constexpr int64_t kKeyTile = 64;

// Per-thread bound on the float32 copies of one kv head's K and V rows kept for inputs that
// are not float32 (default 64 MiB each); above it rows are converted per tile. For tests.
void set_row_cache_limit(int64_t bytes);

void softmax_tiled(const Problem& p, const kernels::TileKernels& kern, const TensorView& out,
                   const TensorView* lse, const TensorView* probs, int threads);

}  // namespace attn::exact
