// attn::info: every family answers, and what it says is what attend() does: causal mechanisms
// hide the future, a state family's state has the declared shape, declared params are accepted
// (and drawn by the harness), the cache bound is the keys a query can see.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "attn/attn.hpp"
#include "attn/info.hpp"
#include "support/expect_error.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

// q, k, v of (B, H, N, D) / (B, H, M, D) / (B, H, M, Dv), float32, seeded.
struct Qkv {
  testing::Buffer q, k, v;
  Qkv(int64_t B, int64_t H, int64_t N, int64_t M, int64_t D, int64_t Dv, uint32_t seed) {
    std::mt19937 rng(seed);
    q = testing::random_tensor(rng, DType::f32, B, H, N, D);
    k = testing::random_tensor(rng, DType::f32, B, H, M, D);
    v = testing::random_tensor(rng, DType::f32, B, H, M, Dv);
  }
};

TEST(Info, EveryFamilyAnswersOnceInVariantOrder) {
  const std::vector<MechanismInfo> all = family_infos();
  ASSERT_EQ(all.size(), std::variant_size_v<Mechanism>);
  std::set<std::string> kinds;
  for (const MechanismInfo& i : all) {
    SCOPED_TRACE(i.family);
    EXPECT_TRUE(kinds.insert(i.family).second);
    EXPECT_FALSE(i.forms.empty());
    EXPECT_EQ(i.forms.back(), "reference");  // every family keeps its float64 oracle last
    EXPECT_EQ(i.grammar.rfind(i.family, 0), 0u) << i.grammar;
    EXPECT_EQ(parse_mechanism(i.text), parse_mechanism(i.family));
    EXPECT_EQ(i.cache == CacheKind::state, !i.state_shape.empty());
    const nlohmann::json j = nlohmann::json::parse(i.to_json());
    EXPECT_EQ(j.at("family"), i.family);
    EXPECT_EQ(j.at("cache"), to_string(i.cache));
  }
}

TEST(Info, CacheRowsFollowTheWindowSinksAndChunk) {
  EXPECT_EQ(info(parse_mechanism("softmax:causal"), 32768).cache_rows, 32768);
  EXPECT_EQ(info(parse_mechanism("softmax:causal,window=256:0,sinks=4"), 32768).cache_rows, 261);
  EXPECT_EQ(info(parse_mechanism("softmax:causal,window=256:0,sinks=4"), 100).cache_rows, 100);
  EXPECT_EQ(info(parse_mechanism("softmax:causal,chunk=512"), 32768).cache_rows, 512);
  const MechanismInfo chunk = info(parse_mechanism("softmax:causal,chunk=512,sinks=2,window=100:0"), 4096);
  EXPECT_EQ(chunk.cache_rows, 103);
  EXPECT_EQ(chunk.align, 512);
  // A strided pattern, dropout (decided per key index), global or random keys: every row.
  for (const char* all : {"softmax:causal,window=64:0,strided=8", "softmax:causal,window=64:0,dropout=0.1",
                          "longformer:causal,window=64:0,global=3", "bigbird:causal", "lsh:causal", "gau:causal",
                          "dca:chunk=64,local=8", "softmax:window=64:0"})
    EXPECT_EQ(info(parse_mechanism(all), 5000).cache_rows, 5000) << all;
  for (const char* none : {"linear:causal", "retention:decay=0.9", "efficient:causal", "linformer:k=8"})
    EXPECT_EQ(info(parse_mechanism(none), 5000).cache_rows, 0) << none;
  EXPECT_EQ(info(parse_mechanism("linformer:k=8")).cache, CacheKind::none);
  testing::expect_error([] { info(Softmax{}, -1); }, "context must be >= 0");
}

