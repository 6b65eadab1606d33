// Check mode: a form's outputs against the family's float64 reference, under the case's
// tolerance rule; and runs (case x form x ISA) with the filters every mode shares.
#pragma once
#include <string>
#include <vector>

#include "core/reference_result.hpp"
#include "harness/case.hpp"
#include "harness/inputs.hpp"

namespace attn::harness {

// Which runs a mode takes: substrings/names to match ("" matches everything).
struct Filter {
  std::string op, form, isa, case_substring;
  bool matches(const Case& c) const;
  // The ISAs this CPU runs that the filter lets through ("scalar" names the portable kernels).
  std::vector<Isa> isas() const;
};

// One unit of work: a case, the form to force ("" = the walk's choice) and the ISA.
struct Run {
  const Case* c = nullptr;
  std::string form;
  Isa isa = Isa::portable;
  std::string name() const;
};

// check: every (case, form, ISA) where the form supports the case (the reference form only
// when asked for by the filter), on every ISA this CPU runs. Other suites: one run per case
// with the filter's form (or the walk) on the active ISA.
std::vector<Run> expand(const std::vector<Case>& cases, Suite suite, const Filter& f);

// The references of a case, computed once and shared by its runs.
struct References {
  core::ReferenceResult f64, plain;
  double tol = 0;        // output tolerance (twice_plain rule)
  double plain_err = 0;  // max |plain - f64|
  double state_tol = 0, plain_state_err = 0;  // the same rule for a recurrent family's final state
};
References references_for(const Case& c, const Inputs& in);

// bf16/fp16 outputs: every element within this many units in the last place of the storage dtype
// at its float64 value (plus the float32 floor), whatever the other elements' errors.
inline constexpr double kHalfUlps = 0.6;
// Forms whose products take bf16 operands (named "<form>_bf16", AttendOptions::precision): their
// outputs are held to the max-error rule only, not kHalfUlps per element (check_out).
bool bf16_products(const std::string& form);

struct Outcome {
  bool pass = true;
  std::string failure;  // the first violated bound, with the values
  double err = 0;       // max |form - f64| over the outputs
  double tol = 0;
  double ulps = 0;      // bf16/fp16: max over elements of (|form - f64| - float32 floor) / ulp(f64)
  std::string form;     // the form that ran
};

// Checks one output against the references under the case's rule (case.hpp), recording the
// largest error (and, for half types, ulps) in `o`; `form` names the output in failures.
void check_out(const Case& c, const TensorView& out, const References& ref, const std::string& form, Outcome& o);

// Runs the form (forced; "" = the walk) on `isa` and checks outputs, LSE and (when the case is
// small enough) probabilities; with agree_with, also runs that form and checks they agree.
Outcome check_run(const Run& r, const Inputs& in, const References& ref);

}  // namespace attn::harness
