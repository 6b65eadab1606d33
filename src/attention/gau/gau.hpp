// GAU's squared-ReLU attention: a_ij = relu(scale q_i.k_j + bias)^2 / n, o_i = sum_j a_ij v_j
// (attn/mechanism.hpp, Gau). The weights are no kernel product, so the cost is quadratic: form
// "tiled" (64 queries x 64 keys per step, both products through kernels.gemm, no N x M buffer)
// beside the float64 reference.
#pragma once
#include <string>
#include <vector>

#include "core/facts.hpp"
#include "core/form.hpp"
#include "core/io_checks.hpp"
#include "core/reference_result.hpp"

namespace attn::gau {

struct GauProblem : core::Dims {
  Gau mech;
  double scale = 1.0;
};

struct GauFamily {
  using Problem = GauProblem;
  static constexpr bool has_lse = false;  // the weights are not a softmax
  static Problem validate(const TensorView& q, const TensorView& k, const TensorView& v, const Gau& m,
                          const AttendOptions& options, const core::Outputs& outs);
  static core::Facts facts(const Gau& m);
  // Its float options' ranges (facts(m).ranges; validate checks them on every call).
  static std::vector<core::OptionRange> ranges(const Gau& m);
  static const std::vector<core::Form<Problem>>& forms();
  // 2 (D + Dv) per (query, key) pair it evaluates (causal: the lower triangle).
  static double flops(const Problem& p);
  static core::ReferenceResult reference(const Problem& p, core::RefPrecision precision);
  // dQ, dK, dV (gau_backward.cpp): forms tiled (float32) and reference (float64); nothing refused.
  static std::string backward_refusal(const Problem& p);
  static const std::vector<core::BackwardForm<Problem>>& backward_forms();
  // The float64 backward (or, with RefPrecision::plain, the same in float rounded to the storage
  // dtype: the tolerance rule's baseline).
  static void backward_reference(const Problem& p, const core::BackwardViews& g, core::RefPrecision precision);
};

}  // namespace attn::gau
