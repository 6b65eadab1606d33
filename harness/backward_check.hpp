// Backward mode of the case list: the gradients of every check case whose mechanism has a backward
// (its family declares one and does not refuse the mechanism: families::backward_refusal), by every
// backward form explain_backward lists as able to run it (the "reference" form only when the filter
// asks for it), on every ISA the check mode runs. The loss's gradient dout is seeded from the case.
//
// Rule for gradients: for each of dq, dk, dv,
//   max |fast - ref64| <= 3 max |plain - ref64| + floor,
// ref64 the family's float64 backward reference and plain the same algorithm with its
// intermediates rounded to the storage dtype (both from q, k, v and dout alone);
// floor = 1e-5 max(1, max |ref64|) (float32 sums over up to a few hundred rows and keys)
//       + 4 eps32 max |lse64| max |ref64| (for families with a log-sum-exp: a flash-style backward
//         recomputes P = exp(t - lse) from the forward's float32 lse, which carries only
//         eps32 |lse| of absolute precision, and recomputes t with another rounding than the
//         forward's: a relative error in P the plain baseline, normalising its own scores, does
//         not have. It matters only for large scores: the case list's inputs x100 give |lse| ~ 5e4,
//         a 2 % floor; at unit scale, |lse| ~ 10, it is 5e-6)
//       + for bf16/fp16, the dtype's rounding floor 2 max |(ref + 0.3 - 0.3) - ref| in that dtype
//         (the gradients are stored in it).
// The gradients of learned params (AttendGradients::dparams, Linformer's E and F when the case
// passes them) by the same rule, float32 (no storage rounding floor). Every gradient finite where
// the reference is; and the form's result on 1 and 3 threads bitwise equal.
#pragma once
#include <array>
#include <map>
#include <string>
#include <vector>

#include "harness/check.hpp"

namespace attn::harness {

// (case, backward form, ISA), named case__form__isa like the check mode's runs. Cases that differ
// only in what the forward returns (row statistics' k, a second forward form) appear once.
std::vector<Run> expand_backward(const std::vector<Case>& cases, const Filter& f);

// The gradient references of a case, computed once and shared by its runs, and the dout they are for.
struct GradientReferences {
  Buffer dout;                 // (B, H, N, Dv) in q's dtype and the case's layout
  AttendGradients f64, plain;  // float32 tensors
  std::array<double, 3> tol{}, plain_err{};  // dq, dk, dv
  double max_lse = 0;                         // max |lse64| over rows that see a key (0: no lse)
  std::map<std::string, std::array<double, 2>> dparams;  // per learned param: {tol, plain_err}
};
GradientReferences gradient_references_for(const Case& c, const Inputs& in);

// The rule for one result: each gradient against the references (failures name `form`), recording
// in `o` the error and tolerance of the gradient closest to its bound.
void check_gradients(const AttendGradients& got, const GradientReferences& ref, const std::string& form, Outcome& o);

// The forward on the run's ISA (the walk's form, its out and lse), then the run's backward form
// on 1 and 3 threads: the gradients against the references, and the two results bitwise equal.
Outcome check_backward_run(const Run& r, const Inputs& in, const GradientReferences& ref);

}  // namespace attn::harness
