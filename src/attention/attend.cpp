// The entry point: validate once, choose the form (walking the family's priority list), pick the
// kernel set for this CPU, run. Family-independent: families/table.hpp maps a mechanism to its
// family's validation, forms, FLOP count, reference and facts.
#include "attn/attend.hpp"

#include <array>
#include <optional>

#include "attn/error.hpp"
#include "core/io_checks.hpp"
#include "core/out_of_memory.hpp"
#include "families/table.hpp"
#include "core/row_stats.hpp"

namespace attn {
namespace {

Layout layout_of(const TensorView& q) {
  return q.heads() > 1 && q.tokens() > 1 && q.strides[2] > q.strides[1] ? Layout::bnhd : Layout::bhnd;
}

using families::has_lse;
using families::has_state;

// The outputs a family cannot give are errors, not silently missing arrays.
template <class Family>
void check_outputs(const typename Family::Problem& p, const Mechanism& m, const AttendOptions& options,
                   const core::Outputs& outs) {
  families::check_precision<Family>(m, options);
  if constexpr (!has_lse<Family>())
    if (options.return_lse || outs.lse)
      fail("attend",
           std::string(kind_of(m)) + " has no log-sum-exp (its weights are not a softmax); do not ask for lse");
  if constexpr (has_state<Family>()) {
    if (outs.final_state) {
      const TensorView& s = *outs.final_state;
      const std::array<int64_t, 4> want = Family::state_shape(p);
      if (s.dtype != DType::f32) fail("attend", "final_state must be float32, got " + dtype_name(s.dtype));
      TensorView shape_only;
      shape_only.shape = want;
      if (s.shape != want)
        fail("attend", "final_state must have shape (B, H, F, state columns) = " + core::dims_text(shape_only) +
                           ", got " + core::dims_text(s));
      core::check_view(s, "final_state");
    }
  } else if (options.return_final_state || outs.final_state) {
    fail("attend", std::string(kind_of(m)) + " has no recurrent state; do not ask for final_state");
  }
}

// Walks the family's forms for a validated problem and runs the chosen one.
template <class Family>
void run(const typename Family::Problem& p, const Mechanism& mechanism, const AttendOptions& options,
         const core::Outputs& outs) {
  check_outputs<Family>(p, mechanism, options, outs);
  const auto& form = core::choose(Family::forms(), p, outs, options.form, core::mechanism_text(mechanism));
  form.run(p, outs, core::context_of(options));
}

}  // namespace

std::string precision_name(Precision p) {
  switch (p) {
    case Precision::automatic: return "auto";
    case Precision::f32: return "f32";
    case Precision::bf16: return "bf16";
  }
  return "?";
}

Precision parse_precision(const std::string& name, const std::string& where) {
  if (name == "auto") return Precision::automatic;
  if (name == "f32") return Precision::f32;
  if (name == "bf16") return Precision::bf16;
  fail(where, "expected auto, f32 or bf16, got '" + name + "'");
}

void attend_into(const TensorView& q, const TensorView& k, const TensorView& v, const Mechanism& mechanism,
                 const AttendOptions& options, const TensorView& out, const TensorView* lse, const TensorView* probs,
                 const TensorView* final_state, const RowStatsViews* stats) try {
  std::optional<core::StatsSink> sink;
  if (stats) sink.emplace(*stats, options.stats_topk);
  const core::Outputs outs{&out, lse, probs, final_state, sink ? &*sink : nullptr};
  families::visit_family(mechanism, [&](const auto& mech, auto family) {
    using Family = decltype(family);
    const typename Family::Problem p = Family::validate(q, k, v, mech, options, outs);
    if (stats) core::check_stats_views(p, *stats);
    run<Family>(p, mechanism, options, outs);
  });
} catch (const std::bad_alloc&) {
  core::fail_out_of_memory("attend_into", "running", mechanism, q);
}

AttendResult attend(const TensorView& q, const TensorView& k, const TensorView& v, const Mechanism& mechanism,
                    const AttendOptions& options) try {
  AttendResult r;
  families::visit_family(mechanism, [&](const auto& mech, auto family) {
    using Family = decltype(family);
    // Validated once, before anything is allocated (a head dim of 0 with 2^40 tokens must not
    // allocate); the outputs allocated below have the shapes validation implies.
    const typename Family::Problem p = Family::validate(q, k, v, mech, options, core::Outputs{});
    r.out = Tensor(q.dtype, {p.B, p.H, p.N, p.Dv}, options.out_layout.value_or(layout_of(q)));
    if (options.return_lse) r.lse = Tensor(DType::f32, {p.B, p.H, p.N, 1});
    if (options.return_probs) r.probs = Tensor(DType::f32, {p.B, p.H, p.N, p.M});
    check_outputs<Family>(p, mechanism, options, core::Outputs{});
    if constexpr (has_state<Family>())
      if (options.return_final_state) {
        const std::array<int64_t, 4> s = Family::state_shape(p);
        r.final_state = Tensor(DType::f32, {s[0], s[1], s[2], s[3]});
      }
    std::optional<core::StatsSink> sink;
    if (options.return_stats) {
      for (Tensor* t : {&r.sparsity, &r.entropy, &r.max_weight, &r.topk_mass}) *t = Tensor(DType::f32, {p.B, p.H, p.N, 1});
      sink.emplace(RowStatsViews{r.sparsity.view(), r.entropy.view(), r.max_weight.view(), r.topk_mass.view()},
                   options.stats_topk);
    }
    run<Family>(p, mechanism, options,
                {&r.out.view(), options.return_lse ? &r.lse.view() : nullptr,
                 options.return_probs ? &r.probs.view() : nullptr,
                 options.return_final_state ? &r.final_state.view() : nullptr, sink ? &*sink : nullptr});
  });
  return r;
} catch (const std::bad_alloc&) {
  core::fail_out_of_memory("attend", "running", mechanism, q);
}

double attention_flops(const TensorView& q, const TensorView& k, const TensorView& v, const Mechanism& mechanism,
                       const AttendOptions& options) {
  return families::visit_family(mechanism, [&](const auto& mech, auto family) {
    using Family = decltype(family);
    return Family::flops(Family::validate(q, k, v, mech, options, core::Outputs{}));
  });
}

std::string_view validate_call(const TensorView& q, const TensorView& k, const TensorView& v,
                               const Mechanism& mechanism, const AttendOptions& options) {
  return families::visit_family(mechanism, [&](const auto& mech, auto family) {
    using Family = decltype(family);
    const core::Outputs none{};
    const typename Family::Problem p = Family::validate(q, k, v, mech, options, none);
    check_outputs<Family>(p, mechanism, options, none);
    return std::string_view(core::choose(Family::forms(), p, none, options.form, core::mechanism_text(mechanism)).name);
  });
}

Explanation explain(const TensorView& q, const TensorView& k, const TensorView& v, const Mechanism& mechanism,
                    const AttendOptions& options) try {
  // Outputs as attend() would allocate them; only their presence matters to the forms.
  TensorView none;
  const core::StatsSink no_stats(RowStatsViews{}, options.stats_topk);  // never written
  const core::Outputs outs{nullptr, options.return_lse ? &none : nullptr, options.return_probs ? &none : nullptr,
                          options.return_final_state ? &none : nullptr, options.return_stats ? &no_stats : nullptr};
  core::Outputs checked{};  // validation sees no output views (they do not exist yet)
  Explanation e;
  e.mechanism = to_string(mechanism);
  e.isa = isa_name(options.isa ? *options.isa : active_isa());
  families::visit_family(mechanism, [&](const auto& mech, auto family) {
    using Family = decltype(family);
    const typename Family::Problem p = Family::validate(q, k, v, mech, options, checked);
    check_outputs<Family>(p, mechanism, options, checked);
    e.forms = core::verdicts(Family::forms(), p, outs);
    e.chosen = std::string(core::choose(Family::forms(), p, outs, options.form, e.mechanism).name);
  });
  return e;
} catch (const std::bad_alloc&) {
  core::fail_out_of_memory("explain", "explaining", mechanism, q);
}

std::string Explanation::text() const {
  std::string o = mechanism + " (isa " + isa + "): runs form '" + chosen + "'\n";
  bool after_chosen = false;
  for (const auto& f : forms) {
    o += "  " + f.form + std::string(f.form.size() < 12 ? 12 - f.form.size() : 1, ' ');
    if (f.form == chosen) {
      o += "chosen";
      after_chosen = true;
    } else if (f.reasons.empty()) {
      o += after_chosen ? "supported (lower priority)" : "supported (passed over: another form was forced)";
    } else {
      o += "refused: ";
      for (size_t i = 0; i < f.reasons.size(); ++i) o += (i ? "; " : "") + f.reasons[i];
    }
    o += "  [" + f.summary + "]\n";
  }
  return o;
}

std::array<int64_t, 4> state_shape(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const Mechanism& mechanism, const AttendOptions& options) {
  return families::visit_family(mechanism, [&](const auto& mech, auto family) -> std::array<int64_t, 4> {
    using Family = decltype(family);
    if constexpr (has_state<Family>())
      return Family::state_shape(Family::validate(q, k, v, mech, options, core::Outputs{}));
    else
      return {0, 0, 0, 0};
  });
}

namespace core {

void fail_out_of_memory(const char* where, const char* doing, const Mechanism& mechanism, const TensorView& q) {
  fail(where, std::string("out of memory while ") + doing + " " + to_string(mechanism) + " on q " + dims_text(q) + " " +
                  dtype_name(q.dtype));
}

}  // namespace core
}  // namespace attn