TEST(Info, CausalMeansTheFutureIsHidden) {
  // A causal family's outputs for the first rows do not change when later tokens change.
  for (const MechanismInfo& fam : family_infos()) {
    if (!fam.can_be_causal) continue;
    const std::string text = fam.family == "dca" ? "dca:chunk=8,local=4" : fam.family + ":causal";
    const Mechanism m = parse_mechanism(text);
    SCOPED_TRACE(text);
    ASSERT_TRUE(info(m).causal);
    Qkv a(1, 2, 12, 12, 8, 8, 5), b(1, 2, 12, 12, 8, 8, 5);
    for (int64_t h = 0; h < 2; ++h)
      testing::fill_token(b.k.view, 0, h, 11, 0.5f), testing::fill_token(b.v.view, 0, h, 11, -2.0f);  // token 11 differs
    const Tensor oa = attend(a.q.view, a.k.view, a.v.view, m).out, ob = attend(b.q.view, b.k.view, b.v.view, m).out;
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 11; ++i)
        for (int64_t c = 0; c < 8; ++c)
          EXPECT_EQ(*reinterpret_cast<const float*>(oa.view().ptr(0, h, i, c)), *reinterpret_cast<const float*>(ob.view().ptr(0, h, i, c)));
  }
}

TEST(Info, DeclaredStateShapesAreTheStatesAttendReturns) {
  for (const char* text : {"linear:causal", "linear:causal,normalize=0", "performer:features=16,causal", "polaformer",
                           "sana", "normattn:causal", "efficient:causal"}) {
    SCOPED_TRACE(text);
    const MechanismInfo i = info(parse_mechanism(text));
    ASSERT_EQ(i.cache, CacheKind::state);
    Qkv x(2, 3, 5, 5, 6, 4, 1);
    const auto s = state_shape(x.q.view, x.k.view, x.v.view, parse_mechanism(text));
    // The rule's symbols replaced by this call's sizes gives the shape.
    std::string rule = i.state_shape;
    const std::string expect = "(" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) + ", " + std::to_string(s[3]) + ")";
    std::string got = rule;
    auto sub = [&](const std::string& from, const std::string& to) {
      for (size_t at; (at = got.find(from)) != std::string::npos;) got.replace(at, from.size(), to);
    };
    sub("Dv / 2 + 1", "3"), sub("Dv + 2", "6"), sub("Dv + 1", "5"), sub("Dv", "4"), sub("4 D", "24"), sub("2 D", "12");
    sub("(B, H, D,", "(2, 3, 6,"), sub("B, H", "2, 3");
    EXPECT_EQ(got, expect) << "rule " << rule;
  }
}

TEST(Info, DeclaredParamsAreTheOnesAttendAccepts) {
  // Every declared param, drawn by its declared rule with its declared shape, is accepted.
  for (const char* text : {"softmax:score=additive", "lsh:buckets=4,rounds=2,chunk=4", "linformer:k=8", "linear:causal",
                           "normattn:causal", "performer:features=8,causal", "sana:causal", "polaformer:causal",
                           "efficient:causal"}) {
    SCOPED_TRACE(text);
    const MechanismInfo i = info(parse_mechanism(text));
    ASSERT_FALSE(i.params.empty());
    harness::Case c;
    c.mechanism = text, c.N = c.M = 9, c.D = 8, c.Dv = 6;
    for (const ParamInfo& p : i.params) {
      EXPECT_FALSE(p.generate.empty());
      if (p.optional) c.extras.params.push_back(p.name);
    }
    harness::Inputs in;
    harness::make_inputs(c, in);
    EXPECT_EQ(in.options.params.size(), i.params.size());
    EXPECT_NO_THROW(attend(in.q.view, in.k.view, in.v.view, in.mechanism, in.options));
    in.options.params["undeclared"] = in.options.params.begin()->second;
    testing::expect_error([&] { attend(in.q.view, in.k.view, in.v.view, in.mechanism, in.options); }, "undeclared");
  }
  const MechanismInfo additive = info(parse_mechanism("softmax:score=additive"));
  ASSERT_EQ(additive.params.size(), 3u);
  EXPECT_FALSE(additive.params[0].optional);
  const MechanismInfo lsh = info(parse_mechanism("lsh:buckets=8,rounds=3"));
  EXPECT_EQ(lsh.params.at(0).shape, (std::vector<std::string>{"3", "D", "4"}));
  const MechanismInfo lin = info(parse_mechanism("linformer:k=16"));
  EXPECT_EQ(lin.params.at(0).shape, (std::vector<std::string>{"16", "M"}));
  EXPECT_EQ(lin.params.at(0).generate, "normal:0.250000");
}

TEST(Info, OnlyDcaAppliesPositionsItself) {
  for (const MechanismInfo& fam : family_infos()) EXPECT_EQ(fam.applies_positions, fam.family == "dca") << fam.family;
}

}  // namespace
}  // namespace attn
