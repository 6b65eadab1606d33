// Which value rows hold a non-finite element, per (batch, kv head), found in one pass over V
// before a form's parallel region. Forms that multiply a tile of weights by a tile of values
// (softmax tiled, GAU tiled, linear chunked) give hidden keys a weight of exactly 0, and
// 0 * NaN = NaN would carry a hidden key's non-finite value into rows that cannot see it. With
// this they zero such elements in their copy of the tile and poison, after the product, only the
// output channels of the rows that see the key (docs/reliability.md, "Non-finite inputs").
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
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
        bool bad;
        if (rows.plain_f32() && !rows.scaled()) {  // read in place: some element with every exponent bit set
          const char* row = rows.row(j);
          uint32_t all_ones = 0;
          for (int64_t c = 0; c < d.Dv; ++c) {
            uint32_t bits;
            std::memcpy(&bits, row + c * sizeof(float), sizeof bits);
            all_ones |= (bits & 0x7f800000u) == 0x7f800000u;
          }
          bad = all_ones != 0;
        } else {
          float probe = 0;  // x * 0 is NaN exactly when x is not finite
          for (int64_t c = 0; c < d.Dv; ++c) probe += rows.at(j, c) * 0.0f;
          bad = std::isnan(probe);
        }
        bad_[static_cast<size_t>(item * M_ + j)] = bad;
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

// Whether every element of a (B, H, N, dim) view is finite (x * 0 is NaN exactly when x is not),
// one (batch, head) per item; float32 rows with unit stride are read directly (exponent bits).
// lens: rows read per batch entry (keys past the valid length are never read by any form, so
// garbage there changes nothing); null: all. An empty view is finite.
inline bool all_finite(const TensorView& t, int threads, const std::vector<int64_t>* lens = nullptr) {
  if (t.empty()) return true;
  const int64_t B = t.shape[0], H = t.shape[1], n = t.shape[2], dim = t.shape[3];
  std::vector<uint8_t> bad(static_cast<size_t>(B * H), 0);
  const bool plain = t.dtype == DType::f32 && t.strides[3] == 1;
  parallel_for(B * H, resolve_threads(threads, B * H), [&](int64_t item, int) {
    const int64_t b = item / H, h = item % H;
    float probe = 0;
    uint32_t all_ones = 0;  // float32 rows: some element with every exponent bit set (inf, NaN)
    const int64_t rows = lens ? std::min(n, (*lens)[static_cast<size_t>(b)]) : n;
    for (int64_t i = 0; i < rows; ++i) {
      if (plain) {
        const char* row = t.ptr(b, h, i);
        for (int64_t c = 0; c < dim; ++c) {
          uint32_t bits;
          std::memcpy(&bits, row + c * sizeof(float), sizeof bits);
          all_ones |= (bits & 0x7f800000u) == 0x7f800000u;
        }
      } else {
        for (int64_t c = 0; c < dim; ++c) probe += t.at(b, h, i, c) * 0.0f;
      }
    }
    bad[static_cast<size_t>(item)] = std::isnan(probe) || all_ones;
  });
  return std::find(bad.begin(), bad.end(), 1) == bad.end();
}

}  // namespace attn::core
