// A serving engine: many sequences decoded at once by one Decoder over one paged KV pool
// (continuous batching). `attn serve` puts an HTTP API over it; C++ programs can embed it.
//
// Every step runs one forward over every running sequence: a chunk of prompt for those still
// prefilling (under a token budget) and one token for each decoding one, so each weight matrix is
// read once per step for all of them. Sequences join and leave between steps.
//
// The KV pool is a set of blocks of `block_size` positions, each holding those positions' K and V
// rows in every layer; a sequence's block table lists its blocks in position order. Blocks are
// taken on demand. Full blocks of a prompt are remembered by a hash chain of their tokens (the
// prefix cache): a later prompt that starts with the same tokens shares them (read-only: a
// sequence writes only into blocks it alone holds) and skips their computation. Blocks no
// sequence holds stay cached until the pool needs them, least recently used first. When every
// layer sees a bounded past (a window, with sinks), the blocks a sequence's window has left are
// freed as it goes. When the pool runs out, the most recently admitted sequence is preempted:
// its blocks are released and it is recomputed later from its tokens (never an out-of-memory
// failure, never a corrupted sequence).
//
// Batch invariance: a request's tokens (greedy, or sampled with a seed) are the same whether it
// runs alone or beside others: each sequence's rows are computed by the same kernels in the same
// order whatever else is in the step (the matrix products are row-wise, attention runs per
// sequence, prompt chunks are cut at fixed positions of the sequence).
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attn/model.hpp"
#include "attn/sampler.hpp"

namespace attn {

struct EngineOptions {
  int64_t parallel = 16;      // sequences running at once at most (the rest wait in the queue)
  int64_t max_context = 0;    // positions per sequence (prompt + generated); 0: the decoder's max_seq_len
  int64_t kv_memory_mib = 256;  // the KV pool's size
  int64_t block_size = 16;    // positions per block
  int64_t queue = 64;         // requests waiting at most; beyond it submit() throws EngineBusy
  bool prefix_cache = true;   // share the full blocks of equal prompt prefixes
  // Prompt tokens computed per step at most (chunked prefill), beside one token per decoding
  // sequence; a multiple of prefill_chunk. 0: the decoder's step (256) less `parallel`, rounded.
  int64_t prefill_budget = 0;
};

struct EngineRequest {
  std::vector<int32_t> prompt;       // at least one token
  int64_t max_tokens = 16;           // tokens to generate at most (>= 0)
  SamplingOptions sampling;          // temperature 0: greedy; the seed makes a sampled reply repeatable
  std::vector<int32_t> stop_tokens;  // generating one of them ends the reply (finish "stop"); it is reported
  int logprobs = -1;                 // -1: none; 0..5: each generated token's logprob and this many alternatives
  bool prompt_logprobs = false;      // also every prompt token's logprob after the first (echo); no prefix sharing
  double timeout_s = 0;              // > 0: the request ends with finish "timeout" this long after submit
};

// A token's log-probability under the model (log-softmax of its raw logits) and the `top` most
// likely tokens of that position with theirs, most likely first.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};

struct EngineEvent {
  enum class Kind { token, done };
  Kind kind = Kind::token;
  int32_t token = -1;          // token: the generated id
  TokenLogprob logprob;        // token: when the request asked for logprobs
  // done: "stop" (a stop token), "length" (max_tokens or the context), "cancelled", "timeout",
  // "shutdown" (the engine stopped), "error" (message in `error`)
  std::string finish_reason;
  std::string error;
};

// Thrown by Engine::submit when the queue holds `queue` requests (HTTP 429) or the engine is
// shutting down (HTTP 503).
struct EngineBusy : std::runtime_error {
  using std::runtime_error::runtime_error;
  bool shutting_down = false;
};

// One request's results, read by the thread that submitted it. Events arrive in order: the
// prompt's logprobs (when asked) are ready before the first event, then one `token` event per
// generated token, then exactly one `done`.
class EngineStream {
 public:
  // Waits up to `wait` for the next event; false when none arrived in time.
  bool next(EngineEvent& event, std::chrono::milliseconds wait);
  // Ends the request at the engine's next step (finish "cancelled"); its blocks are freed.
  void cancel();
  // Prompt tokens, and how many of them came from the prefix cache (known once it started).
  int64_t prompt_tokens() const;
  int64_t cached_tokens() const;
  // The prompt's logprobs (entry i: token i + 1 given the tokens before it), when asked.
  std::vector<TokenLogprob> prompt_logprobs() const;

  struct State;  // shared with the engine
  explicit EngineStream(std::shared_ptr<State> state);

 private:
  std::shared_ptr<State> s_;
};

// Prometheus-style histogram: counts[i] observations <= bounds[i] (cumulative), plus the total.
struct Histogram {
  std::vector<double> bounds;
  std::vector<int64_t> counts;  // cumulative, one per bound
  int64_t count = 0;
  double sum = 0;
};

struct EngineMetrics {
  int64_t prompt_tokens_total = 0;      // prompt tokens of admitted requests (cached ones included)
  int64_t generated_tokens_total = 0;
  int64_t prefix_cache_hits_total = 0;  // requests that reused at least one cached block
  int64_t prefix_cached_tokens_total = 0;
  int64_t preemptions_total = 0;
  int64_t steps_total = 0;
  int64_t queue_length = 0;             // waiting requests
  int64_t running_sequences = 0;
  int64_t kv_blocks_total = 0;          // blocks a sequence can hold (the reserved null block excluded)
  int64_t kv_blocks_in_use = 0;         // held by a sequence
  int64_t kv_blocks_cached = 0;         // held by none, kept for the prefix cache
  Histogram time_to_first_token;        // seconds from submit to the first generated token
  Histogram inter_token_latency;        // seconds between a request's consecutive tokens
};

class Engine {
 public:
  // Takes the decoder (its KV pool is set to the options' size; its own caches are not used) and
  // starts the engine's thread. Every layer must keep a KV cache (recurrent layers: Error).
  Engine(Decoder decoder, const EngineOptions& options);
  ~Engine();  // shutdown(0)
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Bad requests (an empty prompt, ids outside the vocabulary, a prompt and
  // max_tokens beyond max_context, logprobs outside -1..5) throw Error naming the field; a full
  // queue or a stopping engine throws EngineBusy.
  std::shared_ptr<EngineStream> submit(EngineRequest request);
  EngineMetrics metrics() const;
  // Stops accepting requests, lets the running and queued ones finish for up to `grace`, then
  // ends the rest (finish "shutdown") and stops the thread. Idempotent.
  void shutdown(std::chrono::milliseconds grace);

  const EngineOptions& options() const;  // as resolved (max_context, prefill_budget filled in)
  const Decoder& decoder() const;        // read-only (config, caches); the engine's thread runs it
  int64_t kv_block_bytes() const;        // bytes of one block (every layer's K and V rows)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attn
