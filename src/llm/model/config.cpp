// DecoderConfig: layer layouts (all softmax, hybrids), checks, and its JSON form; what depends on
// the architecture is asked of it (arch/).
#include <cmath>
#include <nlohmann/json.hpp>

#include "attn/error.hpp"
#include "attn/model.hpp"
#include "attn/info.hpp"
#include "model/architecture.hpp"
#include "formats/json_limits.hpp"

namespace attn {
namespace {

constexpr const char* kWhere = "decoder config";

std::string layer_name(size_t i) { return "layers[" + std::to_string(i) + "]"; }

void check_layer_count(int64_t count, const std::string& what) {
  if (count < 0 || count > DecoderConfig::kMaxLayers)
    fail(kWhere, what + " must be in [0, " + std::to_string(DecoderConfig::kMaxLayers) + "] (the most layers a decoder may have), got " +
                     std::to_string(count));
}

}  // namespace

std::vector<DecoderLayerSpec> DecoderConfig::softmax_layers(int64_t count, const Mechanism& softmax) {
  check_layer_count(count, "the layer count");
  return std::vector<DecoderLayerSpec>(static_cast<size_t>(std::max<int64_t>(count, 0)),
                                       DecoderLayerSpec{softmax, !info(softmax).applies_positions, false});
}

Mechanism DecoderConfig::lightning_mechanism() {
  Linear m;
  m.map = FeatureMap::identity;
  m.causal = true;
  m.normalize = false;
  m.chunk = 256;
  return m;
}

std::vector<DecoderLayerSpec> DecoderConfig::hybrid_layers(int64_t count, int64_t linear, int64_t softmax,
                                                           const Mechanism& softmax_mechanism) {
  if (linear < 0 || softmax < 1)
    fail(kWhere, "a hybrid needs >= 0 lightning and >= 1 softmax layers per group, got " + std::to_string(linear) +
                     ":" + std::to_string(softmax));
  std::vector<DecoderLayerSpec> layers = softmax_layers(count, softmax_mechanism);
  for (int64_t i = 0; i < count; ++i)
    if (i % (linear + softmax) < linear) layers[static_cast<size_t>(i)] = {lightning_mechanism(), false, true};
  return layers;
}

void DecoderConfig::lay_out(const LayerLayout& layout) { model::architecture(architecture, kWhere).layout(*this, layout); }

double DecoderConfig::residual_scale() const { return model::architecture(architecture, kWhere).residual_scale(*this); }

std::vector<float> lightning_decays(int64_t heads, int64_t layer, int64_t layers) {
  std::vector<float> decay(static_cast<size_t>(heads));
  const double depth = 1.0 - static_cast<double>(layer) / (static_cast<double>(layers) - 1.0 + 1e-5) + 1e-5;
  for (int64_t h = 1; h <= heads; ++h)
    decay[static_cast<size_t>(h - 1)] =
        static_cast<float>(std::exp(-std::exp2(-8.0 * static_cast<double>(h) / static_cast<double>(heads)) * depth));
  return decay;
}

void DecoderConfig::validate() const {
  auto positive = [](int64_t value, const char* field) {
    if (value < 1) fail(kWhere, std::string(field) + " must be >= 1, got " + std::to_string(value));
  };
  positive(vocab_size, "vocab_size");
  positive(dim, "dim");
  positive(hidden_dim, "hidden_dim");
  positive(heads, "heads");
  positive(kv_heads, "kv_heads");
  positive(head_dim, "head_dim");
  positive(max_seq_len, "max_seq_len");
  if (vocab_size > INT32_MAX) fail(kWhere, "vocab_size must fit int32 token ids, got " + std::to_string(vocab_size));
  if (heads % kv_heads != 0)
    fail(kWhere, "kv_heads (" + std::to_string(kv_heads) + ") must divide heads (" + std::to_string(heads) + ")");
  if (head_dim % 2 != 0) fail(kWhere, "head_dim must be even (RoPE rotates pairs), got " + std::to_string(head_dim));
  if (!(rope_theta > 1.0) || !std::isfinite(rope_theta))
    fail(kWhere, "rope_theta must be a finite number > 1, got " + std::to_string(rope_theta));
  if (!(norm_eps > 0.0) || !std::isfinite(norm_eps))
    fail(kWhere, "norm_eps must be a finite number > 0, got " + std::to_string(norm_eps));
  if (!(embed_scale > 0.0) || !std::isfinite(embed_scale))
    fail(kWhere, "embed_scale must be a finite number > 0, got " + std::to_string(embed_scale));
  if (!(final_softcap >= 0.0) || !std::isfinite(final_softcap))
    fail(kWhere, "final_softcap must be a finite number >= 0 (0: none), got " + std::to_string(final_softcap));
  if (moe_experts < 0 || moe_experts > kMaxExperts)
    fail(kWhere, "moe_experts must be in [0, " + std::to_string(kMaxExperts) + "] (0: a dense SwiGLU), got " +
                     std::to_string(moe_experts));
  if (moe_experts > 0 && (moe_top_k < 1 || moe_top_k > moe_experts))
    fail(kWhere, "moe_top_k must be in [1, moe_experts = " + std::to_string(moe_experts) + "], got " +
                     std::to_string(moe_top_k));
  const model::Architecture& arch = model::architecture(architecture, kWhere);
  arch.validate(*this);
  if (layers.empty()) fail(kWhere, "needs at least one layer");
  check_layer_count(static_cast<int64_t>(layers.size()), "the number of layers");
  for (size_t i = 0; i < layers.size(); ++i) {
    const DecoderLayerSpec& l = layers[i];
    const std::string text = to_string(l.mechanism);
    const MechanismInfo facts = info(l.mechanism);
    if (!facts.causal)
      fail(kWhere, layer_name(i) + " mechanism '" + text + "' is not causal: a decoder's token may only see the past");
    if (l.lightning && !std::holds_alternative<Linear>(l.mechanism))
      fail(kWhere, layer_name(i) + " is a lightning layer, which needs a linear mechanism, got '" + text + "'");
    if (l.lightning && l.rope) fail(kWhere, layer_name(i) + " is a lightning layer, which has no RoPE");
    if (l.rope_theta != 0.0 && (!(l.rope_theta > 1.0) || !std::isfinite(l.rope_theta)))
      fail(kWhere, layer_name(i) + " rope_theta must be 0 (the model's) or a finite number > 1, got " +
                       std::to_string(l.rope_theta));
    if (facts.applies_positions && l.rope)
      fail(kWhere, layer_name(i) + " uses " + facts.family + ", which applies RoPE itself: set rope off");
  }
}

std::string DecoderConfig::to_json() const {
  nlohmann::json layer_list = nlohmann::json::array();
  for (const DecoderLayerSpec& l : layers)
    layer_list.push_back({{"mechanism", to_string(l.mechanism)}, {"rope", l.rope}, {"lightning", l.lightning},
                          {"kind", l.local ? "local" : "global"}, {"rope_theta", l.rope_theta}});
  const nlohmann::json j = {{"vocab_size", vocab_size},     {"dim", dim},
                            {"hidden_dim", hidden_dim},     {"heads", heads},
                            {"kv_heads", kv_heads},         {"head_dim", head_dim},
                            {"max_seq_len", max_seq_len},   {"rope_theta", rope_theta},
                            {"rope_style", to_string(rope_style)}, {"norm_eps", norm_eps},
                            {"tied_embeddings", tied_embeddings},  {"layers", layer_list}};
  nlohmann::json out = j;
  out["architecture"] = architecture;
  out["embed_scale"] = embed_scale;
  out["final_softcap"] = final_softcap;
  if (moe_experts > 0) out["moe_experts"] = moe_experts, out["moe_top_k"] = moe_top_k;
  return out.dump();
}

DecoderConfig DecoderConfig::from_json(const std::string& text, const std::string& where) {
  const nlohmann::json j = io::parse_json(text.begin(), text.end(), where, "decoder config is not valid JSON");
  if (!j.is_object()) fail(where, "decoder config must be a JSON object");
  auto field = [&](const nlohmann::json& obj, const char* key, auto fallback, const std::string& ctx) {
    using T = decltype(fallback);
    if (!obj.contains(key)) return fallback;
    const nlohmann::json& v = obj[key];
    if constexpr (std::is_same_v<T, bool>) {
      if (v.is_boolean()) return v.get<bool>();
    } else if constexpr (std::is_same_v<T, int64_t>) {
      if (v.is_number_integer()) return v.get<int64_t>();
    } else if constexpr (std::is_same_v<T, double>) {
      if (v.is_number()) return v.get<double>();
    } else {
      if (v.is_string()) return v.get<std::string>();
    }
    fail(where, ctx + key + " has the wrong type: " + io::json_excerpt(v));
  };
  DecoderConfig c;
  c.vocab_size = field(j, "vocab_size", int64_t{0}, "");
  c.dim = field(j, "dim", int64_t{0}, "");
  c.hidden_dim = field(j, "hidden_dim", int64_t{0}, "");
  c.heads = field(j, "heads", int64_t{0}, "");
  c.kv_heads = field(j, "kv_heads", c.heads, "");
  c.head_dim = field(j, "head_dim", c.heads > 0 ? c.dim / c.heads : int64_t{0}, "");
  c.max_seq_len = field(j, "max_seq_len", int64_t{0}, "");
  c.rope_theta = field(j, "rope_theta", 10000.0, "");
  const std::string style = field(j, "rope_style", std::string("half"), "");
  if (style != "half" && style != "interleaved")
    fail(where, "rope_style must be 'half' or 'interleaved', got '" + style + "'");
  c.rope_style = style == "half" ? RopeStyle::half : RopeStyle::interleaved;
  c.norm_eps = field(j, "norm_eps", 1e-5, "");
  c.tied_embeddings = field(j, "tied_embeddings", false, "");
  c.architecture = field(j, "architecture", std::string("llama"), "");
  c.embed_scale = field(j, "embed_scale", 1.0, "");
  c.final_softcap = field(j, "final_softcap", 0.0, "");
  // files written before the architecture field: MiniMax-01's model said residual "minimax"
  const std::string residual = field(j, "residual", std::string("standard"), "");
  if (residual != "standard" && residual != "minimax")
    fail(where, "residual must be 'standard' or 'minimax', got '" + residual + "'");
  if (residual == "minimax") {
    if (j.contains("architecture") && c.architecture != "minimax")
      fail(where, "residual 'minimax' (MiniMax-01's) contradicts architecture '" + c.architecture + "'");
    c.architecture = "minimax";
  }
  c.moe_experts = field(j, "moe_experts", int64_t{0}, "");
  c.moe_top_k = field(j, "moe_top_k", int64_t{2}, "");
  if (!j.contains("layers") || !j["layers"].is_array()) fail(where, "decoder config needs a 'layers' array");
  if (j["layers"].size() > static_cast<size_t>(kMaxLayers))
    fail(where, "decoder config has " + std::to_string(j["layers"].size()) + " layers, more than " +
                    std::to_string(kMaxLayers) + " (the most a decoder may have)");
  for (size_t i = 0; i < j["layers"].size(); ++i) {
    const nlohmann::json& l = j["layers"][i];
    const std::string ctx = layer_name(i) + ".";
    if (!l.is_object()) fail(where, layer_name(i) + " must be an object");
    DecoderLayerSpec spec;
    try {
      spec.mechanism = parse_mechanism(field(l, "mechanism", std::string("softmax:causal"), ctx));
    } catch (const Error& e) {
      fail(where, ctx + e.what());  // "layers[i].mechanism: ..."
    }
    spec.lightning = field(l, "lightning", false, ctx);
    const std::string kind = field(l, "kind", std::string("global"), ctx);
    if (kind != "global" && kind != "local") fail(where, ctx + "kind must be 'global' or 'local', got '" + kind + "'");
    spec.local = kind == "local";
    spec.rope_theta = field(l, "rope_theta", 0.0, ctx);
    spec.rope = field(l, "rope", !spec.lightning && !info(spec.mechanism).applies_positions, ctx);
    c.layers.push_back(std::move(spec));
  }
  try {
    c.validate();
  } catch (const Error& e) {
    fail(where, e.what());
  }
  return c;
}

}  // namespace attn
