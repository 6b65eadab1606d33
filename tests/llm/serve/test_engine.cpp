// The serving engine and the decoder's paged step: a sequence's logits from the pool equal the
// decoder's own forward, alone and batched the same bits; the engine's replies do not depend on
// what runs beside them (greedy and seeded sampling), the prefix cache reuses whole chunks,
// cancellation and the end of a reply give every block back, a short pool preempts and still
// finishes every request, windows free their past, bad requests are Errors.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <random>
#include <thread>

#include "attn/engine.hpp"
#include "attn/model.hpp"
#include "support/expect_error.hpp"

namespace attn {
namespace {

using namespace std::chrono_literals;
using testing::expect_error;

// hidden_dim 72 is not a multiple of any vector width: the gated activation's scalar tail is
// inside every row.
Decoder small_decoder(const Mechanism& mechanism = Softmax{.causal = true}, int64_t max_seq = 1024, int threads = 2) {
  DecoderConfig c;
  c.vocab_size = 61, c.dim = 48, c.hidden_dim = 72, c.heads = 4, c.kv_heads = 2, c.head_dim = 12;
  c.max_seq_len = max_seq, c.rope_theta = 500.0;
  c.layers = DecoderConfig::softmax_layers(2, mechanism);
  return Decoder::random(c, 7, DType::f32, threads);
}

std::vector<int32_t> random_tokens(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, 60);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = id(rng);
  return t;
}

struct Reply {
  std::vector<int32_t> tokens;
  std::string finish;
  std::vector<TokenLogprob> logprobs;
};

Reply collect(EngineStream& s) {
  Reply r;
  EngineEvent e;
  for (;;) {
    if (!s.next(e, 60s)) {
      ADD_FAILURE() << "no event in 60 s";
      return r;
    }
    if (e.kind == EngineEvent::Kind::done) {
      r.finish = e.finish_reason;
      EXPECT_TRUE(e.error.empty()) << e.error;
      return r;
    }
    r.tokens.push_back(e.token);
    r.logprobs.push_back(e.logprob);
  }
}

EngineRequest request(std::vector<int32_t> prompt, int64_t max_tokens, double temperature = 0, uint64_t seed = 0) {
  EngineRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  return r;
}

// Waits until the engine holds no sequence (the done event precedes the step's bookkeeping).
EngineMetrics settled(const Engine& e) {
  EngineMetrics m = e.metrics();
  for (int i = 0; i < 2000 && (m.running_sequences > 0 || m.kv_blocks_in_use > 0); ++i) {
    std::this_thread::sleep_for(5ms);
    m = e.metrics();
  }
  return m;
}

TEST(PagedStep, LogitsMatchTheDecodersForwardAndDoNotDependOnTheOtherSequences) {
  Decoder d = small_decoder();
  const std::vector<int32_t> a = random_tokens(150, 1), b = random_tokens(7, 2), c = random_tokens(1, 3);
  d.reset();
  const std::vector<float> want = d.forward(a, 0, true);
  d.set_kv_pool(40, 16);
  // sequence a alone in chunks (its blocks scattered: 3, 5, ...), then beside b and c
  auto blocks_of = [](int32_t first, int64_t count) {
    std::vector<int32_t> t;
    for (int64_t i = 0; i < count; ++i) t.push_back(first + 2 * static_cast<int32_t>(i));
    return t;
  };
  const std::vector<int32_t> ta = blocks_of(3, 10), tb = {2}, tc = {4};
  std::vector<float> alone, batched;
  for (int64_t p = 0; p < 150; p += 64) {
    const int64_t n = std::min<int64_t>(64, 150 - p);
    const PagedSequence s{std::span(a).subspan(static_cast<size_t>(p), static_cast<size_t>(n)), p, ta, true};
    const std::vector<float>& out = d.forward_paged(std::span(&s, 1));
    alone.insert(alone.end(), out.begin(), out.end());
  }
  ASSERT_EQ(alone.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(alone[i] - want[i])));
  EXPECT_LT(worst, 2e-4);
  for (int64_t p = 0; p < 150; p += 64) {
    const int64_t n = std::min<int64_t>(64, 150 - p);
    const std::vector<PagedSequence> step{{std::span(c), 0, tc, false},
                                          {std::span(a).subspan(static_cast<size_t>(p), static_cast<size_t>(n)), p, ta, true},
                                          {std::span(b), 0, tb, false}};
    const std::vector<float>& out = d.forward_paged(step);
    ASSERT_EQ(out.size(), static_cast<size_t>((n + 2) * 61));
    batched.insert(batched.end(), out.begin() + 61, out.end() - 61);
  }
  ASSERT_EQ(alone.size(), batched.size());
  for (size_t i = 0; i < alone.size(); ++i)
    ASSERT_EQ(alone[i], batched[i]) << "logit " << i % 61 << " of row " << i / 61;  // bit for bit
}

