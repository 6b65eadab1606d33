// The linear family's backward: dQ, dK, dV, the initial state's gradient (fla's dh0) and the
// gradient flowing in through the final state (dht). With a_i = scale phi(q_i), u_j = [v_j, 1]
// ([v_j] without normalize), the decay L and S0 the initial state:
//   H_i = L^(i+1) S0 + sum_(j <= i) L^(i-j) phi(k_j) u_j^T,   y_i = a_i^T H_i   (Dv [+ 1])
//   o_i = y_i[:Dv] / (y_i[Dv] + eps)  (or y_i; normattn: norm(y_i), its backward in output_norm.hpp);  g_i = dL/dy_i = [dO_i / den_i, -dO_i . o_i / den_i]
//   (a zero denominator: a zero row, g_i = 0); the final state S = L^len S0 + sum_j L^(len-1-j) phi(k_j) u_j^T.
// Then with the backward state  dH_j = sum_(i >= j) L^(i-j) a_i g_i^T + L^(len-1-j) dS:
//   d a_i = H_i g_i,   d phi(k_j) = dH_j u_j,   d u_j = dH_j^T phi(k_j),
//   dS0 = sum_i L^(i+1) a_i g_i^T + L^len dS,
// and dq, dk from d phi(q) = scale d a and d phi(k) through the feature map's backward
// (feature_backward.hpp: phi'(x) o d phi for the elementwise maps, the random features' Jacobian for
// performer), dk summed over a kv head's query heads.
// Non-causal: L = 1 and every query sees every valid key.
#pragma once
#include <functional>
#include <string>

#include "core/backward_views.hpp"
#include "core/form.hpp"
#include "core/reference_result.hpp"
#include "linear/linear.hpp"

namespace attn::linear {

using core::BackwardViews;

// Why this problem has no backward, or "".
std::string linear_backward_refusal(const LinearProblem& p);

// PolaFormer's whole problem: `run` on each stream (stream_problem) with its half of dout, dv,
// coefficients' gradient and the state's rows; dq and dk summed over the streams (float32, stream 0
// first) into g; g.dparams zeroed first, then added to by both streams.
void polar_streams_backward(const LinearProblem& p, const BackwardViews& g,
                            const std::function<void(const LinearProblem&, const BackwardViews&)>& run);

// In float64 from the quadratic weights (the oracle); `plain`: float with the intermediates
// rounded to the storage dtype, the same-dtype baseline of the tolerance rule.
void linear_backward_reference(const LinearProblem& p, const BackwardViews& g,
                               core::RefPrecision precision = core::RefPrecision::f64);

// float32, one task per (batch entry, kv head): causal in blocks of the mechanism's chunk (the
// chunk states recomputed forward, then the blocks walked backward carrying dH); non-causal
// through the whole state (the right product).
void refuse_chunked_backward(const LinearProblem& p, const core::Outputs& o, core::Reasons& why);
void linear_backward_chunked(const LinearProblem& p, const BackwardViews& g, const core::Context& ctx);
void refuse_right_backward(const LinearProblem& p, const core::Outputs& o, core::Reasons& why);
void linear_backward_right(const LinearProblem& p, const BackwardViews& g, const core::Context& ctx);

}  // namespace attn::linear
