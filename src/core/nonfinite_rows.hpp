// Which value rows hold a non-finite element, per (batch, kv head), found in one pass over V
// before a form's parallel region. Forms that multiply a tile of weights by a tile of values
// (softmax tiled, GAU tiled, linear chunked) give hidden keys a weight of exactly 0, and
// 0 * NaN = NaN would carry a hidden key's non-finite value into rows that cannot see it. With
// this they zero such elements in their copy of the tile and poison, after the product, only the
// output channels of the rows that see the key (docs/reliability.md, "Non-finite inputs").
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "base/parallel.hpp"
#include "core/io_checks.hpp"

namespace attn::core {

class NonFiniteRows {
 public:
  NonFiniteRows(const Dims& d, int threads) : Hkv_(d.Hkv), M_(d.M) {
    bad_.assign(static_cast<size_t>(d.B * d.Hkv * d.M), 0);
    parallel_for(d.B * d.Hkv, resolve_threads(threads, d.B * d.Hkv), [&](int64_t item, int) {
      const int64_t b = item / d.Hkv, hk = item % d.Hkv;
      const KvRows rows = d.values(b, hk);
      const int64_t len = d.kv_len[static_cast<size_t>(b)];
      for (int64_t j = 0; j < len; ++j) {
        float probe = 0;  // x * 0 is NaN exactly when x is not finite
        for (int64_t c = 0; c < d.Dv; ++c) probe += rows.at(j, c) * 0.0f;
        bad_[static_cast<size_t>(item * M_ + j)] = std::isnan(probe);
      }
    });
  }
  // Whether a row in [j0, j0 + n) of kv head hk of batch entry b is non-finite somewhere.
  bool any(int64_t b, int64_t hk, int64_t j0, int64_t n) const {
    const uint8_t* f = bad_.data() + (b * Hkv_ + hk) * M_;
    for (int64_t j = j0; j < j0 + n; ++j)
      if (f[j]) return true;
    return false;
  }
  bool row(int64_t b, int64_t hk, int64_t j) const { return bad_[static_cast<size_t>((b * Hkv_ + hk) * M_ + j)] != 0; }

 private:
  int64_t Hkv_, M_;
  std::vector<uint8_t> bad_;  // (B, Hkv, M)
};

}  // namespace attn::core