TEST(PagedStep, BadStepsAreErrorsThatWriteNothing) {
  Decoder d = small_decoder();
  const std::vector<int32_t> a = random_tokens(20, 1);
  expect_error([&] { d.forward_paged({}); }, "no KV pool");
  d.set_kv_pool(8, 16);
  const std::vector<int32_t> short_table{1}, with_null{0, 2}, bad_id{1, 9};
  const PagedSequence too_few{std::span(a), 0, short_table, false};
  expect_error([&] { d.forward_paged(std::span(&too_few, 1)); }, "blocks must cover 20 positions");
  const PagedSequence null_written{std::span(a), 0, with_null, false};
  expect_error([&] { d.forward_paged(std::span(&null_written, 1)); }, "null block 0");
  const PagedSequence out_of_pool{std::span(a), 0, bad_id, false};
  expect_error([&] { d.forward_paged(std::span(&out_of_pool, 1)); }, "must be in [0, 8), got 9");
  const std::vector<int32_t> t12{1, 2};
  const std::vector<PagedSequence> twice{{std::span(a), 0, t12, false}, {std::span(a), 0, t12, false}};
  expect_error([&] { d.forward_paged(twice); }, "written by two sequences");
  DecoderConfig lin = d.config();
  lin.layers = DecoderConfig::softmax_layers(2, parse_mechanism("linear:map=elu,causal"));
  Decoder r = Decoder::random(lin, 1);
  expect_error([&] { r.set_kv_pool(8, 16); }, "recurrent state");
}

TEST(Engine, RepliesAreTheSameAloneAndBesideFifteenOthers) {
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 16; ++i)
    requests.push_back(request(random_tokens(5 + 23 * i, 100 + i), 12 + i % 5, i % 2 ? 0.9 : 0.0, 1000 + i));
  EngineOptions o;
  o.parallel = 16, o.kv_memory_mib = 64;
  std::vector<Reply> alone, together;
  {
    Engine e(small_decoder(), o);
    for (const EngineRequest& r : requests) alone.push_back(collect(*e.submit(r)));
  }
  {
    Engine e(small_decoder(), o);
    std::vector<std::shared_ptr<EngineStream>> streams;
    for (const EngineRequest& r : requests) streams.push_back(e.submit(r));
    for (auto& s : streams) together.push_back(collect(*s));
    const EngineMetrics m = settled(e);
    EXPECT_EQ(m.kv_blocks_in_use, 0);
    EXPECT_EQ(m.running_sequences, 0);
    EXPECT_EQ(m.generated_tokens_total, m.time_to_first_token.count + m.inter_token_latency.count);
    EXPECT_EQ(m.preemptions_total, 0);
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(alone[i].tokens, together[i].tokens) << "request " << i;
    EXPECT_EQ(alone[i].finish, "length");
    EXPECT_EQ(static_cast<int64_t>(alone[i].tokens.size()), requests[i].max_tokens);
  }
}

TEST(Engine, GreedyRepliesEqualTheDecodersOwnGreedyTokens) {
  Decoder ref = small_decoder();
  std::vector<int32_t> ctx = random_tokens(90, 5);
  const std::vector<int32_t> prompt = ctx;
  std::vector<int32_t> want;
  const std::vector<float>* logits = &ref.forward(ctx, 0);
  for (int i = 0; i < 10; ++i) {
    const int32_t t = static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
    want.push_back(t);
    logits = &ref.forward({t}, ref.position());
  }
  Engine e(small_decoder(), EngineOptions{});
  EXPECT_EQ(collect(*e.submit(request(prompt, 10))).tokens, want);
}

TEST(Engine, ARepeatedPromptReusesItsCachedChunksAndAnswersTheSame) {
  EngineOptions o;
  o.parallel = 4;
  Engine e(small_decoder(), o);
  const std::vector<int32_t> prompt = random_tokens(300, 9);
  auto first = e.submit(request(prompt, 8));
  const Reply r1 = collect(*first);
  EXPECT_EQ(first->cached_tokens(), 0);
  settled(e);
  EXPECT_GT(e.metrics().kv_blocks_cached, 0);
  auto second = e.submit(request(prompt, 8));
  const Reply r2 = collect(*second);
  EXPECT_EQ(second->cached_tokens(), 256);  // whole chunks of 64, never the last token
  EXPECT_EQ(r1.tokens, r2.tokens);
  EXPECT_EQ(e.metrics().prefix_cache_hits_total, 1);
  // a prompt that shares only its first 100 tokens reuses the first chunk
  std::vector<int32_t> other = prompt;
  other[100] = (other[100] + 1) % 61;
  auto third = e.submit(request(other, 1));
  collect(*third);
  EXPECT_EQ(third->cached_tokens(), 64);
}

