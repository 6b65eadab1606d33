// The llama-style decoder: incremental decoding equals one full forward (softmax, windowed and
// hybrid lightning stacks), results do not depend on the thread count, weights survive a
// safetensors round trip bit for bit, and bad configs, files and calls are Errors that leave
// the run state as it was. (The check against a literal PyTorch block is python/tests/test_decoder.py.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "attn/attn.hpp"
#include "attn/model.hpp"
#include "attn/safetensors.hpp"
#include "model/memory_need.hpp"
#include "support/expect_error.hpp"
#include "support/gguf_image.hpp"

namespace attn {
namespace {

using testing::expect_error;

DecoderConfig small_config(std::vector<DecoderLayerSpec> layers, int64_t max_seq = 320) {
  DecoderConfig c;
  c.vocab_size = 97, c.dim = 48, c.hidden_dim = 80, c.heads = 4, c.kv_heads = 2, c.head_dim = 12;
  c.max_seq_len = max_seq, c.rope_theta = 500.0;
  c.layers = std::move(layers);
  return c;
}

std::vector<int32_t> random_tokens(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, 96);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = id(rng);
  return t;
}

// Logits of every position: one call over all tokens.
std::vector<float> full_pass(Decoder& d, const std::vector<int32_t>& tokens) {
  d.reset();
  return d.forward(tokens, 0, true);
}

// Logits of every position: the first `prompt` tokens in one call, then one token per call.
std::vector<float> incremental(Decoder& d, const std::vector<int32_t>& tokens, int64_t prompt) {
  d.reset();
  std::vector<float> out = d.forward({tokens.begin(), tokens.begin() + prompt}, 0, true);
  for (size_t i = static_cast<size_t>(prompt); i < tokens.size(); ++i) {
    const std::vector<float>& row = d.forward({tokens[i]}, static_cast<int64_t>(i));
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(a[i]) && std::isfinite(b[i])) << "at " << i;
    worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::abs(b[i])));
  }
  EXPECT_LE(worst, tol * std::max(scale, 1.0)) << "largest |logit| " << scale;
}

struct Stack {
  const char* name;
  std::vector<DecoderLayerSpec> layers;
};

std::vector<Stack> stacks() {
  const Mechanism causal = parse_mechanism("softmax:causal");
  return {{"softmax", DecoderConfig::softmax_layers(3, causal)},
          {"window_sinks", DecoderConfig::softmax_layers(2, parse_mechanism("softmax:causal,window=6:0,sinks=2"))},
          {"hybrid_3_1", DecoderConfig::hybrid_layers(4, 3, 1, causal)},
          {"retention", {{parse_mechanism("retention:decay=0.9"), false, false},
                         {causal, true, false}}}};
}

TEST(Decoder, IncrementalDecodingEqualsOneFullForward) {
  const std::vector<int32_t> tokens = random_tokens(40, 1);
  for (const Stack& s : stacks()) {
    SCOPED_TRACE(s.name);
    Decoder d = Decoder::random(small_config(s.layers), 7);
    const std::vector<float> full = full_pass(d, tokens);
    EXPECT_EQ(d.position(), 40);
    expect_close(incremental(d, tokens, 17), full, 2e-5);
    expect_close(incremental(d, tokens, 1), full, 2e-5);
  }
}

TEST(Decoder, LongPromptsRunInStepsThatMatchPieces) {
  // 300 tokens: more than one internal step of 256; the same tokens fed as 100 + 200.
  const std::vector<int32_t> tokens = random_tokens(300, 2);
  for (const Stack& s : stacks()) {
    SCOPED_TRACE(s.name);
    Decoder d = Decoder::random(small_config(s.layers), 3);
    const std::vector<float> full = full_pass(d, tokens);
    d.reset();
    std::vector<float> pieces = d.forward({tokens.begin(), tokens.begin() + 100}, 0, true);
    const std::vector<float>& rest = d.forward({tokens.begin() + 100, tokens.end()}, 100, true);
    pieces.insert(pieces.end(), rest.begin(), rest.end());
    expect_close(pieces, full, 2e-5);
    d.reset();
    const std::vector<float> last = d.forward(tokens, 0);  // the last row only
    expect_close(last, std::vector<float>(full.end() - 97, full.end()), 2e-5);
  }
}

