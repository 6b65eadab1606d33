// The plain reference: full score rows, float64 accumulation, no tiles, no tricks. It is the
// oracle the fast forms are tested against, and (in `plain` precision) the same-dtype baseline
// whose error sets the tolerance: float arithmetic, intermediates rounded to the storage dtype.
#pragma once
#include "core/form.hpp"
#include "core/reference_result.hpp"
#include "softmax/problem.hpp"

namespace attn::exact {

core::ReferenceResult reference_softmax(const Problem& p, core::RefPrecision precision = core::RefPrecision::f64);

// The reference as a form: runs it and writes the caller's outputs.
void softmax_reference_form(const Problem& p, const core::Outputs& o, const core::Context& ctx);

}  // namespace attn::exact
