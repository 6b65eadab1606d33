// Linformer: K' = E K and V' = F V (E, F of shape (k, M)), then exact softmax attention of q
// against the k projected rows. Forms: "projected" (project in float32, then the softmax
// family's fast forms on K', V') and "reference" (float64 throughout). Backward
// (linformer_backward.cpp): the same two, with the gradients of E and F when the call gives them.
#pragma once
#include <string>
#include <vector>

#include "core/backward_views.hpp"
#include "core/facts.hpp"
#include "core/form.hpp"
#include "core/io_checks.hpp"
#include "core/reference_result.hpp"

namespace attn::lowrank {

struct LinformerProblem : core::Dims {
  Linformer mech;
  int64_t K = 0;                 // projected rows
  double scale = 1.0;
  std::vector<float> E, F;       // (K, M) row-major; keys j >= kv_len[b] are left out
  bool learned = false;          // E and F given in params: the backward returns their gradients
};

struct LinformerFamily {
  using Mechanism = Linformer;
  using Problem = LinformerProblem;
  static Problem validate(const TensorView& q, const TensorView& k, const TensorView& v, const Linformer& m,
                          const AttendOptions& options, const core::Outputs& outs);
  static core::Facts facts(const Linformer& m);
  // What facts(m) declares of them, for validation (each without the rest of the facts).
  static std::vector<core::OptionRange> ranges(const Linformer& m);
  static std::vector<core::ParamSpec> params(const Linformer& m);
  static const std::vector<core::Form<Problem>>& forms();
  // 2 k M (D + Dv) per kv head for the projections + 2 N k (D + Dv) per query head.
  static double flops(const Problem& p);
  static core::ReferenceResult reference(const Problem& p, core::RefPrecision precision);
  // The backward (linformer_backward.cpp): dQ, dK, dV and, when E and F are params, dE and dF.
  // Forms: projected (float32 projections, the softmax family's tiled backward on K', V', then the
  // projections' backward), reference (float64).
  static std::string backward_refusal(const Problem& p);
  static const std::vector<core::BackwardForm<Problem>>& backward_forms();
  static void backward_reference(const Problem& p, const core::BackwardViews& g, core::RefPrecision precision);
  // "E" and "F", (1, 1, k, M) each, when the call gives them; none otherwise.
  static std::vector<core::LearnedParam> learned_params(const Problem& p);
};

// Y (K, d) = P (K, M) X (M, d) in float32 over the keys j < len, X the rows of kv head h of batch
// entry b; row: d floats of scratch (the forward's projection, which the backward repeats).
void linformer_project(const float* P, int64_t K, int64_t M, int64_t len, const TensorView& x, int64_t b, int64_t h,
                       float* y, float* row);

}  // namespace attn::lowrank