TEST(Decoder, ResultsAreBitwiseTheSameForAnyThreadCount) {
  const std::vector<int32_t> tokens = random_tokens(33, 3);
  for (const Stack& s : stacks()) {
    SCOPED_TRACE(s.name);
    Decoder one = Decoder::random(small_config(s.layers), 5, DType::f32, 1);
    Decoder two = Decoder::random(small_config(s.layers), 5, DType::f32, 2);
    Decoder three = Decoder::random(small_config(s.layers), 5, DType::f32, 3);
    const std::vector<float> a = incremental(one, tokens, 20);
    EXPECT_EQ(a, incremental(two, tokens, 20));
    EXPECT_EQ(a, incremental(three, tokens, 20));
  }
}

TEST(Decoder, WeightsSurviveASafetensorsRoundTrip) {
  const std::vector<int32_t> tokens = random_tokens(12, 4);
  for (const DType dt : {DType::f32, DType::bf16}) {
    DecoderConfig c = small_config(DecoderConfig::hybrid_layers(2, 1, 1, parse_mechanism("softmax:causal")));
    c.tied_embeddings = dt == DType::bf16;
    Decoder d = Decoder::random(c, 11, dt);
    const std::string path = ::testing::TempDir() + "attn_decoder_" + dtype_name(dt) + ".safetensors";
    d.save(path);
    const SafetensorsFile f = SafetensorsFile::open(path);
    EXPECT_EQ(f.at("model.layers.0.self_attn.output_gate.weight").dtype, dt == DType::f32 ? "F32" : "BF16");
    EXPECT_EQ(f.contains("lm_head.weight"), !c.tied_embeddings);
    EXPECT_EQ(f.at("model.layers.1.self_attn.k_proj.weight").shape, (std::vector<int64_t>{24, 48}));  // kv_heads 2
    EXPECT_EQ(f.at("model.layers.0.self_attn.k_proj.weight").shape, (std::vector<int64_t>{48, 48}));  // lightning: heads 4
    Decoder loaded = Decoder::from_safetensors(path);
    EXPECT_EQ(loaded.config().to_json(), c.to_json());
    EXPECT_EQ(full_pass(loaded, tokens), full_pass(d, tokens));
    std::remove(path.c_str());
  }
}

TEST(Decoder, CacheMemoryIsKvRowsForSoftmaxLayersAndAFixedStateForLightning) {
  const Mechanism causal = parse_mechanism("softmax:causal");
  Decoder all = Decoder::random(small_config(DecoderConfig::softmax_layers(8, causal)), 1);
  Decoder hybrid = Decoder::random(small_config(DecoderConfig::hybrid_layers(8, 7, 1, causal)), 1);
  const int64_t per_layer = 2 * 2 * 12 * 4;  // K and V, 2 kv heads of 12 floats
  EXPECT_EQ(all.kv_bytes_per_token(), 8 * per_layer);
  EXPECT_EQ(all.state_bytes(), 0);
  // embedding + lm_head, per layer: 2 norms, q, k, v, o, three SwiGLU matrices; the final norm
  EXPECT_EQ(all.parameter_count(), 2 * 97 * 48 + 8 * (2 * 48 + 48 * 48 + 2 * 24 * 48 + 48 * 48 + 3 * 80 * 48) + 48);
  // lightning layers: k and v of every head, the output norm and gate
  EXPECT_EQ(hybrid.parameter_count() - all.parameter_count(), 7 * (2 * 24 * 48 + 48 + 48 * 48));
  EXPECT_EQ(hybrid.kv_bytes_per_token(), per_layer);
  EXPECT_EQ(hybrid.state_bytes(), 7 * 4 * 12 * 12 * 4);  // 4 heads of 12 x 12 floats, no normaliser
  // MiniMax-01's layout: layer i is softmax iff (i + 1) % 8 == 0.
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(hybrid.config().layers[static_cast<size_t>(i)].lightning, (i + 1) % 8 != 0);
}

