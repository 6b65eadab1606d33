// The rows form of exact attention, for few queries per kv head (decode-shaped calls: a
// handful of new tokens against a long cache). The tiled form spreads 64 queries over vector
// lanes; with one query per head it would compute 64 lanes to use one. Here all query rows that
// share a kv head (group x N, at most kMaxRowsPerKvHead) meet each key row once: dot products
// over d, an online softmax per row, and axpy updates. Keys are split in fixed chunks (split-K)
// so even B*Hkv = 1 uses every thread; chunk partials merge in chunk order
// (core/partial_merge.hpp), so results do not depend on the thread count.
#pragma once
#include "core/form.hpp"
#include "softmax/problem.hpp"

namespace attn::exact {

constexpr int64_t kMaxRowsPerKvHead = 16;
constexpr int64_t kKeyChunk = 256;

// Why the rows form cannot serve this problem (few rows per kv head, dot-product scores, no
// dropout, no probabilities requested).
void refuse_rows(const Problem& p, const core::Outputs& o, core::Reasons& why);

void softmax_rows(const Problem& p, const core::Outputs& o, const core::Context& ctx);

}  // namespace attn::exact
