// The few-queries path (decode-shaped calls: a handful of new tokens against a long cache).
// The tiled path spreads 64 queries over vector lanes; with one query per head it would compute
// 64 lanes to use one. Here all query rows that share a kv head (group x N, at most
// kMaxRowsPerKvHead) meet each key row once: dot products over d, an online softmax per row,
// and axpy updates. Keys are split in fixed chunks (split-K) so even B*Hkv = 1 uses every
// thread; chunk partials merge in chunk order, so results do not depend on the thread count.
#pragma once
#include "exact/problem.hpp"
#include "kernels/kernel_table.hpp"

namespace attn::exact {

constexpr int64_t kMaxRowsPerKvHead = 16;
constexpr int64_t kKeyChunk = 256;

// Whether the row path serves this problem (few rows per kv head, dot-product scores,
// no dropout, no probabilities requested).
bool softmax_rows_fits(const Problem& p, const TensorView* probs);

void softmax_rows(const Problem& p, const kernels::TileKernels& kern, const TensorView& out,
                  const TensorView* lse, int threads);

// Tests: false forces every problem onto the tiled path.
void set_row_path_enabled(bool enabled);

}  // namespace attn::exact
