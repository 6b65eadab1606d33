#include "linear/linear.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "attn/error.hpp"
#include "base/counter_random.hpp"
#include "core/params.hpp"
#include "linear/linear_backward.hpp"

namespace attn::linear {
namespace {

const char* kWhere = "attend";
constexpr int64_t kMaxOmega = int64_t{1} << 20;  // performer: features x head dim


// Everything the family's kinds share: inputs, the kernel `core`, decays, the state param.
// `specs()` makes the named params the kind takes (LinearFamily::params), only when some are given.
template <class Specs>
LinearProblem validate_kernel(const TensorView& q, const TensorView& k, const TensorView& v, const Linear& core,
                              LazyText kind, LazyText text, const AttendOptions& opt,
                              const core::Outputs& outs, int64_t F, const Specs& specs, bool polar = false) {
  LinearProblem p;
  static_cast<core::Dims&>(p) = core::check_io(q, k, v, outs, opt);
  p.mech = core;
  core::refuse_score_options(opt, kind, "its weights are phi(q).phi(k), not a score matrix");
  if (core.causal) core::check_causal_tokens(p, text);
  if (core.chunk < 1 || core.chunk > 4096)
    fail(kWhere, kind.str() + " chunk must be in [1, 4096], got " + std::to_string(core.chunk));
  p.scale = core.scale ? *core.scale : 1.0;
  p.F = F;
  // core.scale and core.decay: in the kind's ranges(m) (checked by its validate)
  if (!opt.params.empty()) {  // all optional: nothing given, nothing to check
    core::Symbols symbols{{"B", p.B}, {"H", p.H}, {"F", p.F}, {"D", p.D}, {"Dv", p.Dv}};
    symbols["state_rows"] = polar ? 4 * p.D : p.F;  // PolaFormer: both streams' states
    symbols["state_cols"] = (polar ? p.Dv / 2 : p.Dv) + (core.normalize ? 1 : 0);
    core::check_params(opt.params, specs(), text, symbols);
  } else {
    assert(core::none_required(specs()));
  }
  p.decay.assign(static_cast<size_t>(p.H), core.decay.value_or(1.0));
  if (const auto it = opt.params.find("decay"); it != opt.params.end()) {
    if (core.decay) fail(kWhere, text.str() + " has a decay in its text and params['decay'] too: give one of them");
    const std::vector<float> d = core::to_floats(it->second);
    for (int64_t h = 0; h < p.H; ++h) {
      if (!(d[static_cast<size_t>(h)] > 0 && d[static_cast<size_t>(h)] <= 1))
        fail(kWhere, "params['decay'][" + std::to_string(h) + "] must be in (0, 1], got " +
                         std::to_string(d[static_cast<size_t>(h)]));
      p.decay[static_cast<size_t>(h)] = d[static_cast<size_t>(h)];
    }
  }
  if (p.decays() && !core.causal)
    fail(kWhere, text.str() + ": a decay needs causal (it weighs keys by their distance back from the query)");
  if (const auto it = opt.params.find("initial_state"); it != opt.params.end()) p.initial = it->second;
  return p;
}

}  // namespace

// Performer's omega (F, D): blocks of D orthonormal rows from Gram-Schmidt on Gaussian columns
// (R's diagonal is positive by construction, which makes each block Haar-distributed), every
// row rescaled to the norm of an independent Gaussian vector of D entries. Stream 0: the blocks,
// stream 1: the norms.
std::vector<double> performer_omega(int64_t F, int64_t D, uint64_t seed) {
  std::vector<double> omega(static_cast<size_t>(F * D));
  std::vector<double> g(static_cast<size_t>(std::min(D, F) * D));  // a block's columns, at most F x D
  for (int64_t block = 0; block * D < F; ++block) {
    // only the columns this block uses: column c depends on columns 0..c-1 alone
    const int64_t cols = std::min(D, F - block * D);
    for (int64_t c = 0; c < cols; ++c)  // column c of a Gaussian matrix, orthogonalised against 0..c-1 (twice)
      for (int64_t r = 0; r < D; ++r) g[static_cast<size_t>(c * D + r)] = counter_normal(seed, 0, block, c * D + r);
    for (int64_t c = 0; c < cols; ++c) {
      double* col = &g[static_cast<size_t>(c * D)];
      for (int pass = 0; pass < 2; ++pass)
        for (int64_t e = 0; e < c; ++e) {
          const double* other = &g[static_cast<size_t>(e * D)];
          double dot = 0;
          for (int64_t r = 0; r < D; ++r) dot += col[r] * other[r];
          for (int64_t r = 0; r < D; ++r) col[r] -= dot * other[r];
        }
      double norm = 0;
      for (int64_t r = 0; r < D; ++r) norm += col[r] * col[r];
      norm = std::sqrt(norm);
      for (int64_t r = 0; r < D; ++r) col[r] /= norm;
    }
    for (int64_t c = 0; c < D && block * D + c < F; ++c) {
      const int64_t f = block * D + c;
      double len = 0;  // the norm of a fresh Gaussian vector: chi with D degrees of freedom
      for (int64_t r = 0; r < D; ++r) len += std::pow(counter_normal(seed, 1, f, r), 2);
      len = std::sqrt(len);
      for (int64_t r = 0; r < D; ++r) omega[static_cast<size_t>(f * D + r)] = len * g[static_cast<size_t>(c * D + r)];
    }
  }
  return omega;
}


bool LinearProblem::decays() const {
  for (double d : decay)
    if (d != 1.0) return true;
  return false;
}

float LinearProblem::initial_at(int64_t b, int64_t h, int64_t f, int64_t c) const {
  return initial ? core::element_at(*initial, b, h, f, c) : 0.0f;
}

LinearProblem LinearFamily::validate(const TensorView& q, const TensorView& k, const TensorView& v, const Linear& m,
                                     const AttendOptions& opt, const core::Outputs& outs) {
  core::check_option_ranges(ranges(m), "linear");
  return validate_kernel(q, k, v, m, "linear", core::mechanism_text(m), opt, outs, q.dim(), [&] { return params(m); });
}

LinearProblem LinearFamily::validate(const TensorView& q, const TensorView& k, const TensorView& v, const NormAttn& m,
                                     const AttendOptions& opt, const core::Outputs& outs) {
  core::check_option_ranges(ranges(m), "normattn");
  Linear core;
  core.map = m.map, core.causal = m.causal, core.normalize = false, core.decay = m.decay, core.chunk = m.chunk;
  LinearProblem p = validate_kernel(q, k, v, core, "normattn", core::mechanism_text(m), opt, outs, q.dim(),
                                    [&] { return params(m); });
  p.norm = m.norm;
  return p;
}

LinearProblem LinearFamily::validate(const TensorView& q, const TensorView& k, const TensorView& v, const Performer& m,
                                     const AttendOptions& opt, const core::Outputs& outs) {
  if (m.features < 1 || m.features > 65536)
    fail(kWhere, "performer features must be in [1, 65536], got " + std::to_string(m.features));
  // omega is features x D (drawn by Gram-Schmidt in O(features min(features, D) D)), and every
  // row's features are computed against it: bounded by 2^20 entries before anything is drawn.
  if (m.features * std::max<int64_t>(q.dim(), 1) > kMaxOmega)
    fail(kWhere, "performer features x head dim must be at most 2^20 (the random feature matrix omega), got " +
                     std::to_string(m.features) + " x D = " + std::to_string(q.dim()) + " (use features <= " +
                     std::to_string(kMaxOmega / std::max<int64_t>(q.dim(), 1)) + ")");
  Linear core;
  core.causal = m.causal, core.chunk = m.chunk;
  LinearProblem p = validate_kernel(q, k, v, core, "performer", core::mechanism_text(m), opt, outs, m.features,
                                    [&] { return params(m); });
  const int64_t F = p.F, D = p.D;
  std::vector<double> omega;
  if (const auto it = opt.params.find("omega"); it != opt.params.end()) {
    const std::vector<float> given = core::to_floats(it->second);
    omega.assign(given.begin(), given.end());
  } else {
    omega = performer_omega(F, D, m.seed);
  }
  p.omega_t.resize(static_cast<size_t>(D * F));
  for (int64_t f = 0; f < F; ++f)
    for (int64_t c = 0; c < D; ++c)
      p.omega_t[static_cast<size_t>(c * F + f)] = static_cast<float>(omega[static_cast<size_t>(f * D + c)]);
  return p;
}

LinearProblem LinearFamily::validate(const TensorView& q, const TensorView& k, const TensorView& v, const Sana& m,
                                     const AttendOptions& opt, const core::Outputs& outs) {
  core::check_option_ranges(ranges(m), "sana");
  Linear core;
  core.map = FeatureMap::relu, core.causal = m.causal, core.chunk = m.chunk;
  LinearProblem p = validate_kernel(q, k, v, core, "sana", core::mechanism_text(m), opt, outs, q.dim(),
                                    [&] { return params(m); });
  p.eps = m.eps;
  return p;
}

LinearProblem LinearFamily::validate(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const PolaFormer& m, const AttendOptions& opt, const core::Outputs& outs) {
  core::check_option_ranges(ranges(m), "polaformer");
  if (v.dim() % 2 != 0 || v.dim() == 0)
    fail(kWhere, "polaformer needs an even value head dim (two streams on its halves), got Dv = " +
                     std::to_string(v.dim()));
  if (outs.wants_probs() || opt.return_probs)  // attend() validates before its outputs exist
    fail(kWhere, "return_probs: polaformer has no single weight matrix (its two streams weigh the keys "
                 "differently, each for half of the value channels)");
  Linear core;
  core.causal = m.causal, core.chunk = m.chunk;
  LinearProblem p = validate_kernel(q, k, v, core, "polaformer", core::mechanism_text(m), opt, outs, 2 * q.dim(),
                                    [&] { return params(m); }, true);
  p.power.assign(static_cast<size_t>(p.D), static_cast<float>(m.power));
  if (const auto it = opt.params.find("power"); it != opt.params.end()) {
    p.power = core::to_floats(it->second);
    p.power_given = true;
    const core::OptionRange range = polaformer_power_range(std::nullopt);  // the text option's range
    for (int64_t c = 0; c < p.D; ++c)
      if (!(p.power[static_cast<size_t>(c)] > range.lo && p.power[static_cast<size_t>(c)] <= range.hi))
        fail(kWhere, "params['power'][" + std::to_string(c) + "] must be in " + range.interval() + ", got " +
                         std::to_string(p.power[static_cast<size_t>(c)]));
  }
  if (const auto it = opt.params.find("coefficients"); it != opt.params.end()) p.coef = core::to_floats(it->second);
  return p;
}

LinearProblem stream_problem(const LinearProblem& p, int s) {
  LinearProblem sub = p;
  sub.stream = s;
  sub.Dv = p.Dv / 2;
  sub.F = 2 * p.D;
  sub.v.data = p.v.ptr(0, 0, 0, s * sub.Dv);
  sub.v.shape[3] = sub.Dv;
  if (!p.coef.empty()) sub.coef.assign(p.coef.begin() + s * sub.Dv, p.coef.begin() + (s + 1) * sub.Dv);
  if (p.initial) {  // rows [s 2D, (s + 1) 2D) of the whole state
    ArrayView& a = *sub.initial;
    a.data = static_cast<const char*>(a.data) + s * sub.F * a.strides[2] * static_cast<int64_t>(dtype_size(a.dtype));
    a.shape[2] = sub.F;
  }
  return sub;
}

namespace {

// Runs `run` on each of PolaFormer's streams with the outputs of its half.
template <void (*Run)(const LinearProblem&, const core::Outputs&, const core::Context&)>
void run_streams(const LinearProblem& p, const core::Outputs& o, const core::Context& ctx) {
  for (int s = 0; s < 2; ++s) {
    const LinearProblem sub = stream_problem(p, s);
    TensorView out = *o.out, state;
    out.data = o.out->ptr(0, 0, 0, s * sub.Dv);
    out.shape[3] = sub.Dv;
    core::Outputs so{&out, nullptr, nullptr, nullptr};
    if (o.final_state) {
      state = *o.final_state;
      state.data = o.final_state->ptr(0, 0, s * sub.F, 0);
      state.shape[2] = sub.F;
      so.final_state = &state;
    }
    Run(sub, so, ctx);
  }
}

// Runs `run` on the problem, or on each of PolaFormer's streams with the outputs of its half;
// then the row statistics, if asked for, from their own pass over the whole problem (so
// PolaFormer's are of both streams).
template <void (*Run)(const LinearProblem&, const core::Outputs&, const core::Context&)>
void by_stream(const LinearProblem& p, const core::Outputs& o, const core::Context& ctx) {
  if (p.polar())
    run_streams<Run>(p, o, ctx);
  else
    Run(p, o, ctx);
  if (o.stats) linear_row_stats(p, o, ctx);
}

void run_reference(const LinearProblem& p, const core::Outputs& o, const core::Context&) {
  core::write_reference(linear_reference(p, core::RefPrecision::f64), o);
}

}  // namespace

const std::vector<core::Form<LinearProblem>>& LinearFamily::forms() {
  static const std::vector<core::Form<LinearProblem>> list = {
      {"right", "non-causal right product: the state phi(K)^T [V 1] once, then each row against it", refuse_right,
       by_stream<run_right>},
      {"recurrent", "causal, token by token through the state (decoding: O(F Dv) per token)", refuse_recurrent,
       by_stream<run_recurrent>},
      {"chunked", "causal Lightning blocks: masked product inside a block, the state across blocks", refuse_chunked,
       by_stream<run_chunked>},
      {"reference", "quadratic weights in float64 (slow, exact)", core::refuse_nothing<LinearProblem>, run_reference},
  };
  return list;
}

std::string LinearFamily::backward_refusal(const LinearProblem& p) { return linear_backward_refusal(p); }

std::vector<core::LearnedParam> LinearFamily::learned_params(const LinearProblem& p) {
  std::vector<core::LearnedParam> out;
  if (p.power_given) out.push_back({"power", {1, 1, 1, p.D}});
  if (p.polar() && !p.coef.empty()) out.push_back({"coefficients", {1, 1, 1, p.Dv}});
  return out;
}

void LinearFamily::backward_reference(const LinearProblem& p, const core::BackwardViews& g,
                                      core::RefPrecision precision) {
  linear_backward_reference(p, g, precision);
}

const std::vector<core::BackwardForm<LinearProblem>>& LinearFamily::backward_forms() {
  static const std::vector<core::BackwardForm<LinearProblem>> list = {
      {"chunked", "causal, float32: chunk states recomputed forward, then the blocks walked backward carrying dH",
       refuse_chunked_backward, linear_backward_chunked},
      {"right", "non-causal, float32: the whole state once, then each row against it", refuse_right_backward,
       linear_backward_right},
      {"reference", "quadratic weights in float64 (slow, exact)", core::refuse_nothing<LinearProblem>,
       [](const LinearProblem& p, const BackwardViews& g, const core::Context&) {
         linear_backward_reference(p, g, core::RefPrecision::f64);
       }},
  };
  return list;
}

double LinearFamily::flops(const LinearProblem& p) {
  const double F = static_cast<double>(p.F), Dv = static_cast<double>(p.Dv);
  const double heads = static_cast<double>(p.B * p.H);
  if (!p.mech.causal) return heads * 2.0 * F * Dv * static_cast<double>(p.M + p.N);
  const double C = static_cast<double>(std::min(p.mech.chunk, std::max<int64_t>(p.N, 1)));
  return heads * static_cast<double>(p.N) * (2.0 * C * (F + Dv) + 4.0 * F * Dv);
}

core::ReferenceResult LinearFamily::reference(const LinearProblem& p, core::RefPrecision precision) {
  return linear_reference(p, precision);
}

std::array<int64_t, 4> LinearFamily::state_shape(const LinearProblem& p) {
  return {p.B, p.H, p.state_rows(), p.state_cols()};
}

}  // namespace attn::linear
