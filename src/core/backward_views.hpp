// What a family's backward reads and writes, validated by attend_backward (src/backward.cpp).
#pragma once
#include "attn/tensor.hpp"

namespace attn::core {

// dout (B, H, N, Dv), the forward's out and lse (B, H, N, 1) float32; dq, dk, dv: q's, k's and
// v's shapes and dtypes, freshly allocated; dlse (B, H, N, 1) float32, the gradient with respect
// to lse, or empty (zero).
struct BackwardViews {
  TensorView dout, out, lse, dq, dk, dv, dlse;
};

}  // namespace attn::core
