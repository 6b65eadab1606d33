// The one table from a mechanism to its family's implementation: a new family adds one line
// here (and the compiler points at it: the visit is exhaustive).
#pragma once
#include "attn/mechanism.hpp"
#include "exact/softmax_family.hpp"
#include "lowrank/linformer.hpp"
#include "sparse/lsh.hpp"
#include "positional/dca.hpp"

namespace attn::core {

// Calls f(mechanism_alternative, FamilyStruct{}) for the family `m` belongs to.
template <class F>
decltype(auto) visit_family(const Mechanism& m, F&& f) {
  return std::visit(overloaded{
                        [&](const Softmax& s) { return f(s, exact::SoftmaxFamily{}); },
                        [&](const Longformer& s) { return f(s, exact::SoftmaxFamily{}); },
                        [&](const BigBird& s) { return f(s, exact::SoftmaxFamily{}); },
                        [&](const Linformer& l) { return f(l, lowrank::LinformerFamily{}); },
                        [&](const Lsh& l) { return f(l, sparse::LshFamily{}); },
                        [&](const Dca& d) { return f(d, positional::DcaFamily{}); },
                    },
                    m);
}

}  // namespace attn::core
