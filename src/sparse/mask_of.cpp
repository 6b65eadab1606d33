// attn::mask_of: the block mask a call would compile, written out densely (full runs as runs of
// ones, partial runs through the pattern's columns).
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
  const sparse::Pattern pattern = std::visit(
      overloaded{[&](const Linformer&) -> sparse::Pattern {
                   fail("mask_of", "linformer has no key pattern (it attends to k projected rows, not to the keys)");
                 },
                 [&](const auto& mech) { return sparse::pattern_of(mech, n, m); }},
      mechanism);
  Tensor t(DType::boolean, {1, 1, n, m});
  auto* out = static_cast<uint8_t*>(t.view().data);
  if (n == 0 || m == 0) return t;
  std::memset(out, 0, static_cast<size_t>(n * m));
  constexpr int64_t kTile = 64;
  const sparse::BlockMask mask(pattern, n, m, m - n, kTile, kTile);
  std::vector<uint8_t> vis(kTile);
  for (int64_t tile = 0; tile < mask.tiles(); ++tile) {
    const int64_t i0 = tile * kTile, rows = std::min(kTile, n - i0);
    for (const sparse::Run& r : mask.runs(tile))
      for (int64_t j = r.begin; j < r.end; ++j) {
        if (r.full)
          std::fill(vis.begin(), vis.begin() + rows, uint8_t{1});
        else
          pattern.column(j, i0 + m - n, rows, vis.data());
        for (int64_t i = 0; i < rows; ++i) out[(i0 + i) * m + j] = vis[i];
      }
  }
  return t;
}

}  // namespace attn
