#include "harness/check.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "families/internal_api.hpp"

namespace attn::harness {
namespace {

// The float32 floor: 1e-6 * max(1, max|ref|).
double float32_floor(const core::ReferenceResult& ref) {
  double max_ref = 0;
  for (double x : ref.out) max_ref = std::max(max_ref, std::abs(x));
  return 1e-6 * std::max(1.0, max_ref);
}

// The float32 floor plus, for bf16/fp16, the dtype's rounding floor.
double floor_for(DType dt, const core::ReferenceResult& ref) {
  double noise = 0;
  for (double x : ref.out) {
    const float r = round_to(dt, static_cast<float>(x));
    noise = std::max(noise, std::abs(static_cast<double>(round_to(dt, round_to(dt, r + 0.3f) - 0.3f)) - x));
  }
  return float32_floor(ref) + (dt == DType::f32 ? 0.0 : 2 * noise);
}

// One unit in the last place of `dt` at |x| (its subnormal spacing below the normal range).
double ulp_at(DType dt, double x) {
  const int mantissa = dt == DType::bf16 ? 7 : dt == DType::f16 ? 10 : 23;
  const int min_exp = dt == DType::f16 ? -14 : -126;  // the smallest normal binade
  int e = 0;
  std::frexp(std::abs(x), &e);  // |x| = m 2^e, m in [0.5, 1): the binade is 2^(e-1)
  return std::ldexp(1.0, std::max(e - 1, min_exp) - mantissa);
}

std::string at_text(int64_t b, int64_t h, int64_t i, int64_t j = -1) {
  return "(" + std::to_string(b) + ", " + std::to_string(h) + ", " + std::to_string(i) +
         (j >= 0 ? ", " + std::to_string(j) : "") + ")";
}

std::string number(double x) {
  std::ostringstream s;
  s.precision(4);
  s << x;
  return s.str();
}

bool supports(const Inputs& in, const std::string& form, bool probs, int64_t stats_topk) {
  AttendOptions o = in.options;
  o.return_probs = probs;
  o.return_stats = stats_topk > 0;
  o.stats_topk = stats_topk;
  o.form.clear();
  for (const auto& v : explain(in.q.view, in.k.view, in.v.view, in.mechanism, o).forms)
    if (v.form == form) return v.reasons.empty();
  return false;
}

// The reference with its row statistics (every family gives them).
core::ReferenceResult reference_with_stats(const Case& c, const Inputs& in, core::RefPrecision precision) {
  AttendOptions o = in.options;
  o.return_stats = true;
  o.stats_topk = c.stats_topk;
  return families::reference_outputs(in.q.view, in.k.view, in.v.view, in.mechanism, o, precision);
}

const char* const kStatNames[4] = {"sparsity", "entropy", "max_weight", "topk_mass"};

struct Result {
  AttendResult r;
  std::string form;
};

Result run_form(const Run& run, const Inputs& in, const std::string& form, bool probs, bool stats = false) {
  AttendOptions o = in.options;
  o.isa = run.isa;
  o.form = form;
  o.return_probs = probs;
  o.return_stats = stats;
  o.stats_topk = run.c->stats_topk;
  Result res;
  res.form = explain(in.q.view, in.k.view, in.v.view, in.mechanism, o).chosen;
  res.r = attend(in.q.view, in.k.view, in.v.view, in.mechanism, o);
  return res;
}

void fail_with(Outcome& o, const std::string& what) {
  if (o.pass) o.failure = what;
  o.pass = false;
}

// The four row statistics against the float64 reference's (the rule in case.hpp).
void check_stats(const Case& c, const Result& res, const References& ref, Outcome& o) {
  const Tensor* got[4] = {&res.r.sparsity, &res.r.entropy, &res.r.max_weight, &res.r.topk_mass};
  const double floors[4] = {2e-5, 2e-5 * std::max(1.0, std::log(static_cast<double>(c.M))), 2e-5, 2e-5};
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t i = 0; i < c.N; ++i)
        for (int s = 0; s < 4; ++s) {
          const size_t at = static_cast<size_t>(((b * c.H + h) * c.N + i) * 4 + s);
          const double want = ref.f64.stats[at], plain = ref.plain.stats[at], x = got[s]->at(b, h, i, 0);
          const bool ok = std::isnan(want) ? std::isnan(x) : std::abs(x - want) <= 2 * std::abs(plain - want) + floors[s];
          if (!ok)
            fail_with(o, res.form + ": " + kStatNames[s] + at_text(b, h, i) + " = " + number(x) + ", reference " +
                             number(want) + " (plain " + number(plain) + ")");
        }
}

// Runs `form` and checks it against the reference; returns its result.
Result compare(const Run& run, const Inputs& in, const References& ref, const std::string& form, Outcome& o) {
  const Case& c = *run.c;
  // probabilities too when the case is small and the form returns them (a forced form only:
  // asking for them would change the walk's choice)
  const bool probs = !form.empty() && c.N * c.M <= 20000 && !ref.f64.probs.empty() && supports(in, form, true, 0);
  // row statistics when the form streams them (forced forms only, as probs)
  const bool stats = !form.empty() && !ref.f64.stats.empty() && supports(in, form, probs, c.stats_topk);
  Result res = run_form(run, in, form, probs, stats);
  o.form = res.form;
  const AttendResult& r = res.r;
  if (stats) check_stats(c, res, ref, o);
  if (stats && c.N * c.M <= 20000) {  // asking for statistics changes no bit of out or lse
    const Result plain = run_form(run, in, form, probs, false);
    const TensorView &a = r.out.view(), &b = plain.r.out.view();
    if (std::memcmp(a.data, b.data, static_cast<size_t>(a.numel()) * dtype_size(a.dtype)) != 0)
      fail_with(o, res.form + ": out differs with return_stats from without");
  }
  check_out(c, r.out.view(), ref, res.form, o);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t i = 0; i < c.N; ++i) {
        const double want_lse = ref.f64.lse.empty() ? 0 : ref.f64.l(b, h, i);
        const double got_lse = ref.f64.lse.empty() ? 0 : r.lse.at(b, h, i, 0);
        if (std::isinf(want_lse) ? got_lse != want_lse
                                 : !(std::abs(got_lse - want_lse) <= 1e-5 * (1 + std::abs(want_lse))))
          fail_with(o, res.form + ": lse" + at_text(b, h, i) + " = " + number(got_lse) + ", reference " + number(want_lse));
        if (probs)
          for (int64_t j = 0; j < c.M; ++j) {
            const double got_p = r.probs.at(b, h, i, j), want_p = ref.f64.p(b, h, i, j);
            if (!(std::abs(got_p - want_p) <= 2e-6 + 2 * std::abs(ref.plain.p(b, h, i, j) - want_p)))
              fail_with(o, res.form + ": probs" + at_text(b, h, i, j) + " = " + number(got_p) + ", reference " +
                               number(want_p));
          }
      }
  if (!ref.f64.state.empty()) {  // the final state, element by element
    double state_err = 0;
    for (int64_t b = 0; b < ref.f64.B; ++b)
      for (int64_t h = 0; h < ref.f64.H; ++h)
        for (int64_t f = 0; f < ref.f64.F; ++f)
          for (int64_t x = 0; x < ref.f64.state_cols; ++x) {
            const double got = r.final_state.at(b, h, f, x);
            const double want = ref.f64.state[static_cast<size_t>(((b * ref.f64.H + h) * ref.f64.F + f) * ref.f64.state_cols + x)];
            const double e = std::isfinite(got) ? std::abs(got - want) : INFINITY;
            state_err = std::max(state_err, e);
          }
    if (!(state_err <= ref.state_tol))
      fail_with(o, res.form + ": max |final_state - reference| = " + number(state_err) + " > tolerance " +
                       number(ref.state_tol) + " (plain " + dtype_name(c.dtype) + " error " + number(ref.plain_state_err) + ")");
  }
  return res;
}

}  // namespace

