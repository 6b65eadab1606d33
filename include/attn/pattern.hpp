// The key pattern a mechanism implies, as a dense boolean matrix for people and tests to look
// at: mask_of(parse_mechanism("softmax:causal,window=4:0,sinks=2"), 8, 8)
//
//   x . . . . . . .      query i sees key j (N = M = 8)
//   x x . . . . . .
//   x x x . . . . .
//   ...
//   x x . . x x x x
//
// Positions are aligned bottom-right like attend(): query i sits at i + M - N. Key padding and
// the caller's masks are not part of it.
#pragma once
#include <cstdint>

#include "attn/mechanism.hpp"
#include "attn/tensor.hpp"

namespace attn {

// (1, 1, N, M) boolean: true where query i sees key j. Throws Error for a mechanism without a
// key pattern (linformer attends to projected rows) or an N * M beyond 2^32.
Tensor mask_of(const Mechanism& mechanism, int64_t n, int64_t m);

}  // namespace attn
