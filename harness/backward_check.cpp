#include "harness/backward_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <sstream>

#include "families/internal_api.hpp"

namespace attn::harness {
namespace {

const char* const kGradNames[3] = {"dq", "dk", "dv"};

std::string number(double x) {
  std::ostringstream s;
  s.precision(4);
  s << x;
  return s.str();
}

const Tensor& grad(const AttendGradients& g, int which) { return which == 0 ? g.dq : which == 1 ? g.dk : g.dv; }

// The forward's options for the backward: what it returns is not the backward's to say.
AttendOptions backward_options(const Inputs& in) {
  AttendOptions o = in.options;
  o.return_lse = o.return_probs = o.return_final_state = o.return_stats = false;
  o.form.clear();
  return o;
}

// The floor of the rule (backward_check.hpp) for one gradient of the float64 reference.
double floor_for(DType dt, const TensorView& ref, double max_lse) {
  double largest = 0, noise = 0;
  for (int64_t e = 0; e < ref.numel(); ++e) {
    const double x = load_as_float(ref.data, ref.dtype, e);
    largest = std::max(largest, std::abs(x));
    if (dt != DType::f32) {
      const float r = round_to(dt, static_cast<float>(x));
      noise = std::max(noise, std::abs(static_cast<double>(round_to(dt, round_to(dt, r + 0.3f) - 0.3f)) - x));
    }
  }
  constexpr double eps32 = 1.0 / (1 << 23);
  return 1e-5 * std::max(1.0, largest) + 4 * eps32 * max_lse * largest + 2 * noise;
}

void fail_with(Outcome& o, const std::string& what) {
  if (o.pass) o.failure = what;
  o.pass = false;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const TensorView &x = a.view(), &y = b.view();
  return x.numel() == y.numel() &&
         std::memcmp(x.data, y.data, static_cast<size_t>(x.numel()) * dtype_size(x.dtype)) == 0;
}

}  // namespace

std::vector<Run> expand_backward(const std::vector<Case>& cases, const Filter& f) {
  std::vector<Run> runs;
  const std::vector<Isa> isas = f.isas();
  std::set<std::string> problems;
  for (const Case& c : cases) {
    if (!(c.suites & kCheck) || !f.matches(c)) continue;
    Case same = c;  // what the backward sees: not the forward's forms nor its row statistics
    same.form.clear(), same.agree_with.clear(), same.stats_topk = 8;
    if (!problems.insert(same.name()).second) continue;
    Inputs in;
    make_inputs(c, in, /*shapes_only=*/true);
    if (!families::backward_refusal(in.q.view, in.k.view, in.v.view, in.mechanism, in.options).empty()) continue;
    for (const FormVerdict& v : explain_backward(in.q.view, in.k.view, in.v.view, in.mechanism, backward_options(in)).forms) {
      const bool wanted = f.form.empty() ? v.form != "reference" : v.form == f.form;
      if (!wanted || !v.reasons.empty()) continue;
      for (Isa isa : isas) runs.push_back({&c, v.form, isa});
    }
  }
  return runs;
}

GradientReferences gradient_references_for(const Case& c, const Inputs& in) {
  GradientReferences r;
  std::mt19937 rng(c.seed ^ 0x9e3779b9u);  // apart from q, k, v and the extras
  r.dout = random_tensor(rng, c.dtype, c.B, c.H, c.N, c.Dv, c.layout);
  const AttendOptions o = backward_options(in);
  r.f64 = families::reference_gradients(r.dout.view, in.q.view, in.k.view, in.v.view, in.mechanism, o,
                                        core::RefPrecision::f64);
  r.plain = families::reference_gradients(r.dout.view, in.q.view, in.k.view, in.v.view, in.mechanism, o,
                                          core::RefPrecision::plain);
  if (info(in.mechanism).has_lse)
    for (double l : families::reference_outputs(in.q.view, in.k.view, in.v.view, in.mechanism, o,
                                                core::RefPrecision::f64).lse)
      if (std::isfinite(l)) r.max_lse = std::max(r.max_lse, std::abs(l));
  for (int w = 0; w < 3; ++w) {
    const TensorView &ref = grad(r.f64, w).view(), &plain = grad(r.plain, w).view();
    for (int64_t e = 0; e < ref.numel(); ++e)
      r.plain_err[w] = std::max(r.plain_err[w], std::abs(static_cast<double>(load_as_float(plain.data, plain.dtype, e)) -
                                                         load_as_float(ref.data, ref.dtype, e)));
    r.tol[w] = 3 * r.plain_err[w] + floor_for(c.dtype, ref, r.max_lse);
  }
  for (const auto& [name, t] : r.f64.dparams) {
    const TensorView &ref = t.view(), &plain = r.plain.dparams.at(name).view();
    double err = 0;
    for (int64_t e = 0; e < ref.numel(); ++e)
      err = std::max(err, std::abs(static_cast<double>(load_as_float(plain.data, plain.dtype, e)) -
                                   load_as_float(ref.data, ref.dtype, e)));
    r.dparams[name] = {3 * err + floor_for(DType::f32, ref, r.max_lse), err};
  }
  return r;
}

void check_gradients(const AttendGradients& got_all, const GradientReferences& ref, const std::string& form,
                     Outcome& o) {
  double worst = -1;  // the largest err / tol of them all
  std::vector<std::string> params;
  for (const auto& [name, t] : ref.f64.dparams) params.push_back(name);
  if (got_all.dparams.size() != params.size())
    fail_with(o, form + ": " + std::to_string(got_all.dparams.size()) + " param gradients, the reference has " +
                     std::to_string(params.size()));
  for (size_t w = 0; w < 3 + params.size(); ++w) {
    const bool param = w >= 3;
    const std::string label = param ? "d" + params[w - 3] : kGradNames[w];
    if (param && !got_all.dparams.contains(params[w - 3])) continue;
    const std::string name = form + ": " + label;
    const int which = static_cast<int>(w);
    const TensorView& got = param ? got_all.dparams.at(params[w - 3]).view() : grad(got_all, which).view();
    const TensorView& want = param ? ref.f64.dparams.at(params[w - 3]).view() : grad(ref.f64, which).view();
    const double tol = param ? ref.dparams.at(params[w - 3])[0] : ref.tol[w];
    const double plain_err = param ? ref.dparams.at(params[w - 3])[1] : ref.plain_err[w];
    double err = 0;
    int64_t at = 0;
    for (int64_t e = 0; e < want.numel(); ++e) {
      const double x = load_as_float(got.data, got.dtype, e), y = load_as_float(want.data, want.dtype, e);
      if (std::isfinite(x) != std::isfinite(y)) {  // poison made up, or lost
        fail_with(o, name + " element " + std::to_string(e) + " = " + number(x) + ", reference " + number(y));
        continue;
      }
      if (!std::isfinite(y)) continue;  // both non-finite: the poison reached what it should
      if (std::abs(x - y) > err) err = std::abs(x - y), at = e;
    }
    if (!(err <= tol))
      fail_with(o, name + ": max |fast - reference| = " + number(err) + " (element " + std::to_string(at) +
                       ") > tolerance " + number(tol) + " (plain " + dtype_name(got.dtype) + " error " +
                       number(plain_err) + ")");
    if (err / tol > worst) worst = err / tol, o.err = err, o.tol = tol;
  }
}

Outcome check_backward_run(const Run& r, const Inputs& in, const GradientReferences& ref) {
  Outcome o;
  AttendOptions fo = in.options;
  fo.isa = r.isa;
  const AttendResult fwd = attend(in.q.view, in.k.view, in.v.view, in.mechanism, fo);
  AttendOptions bo = backward_options(in);
  bo.isa = r.isa;
  bo.form = r.form;
  o.form = explain_backward(in.q.view, in.k.view, in.v.view, in.mechanism, bo).chosen;
  auto run = [&](int threads) {
    bo.threads = threads;
    return attend_backward(ref.dout.view, in.q.view, in.k.view, in.v.view, fwd.out.view(), fwd.lse.view(),
                           in.mechanism, bo);
  };
  const AttendGradients one = run(1), three = run(3);
  check_gradients(one, ref, o.form, o);
  for (int w = 0; w < 3; ++w)
    if (!bitwise_equal(grad(one, w), grad(three, w)))
      fail_with(o, o.form + ": " + kGradNames[w] + " differs between 1 and 3 threads (bitwise)");
  for (const auto& [name, t] : one.dparams)
    if (!three.dparams.contains(name) || !bitwise_equal(t, three.dparams.at(name)))
      fail_with(o, o.form + ": d" + name + " differs between 1 and 3 threads (bitwise)");
  return o;
}

}  // namespace attn::harness
