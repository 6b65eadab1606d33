// attend_backward: validate like attend() (the same family validation, the forward's out and
// lse as outputs of that call), then the family's backward. Family-independent: a family has a
// backward when its struct declares one (families/table.hpp maps the mechanism to it).
#include "attn/backward.hpp"

#include "attn/error.hpp"
#include "core/io_checks.hpp"
#include "core/out_of_memory.hpp"
#include "families/table.hpp"

namespace attn {
namespace {

constexpr const char* kWhere = "attend_backward";

void check_dout(const TensorView& dout, const TensorView& out, const TensorView& q) {
  core::check_view(dout, "dout");
  if (dout.dtype != q.dtype)
    fail(kWhere, "dout must have q's dtype " + dtype_name(q.dtype) + ", got " + dtype_name(dout.dtype));
  if (dout.shape != out.shape)
    fail(kWhere, "dout must have out's shape (B, H, N, Dv) = " + core::dims_text(out) + ", got " + core::dims_text(dout));
}

void check_options(const AttendOptions& o) {
  const char* asked = o.return_lse ? "return_lse" : o.return_probs ? "return_probs" : o.return_final_state ? "return_final_state"
                    : o.return_stats ? "return_stats" : nullptr;
  if (asked) fail(kWhere, std::string(asked) + " does not apply: the backward returns dq, dk and dv");
  if (o.paged) fail(kWhere, "paged K/V (a block table) have no backward: pass k and v as tensors");
}

// The family's validation of the forward inputs, its messages said as attend_backward's (the
// forward's checks speak as "attend: ...").
template <class Family, class M>
typename Family::Problem validate_forward(const TensorView& q, const TensorView& k, const TensorView& v, const M& mech,
                                          const AttendOptions& options, const core::Outputs& outs) try {
  return Family::validate(q, k, v, mech, options, outs);
} catch (const Error& e) {
  const std::string what = e.what();
  const std::string prefix = "attend: ";
  if (what.rfind(prefix, 0) == 0) throw Error(std::string(kWhere) + ": " + what.substr(prefix.size()));
  throw;
}

[[noreturn]] void fail_no_backward(const Mechanism& mechanism) {
  fail(kWhere, std::string(kind_of(mechanism)) +
                   " has no backward (every attention family of this build has one: a family added without "
                   "one lands here)");
}

// lse and dlse belong to softmax families; a family without an lse takes an empty lse view
// (checked after the family's refusal, which says more).
template <class Family>
void check_no_lse(const TensorView& lse, const TensorView* dlse, const Mechanism& mechanism) {
  if constexpr (!families::has_lse<Family>()) {
    if (!lse.empty())
      fail(kWhere, "lse does not apply to " + std::string(kind_of(mechanism)) +
                       " (its weights are no softmax): pass an empty view, got " + core::dims_text(lse));
    if (dlse) fail(kWhere, "dlse does not apply to " + std::string(kind_of(mechanism)) + " (it has no lse)");
  }
}

// dfinal_state: the state's shape, float32; only for families with a recurrent state.
template <class Family>
void check_dfinal_state(const TensorView* dfinal_state, const typename Family::Problem& p, const Mechanism& mechanism) {
  if (!dfinal_state) return;
  if constexpr (families::has_state<Family>()) {
    core::check_view(*dfinal_state, "dfinal_state");
    if (dfinal_state->dtype != DType::f32)
      fail(kWhere, "dfinal_state must be float32, got " + dtype_name(dfinal_state->dtype));
    const auto want = Family::state_shape(p);
    if (dfinal_state->shape != want)
      fail(kWhere, "dfinal_state must have the final state's shape (B, H, state_rows, state_cols) = (" +
                       std::to_string(want[0]) + ", " + std::to_string(want[1]) + ", " + std::to_string(want[2]) +
                       ", " + std::to_string(want[3]) + "), got " + core::dims_text(*dfinal_state));
  } else {
    (void)p;
    fail(kWhere, "dfinal_state does not apply to " + std::string(kind_of(mechanism)) + " (it has no recurrent state)");
  }
}

// The family's backward forms with their reasons for a validated problem, and the chosen one.
template <class Family>
const core::BackwardForm<typename Family::Problem>& choose_backward(const typename Family::Problem& p,
                                                                     const Mechanism& mechanism,
                                                                     const AttendOptions& options) {
  families::check_precision<Family>(mechanism, options);
  if (const std::string why = Family::backward_refusal(p); !why.empty()) fail(kWhere, to_string(mechanism) + ": " + why);
  return core::choose(Family::backward_forms(), p, core::Outputs{}, options.form, core::mechanism_text(mechanism),
                      kWhere);
}

}  // namespace

AttendGradients attend_backward(const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& out, const TensorView& lse, const Mechanism& mechanism,
                                const AttendOptions& options, const TensorView* dlse,
                                const TensorView* dfinal_state) try {
  check_options(options);
  AttendGradients g;
  families::visit_family(mechanism, [&](const auto& mech, auto family) {
    using Family = decltype(family);
    if constexpr (requires { Family::backward_forms; }) {
      const auto p = validate_forward<Family>(q, k, v, mech, options,
                                              core::Outputs{&out, families::has_lse<Family>() ? &lse : nullptr});
      check_dout(dout, out, q);
      const auto& form = choose_backward<Family>(p, mechanism, options);
      check_no_lse<Family>(lse, dlse, mechanism);
      check_dfinal_state<Family>(dfinal_state, p, mechanism);
      if (dlse) {
        core::check_view(*dlse, "dlse");
        if (dlse->dtype != DType::f32) fail(kWhere, "dlse must be float32, got " + dtype_name(dlse->dtype));
        if (dlse->shape != lse.shape)
          fail(kWhere, "dlse must have lse's shape (B, H, N, 1) = " + core::dims_text(lse) + ", got " + core::dims_text(*dlse));
      }
      g.dq = Tensor(q.dtype, {p.B, p.H, p.N, p.D});
      g.dk = Tensor(k.dtype, {p.B, p.Hkv, p.M, p.D});
      g.dv = Tensor(v.dtype, {p.B, p.Hkv, p.M, p.Dv});
      core::BackwardViews views{dout, out, lse, g.dq.view(), g.dk.view(), g.dv.view(), dlse ? *dlse : TensorView{}};
      if (dfinal_state) views.dfinal_state = *dfinal_state;
      if constexpr (families::has_state<Family>()) {
        if (options.params.contains("initial_state")) {
          const auto shape = Family::state_shape(p);
          g.d_initial_state = Tensor(DType::f32, {shape[0], shape[1], shape[2], shape[3]});
          views.d_initial_state = g.d_initial_state.view();
        }
      }
      core::allocate_dparams<Family>(p, g.dparams, views);
      form.run(p, views, core::context_of(options));
    } else {
      fail_no_backward(mechanism);
    }
  });
  return g;
} catch (const std::bad_alloc&) {
  core::fail_out_of_memory(kWhere, "running the backward of", mechanism, q);
}

Explanation explain_backward(const TensorView& q, const TensorView& k, const TensorView& v, const Mechanism& mechanism,
                             const AttendOptions& options) try {
  check_options(options);
  Explanation e;
  e.mechanism = to_string(mechanism);
  e.isa = isa_name(options.isa ? *options.isa : active_isa());
  families::visit_family(mechanism, [&](const auto& mech, auto family) {
    using Family = decltype(family);
    if constexpr (requires { Family::backward_forms; }) {
      const auto p = validate_forward<Family>(q, k, v, mech, options, core::Outputs{});
      e.chosen = std::string(choose_backward<Family>(p, mechanism, options).name);
      e.forms = core::verdicts(Family::backward_forms(), p, core::Outputs{});
    } else {
      fail_no_backward(mechanism);
    }
  });
  return e;
} catch (const std::bad_alloc&) {
  core::fail_out_of_memory("explain_backward", "explaining the backward of", mechanism, q);
}

}  // namespace attn
