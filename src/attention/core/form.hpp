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
#include "base/lazy_text.hpp"
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

// Where a form's refuse() states why it cannot run a problem: push_back(reason) for each, a
// literal or a callable making the text (base/lazy_text.hpp). Choosing a form only counts them
// (Reasons{}): no text is made on the way to a form that runs. A listing sink (Reasons{&list})
// renders each into `list`, for explain() and for the message of a call no form can run.
class Reasons {
 public:
  explicit Reasons(std::vector<std::string>* list = nullptr) : list_(list) {}
  void push_back(LazyText reason) {
    ++count_;
    if (list_) list_->push_back(reason.str());
  }
  bool empty() const { return count_ == 0; }

 private:
  std::vector<std::string>* list_;
  size_t count_ = 0;
};

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

// Whether the form can run the problem (its reasons counted, not rendered).
template <class FormT, class Problem>
bool supports(const FormT& f, const Problem& p, const Outputs& o) {
  Reasons count;
  f.refuse(p, o, count);
  return count.empty();
}

// Every form with its reasons as text, in priority order (explain, and refusals' messages).
template <class FormT, class Problem>
std::vector<FormVerdict> verdicts(const std::vector<FormT>& forms, const Problem& p, const Outputs& o) {
  std::vector<FormVerdict> out;
  for (const auto& f : forms) {
    FormVerdict v{std::string(f.name), std::string(f.summary), {}};
    Reasons why(&v.reasons);
    f.refuse(p, o, why);
    out.push_back(std::move(v));
  }
  return out;
}

std::string describe_verdicts(const std::vector<FormVerdict>& v);

// The form to run: the forced one (which must support the problem) or the first that does.
// Throws Error (from `where`) listing every form and its reasons when none can run it; the
// reasons and the mechanism's text are made only then.
template <class FormT, class Problem>
const FormT& choose(const std::vector<FormT>& forms, const Problem& p, const Outputs& o, std::string_view forced,
                    LazyText mechanism, const char* where = "attend") {
  if (!forced.empty()) {
    for (const auto& f : forms) {
      if (f.name != forced) continue;
      if (supports(f, p, o)) return f;
      fail(where, "form '" + std::string(forced) + "' cannot run " + mechanism.str() +
                         " for these inputs; forms: " + describe_verdicts(verdicts(forms, p, o)));
    }
    std::string names;
    for (const auto& f : forms) names += (names.empty() ? "" : ", ") + std::string(f.name);
    fail(where, "form must be one of " + names + " for " + mechanism.str() + ", got '" + std::string(forced) + "'");
  }
  for (const auto& f : forms)
    if (supports(f, p, o)) return f;
  fail(where, "no form can run " + mechanism.str() + " for these inputs; forms: " +
                  describe_verdicts(verdicts(forms, p, o)));
}

}  // namespace attn::core