TEST(Decoder, BoundedCachesGiveTheResultsOfFullCaches) {
  // Windows (+ sinks, dilation), chunks (+ sinks): 160 tokens run through caches of 40-81 rows,
  // compacted several times, give the logits of caches holding every row, prefilled and decoded.
  const std::vector<int32_t> tokens = random_tokens(160, 5);
  for (const char* text : {"softmax:causal,window=6:0,sinks=2", "softmax:causal,window=20:0", "softmax:causal,chunk=24,sinks=3",
                           "softmax:causal,window=9:0,dilation=3,sinks=1", "softmax:causal,chunk=16,window=10:0"}) {
    SCOPED_TRACE(text);
    Decoder d = Decoder::random(small_config(DecoderConfig::softmax_layers(2, parse_mechanism(text))), 9);
    const std::vector<LayerCache> caches = d.layer_caches();
    ASSERT_EQ(caches.size(), 2u);
    EXPECT_EQ(caches[0].kind, "kv-bounded");
    EXPECT_LT(caches[0].rows, 100);
    EXPECT_EQ(caches[0].bytes, 2 * caches[0].rows * 2 * 12 * 4);
    EXPECT_EQ(d.kv_bytes_per_token(), 0);
    EXPECT_EQ(d.bounded_cache_bytes(), 2 * caches[0].bytes);
    const std::vector<float> bounded_full = full_pass(d, tokens), bounded_steps = incremental(d, tokens, 120);
    d.reset();
    d.set_full_caches(true);
    EXPECT_EQ(d.layer_caches()[0].kind, "kv");
    EXPECT_EQ(d.layer_caches()[0].rows, 320);
    const std::vector<float> full = full_pass(d, tokens);
    expect_close(bounded_full, full, 2e-5);
    expect_close(bounded_steps, full, 2e-5);
  }
}

TEST(Decoder, AWindowedModelHoldsOnePercentOfTheFullCacheAt32k) {
  // 30 layers, window 256 + 4 sinks, 32k context: the bounded caches against full ones.
  DecoderConfig c = small_config(DecoderConfig::softmax_layers(30, parse_mechanism("softmax:causal,window=256:0,sinks=4")), 32768);
  const Decoder windowed = Decoder::random(c, 1);
  c.layers = DecoderConfig::softmax_layers(30, parse_mechanism("softmax:causal"));
  const Decoder exact = Decoder::random(c, 1);
  const int64_t full = exact.kv_bytes_per_token() * 32768;
  EXPECT_EQ(windowed.kv_bytes_per_token(), 0);
  EXPECT_LE(windowed.bounded_cache_bytes() * 100, full) << windowed.bounded_cache_bytes() << " of " << full;
  EXPECT_EQ(windowed.layer_caches().at(0).rows, 4 + 256 + 32);
}

TEST(Decoder, SwappingToAMechanismWithOtherCacheRowsNeedsPositionZero) {
  Decoder d = Decoder::random(small_config(DecoderConfig::softmax_layers(2, parse_mechanism("softmax:causal"))), 2);
  d.forward({1, 2, 3}, 0);
  expect_error([&] { d.set_mechanism(-1, parse_mechanism("softmax:causal,window=8:0")); }, "reset() first");
  EXPECT_EQ(d.layer_caches()[0].kind, "kv");  // nothing changed
  d.set_mechanism(-1, parse_mechanism("softmax:causal,scale=0.5"));  // the same rows: allowed mid-context
  d.reset();  // a live cache survives a no-op setting
  d.forward({1, 2, 3}, 0);
  const std::vector<float> before = d.forward({4}, 3);
  d.reset();
  d.forward({1, 2, 3}, 0);
  d.set_full_caches(false);
  EXPECT_EQ(d.forward({4}, 3), before);
  expect_error([&] { d.set_full_caches(true); }, "reset() first");
  d.reset();
  d.set_mechanism(-1, parse_mechanism("softmax:causal,window=8:0"));
  EXPECT_EQ(d.layer_caches()[1].kind, "kv-bounded");
  EXPECT_EQ(d.layer_caches()[1].rows, 8 + 32);  // the window's 8 rows back, 32 queries at a time
}

TEST(Decoder, SwappingToAStateOfAnotherShapeReallocatesIt) {
  // A lightning layer's state (no normaliser) becomes one with a normaliser column: reallocated.
  Decoder d = Decoder::random(small_config(DecoderConfig::hybrid_layers(2, 1, 1, parse_mechanism("softmax:causal"))), 4);
  const int64_t before = d.state_bytes();
  d.set_mechanism(0, parse_mechanism("linear:map=identity,causal"));
  EXPECT_EQ(d.state_bytes(), before / 12 * 13);  // (12 x 12) -> (12 x 13) per head
  EXPECT_EQ(d.forward({1, 2, 3}, 0).size(), 97u);
}

