// MiniMax-01's model in the decoder: the 7:1 layout, the scaled residual
// x = a·RMSNorm(x) + f(RMSNorm(x)) with a = (2L)^(1/4), and the MoE feed-forward. A float64
// reference of the whole model (written here from the formulas, reading the decoder's weights
// from the file it saves) agrees with the decoder's prefill and with token-by-token decoding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "attn/attn.hpp"
#include "attn/model.hpp"
#include "attn/moe.hpp"
#include "attn/safetensors.hpp"
#include "llm/model/float64_model.hpp"
#include "support/expect_error.hpp"

namespace attn {
namespace {

using testing::expect_error;
using float64_model::Tensors;
using float64_model::Vec;
using float64_model::expect_close;
using float64_model::linear;
using float64_model::rms_norm;
using float64_model::rope;
using float64_model::stepwise_logits;
using float64_model::tokens_of;

DecoderConfig minimax_config(int64_t layers = 8) {
  DecoderConfig c;
  c.vocab_size = 61, c.dim = 32, c.hidden_dim = 24, c.heads = 4, c.kv_heads = 2, c.head_dim = 8;
  c.max_seq_len = 64, c.rope_theta = 1000.0;
  c.make_minimax(layers, parse_mechanism("softmax:causal"), 5, 2);
  return c;
}

double silu(double v) { return v / (1.0 + std::exp(-v)); }

// Logits (n, vocab) of every token, the whole model in float64.
Vec reference_logits(const DecoderConfig& c, const Tensors& t, const std::vector<int32_t>& tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size()), d = c.dim, H = c.heads, hd = c.head_dim, L = static_cast<int64_t>(c.layers.size());
  const double a = std::pow(2.0 * static_cast<double>(L), 0.25);
  const Vec embed = t.get("model.embed_tokens.weight");
  Vec x(static_cast<size_t>(n * d));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t e = 0; e < d; ++e) x[static_cast<size_t>(i * d + e)] = embed[static_cast<size_t>(tokens[static_cast<size_t>(i)] * d + e)];
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const bool lightning = (l + 1) % 8 != 0;  // every 8th layer is softmax
    const int64_t kvh = lightning ? H : c.kv_heads;
    Vec h = rms_norm(x, t.get(p + "input_layernorm.weight"), c.norm_eps);
    Vec q = linear(h, t.get(p + "self_attn.q_proj.weight"), H * hd, d);
    Vec k = linear(h, t.get(p + "self_attn.k_proj.weight"), kvh * hd, d);
    Vec v = linear(h, t.get(p + "self_attn.v_proj.weight"), kvh * hd, d);
    Vec o(static_cast<size_t>(n * H * hd), 0.0);
    if (lightning) {
      for (double* m : {q.data(), k.data(), v.data()})
        for (size_t i = 0; i < q.size(); ++i) m[i] = silu(m[i]);
      for (int64_t hh = 1; hh <= H; ++hh) {  // o_i = sum_{j<=i} lambda^(i-j) (q_i . k_j) v_j
        const double s = std::exp2(-8.0 * static_cast<double>(hh) / static_cast<double>(H)) *
                         (1.0 - static_cast<double>(l) / (static_cast<double>(L) - 1.0 + 1e-5) + 1e-5);
        const double lambda = std::exp(-s);
        const int64_t h0 = hh - 1;
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j <= i; ++j) {
            double qk = 0;
            for (int64_t e = 0; e < hd; ++e) qk += q[static_cast<size_t>((i * H + h0) * hd + e)] * k[static_cast<size_t>((j * H + h0) * hd + e)];
            const double f = std::pow(lambda, static_cast<double>(i - j)) * qk;
            for (int64_t e = 0; e < hd; ++e) o[static_cast<size_t>((i * H + h0) * hd + e)] += f * v[static_cast<size_t>((j * H + h0) * hd + e)];
          }
      }
      o = rms_norm(o, t.get(p + "self_attn.norm.weight"), c.norm_eps);
      const Vec g = linear(h, t.get(p + "self_attn.output_gate.weight"), H * hd, d);
      for (size_t i = 0; i < o.size(); ++i) o[i] *= 1.0 / (1.0 + std::exp(-g[i]));
    } else {
      rope(q, n, H, hd, c.rope_theta), rope(k, n, kvh, hd, c.rope_theta);
      for (int64_t hh = 0; hh < H; ++hh) {
        const int64_t g = hh / (H / kvh);
        for (int64_t i = 0; i < n; ++i) {
          Vec s(static_cast<size_t>(i + 1));
          double mx = -1e300, sum = 0;
          for (int64_t j = 0; j <= i; ++j) {
            double dot = 0;
            for (int64_t e = 0; e < hd; ++e) dot += q[static_cast<size_t>((i * H + hh) * hd + e)] * k[static_cast<size_t>((j * kvh + g) * hd + e)];
            s[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(hd));
            mx = std::max(mx, s[static_cast<size_t>(j)]);
          }
          for (double& z : s) sum += z = std::exp(z - mx);
          for (int64_t j = 0; j <= i; ++j)
            for (int64_t e = 0; e < hd; ++e)
              o[static_cast<size_t>((i * H + hh) * hd + e)] += s[static_cast<size_t>(j)] / sum * v[static_cast<size_t>((j * kvh + g) * hd + e)];
        }
      }
    }
    const Vec att = linear(o, t.get(p + "self_attn.o_proj.weight"), d, H * hd);
    for (size_t i = 0; i < x.size(); ++i) x[i] = a * h[i] + att[i];
    h = rms_norm(x, t.get(p + "post_attention_layernorm.weight"), c.norm_eps);
    // the MoE: router and experts stacked as attn::moe_feed_forward's float64 reference takes them
    const int64_t E = c.moe_experts, F = c.hidden_dim;
    Vec w1, w2, w3;
    for (int64_t e = 0; e < E; ++e) {
      const std::string x_ = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
      for (auto [dst, name] : {std::pair{&w1, "w1"}, {&w2, "w2"}, {&w3, "w3"}}) {
        const Vec m = t.get(x_ + name + ".weight");
        dst->insert(dst->end(), m.begin(), m.end());
      }
    }
    Vec y(x.size());
    moe_feed_forward(MoeSizes{n, d, E, F, c.moe_top_k}, std::span<const double>(h), t.get(p + "block_sparse_moe.gate.weight"),
                     w1, w2, w3, std::span<double>(y));
    for (size_t i = 0; i < x.size(); ++i) x[i] = a * h[i] + y[i];
  }
  const Vec hf = rms_norm(x, t.get("model.norm.weight"), c.norm_eps);
  return linear(hf, t.get("lm_head.weight"), c.vocab_size, d);
}

