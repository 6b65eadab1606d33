// The serving engine (include/attn/engine.hpp): a queue of requests, a thread that runs steps of
// every running sequence through Decoder::forward_paged, the KV blocks and the prefix cache.
//
// A step: admit waiting requests while fewer than `parallel` run (each starts with the longest
// run of its prompt's blocks the prefix cache holds); free the blocks each sequence's window has
// left; give every decoding sequence one token and the prefilling ones a chunk each, in admission
// order, under the prefill budget; take the blocks they write (preempting the newest sequence
// when the pool is short); run the step; sample a token for each sequence whose computed tokens
// reached the end of its context.
//
// Batch invariance rests on three rules: forward_paged computes each sequence's rows as it would
// alone (row-wise products, attention per sequence); a sequence's prompt is cut into chunks at
// fixed positions (multiples of kChunk), whatever else runs, so each attention call of it sees
// the same queries in every run; and a prefix cache match is used in whole chunks.
#include "attn/engine.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <list>
#include <mutex>
#include <numeric>
#include <thread>

#include "attn/error.hpp"
#include "attn/info.hpp"
#include "model/memory_need.hpp"
#include "serve/kv_blocks.hpp"
#include "serve/token_logprobs.hpp"

namespace attn {

using Clock = std::chrono::steady_clock;

// ---- a request's stream -------------------------------------------------------------------

struct EngineStream::State {
  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<EngineEvent> events;
  std::atomic<bool> cancelled{false};
  int64_t prompt_tokens = 0, cached_tokens = 0;
  std::vector<TokenLogprob> prompt_logprobs;

  void push(EngineEvent e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(std::move(e));
    }
    cv.notify_all();
  }
};

EngineStream::EngineStream(std::shared_ptr<State> state) : s_(std::move(state)) {}

bool EngineStream::next(EngineEvent& event, std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(s_->mu);
  if (!s_->cv.wait_for(lock, wait, [&] { return !s_->events.empty(); })) return false;
  event = std::move(s_->events.front());
  s_->events.pop_front();
  return true;
}

void EngineStream::cancel() { s_->cancelled = true; }

int64_t EngineStream::prompt_tokens() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->prompt_tokens;
}

int64_t EngineStream::cached_tokens() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->cached_tokens;
}

std::vector<TokenLogprob> EngineStream::prompt_logprobs() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->prompt_logprobs;
}

// ---- the engine ---------------------------------------------------------------------------

namespace {

// Prompt chunks start at multiples of this many positions (see the top of the file).
constexpr int64_t kChunk = 64;

Histogram make_histogram(std::vector<double> bounds) {
  Histogram h;
  h.counts.assign(bounds.size(), 0);
  h.bounds = std::move(bounds);
  return h;
}

void observe(Histogram& h, double v) {
  for (size_t i = 0; i < h.bounds.size(); ++i)
    if (v <= h.bounds[i]) ++h.counts[i];
  ++h.count, h.sum += v;
}

}  // namespace

struct Engine::Impl {
  // One request from submit to done.
  struct Sequence {
    std::shared_ptr<EngineStream::State> stream;
    EngineRequest request;
    Sampler sampler;
    std::vector<int32_t> tokens;  // prompt, then generated
    int64_t prompt_len = 0;
    int64_t computed = 0;         // positions whose K and V rows are in `blocks`
    std::vector<int32_t> blocks;  // block table (0: freed, a window's past)
    std::vector<uint64_t> keys;   // published blocks' keys, in order
    int64_t generated = 0;
    int64_t order = 0;            // admission order (preemption takes the largest)
    Clock::time_point submitted, last_token;
    bool started = false;         // admitted at least once (its prompt counted)
    bool done = false;            // ended: leaves `running` after this step
  };

  Decoder decoder;
  EngineOptions options;
  serve::KvBlocks blocks;
  int64_t lookback = -1, sinks = 0, align = 1;  // every layer's past is bounded: the largest bound
  int64_t vocab = 0;

