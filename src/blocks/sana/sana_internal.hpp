// Internals of SANA's pieces (src/sana/): SiLU and the float64 references (sana_reference.cpp).
#pragma once
#include <cmath>
#include <cstdint>

#include "attn/sana.hpp"

namespace attn::sana {

template <class T>
T silu(T x) {
  return x / (T(1) + std::exp(-x));
}

// attn/sana.hpp's formulas, sums in double; x and out (batch, tokens, C), weights checked.
void lite_la_reference(const double* x, int64_t batch, int64_t tokens, int64_t C, const LiteLaWeights<double>& w,
                       double* out);
// h: the hidden width (w.inverted has 2h rows); tokens = H * W.
void mix_ffn_reference(const double* x, int64_t batch, int64_t tokens, int64_t C, int64_t H, int64_t W, int64_t h,
                       const MixFfnWeights<double>& w, double* out);

}  // namespace attn::sana
