// Efficient attention without its key softmax, softmax(Q) (K^T V) (attn/mechanism.hpp, QSoftmax):
// the query's features softmax-normalised, the keys used raw, no denominator,
//   o_i = scale * softmax(q_i)^T S,   S = S0 + sum_j k_j v_j^T   (D x Dv; causal: j <= i).
// One state S per head behind two fast forms, "right" (non-causal: S once, then every row) and
// "recurrent" (causal, token by token: O(D Dv) per token), and a quadratic float64 reference with
// the weights w_ij = scale * softmax(q_i) . k_j.
#pragma once
#include <array>
#include <optional>
#include <vector>

#include "core/facts.hpp"
#include "core/form.hpp"
#include "core/io_checks.hpp"
#include "core/reference_result.hpp"

namespace attn::qsoftmax {

struct QSoftmaxProblem : core::Dims {
  QSoftmax mech;
  double scale = 1.0;
  std::optional<ArrayView> initial;  // (B, H, D, Dv); none: a zero state
};

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
};

}  // namespace attn::qsoftmax