TEST(Decoder, LightningDecaysFollowMiniMaxsFormula) {
  // H = 8, layer 0: s_h = 2^(-h) (1 + 1e-5) for h = 1..8.
  const std::vector<float> d = lightning_decays(8, 0, 80);
  for (int h = 1; h <= 8; ++h)
    EXPECT_NEAR(d[static_cast<size_t>(h - 1)], std::exp(-std::exp2(-h) * (1 + 1e-5)), 1e-7) << h;
  const std::vector<float> last = lightning_decays(8, 79, 80);  // the deepest layer barely decays
  for (const float x : last) EXPECT_GT(x, 0.9999f);
}

TEST(Decoder, BadCallsAreErrorsAndLeaveTheRunStateAsItWas) {
  Decoder d = Decoder::random(small_config(DecoderConfig::hybrid_layers(2, 1, 1, parse_mechanism("softmax:causal")), 64), 9);
  const std::vector<int32_t> tokens = random_tokens(10, 5);
  const std::vector<float> expected = full_pass(d, tokens);
  d.reset();
  d.forward({tokens.begin(), tokens.begin() + 4}, 0);
  expect_error([&] { d.forward({1}, 3); }, "pos must be the number of tokens run since reset() (4), got 3");
  expect_error([&] { d.forward({}, 4); }, "tokens must not be empty");
  expect_error([&] { d.forward({5, 97}, 4); }, "tokens[1] must be in [0, 97), got 97");
  expect_error([&] { d.forward(std::vector<int32_t>(61, 1), 4); }, "positions 4..64 exceed max_seq_len 64");
  d.set_attention_form("nonexistent");
  expect_error([&] { d.forward({tokens.begin() + 4, tokens.end()}, 4); }, "layer 0 (linear:");
  d.set_attention_form("");
  EXPECT_EQ(d.position(), 4);
  std::vector<float> rest = d.forward({tokens.begin() + 4, tokens.end()}, 4, true);
  expect_close(rest, std::vector<float>(expected.begin() + 4 * 97, expected.end()), 2e-5);
}

// Activations apply to block-quantized matrices only: a float model gives the same bits either way.
TEST(Decoder, ActivationsAreNamedCheckedAndLeaveFloatMatricesAlone) {
  Decoder d = Decoder::random(small_config(DecoderConfig::hybrid_layers(2, 1, 1, parse_mechanism("softmax:causal")), 64), 9);
  EXPECT_EQ(d.activations(), "q8");  // "auto"
  const std::vector<int32_t> tokens = random_tokens(6, 5);
  const std::vector<float> q8 = incremental(d, tokens, 2);  // decode-sized steps
  d.set_activations("f32");
  EXPECT_EQ(d.activations(), "f32");
  EXPECT_EQ(incremental(d, tokens, 2), q8);
  d.set_activations("q8-decode");
  EXPECT_EQ(d.activations(), "q8-decode");
  EXPECT_EQ(incremental(d, tokens, 2), q8);
  d.set_activations("auto");
  EXPECT_EQ(d.activations(), "q8");
  expect_error([&] { d.set_activations("int8"); },
               "activations: expected 'f32', 'q8', 'q8-decode' or 'auto', got 'int8'");
  EXPECT_EQ(d.activations(), "q8");
}

// A 16-bit cache stores K and V (and takes the queries) rounded to float16 or bfloat16: the same
// logits up to that rounding, half the bytes, bounded caches included.
TEST(Decoder, SixteenBitCachesHalveTheBytesAndMoveLogitsByTheirRounding) {
  const auto layers = DecoderConfig::hybrid_layers(2, 1, 1, parse_mechanism("softmax:causal,window=7:0,sinks=2"));
  Decoder d = Decoder::random(small_config(layers, 64), 9);
  const std::vector<int32_t> tokens = random_tokens(40, 5);
  const std::vector<float> f32 = incremental(d, tokens, 20);
  const int64_t bytes = d.kv_bytes_per_token(), bounded = d.bounded_cache_bytes();
  for (DType t : {DType::f16, DType::bf16}) {
    d.reset();
    d.set_cache_dtype(t);
    EXPECT_EQ(d.cache_dtype(), t);
    EXPECT_EQ(d.kv_bytes_per_token(), bytes / 2);
    EXPECT_EQ(d.bounded_cache_bytes(), bounded / 2);
    const std::vector<float> low = incremental(d, tokens, 20);
    float most = 0, diff = 0;
    for (size_t i = 0; i < f32.size(); ++i) most = std::max(most, std::abs(f32[i])), diff = std::max(diff, std::abs(low[i] - f32[i]));
    EXPECT_GT(diff, 0.0f) << dtype_name(t);
    EXPECT_LE(diff, (t == DType::f16 ? 2e-3f : 2e-2f) * most) << dtype_name(t);
  }
  d.reset();
  d.forward({1, 2}, 0);
  expect_error([&] { d.set_cache_dtype(DType::f32); }, "set_cache_dtype: the context holds tokens: reset() first");
  expect_error([&] { d.set_cache_dtype(DType::boolean); }, "cache_dtype: expected float32, float16, bfloat16 or int8, got bool");
}

