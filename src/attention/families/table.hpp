// The one table from a mechanism to its family's implementation: a new family adds one line
// here (and the compiler points at it: the visit is exhaustive). Every family declares its facts
// (core/facts.hpp), checked here by the concept for every mechanism it serves. Nothing in core/
// includes this file: the families sit above core/, the entry point and the edges above them.
#pragma once
#include "attn/error.hpp"
#include "attn/mechanism.hpp"
#include "core/facts.hpp"
#include "softmax/softmax_family.hpp"
#include "linformer/linformer.hpp"
#include "lsh/lsh.hpp"
#include "dca/dca.hpp"
#include "efficient/efficient.hpp"
#include "gau/gau.hpp"
#include "linear/linear.hpp"
#include "qsoftmax/qsoftmax.hpp"

namespace attn::families {

// A family serving mechanism M: it validates M into its Problem and declares M's facts.
template <class Family, class M>
concept FamilyOf = core::DeclaresFacts<Family, M> && requires { typename Family::Problem; Family::forms(); };

template <class Family, class M, class F>
  requires FamilyOf<Family, M>
decltype(auto) to_family(F& f, const M& m) {
  return f(m, Family{});
}

// Calls f(mechanism_alternative, FamilyStruct{}) for the family `m` belongs to.
template <class F>
decltype(auto) visit_family(const Mechanism& m, F&& f) {
  return std::visit(overloaded{
                        [&](const Softmax& s) { return to_family<exact::SoftmaxFamily>(f, s); },
                        [&](const Longformer& s) { return to_family<exact::SoftmaxFamily>(f, s); },
                        [&](const BigBird& s) { return to_family<exact::SoftmaxFamily>(f, s); },
                        [&](const Linformer& l) { return to_family<lowrank::LinformerFamily>(f, l); },
                        [&](const Lsh& l) { return to_family<lsh::LshFamily>(f, l); },
                        [&](const Dca& d) { return to_family<dca::DcaFamily>(f, d); },
                        [&](const Linear& l) { return to_family<linear::LinearFamily>(f, l); },
                        [&](const NormAttn& l) { return to_family<linear::LinearFamily>(f, l); },
                        [&](const Performer& l) { return to_family<linear::LinearFamily>(f, l); },
                        [&](const Sana& l) { return to_family<linear::LinearFamily>(f, l); },
                        [&](const PolaFormer& l) { return to_family<linear::LinearFamily>(f, l); },
                        [&](const Efficient& e) { return to_family<efficient::EfficientFamily>(f, e); },
                        [&](const Gau& g) { return to_family<gau::GauFamily>(f, g); },
                        [&](const QSoftmax& m) { return to_family<qsoftmax::QSoftmaxFamily>(f, m); },
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
// Families with forms that compute in bf16 (AttendOptions::precision) say
// `static constexpr bool computes_in_bf16 = true`.
template <class Family>
constexpr bool computes_in_bf16() {
  if constexpr (requires { Family::computes_in_bf16; })
    return Family::computes_in_bf16;
  else
    return false;
}

// bf16 products are the softmax family's (its tiled forms); the others compute in float32.
template <class Family>
void check_precision(const Mechanism& m, const AttendOptions& options) {
  if constexpr (!computes_in_bf16<Family>())
    if (options.precision == Precision::bf16)
      fail("precision", std::string(kind_of(m)) +
                            " computes in float32 only; bf16 products are exact softmax attention's (softmax, "
                            "longformer, bigbird): use precision f32 or auto");
}

template <class Family>
constexpr bool has_state() {
  return requires(const typename Family::Problem& p) { Family::state_shape(p); };
}

}  // namespace attn::families
