// Linformer: K' = E K and V' = F V (E, F of shape (k, M)), then exact softmax attention of q
// against the k projected rows. Forms: "projected" (project in float32, then the softmax
// family's fast forms on K', V') and "reference" (float64 throughout).
#pragma once
#include <vector>

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
};

struct LinformerFamily {
  using Mechanism = Linformer;
  using Problem = LinformerProblem;
  static Problem validate(const TensorView& q, const TensorView& k, const TensorView& v, const Linformer& m,
                          const AttendOptions& options, const core::Outputs& outs);
  static core::Facts facts(const Linformer& m);
  static const std::vector<core::Form<Problem>>& forms();
  // 2 k M (D + Dv) per kv head for the projections + 2 N k (D + Dv) per query head.
  static double flops(const Problem& p);
  static core::ReferenceResult reference(const Problem& p, core::RefPrecision precision);
};

}  // namespace attn::lowrank
