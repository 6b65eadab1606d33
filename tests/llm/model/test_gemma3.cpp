// Gemma 3's model in the decoder: the 5:1 local:global layout, the embedding scaled by sqrt(dim),
// per-head q/k norms, each block's output normed before its residual, GeGLU, local layers'
// sliding window with its own RoPE base and a cache bounded to the window. A float64 reference of
// the whole model (written here from the formulas, reading the decoder's weights from the file it
// saves) agrees with the decoder's prefill and with token-by-token decoding past the window.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "attn/attn.hpp"
#include "attn/model.hpp"
#include "attn/safetensors.hpp"
#include "llm/model/float64_model.hpp"

namespace attn {
namespace {

using float64_model::Tensors;
using float64_model::Vec;
using float64_model::expect_close;
using float64_model::linear;
using float64_model::rms_norm;
using float64_model::rope;
using float64_model::stepwise_logits;
using float64_model::tokens_of;

constexpr int64_t kWindow = 8;  // keys a local layer sees: query i sees key j when i - j < 8

// A tiny Gemma 3: head_dim independent of the width (4 x 16 = 64 query channels for width 32), one
// KV head, 12 layers (5 and 11 global).
DecoderConfig gemma3_config() {
  DecoderConfig c;
  c.architecture = "gemma3";
  c.vocab_size = 61, c.dim = 32, c.hidden_dim = 24, c.heads = 4, c.kv_heads = 1, c.head_dim = 16;
  c.max_seq_len = 96, c.rope_theta = 1e6, c.norm_eps = 1e-6, c.tied_embeddings = true;
  c.lay_out(LayerLayout{.layers = 12, .softmax = parse_mechanism("softmax:causal")});
  for (DecoderLayerSpec& l : c.layers)
    if (l.local) l.mechanism = parse_mechanism("softmax:causal,window=" + std::to_string(kWindow - 1) + ":0");
  return c;
}

double gelu_tanh(double v) { return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v))); }

// Logits (n, vocab) of every token, the whole model in float64.
Vec reference_logits(const DecoderConfig& c, const Tensors& t, const std::vector<int32_t>& tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size()), d = c.dim, H = c.heads, hd = c.head_dim, kvh = c.kv_heads;
  const Vec embed = t.get("model.embed_tokens.weight");
  Vec x(static_cast<size_t>(n * d));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t e = 0; e < d; ++e)
      x[static_cast<size_t>(i * d + e)] = embed[static_cast<size_t>(tokens[static_cast<size_t>(i)] * d + e)] * std::sqrt(32.0);
  for (size_t l = 0; l < c.layers.size(); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const bool global = (l + 1) % 6 == 0;
    Vec h = rms_norm(x, t.get(p + "input_layernorm.weight"), c.norm_eps);
    Vec q = rms_norm(linear(h, t.get(p + "self_attn.q_proj.weight"), H * hd, d), t.get(p + "self_attn.q_norm.weight"), c.norm_eps);
    Vec k = rms_norm(linear(h, t.get(p + "self_attn.k_proj.weight"), kvh * hd, d), t.get(p + "self_attn.k_norm.weight"), c.norm_eps);
    const Vec v = linear(h, t.get(p + "self_attn.v_proj.weight"), kvh * hd, d);
    const double theta = global ? 1e6 : 1e4;
    rope(q, n, H, hd, theta), rope(k, n, kvh, hd, theta);
    Vec o(static_cast<size_t>(n * H * hd), 0.0);
    for (int64_t hh = 0; hh < H; ++hh) {
      const int64_t g = hh / (H / kvh);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t j0 = global ? 0 : std::max<int64_t>(0, i - kWindow + 1);
        Vec s(static_cast<size_t>(i + 1 - j0));
        double mx = -1e300, sum = 0;
        for (int64_t j = j0; j <= i; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < hd; ++e) dot += q[static_cast<size_t>((i * H + hh) * hd + e)] * k[static_cast<size_t>((j * kvh + g) * hd + e)];
          s[static_cast<size_t>(j - j0)] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[static_cast<size_t>(j - j0)]);
        }
        for (double& z : s) sum += z = std::exp(z - mx);
        for (int64_t j = j0; j <= i; ++j)
          for (int64_t e = 0; e < hd; ++e)
            o[static_cast<size_t>((i * H + hh) * hd + e)] += s[static_cast<size_t>(j - j0)] / sum * v[static_cast<size_t>((j * kvh + g) * hd + e)];
      }
    }
    const Vec att = rms_norm(linear(o, t.get(p + "self_attn.o_proj.weight"), d, H * hd),
                             t.get(p + "post_attention_layernorm.weight"), c.norm_eps);
    for (size_t i = 0; i < x.size(); ++i) x[i] += att[i];
    h = rms_norm(x, t.get(p + "pre_feedforward_layernorm.weight"), c.norm_eps);
    Vec gate = linear(h, t.get(p + "mlp.gate_proj.weight"), c.hidden_dim, d);
    const Vec up = linear(h, t.get(p + "mlp.up_proj.weight"), c.hidden_dim, d);
    for (size_t i = 0; i < gate.size(); ++i) gate[i] = gelu_tanh(gate[i]) * up[i];
    const Vec ffn = rms_norm(linear(gate, t.get(p + "mlp.down_proj.weight"), d, c.hidden_dim),
                             t.get(p + "post_feedforward_layernorm.weight"), c.norm_eps);
    for (size_t i = 0; i < x.size(); ++i) x[i] += ffn[i];
  }
  const Vec hf = rms_norm(x, t.get("model.norm.weight"), c.norm_eps);
  return linear(hf, embed, c.vocab_size, d);  // tied
}

