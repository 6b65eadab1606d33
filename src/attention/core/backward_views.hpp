// What a family's backward reads and writes, validated by attend_backward (src/backward.cpp).
#pragma once
#include <array>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::core {

// dout (B, H, N, Dv), the forward's out and lse (B, H, N, 1) float32; dq, dk, dv: q's, k's and
// v's shapes and dtypes, freshly allocated; dlse (B, H, N, 1) float32, the gradient with respect
// to lse, or empty (zero). Families with a recurrent state (linear): dfinal_state, the gradient
// with respect to the final state (B, H, state_rows, state_cols) float32, or empty (zero); and
// d_initial_state, where the initial state's gradient goes (its shape, float32), or empty when the
// call has no initial state. Families with learned params (Linformer's E and F): dparams, where
// each one's gradient goes by name (float32, (1, 1, rows, cols) for a (rows, cols) param), for
// the params the family's learned_params(problem) names; empty otherwise.
struct BackwardViews {
  TensorView dout, out, lse, dq, dk, dv, dlse;
  TensorView dfinal_state{}, d_initial_state{};
  std::map<std::string, TensorView> dparams{};
};

// A learned param of a call, as a family's learned_params(problem) names it: its name and the
// shape of its gradient (B, H, N, D)-style, a 2-D param's (rows, cols) as (1, 1, rows, cols).
using LearnedParam = std::pair<std::string, std::array<int64_t, 4>>;

// The gradients' tensors of the family's learned params for this problem, allocated into
// `tensors` and their views into `views.dparams` (nothing for a family without learned params).
template <class Family, class Tensors>
void allocate_dparams(const typename Family::Problem& p, Tensors& tensors, BackwardViews& views) {
  if constexpr (requires { Family::learned_params(p); }) {
    for (const LearnedParam& lp : Family::learned_params(p)) {
      auto& t = tensors[lp.first] = Tensor(DType::f32, lp.second);
      views.dparams[lp.first] = t.view();
    }
  } else {
    (void)p, (void)tensors, (void)views;
  }
}

}  // namespace attn::core
