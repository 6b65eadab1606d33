#include "mask/patterns.hpp"

#include <algorithm>
#include <string>

#include "attn/error.hpp"

namespace attn::mask {
namespace {

const char* kWhere = "attend";

std::string str(int64_t x) { return std::to_string(x); }

// The band of a window (left, right) with -1 = unbounded; a bound past every key is unbounded,
// so no index arithmetic sees values near 2^63. Causal is right = min(right, 0).
Band window_band(int64_t left, int64_t right, bool causal, int64_t N, int64_t M, const std::string& what) {
  if (left < -1 || right < -1)
    fail(kWhere, what + " must be LEFT:RIGHT with each >= 0 or -1 for unbounded, got " + str(left) + ":" + str(right));
  auto bound = [&](int64_t w) { return w > N + M ? int64_t{-1} : w; };
  Band b;
  b.left = bound(left);
  b.right = bound(right);
  if (causal) b.right = b.right < 0 ? 0 : std::min<int64_t>(b.right, 0);
  return b;
}

void at_least(int64_t x, int64_t lo, const std::string& what, const std::string& meaning) {
  if (x < lo) fail(kWhere, what + " must be >= " + str(lo) + " (" + meaning + "), got " + str(x));
}

}  // namespace

Pattern pattern_of(const Softmax& m, int64_t N, int64_t M) {
  Pattern p;
  p.causal = m.causal;
  p.band = window_band(m.window_left, m.window_right, m.causal, N, M, "window");
  at_least(m.sinks, 0, "sinks", "0 = none");
  at_least(m.dilation, 1, "dilation", "1 = every key");
  at_least(m.strided, 0, "strided", "0 = off");
  at_least(m.chunk, 0, "chunk", "0 = off");
  if (m.strided > 0 && m.dilation > 1)
    fail(kWhere, "strided and dilation cannot be combined (strided=S is the union of window S and dilation S), got "
                 "strided=" + str(m.strided) + ", dilation=" + str(m.dilation));
  p.sinks = std::min(m.sinks, M);
  // Past every distance (N + M) a dilation, stride or chunk acts as N + M + 1 does: normalised,
  // like the window, so no index arithmetic sees values near 2^63.
  const int64_t far = N + M + 1;
  p.band->dilation = std::min(m.dilation, far);
  p.band->stride = std::min(m.strided, far);
  p.band->chunk = std::min(m.chunk, far);
  return p;
}

Pattern pattern_of(const Longformer& m, int64_t N, int64_t M) {
  Pattern p;
  p.causal = m.causal;
  p.band = window_band(m.window_left, m.window_right, m.causal, N, M, "longformer window");
  at_least(m.dilation, 1, "longformer dilation", "1 = every key");
  p.band->dilation = std::min(m.dilation, N + M + 1);  // as for softmax's dilation
  if (m.global.size() > (size_t{1} << 20))
    fail(kWhere, "longformer takes at most 2^20 global positions, got " + std::to_string(m.global.size()));
  for (int64_t g : m.global) at_least(g, 0, "longformer global position", "positions count from 0");
  p.global = m.global;
  std::sort(p.global.begin(), p.global.end());
  p.global.erase(std::unique(p.global.begin(), p.global.end()), p.global.end());
  return p;
}

Pattern pattern_of(const BigBird& m, int64_t N, int64_t M) {
  Pattern p;
  p.causal = m.causal;
  p.band.reset();
  at_least(m.block, 1, "bigbird block", "positions per block");
  if (m.window < 1 || m.window % 2 == 0)
    fail(kWhere, "bigbird window must be an odd number of blocks >= 1 (its own block and as many on each side), got " +
                     str(m.window));
  at_least(m.global, 0, "bigbird global", "blocks that see and are seen by all");
  at_least(m.random, 0, "bigbird random", "random key blocks per query block");
  const int64_t blocks = (M + m.block - 1) / m.block;
  if (m.random > 0 && static_cast<double>(blocks) * static_cast<double>(m.random) > double(1 << 24))
    fail(kWhere, "bigbird draws random=" + str(m.random) + " blocks for each of " + str(blocks) +
                     " query blocks, more than 2^24 in all; use a larger block (got block=" + str(m.block) + ")");
  Blocks b;
  b.size = std::min(m.block, std::max<int64_t>(M, 1));  // same blocks; products stay small
  b.half_window = std::min((m.window - 1) / 2, blocks + 1);  // bounded, so (a +- half) * size cannot overflow
  b.global = std::min(m.global, blocks + 1);
  b.random = m.random;
  b.seed = m.seed;
  p.blocks = b;
  p.draw_random_blocks(M);
  (void)N;  // blocks are in positions, which only M bounds
  return p;
}

}  // namespace attn::mask
