// Text form of the softmax family:
//   softmax[:causal,score=dot|cosine|additive,scale=S,entropy_scale=L,window=A:B,softcap=C,dropout=P,seed=N,
//            sinks=N,dilation=N,strided=N,chunk=N]
#include <tuple>

#include "mechanism/family_text.hpp"

namespace attn::mechanism {

void read_options(OptionReader& r, Softmax& m) {
  m.causal = r.flag("causal");
  if (auto s = r.word("score", {"dot", "cosine", "additive"}))
    m.score = *s == "cosine" ? ScoreKind::cosine : *s == "additive" ? ScoreKind::additive : ScoreKind::dot;
  m.scale = r.number("scale");
  m.entropy_train_len = r.integer("entropy_scale").value_or(0);
  if (auto w = r.integer_pair("window", "LEFT:RIGHT")) std::tie(m.window_left, m.window_right) = *w;
  m.softcap = r.number("softcap").value_or(0.0);
  m.dropout = r.number("dropout").value_or(0.0);
  m.seed = r.unsigned_integer("seed").value_or(0);
  m.sinks = r.integer("sinks").value_or(0);
  m.dilation = r.integer("dilation").value_or(1);
  m.strided = r.integer("strided").value_or(0);
  m.chunk = r.integer("chunk").value_or(0);
}

void write_options(OptionWriter& w, const Softmax& m) {
  if (m.causal) w.flag("causal");
  if (m.score != ScoreKind::dot) w.word("score", to_string(m.score));
  if (m.scale) w.number("scale", *m.scale);
  if (m.entropy_train_len) w.integer("entropy_scale", m.entropy_train_len);
  if (m.window_left != -1 || m.window_right != -1) w.integer_pair("window", m.window_left, m.window_right);
  if (m.softcap != 0) w.number("softcap", m.softcap);
  if (m.dropout != 0) w.number("dropout", m.dropout);
  if (m.seed != 0) w.unsigned_integer("seed", m.seed);
  if (m.sinks != 0) w.integer("sinks", m.sinks);
  if (m.dilation != 1) w.integer("dilation", m.dilation);
  if (m.strided != 0) w.integer("strided", m.strided);
  if (m.chunk != 0) w.integer("chunk", m.chunk);
}

}  // namespace attn::mechanism