  mutable std::mutex mu;  // guards the queue, flags and metrics
  std::condition_variable wake;
  std::deque<std::unique_ptr<Sequence>> waiting;
  std::vector<std::unique_ptr<Sequence>> running;  // the engine thread's (metrics read the count)
  bool accepting = true, stopping = false;
  EngineMetrics m;
  int64_t next_order = 0;
  std::thread thread;

  Impl(Decoder d, const EngineOptions& o) : decoder(std::move(d)), options(o), blocks(resolve(decoder, options)) {
    const DecoderConfig& c = decoder.config();
    vocab = c.vocab_size;
    decoder.set_kv_pool(blocks.total() + 1, options.block_size);
    bool all_bounded = true;
    for (const DecoderLayerSpec& l : c.layers) {
      const MechanismInfo f = info(l.mechanism);
      if (f.lookback < 0) all_bounded = false;
      lookback = std::max(lookback, f.lookback), sinks = std::max(sinks, f.sinks), align = std::max(align, f.align);
    }
    if (!all_bounded) lookback = -1;
    m.time_to_first_token = make_histogram({0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60});
    m.inter_token_latency = make_histogram({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5});
    m.kv_blocks_total = blocks.total();
    thread = std::thread([this] { run(); });
  }

  // The options with their defaults filled in (checked), and the blocks of the pool.
  static serve::KvBlocks resolve(const Decoder& d, EngineOptions& o) {
    const std::string where = "engine options";
    const DecoderConfig& c = d.config();
    if (o.parallel < 1 || o.parallel > 1024) fail(where, "parallel must be in [1, 1024], got " + std::to_string(o.parallel));
    if (o.block_size < 1 || o.block_size > 4096)
      fail(where, "block_size must be in [1, 4096], got " + std::to_string(o.block_size));
    if (o.queue < 0) fail(where, "queue must be >= 0, got " + std::to_string(o.queue));
    if (o.max_context == 0) o.max_context = c.max_seq_len;
    if (o.max_context < 1 || o.max_context > c.max_seq_len)
      fail(where, "max_context must be in [1, " + std::to_string(c.max_seq_len) + "] (the decoder's max_seq_len), got " +
                      std::to_string(o.max_context));
    const int64_t step = model::kStepTokens;  // Decoder::max_step_tokens() once the pool is set
    if (o.parallel > step - kChunk)
      fail(where, "parallel must be at most " + std::to_string(step - kChunk) + " (a step's " + std::to_string(step) +
                      " tokens less one prompt chunk of " + std::to_string(kChunk) + "), got " + std::to_string(o.parallel));
    if (o.prefill_budget == 0) o.prefill_budget = (step - o.parallel) / kChunk * kChunk;
    if (o.prefill_budget < kChunk || o.prefill_budget % kChunk != 0 || o.prefill_budget + o.parallel > step)
      fail(where, "prefill_budget must be a multiple of " + std::to_string(kChunk) + " in [" + std::to_string(kChunk) + ", " +
                      std::to_string(step - o.parallel) + "] (a step's " + std::to_string(step) +
                      " tokens less parallel), got " + std::to_string(o.prefill_budget));
    const int64_t block_bytes = d.kv_pool_block_bytes(o.block_size);
    if (o.kv_memory_mib < 1) fail(where, "kv_memory_mib must be >= 1, got " + std::to_string(o.kv_memory_mib));
    const int64_t count = (o.kv_memory_mib << 20) / block_bytes;
    if (count < 2)
      fail(where, "kv_memory_mib " + std::to_string(o.kv_memory_mib) + " holds " + std::to_string(count) +
                      " blocks of " + std::to_string(block_bytes) + " bytes; at least 2 are needed");
    return serve::KvBlocks(count, o.block_size);
  }

  ~Impl() { stop(std::chrono::milliseconds(0)); }

  void stop(std::chrono::milliseconds grace) {
    {
      std::unique_lock<std::mutex> lock(mu);
      accepting = false;
      const auto deadline = Clock::now() + grace;
      wake.notify_all();
      wake.wait_until(lock, deadline, [&] { return waiting.empty() && m.running_sequences == 0; });
      stopping = true;
    }
    wake.notify_all();
    if (thread.joinable()) thread.join();
  }

