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

#include <vector>

#include "attn/attend.hpp"
#include "attn/mechanism.hpp"
#include "attn/tensor.hpp"

namespace attn {

// (1, 1, N, M) boolean: true where query i sees key j. Throws Error for a mechanism without a
// key pattern (linformer attends to projected rows) or an N * M beyond 2^32.
Tensor mask_of(const Mechanism& mechanism, int64_t n, int64_t m);

// The buckets Reformer's LSH attention uses for these inputs (an lsh mechanism has no fixed
// pattern: its keys follow the data). Validates like attend(); options.params may hold
// "rotations". Query buckets (B, H, rounds, N); key buckets (B, key_heads, rounds, M), with
// key_heads = H under shared_qk (keys hashed from the queries) else Hkv, and -1 for keys past
// the valid length. Query i sees key j in round r when, after sorting each side by (bucket,
// position), j's chunk is i's or the one before (attn::Lsh has the whole rule).
struct LshBuckets {
  int64_t B = 0, H = 0, key_heads = 0, rounds = 0, N = 0, M = 0;
  std::vector<int32_t> query, key;
};
LshBuckets lsh_buckets(const TensorView& q, const TensorView& k, const TensorView& v, const Lsh& mechanism,
                       const AttendOptions& options = {});

}  // namespace attn