TEST(MiniMax, LayoutResidualAndExpertsAreWhatTheSpecSays) {
  const DecoderConfig c = minimax_config(16);
  for (size_t i = 0; i < c.layers.size(); ++i) EXPECT_EQ(c.layers[i].lightning, (i + 1) % 8 != 0) << i;
  EXPECT_EQ(c.architecture, "minimax");
  EXPECT_NEAR(c.residual_scale(), std::pow(32.0, 0.25), 1e-12);
  DecoderConfig m1 = c;
  m1.layers = DecoderConfig::hybrid_layers(80, 7, 1, parse_mechanism("softmax:causal"));
  EXPECT_NEAR(m1.residual_scale(), 3.5566, 1e-4);  // the released M1 config: (2 * 80)^(1/4)
  m1.architecture = "llama";
  EXPECT_EQ(m1.residual_scale(), 1.0);
  const DecoderConfig back = DecoderConfig::from_json(c.to_json(), "json");
  EXPECT_EQ(back.architecture, "minimax");
  EXPECT_EQ(back.moe_experts, 5);
  EXPECT_EQ(back.moe_top_k, 2);
}

TEST(MiniMax, DecoderAgreesWithAFloat64ReferenceModelInPrefillAndDecode) {
  const DecoderConfig c = minimax_config();
  Decoder d = Decoder::random(c, 9);
  const std::string path = ::testing::TempDir() + "attn_minimax.safetensors";
  d.save(path);
  const Tensors t{SafetensorsFile::open(path)};
  const std::vector<int32_t> tokens = tokens_of(21, 4, c.vocab_size);
  const Vec want = reference_logits(c, t, tokens);
  d.reset();
  const std::vector<float> prefill = d.forward(tokens, 0, true);
  expect_close(prefill, want, 5e-4);
  // 5 tokens of prompt, then one at a time (the lightning layers' recurrent state, the MoE on one token)
  const std::vector<float> stepwise = stepwise_logits(d, tokens, 5);
  expect_close(stepwise, want, 5e-4);
  double moved = 0;
  for (size_t i = 0; i < prefill.size(); ++i) moved = std::max(moved, static_cast<double>(std::abs(prefill[i] - stepwise[i])));
  EXPECT_LE(moved, 1e-4);
  // the file loads back into the same model, and threads change no bit
  Decoder loaded = Decoder::from_safetensors(path, 2);
  EXPECT_EQ(loaded.config().moe_experts, 5);
  EXPECT_EQ(loaded.forward(tokens, 0, true), prefill);
  std::remove(path.c_str());
}

