// The tiled form of exact attention: online softmax over blocks of 64 queries and kKeyTile
// keys, never storing an N x M matrix. ISA-independent: it calls the tile primitives of the
// kernel table in the context.
#pragma once
#include "core/form.hpp"
#include "exact/problem.hpp"

namespace attn::exact {

constexpr int64_t kKeyTile = 64;

void softmax_tiled(const Problem& p, const core::Outputs& o, const core::Context& ctx);

}  // namespace attn::exact
