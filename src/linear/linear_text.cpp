// Text form of linear attention:
//   linear[:map=elu|relu|identity|exp|relu2,causal,normalize=0|1,decay=L,chunk=C,scale=S]
//       (elu, normalised, non-causal, chunks of 64, scale 1)
//   retention[:decay=L,chunk=C,scale=S]   alias of linear:map=identity,causal,normalize=0,...
#include "attn/error.hpp"
#include "mechanism/family_text.hpp"

namespace attn {

std::string to_string(FeatureMap f) {
  switch (f) {
    case FeatureMap::elu: return "elu";
    case FeatureMap::relu: return "relu";
    case FeatureMap::identity: return "identity";
    case FeatureMap::exp: return "exp";
    case FeatureMap::relu2: return "relu2";
  }
  return "?";
}

namespace mechanism {
namespace {

void read_shared(OptionReader& r, Linear& m) {
  m.decay = r.number("decay");
  m.chunk = r.integer("chunk").value_or(64);
  m.scale = r.number("scale");
}

}  // namespace

void read_options(OptionReader& r, Linear& m) {
  if (auto w = r.word("map", {"elu", "relu", "identity", "exp", "relu2"}))
    for (FeatureMap f : {FeatureMap::elu, FeatureMap::relu, FeatureMap::identity, FeatureMap::exp, FeatureMap::relu2})
      if (*w == to_string(f)) m.map = f;
  m.causal = r.flag("causal");
  if (auto n = r.integer("normalize")) {
    if (*n != 0 && *n != 1) fail("mechanism", "linear normalize must be 0 or 1, got " + std::to_string(*n));
    m.normalize = *n == 1;
  }
  read_shared(r, m);
}

void read_retention(OptionReader& r, Linear& m) {
  m.map = FeatureMap::identity, m.causal = true, m.normalize = false;
  read_shared(r, m);
}

void write_options(OptionWriter& w, const Linear& m) {
  if (m.map != FeatureMap::elu) w.word("map", to_string(m.map));
  if (m.causal) w.flag("causal");
  if (!m.normalize) w.integer("normalize", 0);
  if (m.decay) w.number("decay", *m.decay);
  if (m.chunk != 64) w.integer("chunk", m.chunk);
  if (m.scale) w.number("scale", *m.scale);
}

}  // namespace mechanism
}  // namespace attn
