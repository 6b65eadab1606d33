// The softmax family as the entry point sees it: validation, its forms in priority order, its
// FLOP count and its reference. Every family has such a struct (families/table.hpp lists them).
#pragma once
#include <string>
#include <vector>

#include "core/backward_views.hpp"
#include "core/facts.hpp"
#include "core/form.hpp"
#include "core/reference_result.hpp"
#include "softmax/problem.hpp"

namespace attn::exact {

// The named parameters a softmax mechanism takes (score=additive: wq, wk, w).
std::vector<core::ParamSpec> softmax_params(const Softmax& m);

struct SoftmaxFamily {
  using Problem = exact::Problem;
  static constexpr bool computes_in_bf16 = true;  // the tiled_bf16 form (AttendOptions::precision)
  // Softmax, Longformer or BigBird: exact attention over the mechanism's pattern.
  template <class M>
  static Problem validate(const TensorView& q, const TensorView& k, const TensorView& v, const M& m,
                          const AttendOptions& options, const core::Outputs& outs) {
    core::check_option_ranges(ranges(m), M::kind);
    return validate_softmax(q, k, v, m, options, outs);
  }
  // What each mechanism is (softmax_facts.cpp): causal, its KV rows, params, limits.
  static core::Facts facts(const Softmax& m);
  static core::Facts facts(const Longformer& m);
  static core::Facts facts(const BigBird& m);
  // Their float options' ranges (facts(m).ranges; validate checks them on every call).
  static std::vector<core::OptionRange> ranges(const Softmax& m);
  static std::vector<core::OptionRange> ranges(const Longformer& m);
  static std::vector<core::OptionRange> ranges(const BigBird& m);
  // rows (few queries per kv head), tiled (everything), reference (float64).
  static const std::vector<core::Form<Problem>>& forms();
  // 2 (D + Dv) per (query, key) pair inside the structural masks.
  static double flops(const Problem& p);
  static core::ReferenceResult reference(const Problem& p, core::RefPrecision precision);
  // dQ, dK, dV (softmax_backward.cpp). backward_refusal: why this call has no gradient at all
  // (int8 K/V rows), or ""; backward_forms: its backward forms in priority order (tiled_bf16,
  // tiled, rows: dot scores; scores: cosine and additive; reference: float64, every score).
  static std::string backward_refusal(const Problem& p);
  static const std::vector<core::BackwardForm<Problem>>& backward_forms();
  // score=additive: "wq" (1, 1, A, D), "wk" (1, 1, A, D) and "w" (1, 1, 1, A); none otherwise.
  static std::vector<core::LearnedParam> learned_params(const Problem& p);
  // The backward's float64 oracle or plain same-dtype baseline (softmax_backward_reference), which
  // the case list's backward mode checks every backward form against.
  static void backward_reference(const Problem& p, const core::BackwardViews& g, core::RefPrecision precision);
};

}  // namespace attn::exact
