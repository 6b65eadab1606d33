// attn::mask_of: the block mask a call would compile, written out densely column by column.
#include <algorithm>
#include <cstring>

#include "attn/error.hpp"
#include "attn/pattern.hpp"
#include "sparse/block_mask.hpp"
#include "sparse/patterns.hpp"

namespace attn {

Tensor mask_of(const Mechanism& mechanism, int64_t n, int64_t m) {
  if (n < 0 || m < 0) fail("mask_of", "n and m must be >= 0, got n = " + std::to_string(n) + ", m = " + std::to_string(m));
  if (static_cast<double>(n) * static_cast<double>(m) > 4294967296.0)
    fail("mask_of", "n * m must be at most 2^32 (a dense boolean matrix), got " + std::to_string(n) + " x " +
                        std::to_string(m));
  auto dense = [&](bool causal) {  // the linear family: every key (before the query when causal)
    Softmax s;
    s.causal = causal;
    return sparse::pattern_of(s, n, m);
  };
  const sparse::Pattern pattern = std::visit(
      overloaded{[&](const Linformer&) -> sparse::Pattern {
                   fail("mask_of", "linformer has no key pattern (it attends to k projected rows, not to the keys)");
                 },
                 [&](const Lsh&) -> sparse::Pattern {
                   fail("mask_of", "lsh has no fixed key pattern (its keys follow the hashed inputs: see lsh_buckets)");
                 },
                 [&](const Dca&) {  // every causal key, at remapped positions
                   Softmax causal;
                   causal.causal = true;
                   return sparse::pattern_of(causal, n, m);
                 },
                 [&](const Linear& l) { return dense(l.causal); },
                 [&](const NormAttn& l) { return dense(l.causal); },
                 [&](const Performer& l) { return dense(l.causal); },
                 [&](const Sana& l) { return dense(l.causal); },
                 [&](const PolaFormer& l) { return dense(l.causal); },
                 [&](const Efficient& e) { return dense(e.causal); },
                 [&](const Gau& g) { return dense(g.causal); },
                 [&](const auto& mech) { return sparse::pattern_of(mech, n, m); }},
      mechanism);
  Tensor t(DType::boolean, {1, 1, n, m});
  auto* out = static_cast<uint8_t*>(t.view().data);
  if (n == 0 || m == 0) return t;
  std::memset(out, 0, static_cast<size_t>(n * m));
  constexpr int64_t kTile = 64;
  sparse::BlockMask(pattern, n, m, m - n, kTile, kTile)
      .for_each_column(pattern, n, m - n, m, [&](int64_t i0, int64_t rows, int64_t j, const uint8_t* vis) {
        for (int64_t i = 0; i < rows; ++i) out[(i0 + i) * m + j] = vis[i];
      });
  return t;
}

}  // namespace attn
