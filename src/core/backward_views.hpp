// What a family's backward reads and writes, validated by attend_backward (src/backward.cpp).
#pragma once
#include "attn/tensor.hpp"

namespace attn::core {

// dout (B, H, N, Dv), the forward's out and lse (B, H, N, 1) float32; dq, dk, dv: q's, k's and
// v's shapes and dtypes, freshly allocated.
struct BackwardViews {
  TensorView dout, out, lse, dq, dk, dv;
};

}  // namespace attn::core
