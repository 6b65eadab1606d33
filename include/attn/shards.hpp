// How one sequence is cut across the ranks of a sequence-parallel run (attn/distributed.hpp): the
// one rule the ring, the sharded decode, `attn run --distributed` and Python's attn.distributed
// share. N tokens are cut into P pieces of nearly equal length (the first N mod P pieces one token
// longer, so any N works, also N < ranks and N = 1):
//   contiguous  P = R pieces, rank r holds piece r;
//   zig-zag     P = 2R pieces, rank r holds pieces r and 2R-1-r, in that order (balances causal
//               work: every rank gets one early and one late piece).
// Part of the attention library (no MPI needed to ask it).
#pragma once
#include <cstdint>
#include <vector>

namespace attn::distributed {

// A run of consecutive tokens: global position `start`, `length` tokens, at row `local` of the
// rank's shard.
struct Piece {
  int64_t start = 0, length = 0, local = 0;
};

// The pieces rank `rank` of `ranks` holds of a sequence of n tokens (zig-zag: two pieces); an
// attn::Error names a rank outside [0, ranks) or n < 0.
std::vector<Piece> shard_pieces(int64_t n, int ranks, int rank, bool zigzag);
// Their total length.
int64_t shard_length(int64_t n, int ranks, int rank, bool zigzag);

}  // namespace attn::distributed
