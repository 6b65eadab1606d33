// Library internals the test/benchmark harness needs beyond the public API (harness/); defined
// in families/info.cpp.
#pragma once
#include "attn/attend.hpp"
#include "core/reference_result.hpp"

namespace attn::families {

// The family's reference for this call, float64 (the oracle) or plain (the same-dtype
// baseline of the tolerance rule). Validates like attend().
core::ReferenceResult reference_outputs(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const Mechanism& mechanism, const AttendOptions& options, core::RefPrecision precision);

}  // namespace attn::families
