// The backward's reference through the family table, for the case list's backward mode: a family
// with a backward (backward_forms) also declares
//   static void backward_reference(const Problem&, const core::BackwardViews&, core::RefPrecision);
// its float64 oracle and plain same-dtype baseline, recomputing everything from q, k, v and dout
// (the views' out, lse and dlse are empty).
#include <array>
#include <string>

#include "attn/error.hpp"
#include "core/io_checks.hpp"
#include "core/out_of_memory.hpp"
#include "families/internal_api.hpp"
#include "families/table.hpp"

namespace attn::families {
namespace {

template <class Family>
constexpr bool has_backward() {
  return requires { Family::backward_forms(); };
}

}  // namespace

std::string backward_refusal(const TensorView& q, const TensorView& k, const TensorView& v, const Mechanism& mechanism,
                             const AttendOptions& options) {
  return visit_family(mechanism, [&](const auto& mech, auto family) -> std::string {
    using Family = decltype(family);
    if constexpr (has_backward<Family>()) {
      return Family::backward_refusal(Family::validate(q, k, v, mech, options, core::Outputs{}));
    } else {
      return std::string(kind_of(mechanism)) + " has no backward yet";
    }
  });
}

AttendGradients reference_gradients(const TensorView& dout, const TensorView& q, const TensorView& k,
                                    const TensorView& v, const Mechanism& mechanism, const AttendOptions& options,
                                    core::RefPrecision precision) try {
  AttendGradients g;
  visit_family(mechanism, [&](const auto& mech, auto family) {
    using Family = decltype(family);
    if constexpr (has_backward<Family>()) {
      static_assert(requires(const typename Family::Problem& p, const core::BackwardViews& views) {
        Family::backward_reference(p, views, precision);
      }, "a family with backward_forms() declares backward_reference(problem, views, precision): the case list "
         "checks its backward forms against it (docs/adding-a-mechanism.md)");
      const auto p = Family::validate(q, k, v, mech, options, core::Outputs{});
      if (const std::string why = Family::backward_refusal(p); !why.empty())
        fail("reference_gradients", to_string(mechanism) + ": " + why);
      core::check_view(dout, "dout");
      if (dout.shape != std::array<int64_t, 4>{p.B, p.H, p.N, p.Dv})
        fail("reference_gradients", "dout must have shape (B, H, N, Dv) = (" + std::to_string(p.B) + ", " +
                                        std::to_string(p.H) + ", " + std::to_string(p.N) + ", " + std::to_string(p.Dv) +
                                        "), got " + core::dims_text(dout));
      if (dout.dtype != q.dtype)
        fail("reference_gradients", "dout must have q's dtype " + dtype_name(q.dtype) + ", got " + dtype_name(dout.dtype));
      g.dq = Tensor(DType::f32, {p.B, p.H, p.N, p.D});
      g.dk = Tensor(DType::f32, {p.B, p.Hkv, p.M, p.D});
      g.dv = Tensor(DType::f32, {p.B, p.Hkv, p.M, p.Dv});
      core::BackwardViews views{dout, {}, {}, g.dq.view(), g.dk.view(), g.dv.view(), {}};
      core::allocate_dparams<Family>(p, g.dparams, views);
      Family::backward_reference(p, views, precision);
    } else {
      fail("reference_gradients", std::string(kind_of(mechanism)) + " has no backward yet");
    }
  });
  return g;
} catch (const std::bad_alloc&) {
  core::fail_out_of_memory("reference_gradients", "computing the reference gradients of", mechanism, q);
}

}  // namespace attn::families
