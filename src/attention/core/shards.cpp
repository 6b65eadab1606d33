// The sharding rule (attn/shards.hpp).
#include "attn/shards.hpp"

#include <algorithm>
#include <string>

#include "attn/error.hpp"

namespace attn::distributed {

std::vector<Piece> shard_pieces(int64_t n, int ranks, int rank, bool zigzag) {
  if (ranks < 1 || rank < 0 || rank >= ranks)
    fail("shard_pieces", "rank must be in [0, " + std::to_string(ranks) + "), got " + std::to_string(rank));
  if (n < 0) fail("shard_pieces", "n must be >= 0, got " + std::to_string(n));
  const int64_t P = zigzag ? 2 * int64_t{ranks} : ranks;
  auto start = [&](int64_t c) { return c * (n / P) + std::min(c, n % P); };
  std::vector<Piece> out;
  int64_t local = 0;
  for (int64_t c : zigzag ? std::vector<int64_t>{rank, P - 1 - rank} : std::vector<int64_t>{rank}) {
    const Piece p{start(c), start(c + 1) - start(c), local};
    local += p.length;
    out.push_back(p);
  }
  return out;
}

int64_t shard_length(int64_t n, int ranks, int rank, bool zigzag) {
  int64_t total = 0;
  for (const Piece& p : shard_pieces(n, ranks, rank, zigzag)) total += p.length;
  return total;
}

}  // namespace attn::distributed
