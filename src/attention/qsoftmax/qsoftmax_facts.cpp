// What the snippet's linear attention is (core/facts.hpp): a state S (D x Dv) per head instead of
// K/V rows; the state may be passed in.
#include "qsoftmax/qsoftmax.hpp"

namespace attn::qsoftmax {

core::Facts QSoftmaxFamily::facts(const QSoftmax& m) {
  core::Facts f;
  f.causal = m.causal;
  f.can_be_causal = true;
  f.position_mask = m.causal;
  f.cache = CacheKind::state;
  f.state_shape = "(B, H, D, Dv)";
  f.params = params(m);
  f.ranges = ranges(m);
  f.limits = {"causal: N == M (each token brings q, k, v)", "no masks but key padding"};
  return f;
}

std::vector<core::OptionRange> QSoftmaxFamily::ranges(const QSoftmax& m) { return {core::scale_range(m.scale)}; }

std::vector<core::ParamSpec> QSoftmaxFamily::params(const QSoftmax&) {
  // its gradient: attend_backward's d_initial_state (qsoftmax_backward.cpp)
  return {{"initial_state", {"B", "H", "D", "Dv"}, "the state S a previous call returned as final_state", true,
           "state", true}};
}

}  // namespace attn::qsoftmax