TEST(MiniMax, APromptLongerThanALightningBlockMatchesTheQuadraticReference) {
  // 300 tokens: the lightning layers' blocks of 256 and the decoder's steps of 256 are crossed
  // (blocked = quadratic form with N not a multiple of 256); the last tokens are decoded one by one.
  DecoderConfig c = minimax_config();
  c.max_seq_len = 320;
  Decoder d = Decoder::random(c, 13);
  const std::string path = ::testing::TempDir() + "attn_minimax_long.safetensors";
  d.save(path);
  const Tensors t{SafetensorsFile::open(path)};
  const std::vector<int32_t> tokens = tokens_of(300, 8, c.vocab_size);
  const Vec want = reference_logits(c, t, tokens);
  std::vector<float> got = d.forward({tokens.begin(), tokens.begin() + 297}, 0, true);
  for (size_t i = 297; i < tokens.size(); ++i) {
    const std::vector<float>& row = d.forward({tokens[i]}, static_cast<int64_t>(i));
    got.insert(got.end(), row.begin(), row.end());
  }
  expect_close(got, want, 5e-4);
  std::remove(path.c_str());
}

TEST(MiniMax, SixteenBitExpertsDecodeAsTheyPrefillOnAnyThreadCount) {
  // bfloat16 matrices: the experts' rows are converted per work item; decode equals prefill.
  const DecoderConfig c = minimax_config();
  const std::vector<int32_t> tokens = tokens_of(12, 6, c.vocab_size);
  Decoder one = Decoder::random(c, 3, DType::bf16, 1), two = Decoder::random(c, 3, DType::bf16, 2);
  const std::vector<float> prefill = one.forward(tokens, 0, true);
  EXPECT_EQ(two.forward(tokens, 0, true), prefill);
  two.reset();
  std::vector<float> stepwise = two.forward({tokens.front()}, 0, true);
  for (size_t i = 1; i < tokens.size(); ++i) {
    const std::vector<float>& row = two.forward({tokens[i]}, static_cast<int64_t>(i));
    stepwise.insert(stepwise.end(), row.begin(), row.end());
  }
  Vec want(prefill.begin(), prefill.end());
  expect_close(stepwise, want, 1e-4);
}

TEST(MiniMax, BadMoeConfigsNameTheField) {
  DecoderConfig c = minimax_config();
  c.moe_top_k = 6;
  expect_error([&] { c.validate(); }, "moe_top_k must be in [1, moe_experts = 5], got 6");
  c.moe_top_k = 0;
  expect_error([&] { c.validate(); }, "moe_top_k must be in [1, moe_experts = 5], got 0");
  c = minimax_config(), c.moe_experts = -1;
  expect_error([&] { c.validate(); }, "moe_experts must be in [0, 4096] (0: a dense SwiGLU), got -1");
  c = minimax_config(), c.architecture = "scaled";
  expect_error([&] { c.validate(); }, "unknown architecture 'scaled' (known: llama, minimax, gemma3)");
  // configs written before the architecture field named MiniMax-01's model by its residual
  const std::string legacy = R"({"vocab_size": 61, "dim": 32, "hidden_dim": 24, "heads": 4, "kv_heads": 2, "head_dim": 8,
      "max_seq_len": 64, "residual": "minimax", "moe_experts": 5, "moe_top_k": 2, "layers": [{"mechanism": "softmax:causal"}]})";
  EXPECT_EQ(DecoderConfig::from_json(legacy, "legacy").architecture, "minimax");
  const std::string both = std::string(legacy).replace(legacy.find("\"residual\""), 0, R"("architecture": "llama", )");
  expect_error([&] { DecoderConfig::from_json(both, "f"); }, "f: residual 'minimax' (MiniMax-01's) contradicts architecture 'llama'");
  const std::string scaled = std::string(legacy).replace(legacy.find("\"minimax\""), 9, "\"scaled\"");
  expect_error([&] { DecoderConfig::from_json(scaled, "f"); }, "f: residual must be 'standard' or 'minimax', got 'scaled'");
}

}  // namespace
}  // namespace attn