bool bf16_products(const std::string& form) { return form.size() > 5 && form.ends_with("_bf16"); }

void check_out(const Case& c, const TensorView& out, const References& ref, const std::string& form, Outcome& o) {
  double err = 0;
  // bf16 products (tiled_bf16) round the weights P to bf16 before P V: each output element then
  // carries up to ~2^-9 of its row's sum of |p v|, more than 0.6 ulps of a small output; they are
  // held to the max-error rule (twice the plain bf16 implementation's error) alone.
  const bool half = (c.dtype == DType::bf16 || c.dtype == DType::f16) && !bf16_products(form);
  const double floor32 = float32_floor(ref.f64);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t i = 0; i < c.N; ++i)
        for (int64_t d = 0; d < c.Dv; ++d) {
          const double got = out.at(b, h, i, d);
          if (!std::isfinite(got)) {
            fail_with(o, form + ": out" + at_text(b, h, i, d) + " is not finite");
            continue;
          }
          const double want = ref.f64.o(b, h, i, d), e = std::abs(got - want);
          err = std::max(err, e);
          if (half) {  // each element within kHalfUlps units of its own magnitude
            const double ulps = (e - floor32) / ulp_at(c.dtype, want);
            o.ulps = std::max(o.ulps, ulps);
            if (!(ulps <= kHalfUlps))
              fail_with(o, form + ": out" + at_text(b, h, i, d) + " = " + number(got) + ", reference " +
                               number(want) + ": " + number(ulps) + " " + dtype_name(c.dtype) + " ulps > " +
                               number(kHalfUlps));
          }
        }
  o.err = std::max(o.err, err);
  if (err > ref.tol)
    fail_with(o, form + ": max |out - reference| = " + number(err) + " > tolerance " + number(ref.tol) +
                     " (plain " + dtype_name(c.dtype) + " error " + number(ref.plain_err) + ")");
}

