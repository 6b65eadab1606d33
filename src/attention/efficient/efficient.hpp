// Efficient attention (attn/mechanism.hpp, Efficient): per feature f an online softmax over the
// keys, its state (context C_f, sum z_f, maximum m_f) absorbing one key at a time, so the
// non-causal form ("right": all keys, then every query) and the causal one ("recurrent": one token
// at a time, O(D Dv) each) share one update; a quadratic float64 reference beside them.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "core/backward_views.hpp"
#include "core/facts.hpp"
#include "core/form.hpp"
#include "core/io_checks.hpp"
#include "core/reference_result.hpp"

namespace attn::efficient {

struct EfficientProblem : core::Dims {
  Efficient mech;
  double scale = 1.0;
  std::optional<ArrayView> initial;  // (B, H, D, Dv + 2) = [C | z | m]; none: no earlier tokens
};

struct EfficientFamily {
  using Problem = EfficientProblem;
  static constexpr bool has_lse = false;
  static Problem validate(const TensorView& q, const TensorView& k, const TensorView& v, const Efficient& m,
                          const AttendOptions& options, const core::Outputs& outs);
  static core::Facts facts(const Efficient& m);
  // What facts(m) declares of them, for validation (each without the rest of the facts).
  static std::vector<core::OptionRange> ranges(const Efficient& m);
  static std::vector<core::ParamSpec> params(const Efficient& m);
  static const std::vector<core::Form<Problem>>& forms();
  // 2 D Dv per key (the update) and per query (the output).
  static double flops(const Problem& p);
  static core::ReferenceResult reference(const Problem& p, core::RefPrecision precision);
  static std::array<int64_t, 4> state_shape(const Problem& p);
  // dQ, dK, dV, the initial state's gradient and dfinal_state in (efficient_backward.cpp): forms
  // online (float32: the states again forward, then one walk back over the keys) and reference
  // (float64). Nothing refused.
  static std::string backward_refusal(const Problem& p);
  static const std::vector<core::BackwardForm<Problem>>& backward_forms();
  static void backward_reference(const Problem& p, const core::BackwardViews& g, core::RefPrecision precision);
};

// The row statistics of the whole problem into o.stats, a second pass after the form (see
// efficient_stats.cpp).
void efficient_row_stats(const EfficientProblem& p, const core::Outputs& o, const core::Context& ctx);

}  // namespace attn::efficient
