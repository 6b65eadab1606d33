// attn serve: an OpenAI-compatible HTTP server over the serving engine (attn/engine.hpp): many
// requests decoded at once on one paged KV pool. This file holds the options, the startup (it
// listens at once and loads the model in the background, /health saying "loading" meanwhile)
// and the signals: SIGTERM or SIGINT stops accepting requests (503), lets the running ones finish
// for up to --timeout seconds, then stops the server and exits 0; a second signal ends the
// process at once. The HTTP layer is in serve/.
#include <fmt/core.h>

#include <pthread.h>

#include <atomic>
#include <csignal>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "attn/engine.hpp"
#include "attn/error.hpp"
#include "commands.hpp"
#include "log_level.hpp"
#include "model_option.hpp"
#include "serve/http_server.hpp"
#include "text_model.hpp"
#include "usage.hpp"

namespace attn::cli {
namespace {

struct ServeArgs {
  TextModelOptions model;
  std::string host = "127.0.0.1";
  int port = 8080;
  int64_t parallel = 4, kv_memory_mib = 256, block_size = 16, queue = 64;
  double timeout_s = 600;
  std::string api_key;
  bool no_prefix_cache = false;
};

// SIGINT and SIGTERM, blocked in every thread and taken by the main thread with sigtimedwait (no
// handler runs; nothing is done in a signal context).
sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

int run(const ServeArgs& a) {
  const std::string name = std::filesystem::path(a.model.path).stem().string();
  serve::HttpOptions http;
  http.model_name = name;
  http.api_key = a.api_key;
  http.timeout_s = a.timeout_s;
  // a thread per connection: every running and queued request, the chat page, /metrics scrapes
  http.threads = static_cast<int>(std::min<int64_t>(a.parallel + a.queue + 8, 1024));
  serve::HttpServer server(http);
  const int port = server.bind(a.host, a.port);

  const sigset_t signals = stop_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // before any thread starts: they inherit it
  std::signal(SIGPIPE, SIG_IGN);                  // a client gone mid-write is an error return, not a death

  std::atomic<bool> listen_failed{false};
  std::thread listener([&] {
    if (!server.listen()) listen_failed = true;
  });
  if (logs(LogLevel::info))
    fmt::print(stderr, "attn serve: listening on http://{}:{}/ (loading {})\n", a.host, port, a.model.path);

  // the model, loaded beside the listening server
  std::optional<TextModelParts> parts;
  std::unique_ptr<Engine> engine;
  std::exception_ptr load_error;
  std::atomic<bool> loaded{false};
  std::thread loader([&] {
    try {
      const auto t0 = std::chrono::steady_clock::now();
      TextModelOptions o = a.model;
      parts.emplace(load_text_model(o));
      EngineOptions e;
      e.parallel = a.parallel;
      e.max_context = a.model.max_context;
      e.kv_memory_mib = a.kv_memory_mib;
      e.block_size = a.block_size;
      e.queue = a.queue;
      e.prefix_cache = !a.no_prefix_cache;
      engine = std::make_unique<Engine>(std::move(parts->decoder), e);
      serve::ServedModel m;
      m.name = name;
      m.tokenizer = &parts->tokenizer;
      m.stop_tokens.assign(parts->stop_tokens.begin(), parts->stop_tokens.end());
      m.max_context = engine->options().max_context;
      m.created = static_cast<int64_t>(std::time(nullptr));
      server.set_model(m, engine.get());
      if (logs(LogLevel::info)) {
        const EngineMetrics metrics = engine->metrics();
        fmt::print(stderr,
                   "attn serve: {} ready in {:.1f} s: {} sequences at once, {} tokens each, KV pool {} blocks of {} "
                   "positions ({} each)\n",
                   name, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                   engine->options().parallel, m.max_context, metrics.kv_blocks_total, engine->options().block_size,
                   bytes_text(static_cast<double>(engine->kv_block_bytes())));
      }
    } catch (...) {
      load_error = std::current_exception();
    }
    loaded = true;
  });

  // wait for a signal, a failed load or a failed listener
  bool signalled = false;
  const timespec tick{0, 200'000'000};
  while (!signalled) {
    if (sigtimedwait(&signals, nullptr, &tick) > 0) signalled = true;
    else if (listen_failed || (loaded && load_error)) break;
  }
  if (signalled) {
    // a second signal: the default action (the process ends at once)
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);
    if (logs(LogLevel::info))
      fmt::print(stderr, "attn serve: stopping: no new requests; running ones have {} s to finish\n", a.timeout_s);
  }
  server.begin_shutdown();
  loader.join();
  if (engine) {
    engine->shutdown(std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000)));
    server.wait_idle(std::chrono::seconds(10));  // the replies' last events written
  }
  server.stop();
  listener.join();
  if (load_error) std::rethrow_exception(load_error);
  if (listen_failed) fail("attn serve", fmt::format("listening on {}:{} failed", a.host, port));
  if (logs(LogLevel::info)) fmt::print(stderr, "attn serve: stopped\n");
  return 0;
}

}  // namespace