  std::shared_ptr<EngineStream> submit(EngineRequest r) {
    const std::string where = "request";
    const int64_t n = static_cast<int64_t>(r.prompt.size());
    if (n == 0) fail(where, "prompt must hold at least one token");
    for (size_t i = 0; i < r.prompt.size(); ++i)
      if (r.prompt[i] < 0 || r.prompt[i] >= vocab)
        fail(where, "prompt[" + std::to_string(i) + "] must be a token id in [0, " + std::to_string(vocab) + "), got " +
                        std::to_string(r.prompt[i]));
    if (r.max_tokens < 0) fail(where, "max_tokens must be >= 0, got " + std::to_string(r.max_tokens));
    if (n + r.max_tokens > options.max_context)
      fail(where, "the prompt's " + std::to_string(n) + " tokens and max_tokens " + std::to_string(r.max_tokens) +
                      " exceed the context of " + std::to_string(options.max_context) + " tokens");
    // blocks held at once at most: every position, or a bounded model's sinks, window and chunk
    int64_t need = (n + r.max_tokens + options.block_size - 1) / options.block_size;
    if (lookback >= 0)
      need = std::min(need, (sinks + options.block_size - 1) / options.block_size +
                                (lookback + align + kChunk + options.block_size - 1) / options.block_size + 2);
    if (need > blocks.total())
      fail(where, "the prompt's " + std::to_string(n) + " tokens and max_tokens " + std::to_string(r.max_tokens) +
                      " need " + std::to_string(need) + " KV blocks; the pool holds " + std::to_string(blocks.total()));
    if (r.logprobs < -1 || r.logprobs > 5) fail(where, "logprobs must be in [-1, 5], got " + std::to_string(r.logprobs));
    if (!(r.timeout_s >= 0)) fail(where, "timeout_s must be >= 0, got " + std::to_string(r.timeout_s));
    for (const int32_t t : r.stop_tokens)
      if (t < 0 || t >= vocab) fail(where, "stop_tokens: " + std::to_string(t) + " is not a token id");
    auto s = std::make_unique<Sequence>(Sequence{.stream = std::make_shared<EngineStream::State>(),
                                                 .request = {},
                                                 .sampler = Sampler(r.sampling)});
    s->tokens = r.prompt;
    s->prompt_len = n;
    s->request = std::move(r);
    s->submitted = Clock::now();
    s->stream->prompt_tokens = n;
    auto stream = std::make_shared<EngineStream>(s->stream);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!accepting) {
        EngineBusy busy("the engine is shutting down");
        busy.shutting_down = true;
        throw busy;
      }
      if (static_cast<int64_t>(waiting.size()) >= options.queue + std::max<int64_t>(0, options.parallel - m.running_sequences))
        throw EngineBusy("the queue is full (" + std::to_string(options.queue) + " requests waiting)");
      waiting.push_back(std::move(s));
      m.queue_length = static_cast<int64_t>(waiting.size());
    }
    wake.notify_all();
    return stream;
  }

  // ---- the engine's thread ----
  void run() {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu);
        wake.wait(lock, [&] { return stopping || !waiting.empty() || !running.empty(); });
        if (stopping) break;
        admit();
      }
      step();
    }
    std::lock_guard<std::mutex> lock(mu);
    for (auto& s : running) finish(*s, "shutdown");
    for (auto& s : waiting) finish(*s, "shutdown");
    running.clear(), waiting.clear();
    publish_counts();
  }

  // Moves waiting requests to running (under mu) while there is room; expired or cancelled
  // waiting requests end here.
  void admit() {
    for (auto it = waiting.begin(); it != waiting.end();) {
      if (ended((*it)->stream->cancelled, **it)) {
        finish(**it, (*it)->stream->cancelled ? "cancelled" : "timeout");
        it = waiting.erase(it);
        continue;
      }
      ++it;
    }
    while (!waiting.empty() && static_cast<int64_t>(running.size()) < options.parallel) {
      std::unique_ptr<Sequence> s = std::move(waiting.front());
      waiting.pop_front();
      start(*s);
      running.push_back(std::move(s));
    }
    publish_counts();
  }

  bool ended(bool cancelled, const Sequence& s) const {
    return cancelled || (s.request.timeout_s > 0 &&
                         std::chrono::duration<double>(Clock::now() - s.submitted).count() > s.request.timeout_s);
  }

  // A sequence starts (or restarts after preemption): the prefix cache's blocks for its tokens.
  void start(Sequence& s) {
    s.order = next_order++;
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    int64_t reuse = 0;
    if (options.prefix_cache && !s.request.prompt_logprobs) {
      // whole chunks, and never the last token (its logits are needed)
      const int64_t usable = (n - 1) / kChunk * kChunk;
      serve::KvBlocks::Match found = blocks.match(s.tokens, usable / options.block_size);
      const int64_t unit = std::lcm(options.block_size, kChunk);
      const int64_t whole = static_cast<int64_t>(found.ids.size()) * options.block_size / unit * unit;
      while (static_cast<int64_t>(found.ids.size()) * options.block_size > whole) {  // keep whole chunks only
        blocks.release(found.ids.back());
        found.ids.pop_back(), found.keys.pop_back();
      }
      s.blocks = std::move(found.ids);
      s.keys = std::move(found.keys);
      reuse = whole;
    }
    s.computed = reuse;
    if (!s.started) {
      s.started = true;
      m.prompt_tokens_total += s.prompt_len;
      if (reuse > 0) ++m.prefix_cache_hits_total, m.prefix_cached_tokens_total += reuse;
      std::lock_guard<std::mutex> lock(s.stream->mu);
      s.stream->cached_tokens = reuse;
    }
  }

  // Releases every block the sequence holds, publishing its full blocks first (a preempted
  // sequence finds them again; a finished one leaves them to later prompts).
  void release_blocks(Sequence& s) {
    if (options.prefix_cache) {
      const int64_t full = std::min<int64_t>(s.computed / options.block_size, static_cast<int64_t>(s.blocks.size()));
      for (int64_t b = static_cast<int64_t>(s.keys.size()); b < full; ++b) {
        const uint64_t parent = b == 0 ? 0 : s.keys.back();
        const auto part = std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(b * options.block_size),
                                                                     static_cast<size_t>(options.block_size));
        if (s.blocks[static_cast<size_t>(b)] == 0) break;  // a window's past: the chain stops
        s.keys.push_back(blocks.publish(s.blocks[static_cast<size_t>(b)], parent, part));
      }
    }
    for (const int32_t id : s.blocks)
      if (id != 0) blocks.release(id);
    s.blocks.clear(), s.keys.clear();
    s.computed = 0;
  }

  // Ends a sequence: its done event (under mu or from the engine's thread).
  void finish(Sequence& s, const std::string& reason, const std::string& error = "") {
    EngineEvent e;
    e.kind = EngineEvent::Kind::done;
    e.finish_reason = reason;
    e.error = error;
    s.stream->push(std::move(e));
  }

  // (under mu) The gauges; and when nothing waits or runs any more, shutdown() is woken: every
  // path that empties the engine passes here.
  void publish_counts() {
    m.queue_length = static_cast<int64_t>(waiting.size());
    m.running_sequences = static_cast<int64_t>(running.size());
    m.kv_blocks_in_use = blocks.in_use();
    m.kv_blocks_cached = blocks.cached();
    if (waiting.empty() && running.empty()) wake.notify_all();
  }

  // Frees the blocks a bounded model's windows have left (every layer sees at most `lookback`
  // positions back, after the first `sinks`).
  void free_window_past(Sequence& s) {
    if (lookback < 0) return;
    const int64_t keep_from = std::max<int64_t>(0, s.computed - lookback - align);
    for (int64_t b = 0; b < static_cast<int64_t>(s.blocks.size()); ++b) {
      const int64_t first = b * options.block_size, last = first + options.block_size - 1;
      if (last >= keep_from) break;
      if (first < sinks || s.blocks[static_cast<size_t>(b)] == 0) continue;
      blocks.release(s.blocks[static_cast<size_t>(b)]);
      s.blocks[static_cast<size_t>(b)] = 0;
    }
  }

  // Takes blocks so that `s` covers `upto` positions; false when the pool is short.
  bool cover(Sequence& s, int64_t upto) {
    const int64_t need = (upto + options.block_size - 1) / options.block_size;
    while (static_cast<int64_t>(s.blocks.size()) < need) {
      const int32_t id = blocks.take();
      if (id < 0) return false;
      s.blocks.push_back(id);
    }
    return true;
  }

  // Preempts the most recently admitted running sequence other than `keep` (or `keep` itself
  // when it is the only one): its blocks go, it waits at the front of the queue to be recomputed.
  void preempt(Sequence* keep) {
    auto victim = running.end();
    for (auto it = running.begin(); it != running.end(); ++it)
      if (it->get() != keep && (victim == running.end() || (*it)->order > (*victim)->order)) victim = it;
    if (victim == running.end())
      for (auto it = running.begin(); it != running.end(); ++it)
        if (it->get() == keep) victim = it;
    release_blocks(**victim);
    std::lock_guard<std::mutex> lock(mu);
    ++m.preemptions_total;
    waiting.push_front(std::move(*victim));
    running.erase(victim);
    publish_counts();
  }

  void step() {
    // cancelled and expired sequences end first; their blocks go back
    for (auto it = running.begin(); it != running.end();) {
      Sequence& s = **it;
      if (ended(s.stream->cancelled, s)) {
        release_blocks(s);
        finish(s, s.stream->cancelled ? "cancelled" : "timeout");
        it = running.erase(it);
        continue;
      }
      ++it;
    }
    // plan: decoding sequences first (consecutive one-token rows), then prompt chunks
    struct Planned {
      Sequence* s;
      int64_t n;
    };
    std::vector<Planned> plan;
    for (bool decoding : {true, false}) {
      int64_t budget = options.prefill_budget;
      std::vector<Sequence*> order;
      for (auto& s : running) order.push_back(s.get());
      std::sort(order.begin(), order.end(), [](const Sequence* a, const Sequence* b) { return a->order < b->order; });
      for (Sequence* s : order) {
        const int64_t left = static_cast<int64_t>(s->tokens.size()) - s->computed;
        if ((left == 1) != decoding) continue;
        int64_t n = 1;
        if (!decoding) {
          n = std::min(left, (s->computed / kChunk + 1) * kChunk - s->computed);
          if (n > budget) continue;
          budget -= n;
        }
        plan.push_back({s, n});
      }
    }
    // blocks: the window's past goes, then each planned sequence takes what it writes
    for (auto& s : running) free_window_past(*s);
    // (a preemption frees blocks of sequences planned before: the walk starts over, and the
    // sequences already covered take nothing more)
    for (size_t i = 0; i < plan.size();) {
      Sequence* s = plan[i].s;
      if (cover(*s, s->computed + plan[i].n)) {
        ++i;
        continue;
      }
      preempt(s);
      std::erase_if(plan, [&](const Planned& p) {
        return std::none_of(running.begin(), running.end(), [&](const auto& r) { return r.get() == p.s; });
      });
      i = 0;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      publish_counts();
    }
    if (plan.empty()) return;
    std::vector<PagedSequence> seqs;
    for (const Planned& p : plan) {
      Sequence& s = *p.s;
      PagedSequence q;
      q.tokens = std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(s.computed), static_cast<size_t>(p.n));
      q.pos = s.computed;
      q.blocks = s.blocks;
      q.all_logits = s.request.prompt_logprobs && s.computed < s.prompt_len;
      seqs.push_back(q);
    }
    const std::vector<float>* logits = nullptr;
    try {
      logits = &decoder.forward_paged(seqs);
    } catch (const std::exception& e) {  // a bug, not a request's fault: every planned sequence ends
      for (const Planned& p : plan) end(*p.s, "error", e.what());
      std::erase_if(running, [](const auto& r) { return r->done; });
      std::lock_guard<std::mutex> lock(mu);
      publish_counts();
      return;
    }
    const auto now = Clock::now();
    int64_t row = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
      Sequence& s = *plan[i].s;
      const int64_t n = plan[i].n;
      const int64_t rows = seqs[i].all_logits ? n : 1;
      const float* last = logits->data() + (row + rows - 1) * vocab;
      if (seqs[i].all_logits) record_prompt_logprobs(s, logits->data() + row * vocab, n);
      row += rows;
      s.computed += n;
      if (s.computed < static_cast<int64_t>(s.tokens.size())) continue;  // more prompt to go
      emit_token(s, last, now);
    }
    std::lock_guard<std::mutex> lock(mu);
    ++m.steps_total;
    // finished sequences leave
    for (auto it = running.begin(); it != running.end();) {
      if ((*it)->done) {
        it = running.erase(it);
        continue;
      }
      ++it;
    }
    publish_counts();
  }

  // The logprobs of the prompt tokens after the chunk's rows (row r predicts token pos + r + 1).
  void record_prompt_logprobs(Sequence& s, const float* rows, int64_t n) {
    const int64_t pos = s.computed;
    std::lock_guard<std::mutex> lock(s.stream->mu);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t next = pos + r + 1;
      if (next >= s.prompt_len) break;
      if (next - 1 < static_cast<int64_t>(s.stream->prompt_logprobs.size())) continue;  // recomputed after a preemption
      s.stream->prompt_logprobs.push_back(
          serve::token_logprob(rows + r * vocab, vocab, s.tokens[static_cast<size_t>(next)], std::max(0, s.request.logprobs)));
    }
  }

  // Samples the next token from the last row's logits, reports it, and ends the sequence when it
  // is done (its blocks released: `blocks` empty and the stream cancelled mark it to leave).
  void emit_token(Sequence& s, const float* logits, Clock::time_point now) {
    if (s.request.max_tokens == 0) return end(s, "length");
    int32_t token = 0;
    try {
      token = s.sampler.next(logits, vocab, s.tokens);
    } catch (const Error& e) {  // non-finite logits
      return end(s, "error", e.what());
    }
    EngineEvent e;
    e.kind = EngineEvent::Kind::token;
    e.token = token;
    if (s.request.logprobs >= 0) e.logprob = serve::token_logprob(logits, vocab, token, s.request.logprobs);
    s.stream->push(std::move(e));
    s.tokens.push_back(token);
    ++s.generated;
    {
      std::lock_guard<std::mutex> lock(mu);
      ++m.generated_tokens_total;
      const double since = std::chrono::duration<double>(now - (s.generated == 1 ? s.submitted : s.last_token)).count();
      observe(s.generated == 1 ? m.time_to_first_token : m.inter_token_latency, since);
    }
    s.last_token = now;
    if (std::find(s.request.stop_tokens.begin(), s.request.stop_tokens.end(), token) != s.request.stop_tokens.end())
      return end(s, "stop");
    if (s.generated >= s.request.max_tokens || static_cast<int64_t>(s.tokens.size()) >= options.max_context)
      return end(s, "length");
  }

  void end(Sequence& s, const std::string& reason, const std::string& error = "") {
    release_blocks(s);
    finish(s, reason, error);
    s.done = true;
  }
};

Engine::Engine(Decoder decoder, const EngineOptions& options)
    : impl_(std::make_unique<Impl>(std::move(decoder), options)) {}
Engine::~Engine() = default;

std::shared_ptr<EngineStream> Engine::submit(EngineRequest request) { return impl_->submit(std::move(request)); }

EngineMetrics Engine::metrics() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->m;
}

void Engine::shutdown(std::chrono::milliseconds grace) { impl_->stop(grace); }
const EngineOptions& Engine::options() const { return impl_->options; }
const Decoder& Engine::decoder() const { return impl_->decoder; }
int64_t Engine::kv_block_bytes() const { return impl_->decoder.kv_pool_block_bytes(impl_->options.block_size); }

}  // namespace attn
