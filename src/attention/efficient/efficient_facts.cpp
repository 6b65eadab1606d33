// What efficient attention is (core/facts.hpp): a per-feature state [C | z | m] of fixed size
// instead of K/V rows.
#include "efficient/efficient.hpp"

namespace attn::efficient {

core::Facts EfficientFamily::facts(const Efficient& m) {
  core::Facts f;
  f.causal = m.causal;
  f.can_be_causal = true;
  f.position_mask = m.causal;
  f.cache = CacheKind::state;
  f.state_shape = "(B, H, D, Dv + 2)";
  f.params = params(m);
  f.symbols = {{"state_cols", "Dv + 2"}};
  f.ranges = ranges(m);
  f.limits = {"causal: N == M (each token brings q, k, v)", "no probabilities"};
  return f;
}

std::vector<core::OptionRange> EfficientFamily::ranges(const Efficient& m) { return {core::scale_range(m.scale)}; }

std::vector<core::ParamSpec> EfficientFamily::params(const Efficient&) {
  return {{"initial_state", {"B", "H", "D", "state_cols"},
           "the per-feature state [C | z | m] a previous call returned as final_state", true, "state", true}};
}

}  // namespace attn::efficient