// An int8 cache stores each row of K and V rounded to 8 bits with a float32 scale (the queries
// stay float32): logits near the float32 cache's, about a quarter of its bytes; a bounded cache,
// compacted many times (its scales moving with its rows), gives the logits of a full int8 cache.
TEST(Decoder, Int8CachesQuarterTheBytesAndFollowTheFloatCache) {
  const std::vector<int32_t> tokens = random_tokens(160, 5);
  Decoder d = Decoder::random(small_config(DecoderConfig::softmax_layers(2, parse_mechanism("softmax:causal,window=6:0,sinks=2"))), 9);
  d.set_full_caches(true);
  const std::vector<float> f32 = incremental(d, tokens, 100);
  d.reset();
  d.set_cache_dtype(DType::i8);
  EXPECT_EQ(d.cache_dtype(), DType::i8);
  EXPECT_EQ(d.kv_bytes_per_token(), 2 * 2 * 2 * (12 + 4));  // layers x (K, V) x kv heads x (12 int8 + a scale)
  const std::vector<float> full = incremental(d, tokens, 100);
  double most = 0, diff = 0;
  for (size_t i = 0; i < f32.size(); ++i) most = std::max(most, std::abs(static_cast<double>(f32[i]))), diff = std::max(diff, std::abs(static_cast<double>(full[i]) - f32[i]));
  EXPECT_GT(diff, 0.0);
  EXPECT_LE(diff, 3e-2 * most);  // 8-bit rows: within ~0.4 % per value, less once attention averages them
  d.reset();
  d.set_full_caches(false);
  const std::vector<LayerCache> caches = d.layer_caches();
  EXPECT_EQ(caches[0].kind, "kv-bounded");
  EXPECT_EQ(caches[0].bytes, caches[0].rows * 2 * 2 * (12 + 4));
  expect_close(incremental(d, tokens, 100), full, 2e-5);
  expect_close(full_pass(d, tokens), full, 2e-5);
}

TEST(Decoder, BadConfigsNameTheField) {
  const Mechanism causal = parse_mechanism("softmax:causal");
  auto with = [&](auto edit) {
    DecoderConfig c = small_config(DecoderConfig::softmax_layers(2, causal));
    edit(c);
    return c;
  };
  expect_error([&] { with([](DecoderConfig& c) { c.kv_heads = 3; }).validate(); }, "kv_heads (3) must divide heads (4)");
  expect_error([&] { with([](DecoderConfig& c) { c.dim = 0; }).validate(); }, "dim must be >= 1, got 0");
  expect_error([&] { with([](DecoderConfig& c) { c.head_dim = 7; }).validate(); }, "head_dim must be even");
  expect_error([&] { with([](DecoderConfig& c) { c.layers.clear(); }).validate(); }, "needs at least one layer");
  expect_error([&] { with([](DecoderConfig& c) { c.layers[1].mechanism = parse_mechanism("softmax"); }).validate(); },
               "layers[1] mechanism 'softmax' is not causal");
  expect_error([&] { with([](DecoderConfig& c) { c.layers[0].lightning = true; }).validate(); },
               "layers[0] is a lightning layer, which needs a linear mechanism");
  expect_error([&] { DecoderConfig::hybrid_layers(8, 7, 0, causal); }, "a hybrid needs");
  expect_error([] { DecoderConfig::from_json("{\"dim\": 4", "f"); }, "f: decoder config is not valid JSON");
  expect_error([] { DecoderConfig::from_json(R"({"dim": "4", "layers": []})", "f"); }, "dim has the wrong type: \"4\"");
  expect_error(
      [] {
        DecoderConfig::from_json(
            R"({"vocab_size":5,"dim":4,"hidden_dim":4,"heads":1,"head_dim":4,"max_seq_len":8,"layers":[{"mechanism":"softmax:casual"}]})",
            "f");
      },
      "layers[0].mechanism: unknown softmax option 'casual'");
}

