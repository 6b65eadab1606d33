// What the softmax family's mechanisms are (core/facts.hpp): exact attention over a pattern, a
// KV cache whose rows a window (+ sinks) or a chunk bounds.
#include <algorithm>

#include "softmax/softmax_family.hpp"

namespace attn::exact {

std::vector<core::ParamSpec> softmax_params(const Softmax& m) {
  if (m.score != ScoreKind::additive) return {};
  return {{"wq", {"A", "D"}, "query projection of the additive score w^T tanh(Wq q + Wk k)", false, "normal:0.3", true},
          {"wk", {"A", "D"}, "key projection of the additive score", false, "normal:0.3", true},
          {"w", {"A"}, "output weights of the additive score", false, "normal:0.9", true}};
}

namespace {

core::Facts kv_facts(bool causal, bool window) {
  core::Facts f;
  f.causal = causal;
  f.can_be_causal = true;
  f.position_mask = causal || window;
  f.cache = CacheKind::kv;
  return f;
}

}  // namespace

core::Facts SoftmaxFamily::facts(const Softmax& m) {
  core::Facts f = kv_facts(m.causal, m.window_left >= 0 || m.window_right >= 0);
  // A causal query needs its window (and the sinks), or its chunk; strided patterns and dropout
  // (decided per key index) need every row.
  if (m.causal && m.strided == 0 && m.dropout == 0) {
    int64_t back = -1;
    if (m.window_left >= 0) back = m.window_left;
    if (m.chunk > 0) back = back < 0 ? m.chunk - 1 : std::min(back, m.chunk - 1);
    // A bound beyond 2^40 positions bounds nothing a cache could hold (and its sums must not overflow).
    constexpr int64_t kFar = int64_t{1} << 40;
    if (back >= 0 && back < kFar && m.sinks >= 0 && m.sinks < kFar && m.chunk < kFar)
      f.lookback = back, f.sinks = m.sinks, f.align = m.chunk > 0 ? m.chunk : 1;
  }
  f.params = softmax_params(m);
  f.ranges = ranges(m);
  f.limits = {"entropy_scale > 1", "window bounds >= -1", "sinks, strided, chunk >= 0; dilation >= 1"};
  return f;
}

core::Facts SoftmaxFamily::facts(const Longformer& m) {
  core::Facts f = kv_facts(m.causal, true);  // global positions may be anywhere: every row
  f.ranges = ranges(m);
  f.limits = {"window bounds >= -1", "dilation >= 1", "global positions >= 0"};
  return f;
}

core::Facts SoftmaxFamily::facts(const BigBird& m) {
  core::Facts f = kv_facts(m.causal, false);  // random blocks may be anywhere: every row
  f.ranges = ranges(m);
  f.limits = {"block >= 1", "window odd and >= 1", "global, random >= 0"};
  return f;
}

std::vector<core::OptionRange> SoftmaxFamily::ranges(const Softmax& m) {
  // softcap: cap tanh(s / cap) <= cap, so any float32 works; 1e30 matches the other bounds.
  return {core::scale_range(m.scale),
          {"softcap", m.softcap != 0 ? std::optional<double>(m.softcap) : std::nullopt, 1e-30, 1e30, false, false,
           "0 = off"},
          {"dropout", m.dropout, 0, 1, false, true, ""}};
}

std::vector<core::OptionRange> SoftmaxFamily::ranges(const Longformer& m) { return {core::scale_range(m.scale)}; }

std::vector<core::OptionRange> SoftmaxFamily::ranges(const BigBird& m) { return {core::scale_range(m.scale)}; }

}  // namespace attn::exact
