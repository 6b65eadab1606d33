// What a family's backward reads and writes, validated by attend_backward (src/backward.cpp).
#pragma once
#include "attn/tensor.hpp"

namespace attn::core {

// dout (B, H, N, Dv), the forward's out and lse (B, H, N, 1) float32; dq, dk, dv: q's, k's and
// v's shapes and dtypes, freshly allocated; dlse (B, H, N, 1) float32, the gradient with respect
// to lse, or empty (zero). Families with a recurrent state (linear): dfinal_state, the gradient
// with respect to the final state (B, H, state_rows, state_cols) float32, or empty (zero); and
// d_initial_state, where the initial state's gradient goes (its shape, float32), or empty when the
// call has no initial state.
struct BackwardViews {
  TensorView dout, out, lse, dq, dk, dv, dlse;
  TensorView dfinal_state{}, d_initial_state{};
};

}  // namespace attn::core