TEST(Decoder, FilesThatDoNotMatchTheConfigAreRefused) {
  const std::string path = ::testing::TempDir() + "attn_decoder_bad.safetensors";
  const float x[4] = {1, 2, 3, 4};
  write_safetensors(path, {{"model.norm.weight", {DType::f32, {4}, x}}});
  expect_error([&] { Decoder::from_safetensors(path); }, "has no 'attn.decoder' entry in its metadata");
  DecoderConfig c = small_config(DecoderConfig::softmax_layers(1, parse_mechanism("softmax:causal")));
  write_safetensors(path, {{"model.norm.weight", {DType::f32, {4}, x}}}, {{"attn.decoder", c.to_json()}});
  expect_error([&] { Decoder::from_safetensors(path); }, "has no tensor 'model.embed_tokens.weight'");
  Decoder d = Decoder::random(c, 1);
  d.save(path);
  {  // a tensor of the wrong shape
    const SafetensorsFile f = SafetensorsFile::open(path);
    std::map<std::string, SafetensorsEntry> t;
    for (const auto& [name, e] : f.tensors()) t[name] = {e.float_dtype(name), e.shape, e.data};
    t["model.norm.weight"].shape = {2, 24};
    write_safetensors(path + "2", t, f.metadata());
    t["model.norm.weight"].shape = {48};
    t["extra.bias"] = {DType::f32, {1}, x};
    write_safetensors(path + "3", t, f.metadata());
  }
  expect_error([&] { Decoder::from_safetensors(path + "2"); }, "tensor 'model.norm.weight' has shape (2, 24), expected (48,)");
  expect_error([&] { Decoder::from_safetensors(path + "3"); }, "has tensor 'extra.bias', which this decoder config does not use");
  const std::vector<DecoderLayerSpec> lightning = {{DecoderConfig::lightning_mechanism(), false, true}};
  expect_error([&] { Decoder::from_safetensors(path, 0, &lightning); }, "layers[0]: the file's layer is not a lightning layer");
  const std::vector<DecoderLayerSpec> windowed = DecoderConfig::softmax_layers(1, parse_mechanism("softmax:causal,window=3:0"));
  EXPECT_EQ(to_string(Decoder::from_safetensors(path, 0, &windowed).config().layers[0].mechanism), "softmax:causal,window=3:0");
  for (const std::string& p : {path, path + "2", path + "3"}) std::remove(p.c_str());
}

// Regression: sizes from a caller or a file were used to allocate before they
// were weighed (10^8 layers, a vocabulary times a width past the machine's memory, a context of
// 10^15 positions ended in std::bad_alloc). Each is now refused naming the sizes, before the
// allocation (the message is the size check's, not "out of memory").
TEST(Decoder, AbsurdSizesAreRefusedNamingThemBeforeAnythingIsAllocated) {
  const Mechanism causal = parse_mechanism("softmax:causal");
  expect_error([&] { DecoderConfig::softmax_layers(100000000, causal); },
               "the layer count must be in [0, 4096] (the most layers a decoder may have), got 100000000");
  expect_error([&] { DecoderConfig::softmax_layers(-1, causal); }, "the layer count must be in [0, 4096]");
  expect_error([&] { DecoderConfig::hybrid_layers(int64_t{1} << 40, 7, 1, causal); }, "got 1099511627776");
  std::string many = R"({"vocab_size":5,"dim":4,"hidden_dim":4,"heads":1,"head_dim":4,"max_seq_len":8,"layers":[)";
  for (int i = 0; i < 4097; ++i) many += i ? ",{}" : "{}";
  expect_error([&] { DecoderConfig::from_json(many + "]}", "f"); }, "f: decoder config has 4097 layers, more than 4096");
  auto random = [&](auto edit, DType dtype = DType::f32) {
    DecoderConfig c = small_config(DecoderConfig::softmax_layers(2, causal));
    edit(c);
    return [=] { Decoder::random(c, 1, dtype); };
  };
  const char* beyond = "more than this machine's memory";
  expect_error(random([](DecoderConfig& c) { c.vocab_size = INT32_MAX, c.dim = 1 << 20, c.heads = 1 << 16, c.kv_heads = 1, c.head_dim = 16; }),
               "vocab_size 2147483647, dim 1048576");
  expect_error(random([](DecoderConfig& c) { c.vocab_size = INT32_MAX; }, DType::bf16), beyond);
  expect_error(random([](DecoderConfig& c) { c.hidden_dim = int64_t{1} << 40; }), beyond);
  expect_error(random([](DecoderConfig& c) { c.hidden_dim = int64_t{1} << 62; }),
               "of this decoder overflow 64-bit byte counts (vocab_size 97, dim 48, hidden_dim 4611686018427387904");
  expect_error(random([](DecoderConfig& c) { c.heads = c.kv_heads = 1 << 30, c.head_dim = 1 << 30; }), "overflow 64-bit byte counts");
  expect_error(random([](DecoderConfig& c) { c.max_seq_len = int64_t{1} << 50; }), "max_seq_len 1125899906842624");
  expect_error(random([](DecoderConfig& c) { c.max_seq_len = INT64_MAX; }), "run state of this decoder overflow");
  // a bounded cache does not grow with max_seq_len: a windowed model of a huge context is fine
  DecoderConfig windowed = small_config(DecoderConfig::softmax_layers(2, parse_mechanism("softmax:causal,window=15:0")), int64_t{1} << 50);
  EXPECT_NO_THROW(Decoder::random(windowed, 1));
}

