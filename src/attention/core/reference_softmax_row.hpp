// The softmax over one row of scores that the families' plain references share (Linformer, LSH,
// DCA): written once, so each reference only says which keys a row sees and what their scores are.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/row_stats.hpp"

namespace attn::core {

// s[j] holds the score of key j, already rounded by `rnd`, for the visible keys (vis[j] != 0; every
// key when vis is null). Writes lse = max + log(sum of exp), probs[j] = p_j when probs is given,
// and out[c] = rnd(sum_j rnd(p_j) value(j, c)) for c < dv; s is overwritten with exp(s - max).
// With stats (4 values, see core/row_stats.hpp), the row statistics of the probabilities over the
// visible keys whose score is > -inf, top-k mass with k = topk.
// A row with no visible key (or only -inf scores) is left as the caller initialised it; a NaN
// score makes the whole row (lse, probabilities, out) NaN.
template <class T, class Round, class Value>
void reference_softmax_row(std::vector<T>& s, const uint8_t* vis, int64_t dv, Round rnd, Value value, double& lse,
                           double* probs, double* out, double* stats = nullptr, int64_t topk = 0) {
  const auto n = static_cast<int64_t>(s.size());
  auto seen = [&](int64_t j) { return !vis || vis[j] != 0; };
  T mx = -std::numeric_limits<T>::infinity();
  std::vector<uint8_t> counted(stats ? static_cast<size_t>(n) : 0);
  for (int64_t j = 0; j < n; ++j)
    if (seen(j)) {
      const T x = s[static_cast<size_t>(j)];
      mx = std::isnan(x) || x > mx ? x : mx;  // a NaN score (non-finite input) makes the row NaN, as in the kernels
      if (stats) counted[static_cast<size_t>(j)] = s[static_cast<size_t>(j)] > -std::numeric_limits<T>::infinity();
    }
  if (mx == -std::numeric_limits<T>::infinity()) return;
  T sum = 0;
  for (int64_t j = 0; j < n; ++j)
    if (seen(j)) sum += (s[static_cast<size_t>(j)] = std::exp(s[static_cast<size_t>(j)] - mx));
  lse = static_cast<double>(mx + std::log(sum));
  if (probs)
    for (int64_t j = 0; j < n; ++j)
      if (seen(j)) probs[j] = static_cast<double>(s[static_cast<size_t>(j)] / sum);
  if (stats) {
    std::vector<double> w(static_cast<size_t>(n), 0.0);
    for (int64_t j = 0; j < n; ++j)
      if (counted[static_cast<size_t>(j)]) w[static_cast<size_t>(j)] = static_cast<double>(s[static_cast<size_t>(j)] / sum);
    reference_row_stats(w.data(), counted.data(), n, topk, stats);
  }
  for (int64_t c = 0; c < dv; ++c) {
    T acc = 0;
    for (int64_t j = 0; j < n; ++j)
      if (seen(j)) acc += rnd(s[static_cast<size_t>(j)] / sum) * value(j, c);
    out[c] = static_cast<double>(rnd(acc));
  }
}

}  // namespace attn::core
