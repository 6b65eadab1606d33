// The one table from a mechanism to its family's implementation: a new family adds one line
// here (and the compiler points at it: the visit is exhaustive).
#pragma once
#include "attn/mechanism.hpp"
#include "exact/softmax_family.hpp"
#include "lowrank/linformer.hpp"
#include "sparse/lsh.hpp"
#include "positional/dca.hpp"
#include "linear/efficient.hpp"
#include "linear/gau.hpp"
#include "linear/linear.hpp"

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
                        [&](const Linear& l) { return f(l, linear::LinearFamily{}); },
                        [&](const NormAttn& l) { return f(l, linear::LinearFamily{}); },
                        [&](const Performer& l) { return f(l, linear::LinearFamily{}); },
                        [&](const Sana& l) { return f(l, linear::LinearFamily{}); },
                        [&](const PolaFormer& l) { return f(l, linear::LinearFamily{}); },
                        [&](const Efficient& e) { return f(e, linear::EfficientFamily{}); },
                        [&](const Gau& g) { return f(g, linear::GauFamily{}); },
                    },
                    m);
}

// Families whose weights are no softmax say `static constexpr bool has_lse = false`; families
// with a recurrent state say its shape (`state_shape(problem)`).
template <class Family>
constexpr bool has_lse() {
  if constexpr (requires { Family::has_lse; })
    return Family::has_lse;
  else
    return true;
}
template <class Family>
constexpr bool has_state() {
  return requires(const typename Family::Problem& p) { Family::state_shape(p); };
}

}  // namespace attn::core
