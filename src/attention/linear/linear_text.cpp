// Text form of linear attention:
//   linear[:map=elu|relu|identity|exp|relu2,causal,normalize=0|1,decay=L,chunk=C,scale=S]
//       (elu, normalised, non-causal, chunks of 64, scale 1)
//   retention[:decay=L,chunk=C,scale=S]   alias of linear:map=identity,causal,normalize=0,...
// and its relatives (one family, src/linear/): normattn, performer, sana, polaformer; and two families beside
// it: efficient (per-feature key softmax) and gau (quadratic).
#include <optional>

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

std::string to_string(OutputNorm n) {
  switch (n) {
    case OutputNorm::none: return "none";
    case OutputNorm::rms: return "rms";
    case OutputNorm::layer: return "layer";
  }
  return "?";
}

namespace mechanism {
namespace {

std::optional<FeatureMap> read_map(OptionReader& r) {
  if (auto w = r.word("map", {"elu", "relu", "identity", "exp", "relu2"}))
    for (FeatureMap f : {FeatureMap::elu, FeatureMap::relu, FeatureMap::identity, FeatureMap::exp, FeatureMap::relu2})
      if (*w == to_string(f)) return f;
  return std::nullopt;
}

void read_shared(OptionReader& r, Linear& m) {
  m.decay = r.number("decay");
  m.chunk = r.integer("chunk").value_or(64);
  m.scale = r.number("scale");
}

}  // namespace

void read_options(OptionReader& r, Linear& m) {
  m.map = read_map(r).value_or(FeatureMap::elu);
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

// normattn[:map=M,norm=rms|layer,causal,decay=L,chunk=C]   (elu, rms)
void read_options(OptionReader& r, NormAttn& m) {
  m.map = read_map(r).value_or(FeatureMap::elu);
  if (auto n = r.word("norm", {"rms", "layer"})) m.norm = *n == "layer" ? OutputNorm::layer : OutputNorm::rms;
  m.causal = r.flag("causal");
  m.decay = r.number("decay");
  m.chunk = r.integer("chunk").value_or(64);
}

void write_options(OptionWriter& w, const NormAttn& m) {
  if (m.map != FeatureMap::elu) w.word("map", to_string(m.map));
  if (m.norm != OutputNorm::rms) w.word("norm", to_string(m.norm));
  if (m.causal) w.flag("causal");
  if (m.decay) w.number("decay", *m.decay);
  if (m.chunk != 64) w.integer("chunk", m.chunk);
}

// performer[:features=M,seed=N,causal,chunk=C]   (256 features)
void read_options(OptionReader& r, Performer& m) {
  m.features = r.integer("features").value_or(256);
  m.seed = r.unsigned_integer("seed").value_or(0);
  m.causal = r.flag("causal");
  m.chunk = r.integer("chunk").value_or(64);
}

void write_options(OptionWriter& w, const Performer& m) {
  if (m.features != 256) w.integer("features", m.features);
  if (m.seed != 0) w.unsigned_integer("seed", m.seed);
  if (m.causal) w.flag("causal");
  if (m.chunk != 64) w.integer("chunk", m.chunk);
}

// sana[:causal,eps=E,chunk=C]   (eps 1e-15)
void read_options(OptionReader& r, Sana& m) {
  m.causal = r.flag("causal");
  m.eps = r.number("eps").value_or(1e-15);
  m.chunk = r.integer("chunk").value_or(64);
}

void write_options(OptionWriter& w, const Sana& m) {
  if (m.causal) w.flag("causal");
  if (m.eps != 1e-15) w.number("eps", m.eps);
  if (m.chunk != 64) w.integer("chunk", m.chunk);
}

// polaformer[:power=P,causal,chunk=C]   (power 3)
void read_options(OptionReader& r, PolaFormer& m) {
  m.power = r.number("power").value_or(3.0);
  m.causal = r.flag("causal");
  m.chunk = r.integer("chunk").value_or(64);
}

void write_options(OptionWriter& w, const PolaFormer& m) {
  if (m.power != 3.0) w.number("power", m.power);
  if (m.causal) w.flag("causal");
  if (m.chunk != 64) w.integer("chunk", m.chunk);
}

// efficient[:causal,scale=S]   (scale 1/sqrt(d))
void read_options(OptionReader& r, Efficient& m) {
  m.causal = r.flag("causal");
  m.scale = r.number("scale");
}

void write_options(OptionWriter& w, const Efficient& m) {
  if (m.causal) w.flag("causal");
  if (m.scale) w.number("scale", *m.scale);
}

// gau[:bias=B,causal,scale=S]   (bias 0, scale 1/sqrt(d))
void read_options(OptionReader& r, Gau& m) {
  m.bias = r.number("bias").value_or(0.0);
  m.causal = r.flag("causal");
  m.scale = r.number("scale");
}

void write_options(OptionWriter& w, const Gau& m) {
  if (m.bias != 0) w.number("bias", m.bias);
  if (m.causal) w.flag("causal");
  if (m.scale) w.number("scale", *m.scale);
}

}  // namespace mechanism
}  // namespace attn