TEST(Engine, CancellingAndFinishingGiveEveryBlockBack) {
  Engine e(small_decoder(), EngineOptions{});
  auto s = e.submit(request(random_tokens(40, 3), 900));
  EngineEvent ev;
  ASSERT_TRUE(s->next(ev, 60s));
  EXPECT_EQ(ev.kind, EngineEvent::Kind::token);
  s->cancel();
  const Reply rest = collect(*s);
  EXPECT_EQ(rest.finish, "cancelled");
  EngineMetrics m = settled(e);
  EXPECT_EQ(m.kv_blocks_in_use, 0);
  EXPECT_EQ(m.running_sequences, 0);
  EXPECT_EQ(collect(*e.submit(request(random_tokens(3, 4), 0))).finish, "length");  // max_tokens 0: scoring only
}

TEST(Engine, AShortPoolPreemptsAndStillFinishesEveryRequest) {
  EngineOptions o;
  o.parallel = 8, o.block_size = 16;
  Decoder d = small_decoder();
  // room for ~1.5 sequences of 400 positions: they must take turns
  o.kv_memory_mib = 1;
  const int64_t block_bytes = d.kv_pool_block_bytes(16);
  ASSERT_GT((int64_t{1} << 20) / block_bytes, 30);
  Engine e(std::move(d), o);
  const int64_t positions = e.metrics().kv_blocks_total * 16;
  const int64_t prompt = positions / 3, gen = std::min<int64_t>(positions / 4, 1024 - prompt);
  std::vector<std::shared_ptr<EngineStream>> streams;
  for (int i = 0; i < 6; ++i) streams.push_back(e.submit(request(random_tokens(prompt, 40 + i), gen)));
  for (auto& s : streams) {
    const Reply r = collect(*s);
    EXPECT_EQ(r.finish, "length");
    EXPECT_EQ(static_cast<int64_t>(r.tokens.size()), gen);
  }
  const EngineMetrics m = settled(e);
  EXPECT_GT(m.preemptions_total, 0);
  EXPECT_EQ(m.kv_blocks_in_use, 0);
}

TEST(Engine, AWindowedModelFreesItsPastAndServesMoreThanThePoolHolds) {
  EngineOptions o;
  o.parallel = 2, o.kv_memory_mib = 1;
  Decoder d = small_decoder(parse_mechanism("softmax:causal,window=63:0"), 4096);
  Engine e(std::move(d), o);
  const int64_t positions = e.metrics().kv_blocks_total * 16;
  auto s = e.submit(request(random_tokens(200, 8), positions + 100));  // longer than the pool
  const Reply r = collect(*s);
  EXPECT_EQ(r.finish, "length");
  EXPECT_EQ(static_cast<int64_t>(r.tokens.size()), positions + 100);
  EXPECT_EQ(settled(e).kv_blocks_in_use, 0);
}

TEST(Engine, LogprobsAreTheLogSoftmaxOfTheRow) {
  Engine e(small_decoder(), EngineOptions{});
  EngineRequest r = request(random_tokens(30, 6), 4);
  r.logprobs = 3, r.prompt_logprobs = true;
  auto s = e.submit(r);
  const Reply got = collect(*s);
  const std::vector<TokenLogprob> prompt = s->prompt_logprobs();
  ASSERT_EQ(prompt.size(), 29u);
  for (size_t i = 0; i < prompt.size(); ++i) {
    EXPECT_EQ(prompt[i].token, r.prompt[i + 1]);
    EXPECT_LE(prompt[i].logprob, 0.0f);
    ASSERT_EQ(prompt[i].top.size(), 3u);
    EXPECT_GE(prompt[i].top[0].second, prompt[i].top[1].second);
  }
  for (const TokenLogprob& l : got.logprobs) {
    ASSERT_EQ(l.top.size(), 3u);
    EXPECT_EQ(l.top[0].first, l.token);  // greedy: the chosen token is the most likely
    EXPECT_EQ(l.top[0].second, l.logprob);
    double mass = 0;
    for (const auto& [id, lp] : l.top) mass += std::exp(lp);
    EXPECT_LE(mass, 1.0 + 1e-6);
  }
}

