// Checks of flash-attn-style rotary tables, for callers that must validate before writing
// anything (the KV cache's append).
#pragma once
#include <cstdint>

#include "attn/tensor.hpp"

namespace attn::rope {

// cos and sin are (1, 1, positions, rotary_dim / 2) float views of one shape, with
// 1 <= rotary_dim / 2 <= head_dim / 2. Throws Error naming the table otherwise.
void check_rope_tables(int64_t head_dim, const TensorView& cos, const TensorView& sin);

}  // namespace attn::rope