TEST(Gemma3, LayoutIsFiveLocalLayersThenOneGlobal) {
  const DecoderConfig c = gemma3_config();
  for (size_t i = 0; i < c.layers.size(); ++i) {
    const bool global = (i + 1) % 6 == 0;
    EXPECT_EQ(c.layers[i].local, !global) << i;
    EXPECT_EQ(c.layers[i].rope_theta, global ? 0.0 : 10000.0) << i;
  }
  EXPECT_FLOAT_EQ(static_cast<float>(c.embed_scale), std::sqrt(32.0f));
  const DecoderConfig back = DecoderConfig::from_json(c.to_json(), "json");
  EXPECT_EQ(back.architecture, "gemma3");
  EXPECT_EQ(back.embed_scale, c.embed_scale);
  for (size_t i = 0; i < c.layers.size(); ++i) {
    EXPECT_EQ(back.layers[i].local, c.layers[i].local) << i;
    EXPECT_EQ(back.layers[i].rope_theta, c.layers[i].rope_theta) << i;
    EXPECT_EQ(back.layers[i].mechanism, c.layers[i].mechanism) << i;
  }
}

TEST(Gemma3, LocalLayersKeepAWindowsRowsAndGlobalLayersEveryRow) {
  Decoder d = Decoder::random(gemma3_config(), 2);
  const std::vector<LayerCache> caches = d.layer_caches();
  for (size_t i = 0; i < caches.size(); ++i) {
    EXPECT_EQ(caches[i].kind, (i + 1) % 6 == 0 ? "kv" : "kv-bounded") << i;
    if ((i + 1) % 6 != 0) EXPECT_LT(caches[i].rows, 96) << i;
  }
  // a global mechanism on a local layer keeps the layer local (its kind and RoPE base)
  d.set_mechanism(0, parse_mechanism("softmax:causal"));
  EXPECT_TRUE(d.config().layers[0].local);
  EXPECT_EQ(d.config().layers[0].rope_theta, 10000.0);
  EXPECT_EQ(d.layer_caches()[0].kind, "kv");
}

TEST(Gemma3, DecoderAgreesWithAFloat64ReferenceModelInPrefillAndDecodePastTheWindow) {
  const DecoderConfig c = gemma3_config();
  Decoder d = Decoder::random(c, 9);
  const std::string path = ::testing::TempDir() + "attn_gemma3.safetensors";
  d.save(path);
  const Tensors t{SafetensorsFile::open(path)};
  const std::vector<int32_t> tokens = tokens_of(70, 4, c.vocab_size);  // > the bounded caches' rows
  const Vec want = reference_logits(c, t, tokens);
  const std::vector<float> prefill = d.forward(tokens, 0, true);
  expect_close(prefill, want, 5e-4);
  // 5 tokens of prompt, then one at a time through the bounded caches
  const std::vector<float> stepwise = stepwise_logits(d, tokens, 5);
  expect_close(stepwise, want, 5e-4);
  // full caches give the same logits (to rounding: bounded caches take the queries in shorter runs)
  d.reset();
  d.set_full_caches(true);
  expect_close(d.forward(tokens, 0, true), Vec(prefill.begin(), prefill.end()), 1e-5);
  d.reset();
  d.set_full_caches(false);
  // the file loads back into the same model
  Decoder loaded = Decoder::from_safetensors(path, 2);
  EXPECT_EQ(loaded.config().architecture, "gemma3");
  EXPECT_EQ(loaded.forward(tokens, 0, true), prefill);
  std::remove(path.c_str());
}

TEST(Gemma3, FinalSoftcapBoundsTheLogits) {
  DecoderConfig c = gemma3_config();
  const std::vector<int32_t> tokens = tokens_of(6, 1, c.vocab_size);
  Decoder plain = Decoder::random(c, 5);
  const std::vector<float> raw = plain.forward(tokens, 0, true);
  c.final_softcap = 3.0;
  Decoder capped = Decoder::random(c, 5);
  const std::vector<float> got = capped.forward(tokens, 0, true);
  for (size_t i = 0; i < raw.size(); ++i) EXPECT_NEAR(got[i], 3.0 * std::tanh(raw[i] / 3.0), 1e-5) << i;
}

}  // namespace
}  // namespace attn