Runner add_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* c = app.add_subcommand(
      "serve",
      "An OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions (streamed with stream: true),\n"
      "/v1/models, /health, /metrics (Prometheus) and a chat page at /. Requests are decoded together\n"
      "(continuous batching over a paged KV cache shared by prefix). SIGTERM or Ctrl-C: running requests finish.\n"
      "  attn serve --model smollm2                       (http://127.0.0.1:8080/)\n"
      "  attn serve --model M.gguf --port 9000 --parallel 8 --ctx-size 2048 --kv-memory 512 --api-key secret\n"
      "  curl http://127.0.0.1:8080/v1/completions -H 'Content-Type: application/json' \\\n"
      "       -d '{\"prompt\": \"Once upon a time\", \"max_tokens\": 32, \"temperature\": 0}'");
  c->add_option("--model", a->model.path, "A GGUF file, or a model's name (attn models: smollm2, ...)")
      ->required()
      ->transform(model_file());
  c->add_option("--host", a->host, "Address to listen on (0.0.0.0: every interface; mind --api-key)")->capture_default_str();
  c->add_option("--port", a->port, "Port to listen on (0: any free one, printed)")->capture_default_str()->check(in_range(0, 65535));
  c->add_option("--parallel", a->parallel,
                "Sequences decoded at once at most (up to 192: a step holds 256 tokens, 64 of them a prompt chunk); "
                "more requests wait in the queue")
      ->capture_default_str()
      ->check(in_range(int64_t{1}, int64_t{192}));
  c->add_option("-c,--ctx-size", a->model.max_context, "Context of each sequence in tokens (prompt + generated)")
      ->capture_default_str()
      ->check(in_range(1, 1 << 22));
  c->add_option("--kv-memory", a->kv_memory_mib, "MiB of the KV pool every sequence shares (in blocks of --block-size positions)")
      ->capture_default_str()
      ->check(in_range(int64_t{1}, int64_t{1} << 30));
  c->add_option("--block-size", a->block_size, "Positions per KV block (the prefix cache shares whole blocks)")
      ->capture_default_str()
      ->check(in_range(int64_t{1}, int64_t{4096}));
  c->add_option("--cache-type", a->model.cache_type, "KV storage: f32, f16 (half the bytes) or int8 (8-bit rows with a scale each)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "f16", "bf16", "int8"}));
  c->add_option("-t,--threads", a->model.threads, "Threads of each step (0 = all cores)")->capture_default_str()->check(in_range(0, 256));
  c->add_option("-m,--mechanism", a->model.mechanism,
                "Attention of every layer (causal), e.g. softmax:causal,window=255:0 (default: the file's)");
  c->add_option("--queue", a->queue, "Requests waiting at most beyond --parallel; more get 429 with Retry-After")
      ->capture_default_str()
      ->check(in_range(int64_t{0}, int64_t{1} << 20));
  c->add_option("--timeout", a->timeout_s,
                "Seconds a request may take (it then ends with finish_reason \"timeout\"); also how long running "
                "requests may go on after SIGTERM")
      ->capture_default_str()
      ->check(in_range(0.001, 1e7));
  c->add_option("--api-key", a->api_key, "Require 'Authorization: Bearer KEY' on /v1/* (/, /health and /metrics stay open)");
  c->add_flag("--no-prefix-cache", a->no_prefix_cache, "Do not share the KV blocks of equal prompt prefixes");
  return [a] { return run(*a); };
}

}  // namespace attn::cli
