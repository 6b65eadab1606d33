#include "linear/linear.hpp"

#include <cmath>

#include "attn/error.hpp"
#include "core/params.hpp"

namespace attn::linear {
namespace {

const char* kWhere = "attend";

void refuse_option(bool given, const std::string& kind, const std::string& what) {
  if (given) fail(kWhere, kind + " does not take " + what + " (its weights are phi(q).phi(k), not a score matrix)");
}

}  // namespace

bool LinearProblem::decays() const {
  for (double d : decay)
    if (d != 1.0) return true;
  return false;
}

float LinearProblem::initial_at(int64_t b, int64_t h, int64_t f, int64_t c) const {
  if (!initial) return 0.0f;
  const std::vector<int64_t>& st = initial->strides;
  return load_as_float(initial->data, initial->dtype, b * st[0] + h * st[1] + f * st[2] + c * st[3]);
}

LinearProblem LinearFamily::validate(const TensorView& q, const TensorView& k, const TensorView& v, const Linear& m,
                                     const AttendOptions& opt, const core::Outputs& outs) {
  LinearProblem p;
  static_cast<core::Dims&>(p) = core::check_io(q, k, v, outs, opt);
  p.mech = m;
  const std::string kind(Linear::kind), text = to_string(Mechanism{m});
  refuse_option(opt.mask.has_value(), kind, "a boolean mask");
  refuse_option(opt.block_mask.has_value() || static_cast<bool>(opt.mask_mod), kind, "a block mask or mask_mod");
  refuse_option(opt.bias.has_value(), kind, "an additive bias");
  refuse_option(!opt.alibi_slopes.empty(), kind, "ALiBi slopes");
  if (m.causal && p.N != p.M)
    fail(kWhere, text + " is causal: each token brings its q, k and v, so N (queries) must equal M (keys), got N = " +
                     std::to_string(p.N) + ", M = " + std::to_string(p.M) + " (pass earlier tokens as initial_state)");
  if (m.chunk < 1 || m.chunk > 4096) fail(kWhere, "linear chunk must be in [1, 4096], got " + std::to_string(m.chunk));
  if (m.scale) core::check_positive_float32(*m.scale, "scale");
  p.scale = m.scale ? *m.scale : 1.0;
  p.F = p.D;
  if (m.decay) {
    core::check_finite(*m.decay, "decay");
    if (!(*m.decay > 0 && *m.decay <= 1))
      fail(kWhere, "linear decay must be in (0, 1], got " + std::to_string(*m.decay));
  }
  core::Symbols symbols{{"B", p.B}, {"H", p.H}, {"F", p.F}, {"state_cols", p.state_cols()}};
  core::check_params(opt.params,
                     {{"decay", {"H"}, "a decay in (0, 1] per query head", true},
                      {"initial_state", {"B", "H", "F", "state_cols"},
                       "the state (S, z) a previous call returned as final_state", true}},
                     text, symbols);
  p.decay.assign(static_cast<size_t>(p.H), m.decay.value_or(1.0));
  if (const auto it = opt.params.find("decay"); it != opt.params.end()) {
    if (m.decay) fail(kWhere, text + " has a decay in its text and params['decay'] too: give one of them");
    const std::vector<float> d = core::to_floats(it->second);
    for (int64_t h = 0; h < p.H; ++h) {
      if (!(d[static_cast<size_t>(h)] > 0 && d[static_cast<size_t>(h)] <= 1))
        fail(kWhere, "params['decay'][" + std::to_string(h) + "] must be in (0, 1], got " +
                         std::to_string(d[static_cast<size_t>(h)]));
      p.decay[static_cast<size_t>(h)] = d[static_cast<size_t>(h)];
    }
  }
  if (p.decays() && !m.causal)
    fail(kWhere, text + ": a decay needs causal (it weighs keys by their distance back from the query)");
  if (const auto it = opt.params.find("initial_state"); it != opt.params.end()) p.initial = it->second;
  return p;
}

const std::vector<core::Form<LinearProblem>>& LinearFamily::forms() {
  static const std::vector<core::Form<LinearProblem>> list = {
      {"right", "non-causal right product: the state phi(K)^T [V 1] once, then each row against it", refuse_right,
       run_right},
      {"recurrent", "causal, token by token through the state (decoding: O(F Dv) per token)", refuse_recurrent,
       run_recurrent},
      {"chunked", "causal Lightning blocks: masked product inside a block, the state across blocks", refuse_chunked,
       run_chunked},
      {"reference", "quadratic weights in float64 (slow, exact)", core::refuse_nothing<LinearProblem>,
       [](const LinearProblem& p, const core::Outputs& o, const core::Context&) {
         core::write_reference(linear_reference(p, core::RefPrecision::f64), o);
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

std::array<int64_t, 4> LinearFamily::state_shape(const LinearProblem& p) { return {p.B, p.H, p.F, p.state_cols()}; }

}  // namespace attn::linear
