// Efficient attention without its key softmax, softmax(Q) (K^T V) (attn/mechanism.hpp, QSoftmax):
// the query's features softmax-normalised, the keys used raw, no denominator,
//   o_i = scale * softmax(q_i)^T S,   S = S0 + sum_j k_j v_j^T   (D x Dv; causal: j <= i).
// One state S per head behind two fast forms, "right" (non-causal: S once, then every row) and
// "recurrent" (causal, token by token: O(D Dv) per token), and a quadratic float64 reference with
// the weights w_ij = scale * softmax(q_i) . k_j. Backward (qsoftmax_backward*.cpp): "right"
// (non-causal) and "recurrent" (causal), float32, and a float64 reference; the gradients of q, k,
// v, of the initial state and through the final state.
#pragma once
#include <algorithm>
#include <array>
#include <string>
#include <optional>
#include <vector>

#include "core/facts.hpp"
#include "core/form.hpp"
#include "core/io_checks.hpp"
#include "core/backward_views.hpp"
#include "core/reference_result.hpp"

namespace attn::qsoftmax {

struct QSoftmaxProblem : core::Dims {
  QSoftmax mech;
  double scale = 1.0;
  std::optional<ArrayView> initial;  // (B, H, D, Dv); none: a zero state
};

// Keys [0, end) query i of batch b sees: the valid ones, and causal: j <= i (N == M).
inline int64_t key_end(const QSoftmaxProblem& p, int64_t b, int64_t i) {
  const int64_t len = p.kv_len[static_cast<size_t>(b)];
  return p.mech.causal ? std::min(i + 1, len) : len;
}

struct QSoftmaxFamily {
  using Problem = QSoftmaxProblem;
  static constexpr bool has_lse = false;  // the weights are not a softmax over keys
  static Problem validate(const TensorView& q, const TensorView& k, const TensorView& v, const QSoftmax& m,
                          const AttendOptions& options, const core::Outputs& outs);
  static core::Facts facts(const QSoftmax& m);
  // What facts(m) declares of them, for validation (each without the rest of the facts).
  static std::vector<core::OptionRange> ranges(const QSoftmax& m);
  static std::vector<core::ParamSpec> params(const QSoftmax& m);
  static const std::vector<core::Form<Problem>>& forms();
  // 2 D Dv per key (the update) and per query (the output).
  static double flops(const Problem& p);
  static core::ReferenceResult reference(const Problem& p, core::RefPrecision precision);
  static std::array<int64_t, 4> state_shape(const Problem& p);
  // dQ, dK, dV, d_initial_state and the final state's gradient (qsoftmax_backward.cpp). Nothing is
  // refused: the forward is smooth in q (a softmax), linear in k, v and the state, and has no
  // quantisation or other rounding step whose derivative would be a convention.
  static std::string backward_refusal(const Problem& p);
  static const std::vector<core::BackwardForm<Problem>>& backward_forms();
  // The float64 backward from the quadratic weights (or, with RefPrecision::plain, the same in
  // float rounded to the storage dtype: the tolerance rule's baseline).
  static void backward_reference(const Problem& p, const core::BackwardViews& g, core::RefPrecision precision);
};

}  // namespace attn::qsoftmax