TEST(Engine, BadRequestsAndAFullQueueAreRefused) {
  EngineOptions o;
  o.parallel = 1, o.queue = 2, o.max_context = 500;
  Engine e(small_decoder(), o);
  expect_error([&] { e.submit(request({}, 4)); }, "prompt must hold at least one token");
  expect_error([&] { e.submit(request({1, 61}, 4)); }, "prompt[1] must be a token id in [0, 61), got 61");
  expect_error([&] { e.submit(request(random_tokens(400, 1), 101)); }, "exceed the context of 500 tokens");
  EngineRequest lp = request({1}, 1);
  lp.logprobs = 6;
  expect_error([&] { e.submit(lp); }, "logprobs must be in [-1, 5], got 6");
  // long requests submitted at once: one runs, two wait, the rest are refused; each accepted one
  // ends exactly once
  std::vector<std::shared_ptr<EngineStream>> accepted;
  int busy = 0;
  for (int i = 0; i < 12; ++i) {
    try {
      accepted.push_back(e.submit(request(random_tokens(10, i), 300)));
    } catch (const EngineBusy& b) {
      EXPECT_FALSE(b.shutting_down);
      ++busy;
    }
  }
  EXPECT_GT(busy, 0);
  EXPECT_LE(accepted.size(), 4u);
  for (auto& s : accepted) {
    EXPECT_EQ(collect(*s).finish, "length");
    EngineEvent extra;
    EXPECT_FALSE(s->next(extra, 1ms));
  }
  e.shutdown(0ms);
  try {
    e.submit(request({1}, 1));
    ADD_FAILURE() << "a stopped engine accepted a request";
  } catch (const EngineBusy& b) {
    EXPECT_TRUE(b.shutting_down);
  }
}

TEST(Engine, AModelOfShortContextStillBatchesAStepOfManySequences) {
  EngineOptions o;
  o.parallel = 12;
  Engine e(small_decoder(Softmax{.causal = true}, 48), o);  // a step of 256 rows, contexts of 48
  EXPECT_EQ(e.options().max_context, 48);
  std::vector<std::shared_ptr<EngineStream>> streams;
  for (int i = 0; i < 12; ++i) streams.push_back(e.submit(request(random_tokens(30, i), 18)));
  for (auto& s : streams) EXPECT_EQ(collect(*s).tokens.size(), 18u);
  EngineOptions too_many;
  too_many.parallel = 200;
  expect_error([&] { Engine(small_decoder(), too_many); }, "parallel must be at most 192");
  EngineOptions odd_budget;
  odd_budget.prefill_budget = 100;
  expect_error([&] { Engine(small_decoder(), odd_budget); }, "prefill_budget must be a multiple of 64");
}

// Many client threads at once, as the HTTP server's handlers are: submitting, reading, cancelling
// and reading the metrics while the engine runs (the ThreadSanitizer build runs this suite).
TEST(Engine, ClientThreadsSubmitReadAndCancelAtOnce) {
  EngineOptions o;
  o.parallel = 6, o.queue = 64;
  Engine e(small_decoder(), o);
  std::atomic<int> done{0}, cancelled{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 8; ++c)
    clients.emplace_back([&, c] {
      for (int i = 0; i < 3; ++i) {
        auto s = e.submit(request(random_tokens(10 + 30 * c + i, c * 10 + i), 40, c % 2 ? 0.7 : 0.0, c));
        EngineEvent ev;
        int tokens = 0;
        while (s->next(ev, 60s)) {
          if (ev.kind == EngineEvent::Kind::done) {
            (ev.finish_reason == "cancelled" ? cancelled : done)++;
            break;
          }
          if (++tokens == 5 && (c + i) % 3 == 0) s->cancel();
        }
      }
    });
  std::atomic<bool> stop{false};
  std::thread watcher([&] {
    while (!stop) {
      const EngineMetrics m = e.metrics();
      EXPECT_LE(m.kv_blocks_in_use + m.kv_blocks_cached, m.kv_blocks_total);
      std::this_thread::sleep_for(1ms);
    }
  });
  for (auto& t : clients) t.join();
  stop = true;
  watcher.join();
  EXPECT_EQ(done + cancelled, 24);
  EXPECT_GT(cancelled, 0);
  EXPECT_EQ(settled(e).kv_blocks_in_use, 0);
}

// shutdown() begun while a cancelled sequence is still in the engine returns once the engine has
// let it go (a step that ends with nothing to run wakes it), not at the end of its grace.
TEST(Engine, ShutdownReturnsOnceACancelledSequenceHasGone) {
  for (int round = 0; round < 5; ++round) {
    Engine e(small_decoder(), EngineOptions{});
    auto s = e.submit(request(random_tokens(10, round), 1000));
    EngineEvent ev;
    ASSERT_TRUE(s->next(ev, 60s));
    s->cancel();
    auto stopped = std::async(std::launch::async, [&] { e.shutdown(90s); });
    ASSERT_EQ(stopped.wait_for(60s), std::future_status::ready) << "round " << round;
    EXPECT_EQ(collect(*s).finish, "cancelled");
  }
}

TEST(Engine, ShutdownEndsWhatStillRuns) {
  Engine e(small_decoder(), EngineOptions{});
  auto s = e.submit(request(random_tokens(10, 1), 1000));
  EngineEvent ev;
  ASSERT_TRUE(s->next(ev, 60s));
  e.shutdown(0ms);
  EXPECT_EQ(collect(*s).finish, "shutdown");
}

}  // namespace
}  // namespace attn