bool Filter::matches(const Case& c) const {
  if (!op.empty() && c.op() != op) return false;
  if (!case_substring.empty() && c.name().find(case_substring) == std::string::npos &&
      c.mechanism.find(case_substring) == std::string::npos && c.label.find(case_substring) == std::string::npos)
    return false;
  return true;
}

std::string Run::name() const { return c->name() + "__" + (form.empty() ? "auto" : form) + "__" + isa_name(isa); }

std::vector<Isa> Filter::isas() const {
  std::vector<Isa> out;
  for (Isa i : supported_isas())
    if (isa.empty() || isa_name(i) == isa || (isa == "scalar" && i == Isa::portable)) out.push_back(i);
  return out;
}

std::vector<Run> expand(const std::vector<Case>& cases, Suite suite, const Filter& f) {
  std::vector<Run> runs;
  const std::vector<Isa> isas = f.isas();
  for (const Case& c : cases) {
    if (!(c.suites & suite) || !f.matches(c)) continue;
    if (suite != kCheck) {
      if (!f.form.empty() && !c.form.empty() && f.form != c.form) continue;
      const Isa active = active_isa();
      if (!f.isa.empty() && std::find(isas.begin(), isas.end(), active) == isas.end()) continue;
      runs.push_back({&c, f.form.empty() ? c.form : f.form, active});
      continue;
    }
    std::vector<std::string> forms;
    if (!c.form.empty()) {
      forms.push_back(c.form);
    } else {
      Inputs in;
      make_inputs(c, in, /*shapes_only=*/true);
      for (const auto& v : explain(in.q.view, in.k.view, in.v.view, in.mechanism, in.options).forms)
        if (v.reasons.empty() && v.form != "reference") forms.push_back(v.form);
      if (f.form == "reference") forms.push_back("reference");
    }
    for (const std::string& form : forms) {
      if (!f.form.empty() && form != f.form && c.agree_with != f.form) continue;
      for (Isa isa : isas) runs.push_back({&c, form, isa});
    }
  }
  return runs;
}

References references_for(const Case& c, const Inputs& in) {
  References r;
  r.f64 = reference_with_stats(c, in, core::RefPrecision::f64);
  r.plain = reference_with_stats(c, in, core::RefPrecision::plain);
  for (size_t i = 0; i < r.f64.out.size(); ++i) r.plain_err = std::max(r.plain_err, std::abs(r.plain.out[i] - r.f64.out[i]));
  r.tol = 2 * r.plain_err + floor_for(c.dtype, r.f64);
  double max_state = 0;
  for (size_t i = 0; i < r.f64.state.size(); ++i) {
    r.plain_state_err = std::max(r.plain_state_err, std::abs(r.plain.state[i] - r.f64.state[i]));
    max_state = std::max(max_state, std::abs(r.f64.state[i]));
  }
  r.state_tol = 2 * r.plain_state_err + 1e-6 * std::max(1.0, max_state);
  return r;
}

Outcome check_run(const Run& r, const Inputs& in, const References& ref) {
  Outcome o;
  o.tol = ref.tol;
  const Result a = compare(r, in, ref, r.form, o);
  if (!r.c->agree_with.empty()) {  // a pair of forms: each against the reference, then against each other
    Outcome other;
    const Result b = compare(r, in, ref, r.c->agree_with, other);
    if (!other.pass) fail_with(o, other.failure);
    double diff = 0;
    const TensorView& va = a.r.out.view();
    for (int64_t bb = 0; bb < va.shape[0]; ++bb)
      for (int64_t h = 0; h < va.shape[1]; ++h)
        for (int64_t i = 0; i < va.shape[2]; ++i)
          for (int64_t d = 0; d < va.shape[3]; ++d)
            diff = std::max(diff, static_cast<double>(std::abs(a.r.out.at(bb, h, i, d) - b.r.out.at(bb, h, i, d))));
    if (!(diff <= ref.tol))
      fail_with(o, r.form + " and " + r.c->agree_with + " disagree by " + number(diff) + " > tolerance " +
                       number(ref.tol));
    double state_diff = 0;  // and their final states
    const TensorView& sa = a.r.final_state.view();
    for (int64_t e = 0; e < sa.numel(); ++e)
      state_diff = std::max(state_diff, static_cast<double>(std::abs(static_cast<const float*>(sa.data)[e] -
                                                                     static_cast<const float*>(b.r.final_state.view().data)[e])));
    if (!(state_diff <= ref.state_tol))
      fail_with(o, r.form + " and " + r.c->agree_with + " final states disagree by " + number(state_diff) +
                       " > tolerance " + number(ref.state_tol));
  }
  return o;
}

}  // namespace attn::harness
