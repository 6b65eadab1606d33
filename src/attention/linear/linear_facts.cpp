// What the linear family's kinds are (core/facts.hpp): a recurrent state of fixed size instead of
// K/V rows, (B, H, F, Dv [+ 1]); per-head decays and the state as optional params.
#include <optional>
#include <string>

#include "linear/linear.hpp"

namespace attn::linear {
namespace {

// What every kind shares; `F` and the state's rule are the kind's.
core::Facts common(bool causal, bool normalize, const std::string& F) {
  core::Facts f;
  f.causal = causal;
  f.can_be_causal = true;
  f.position_mask = causal;
  f.cache = CacheKind::state;
  const std::string cols = normalize ? "Dv + 1" : "Dv";
  f.state_shape = "(B, H, " + F + ", " + cols + ")";
  f.symbols = {{"F", F}, {"state_rows", F}, {"state_cols", cols}};
  f.limits = {"chunk in [1, 4096]", "causal: N == M (each token brings q, k, v)",
              "no log-sum-exp"};
  return f;
}

// The params every kind takes, then the kind's own (`extra`): all optional.
std::vector<core::ParamSpec> common_params(std::vector<core::ParamSpec> extra = {}) {
  std::vector<core::ParamSpec> p = {
      {"decay", {"H"}, "a decay in (0, 1] per query head (causal only)", true, "decay"},
      {"initial_state", {"B", "H", "state_rows", "state_cols"},
       "the state (S, z) a previous call returned as final_state", true, "state", true}};
  p.insert(p.end(), extra.begin(), extra.end());
  return p;
}

core::OptionRange decay_range(const std::optional<double>& value) {
  return {"decay", value, 0, 1, true, false, "1 = none; needs causal"};
}

}  // namespace

// |x|^power per channel, then products of two such features summed over the keys: power 10
// keeps entries up to 10 finite in float32 (10^20 per product); power 100 overflows at |x| = 3.
core::OptionRange polaformer_power_range(const std::optional<double>& value) {
  return {"power", value, 1, 10, true, false, ""};
}

core::Facts LinearFamily::facts(const Linear& m) {
  core::Facts f = common(m.causal, m.normalize, "D");
  f.params = params(m);
  f.ranges = ranges(m);
  return f;
}

core::Facts LinearFamily::facts(const NormAttn& m) {
  core::Facts f = common(m.causal, false, "D");
  f.params = params(m);
  f.ranges = ranges(m);
  return f;
}

core::Facts LinearFamily::facts(const Performer& m) {
  core::Facts f = common(m.causal, true, std::to_string(m.features));
  f.params = params(m);
  f.ranges = ranges(m);
  f.limits.push_back("features in [1, 65536], features x D <= 2^20");
  return f;
}

core::Facts LinearFamily::facts(const Sana& m) {
  core::Facts f = common(m.causal, true, "D");
  f.params = params(m);
  f.ranges = ranges(m);
  return f;
}

core::Facts LinearFamily::facts(const PolaFormer& m) {
  core::Facts f = common(m.causal, true, "2 D");
  f.params = params(m);
  f.state_shape = "(B, H, 4 D, Dv / 2 + 1)";  // both streams' states, the same-sign one first
  f.symbols["state_rows"] = "4 D";
  f.symbols["state_cols"] = "Dv / 2 + 1";
  f.ranges = ranges(m);
  f.limits.insert(f.limits.end(), {"params['power'] in the same range", "even Dv", "no probabilities"});
  return f;
}

std::vector<core::OptionRange> LinearFamily::ranges(const Linear& m) {
  return {core::scale_range(m.scale), decay_range(m.decay)};
}

std::vector<core::OptionRange> LinearFamily::ranges(const NormAttn& m) { return {decay_range(m.decay)}; }

std::vector<core::OptionRange> LinearFamily::ranges(const Performer&) { return {}; }

std::vector<core::OptionRange> LinearFamily::ranges(const Sana& m) {
  return {{"eps", m.eps, 0, 1e30, false, false, "added to the normaliser"}};
}

std::vector<core::OptionRange> LinearFamily::ranges(const PolaFormer& m) { return {polaformer_power_range(m.power)}; }

std::vector<core::ParamSpec> LinearFamily::params(const Linear&) { return common_params(); }

std::vector<core::ParamSpec> LinearFamily::params(const NormAttn&) { return common_params(); }

std::vector<core::ParamSpec> LinearFamily::params(const Performer&) {
  return common_params({{"omega", {"F", "D"}, "the random feature rows (features, head dim)", true, "normal:1"}});
}

std::vector<core::ParamSpec> LinearFamily::params(const Sana&) { return common_params(); }

std::vector<core::ParamSpec> LinearFamily::params(const PolaFormer&) {
  return common_params({{"power", {"D"}, "a power > 1 per channel", true, "positive:0.5", true},
                        {"coefficients", {"Dv"}, "a factor per output channel", true, "normal:1", true}});
}

}  // namespace attn::linear
