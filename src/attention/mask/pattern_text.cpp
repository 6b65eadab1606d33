// Text forms of the pattern mechanisms that are not softmax options:
//   longformer[:window=A:B,dilation=N,global=I;J;K,causal,scale=S]
//   bigbird[:block=N,window=N,global=N,random=N,seed=N,causal,scale=S]
#include <tuple>

#include "mechanism/family_text.hpp"

namespace attn::mechanism {

void read_options(OptionReader& r, Longformer& m) {
  if (auto w = r.integer_pair("window", "LEFT:RIGHT")) std::tie(m.window_left, m.window_right) = *w;
  m.dilation = r.integer("dilation").value_or(1);
  if (auto g = r.integer_list("global", "I;J;K")) m.global = *g;
  m.causal = r.flag("causal");
  m.scale = r.number("scale");
}

void write_options(OptionWriter& w, const Longformer& m) {
  w.integer_pair("window", m.window_left, m.window_right);
  if (m.dilation != 1) w.integer("dilation", m.dilation);
  if (!m.global.empty()) w.integer_list("global", m.global);
  if (m.causal) w.flag("causal");
  if (m.scale) w.number("scale", *m.scale);
}

void read_options(OptionReader& r, BigBird& m) {
  m.block = r.integer("block").value_or(m.block);
  m.window = r.integer("window").value_or(m.window);
  m.global = r.integer("global").value_or(m.global);
  m.random = r.integer("random").value_or(m.random);
  m.seed = r.unsigned_integer("seed").value_or(0);
  m.causal = r.flag("causal");
  m.scale = r.number("scale");
}

void write_options(OptionWriter& w, const BigBird& m) {
  w.integer("block", m.block);
  w.integer("window", m.window);
  w.integer("global", m.global);
  w.integer("random", m.random);
  if (m.seed != 0) w.unsigned_integer("seed", m.seed);
  if (m.causal) w.flag("causal");
  if (m.scale) w.number("scale", *m.scale);
}

}  // namespace attn::mechanism
