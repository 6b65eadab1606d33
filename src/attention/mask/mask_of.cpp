// attn::mask_of: the block mask a call would compile, written out densely column by column.
#include <algorithm>
#include <cstring>

#include "attn/error.hpp"
#include "attn/info.hpp"
#include "attn/pattern.hpp"
#include "mask/block_mask.hpp"
#include "mask/patterns.hpp"

namespace attn {

Tensor mask_of(const Mechanism& mechanism, int64_t n, int64_t m) {
  if (n < 0 || m < 0) fail("mask_of", "n and m must be >= 0, got n = " + std::to_string(n) + ", m = " + std::to_string(m));
  if (static_cast<double>(n) * static_cast<double>(m) > 4294967296.0)
    fail("mask_of", "n * m must be at most 2^32 (a dense boolean matrix), got " + std::to_string(n) + " x " +
                        std::to_string(m));
  auto dense = [&](bool causal) {  // every key (before the query when causal)
    Softmax s;
    s.causal = causal;
    return mask::pattern_of(s, n, m);
  };
  // A pattern mechanism's own pattern; any other family sees every key (before the query when
  // causal), unless it says it has no fixed key pattern (attn::info).
  const mask::Pattern pattern = std::visit(
      [&](const auto& mech) -> mask::Pattern {
        if constexpr (requires { mask::pattern_of(mech, n, m); }) {
          return mask::pattern_of(mech, n, m);
        } else {
          const MechanismInfo facts = info(mechanism);
          if (!facts.no_key_pattern.empty()) fail("mask_of", facts.family + " has no fixed key pattern (" + facts.no_key_pattern + ")");
          return dense(facts.causal);
        }
      },
      mechanism);
  Tensor t(DType::boolean, {1, 1, n, m});
  auto* out = static_cast<uint8_t*>(t.view().data);
  if (n == 0 || m == 0) return t;
  std::memset(out, 0, static_cast<size_t>(n * m));
  constexpr int64_t kTile = 64;
  mask::BlockMask(pattern, n, m, m - n, kTile, kTile)
      .for_each_column(pattern, n, m - n, m, [&](int64_t i0, int64_t rows, int64_t j, const uint8_t* vis) {
        for (int64_t i = 0; i < rows; ++i) out[(i0 + i) * m + j] = vis[i];
      });
  return t;
}

}  // namespace attn