// The weights a decoder holds in memory, per 32 matrix values: none when mapped, a packed or
// Q8_0-converted block's 34 bytes for a quantized GGUF (counted: the check once took them as
// mapped), 128 dequantized; the float32 norm vectors always.
TEST(Decoder, MemoryNeedCountsPackedAndConvertedMatrices) {
  const DecoderConfig c = small_config(DecoderConfig::softmax_layers(2, parse_mechanism("softmax:causal")));
  const int64_t mapped = model::memory_need(c, 0, "t").weights;
  const int64_t packed = model::memory_need(c, 34, "t").weights, dense = model::memory_need(c, 128, "t").weights;
  int64_t values = c.vocab_size * c.dim * (c.tied_embeddings ? 1 : 2);
  for (size_t i = 0; i < c.layers.size(); ++i)
    values += c.dim * (c.heads * c.head_dim) * 2 + c.dim * (c.kv_heads * c.head_dim) * 2 + 3 * c.dim * c.hidden_dim;
  EXPECT_EQ(dense - mapped, 4 * values);
  EXPECT_GE(packed - mapped, values * 34 / 32);
  EXPECT_LE(packed - mapped, values * 34 / 32 + 3);  // each of the three sums rounded up
  EXPECT_EQ(model::memory_need(c, 32 * 2, "t").weights - mapped, 2 * values);  // random bf16 weights
}

