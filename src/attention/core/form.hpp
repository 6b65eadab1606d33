// Forms: the implementations of one mechanism family (reference, tiled, rows, later chunked,
// recurrent, decode ...). Each form says whether it supports a validated problem and, if not,
// why; selection walks the family's list in priority order, and a refusal lists every reason
// (the shape of xformers' fmha dispatch and PyTorch's sdp_utils). No global switches: a caller
// forces a form through AttendOptions::form.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "attn/attend.hpp"
#include "attn/error.hpp"
#include "core/backward_views.hpp"
#include "kernels/kernel_table.hpp"

namespace attn::core {

class StatsSink;  // core/row_stats.hpp

// The caller's outputs; out is null when only explaining (and stats then a sink that is never
// written).
struct Outputs {
  const TensorView* out = nullptr;
  const TensorView* lse = nullptr;
  const TensorView* probs = nullptr;
  const TensorView* final_state = nullptr;
  const StatsSink* stats = nullptr;  // per-row statistics (return_stats)
  bool wants_lse() const { return lse != nullptr; }
  bool wants_probs() const { return probs != nullptr; }
  bool wants_stats() const { return stats != nullptr; }
};

// How to run: kernels of the chosen ISA, thread count, tuning knobs.
struct Context {
  const kernels::TileKernels* kern = nullptr;
  int threads = 0;
  int64_t row_cache_bytes = 0;
};

// The options' ISA (or this CPU's best), threads and tuning.
inline Context context_of(const AttendOptions& options) {
  const Isa isa = options.isa ? *options.isa : active_isa();
  return {&kernels::kernels_for(isa), options.threads, options.row_cache_bytes};
}

using Reasons = std::vector<std::string>;

template <class Problem>
struct Form {
  std::string_view name;
  std::string_view summary;
  // Appends every reason this form cannot run the problem (none: it can).
  void (*refuse)(const Problem&, const Outputs&, Reasons&);
  void (*run)(const Problem&, const Outputs&, const Context&);
};

// A family's backward forms (the gradients of one of its forward computations), walked the same
// way: refuse gets no outputs (Outputs{}), run writes the gradients.
template <class Problem>
struct BackwardForm {
  std::string_view name;
  std::string_view summary;
  void (*refuse)(const Problem&, const Outputs&, Reasons&);
  void (*run)(const Problem&, const BackwardViews&, const Context&);
};

// For forms that run every problem of their family.
template <class Problem>
void refuse_nothing(const Problem&, const Outputs&, Reasons&) {}

// For fast forms that leave the weights to their family's reference form.
template <class Problem>
void refuse_probs(const Problem&, const Outputs& o, Reasons& why) {
  if (o.wants_probs()) why.push_back("returns no probabilities (the reference form does)");
}

// Every form with its reasons, in priority order.
template <class FormT, class Problem>
std::vector<FormVerdict> verdicts(const std::vector<FormT>& forms, const Problem& p, const Outputs& o) {
  std::vector<FormVerdict> out;
  for (const auto& f : forms) {
    FormVerdict v{std::string(f.name), std::string(f.summary), {}};
    f.refuse(p, o, v.reasons);
    out.push_back(std::move(v));
  }
  return out;
}

std::string describe_verdicts(const std::vector<FormVerdict>& v);

// The form to run: the forced one (which must support the problem) or the first that does.
// Throws Error (from `where`) listing every form and its reasons when none can run it.
template <class FormT, class Problem>
const FormT& choose(const std::vector<FormT>& forms, const Problem& p, const Outputs& o, std::string_view forced,
                    std::string_view mechanism, const char* where = "attend") {
  const auto all = verdicts(forms, p, o);
  if (!forced.empty()) {
    for (size_t i = 0; i < forms.size(); ++i) {
      if (forms[i].name != forced) continue;
      if (all[i].reasons.empty()) return forms[i];
      fail(where, "form '" + std::string(forced) + "' cannot run " + std::string(mechanism) +
                         " for these inputs; forms: " + describe_verdicts(all));
    }
    std::string names;
    for (const auto& f : forms) names += (names.empty() ? "" : ", ") + std::string(f.name);
    fail(where, "form must be one of " + names + " for " + std::string(mechanism) + ", got '" +
                       std::string(forced) + "'");
  }
  for (size_t i = 0; i < forms.size(); ++i)
    if (all[i].reasons.empty()) return forms[i];
  fail(where, "no form can run " + std::string(mechanism) + " for these inputs; forms: " + describe_verdicts(all));
}

}  // namespace attn::core
