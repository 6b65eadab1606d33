// The plain reference: full score rows, float64 accumulation, no tiles, no tricks. It is the
// oracle the fast path is tested against, and (in `plain` precision) the same-dtype baseline
// whose error sets the tolerance: float arithmetic, intermediates rounded to the storage dtype.
#pragma once
#include <vector>

#include "exact/problem.hpp"

namespace attn::exact {

enum class RefPrecision { f64, plain };

struct ReferenceResult {
  int64_t B = 0, H = 0, N = 0, M = 0, Dv = 0;
  std::vector<double> out;    // (B, H, N, Dv)
  std::vector<double> lse;    // (B, H, N); -inf for rows that see no key
  std::vector<double> probs;  // (B, H, N, M); weights before dropout
  double o(int64_t b, int64_t h, int64_t i, int64_t c) const { return out[((b * H + h) * N + i) * Dv + c]; }
  double l(int64_t b, int64_t h, int64_t i) const { return lse[(b * H + h) * N + i]; }
  double p(int64_t b, int64_t h, int64_t i, int64_t j) const { return probs[((b * H + h) * N + i) * M + j]; }
};

ReferenceResult reference_softmax(const Problem& p, RefPrecision precision = RefPrecision::f64);

}  // namespace attn::exact