// A llama GGUF of `blocks` blocks of F32 tensors (dim 4, one head, hidden 4, vocab 3) whose
// metadata says block_count and context_length.
void write_llama_gguf(const std::string& path, int64_t blocks, uint64_t block_count, uint64_t context) {
  testing::GgufImage g;
  g.text("general.architecture", "llama");
  g.u64("llama.block_count", block_count), g.u64("llama.context_length", context);
  g.u32("llama.embedding_length", 4), g.u32("llama.feed_forward_length", 4), g.u32("llama.attention.head_count", 1);
  auto quarters = [](std::vector<uint64_t> dims) {  // F32 values of 0.25
    std::vector<uint8_t> b(static_cast<size_t>(dims.size() == 2 ? dims[0] * dims[1] : dims[0]) * 4);
    const float x = 0.25f;
    for (size_t i = 0; i < b.size(); i += 4) std::memcpy(&b[i], &x, 4);
    return b;
  };
  g.tensor("token_embd.weight", {4, 3}, 0, quarters({4, 3}));
  g.tensor("output_norm.weight", {4}, 0, quarters({4}));
  for (int64_t i = 0; i < blocks; ++i)
    for (const char* n : {"attn_norm", "ffn_norm"}) g.tensor("blk." + std::to_string(i) + "." + n + ".weight", {4}, 0, quarters({4}));
  for (int64_t i = 0; i < blocks; ++i)
    for (const char* n : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"})
      g.tensor("blk." + std::to_string(i) + "." + n + ".weight", {4, 4}, 0, quarters({4, 4}));
  ASSERT_TRUE(g.write(path)) << path;
}

// Regression: a GGUF whose llama.block_count is 10^8 made a list of 10^8
// layers before any tensor was looked at; a context_length of 10^15 sized the caches. Both are
// checked against the file (its blk.N tensors) and the machine first.
TEST(Decoder, GgufSizesMustAgreeWithTheFileAndFitTheMachine) {
  const std::string path = ::testing::TempDir() + "attn_decoder_sizes.gguf";
  write_llama_gguf(path, 2, 2, 64);
  EXPECT_EQ(Decoder::from_gguf(path).config().layers.size(), 2u);
  write_llama_gguf(path, 2, 100000000, 64);
  expect_error([&] { Decoder::from_gguf(path); },
               "llama.block_count is 100000000, but the file's tensors name 2 blocks (blk.0 .. blk.1)");
  write_llama_gguf(path, 2, 1, 64);
  expect_error([&] { Decoder::from_gguf(path); }, "llama.block_count is 1, but the file's tensors name 2 blocks");
  write_llama_gguf(path, 0, 0, 64);
  expect_error([&] { Decoder::from_gguf(path); }, "needs at least one layer");
  write_llama_gguf(path, 2, uint64_t{1} << 63, 64);
  expect_error([&] { Decoder::from_gguf(path); }, "llama.block_count is 9223372036854775807");
  write_llama_gguf(path, 2, 2, uint64_t{1} << 50);
  expect_error([&] { Decoder::from_gguf(path); }, "max_seq_len 1125899906842624");
  GgufLoadOptions small;
  small.max_seq_len = 16;  // the caller's own context: fine
  EXPECT_EQ(Decoder::from_gguf(path, small).config().max_seq_len, 16);
  std::remove(path.c_str());
}

// Decoder::weight / set_weight (Transformer² SVF's access to a model's matrices): by Hugging Face
// name, float32 values; setting a weight's own values changes no bit; the tied embedding is the
// output matrix too; bad names and shapes are Errors.
TEST(Decoder, WeightsAreReadAndReplacedByName) {
  DecoderConfig c = small_config(DecoderConfig::softmax_layers(2, parse_mechanism("softmax:causal")), 64);
  c.tied_embeddings = true;
  Decoder d = Decoder::random(c, 3);
  const std::vector<int32_t> tokens = random_tokens(6, 2);
  const std::vector<float> base = full_pass(d, tokens);
  const std::vector<std::string> names = d.weight_names();
  ASSERT_EQ(names.size(), 1 + 2 * 9 + 1u);
  EXPECT_EQ(names[0], "model.embed_tokens.weight");
  EXPECT_EQ(names[9], "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(names[10], "model.layers.1.input_layernorm.weight");
  for (const std::string& n : names) {
    const WeightValues w = d.weight(n);
    d.set_weight(n, w.shape, w.values);
  }
  EXPECT_EQ(full_pass(d, tokens), base);  // the same floats, now in the decoder's own memory
  const std::string gate = "model.layers.1.mlp.gate_proj.weight";
  WeightValues w = d.weight(gate);
  EXPECT_EQ(w.shape, (std::vector<int64_t>{80, 48}));
  std::vector<float> doubled = w.values;
  for (float& x : doubled) x *= 2;
  d.set_weight(gate, w.shape, doubled);
  EXPECT_EQ(d.weight(gate).values, doubled);
  EXPECT_NE(full_pass(d, tokens), base);
  d.set_weight(gate, w.shape, w.values);  // replaces the copy made just before
  EXPECT_EQ(full_pass(d, tokens), base);
  const WeightValues embed = d.weight("model.embed_tokens.weight");
  d.set_weight("model.embed_tokens.weight", embed.shape, std::vector<float>(embed.values.size(), 0.0f));
  for (const float x : full_pass(d, tokens)) ASSERT_EQ(x, 0.0f);  // tied: the output matrix is zero too
  expect_error([&] { d.weight("model.layers.2.mlp.up_proj.weight"); },
               "no weight named 'model.layers.2.mlp.up_proj.weight'");
  expect_error([&] { d.set_weight(gate, {48, 80}, w.values); },
               "'" + gate + "' has shape (80, 48), got values of shape (48, 80)");
  expect_error([&] { d.set_weight(gate, {80, 48}, std::span<const float>(doubled.data(), 10)); },
               "shape (80, 48) holds 3840 values, got 10");
}

}  // namespace
}  // namespace attn
