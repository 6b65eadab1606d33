// Which keys each query sees: a typed sparsity pattern shared by every softmax-family mechanism
// (window, sinks, dilation, strided, chunks, Longformer's global tokens, BigBird's blocks).
//
// Positions are aligned bottom-right: query i of N sits at position p = i + M - N and key j at
// j, so with N = M query i is at i, and with a cache the last query is at M - 1.
//
// A pair (p, j) is visible when causality allows it (j <= p, if causal) and any term lets it
// through:
//   band    p - left <= j <= p + right, and (if set) (p - j) mod dilation = 0, or strided:
//           |p - j| <= stride or (p - j) mod stride = 0; and (if set) p, j in the same chunk
//           (or chunks lag_min .. lag_max apart);
//   sinks   j < sinks;
//   global  j or p is a global position;
//   blocks  BigBird: query block a = p / size sees key block c = j / size when |a - c| <= half
//           window, a or c < global blocks, or c is one of a's random blocks. A query before the
//           first key (p < 0: N > M) is in no block and sees the global key blocks only.
// Key padding and the user's masks are applied on top by the kernels.
//
// Three views of the same set, tested against each other (tests/mask/test_pattern.cpp):
// visible() is the definition (the reference uses it); column() gives one key's visible lanes
// for the kernels' partial tiles; classify() says whether a rectangle is hidden, full or mixed,
// which is what the block mask is compiled from.
#pragma once
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace attn::mask {

struct Band {
  int64_t left = -1, right = -1;  // -1 = unbounded
  int64_t dilation = 1;           // >= 1
  int64_t stride = 0;             // 0 = off; exclusive with dilation > 1
  int64_t chunk = 0;              // 0 = off
  // With chunks: the query's chunk minus the key's lies in [lag_min, lag_max] (-1 = unbounded);
  // 0:0 is "the same chunk"; Dual Chunk Attention also uses 1:1 and 2:-1.
  int64_t lag_min = 0, lag_max = 0;
};

struct Blocks {
  int64_t size = 64;
  int64_t half_window = 1;  // window = 2 * half_window + 1 blocks
  int64_t global = 0;       // the first `global` blocks see and are seen by all
  int64_t random = 0;       // random key blocks per query block
  uint64_t seed = 0;
  // Random key blocks of query block a (sorted), for a in [0, ceil(M / size)); set by
  // draw_random_blocks once M is known.
  std::vector<std::vector<int64_t>> random_of;
};

enum class Coverage { hidden, partial, full };

struct Pattern {
  bool causal = false;
  std::optional<Band> band = Band{};  // the local term; none for BigBird
  int64_t sinks = 0;
  std::vector<int64_t> global;  // sorted, unique
  // false: global positions are only seen by all (a kernel that computes the global query rows
  // apart, against every key, switches their own term off).
  bool global_queries = true;
  std::optional<Blocks> blocks;

  // The definition: is key j visible to the query at position p?
  bool visible(int64_t p, int64_t j) const;
  // vis[i] = visible(p0 + i, j) for i in [0, n).
  void column(int64_t j, int64_t p0, int64_t n, uint8_t* vis) const;
  // The common case of column(), without a byte per lane: when key j's visible lanes are one
  // interval, sets [lo, hi) and returns true (window, causal, chunk, sinks); else false.
  bool column_interval(int64_t j, int64_t p0, int64_t n, int64_t& lo, int64_t& hi) const;
  // Over every (p, j) in [p0, p1] x [j0, j1]: none visible (hidden), all (full), or some.
  // Never says hidden or full when it is not; may say partial when unsure.
  Coverage classify(int64_t p0, int64_t p1, int64_t j0, int64_t j1) const;
  // Sorted, disjoint key intervals [begin, end) within [0, M) outside of which no query in
  // [p0, p1] sees a key.
  std::vector<std::pair<int64_t, int64_t>> candidates(int64_t p0, int64_t p1, int64_t M) const;
  // The same into out[0..capacity) without allocating (parallel regions): returns how many, or
  // -1 when they need more than `capacity` slots (out is then scratch).
  int64_t candidates_into(int64_t p0, int64_t p1, int64_t M, std::pair<int64_t, int64_t>* out, int64_t capacity) const;
  // True when candidates() of a single position are exactly its visible keys (no dilation or
  // stride gaps), so counting can add lengths.
  bool intervals_exact() const { return !band || (band->dilation <= 1 && band->stride == 0); }
  // Every key visible to every query (no term restricts anything).
  bool dense() const;
  // BigBird: draws each query block's random key blocks for M keys (reproducible for the seed).
  void draw_random_blocks(int64_t M);
};

// floor(a / b) and a mod b in [0, b), for b > 0 and any sign of a.
inline int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
inline int64_t floor_mod(int64_t a, int64_t b) { return a - floor_div(a, b) * b; }

}  // namespace attn::mask
