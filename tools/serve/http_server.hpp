// attn serve's HTTP layer (cpp-httplib): the routes, the API key, the body limit, server-sent
// events and the log line of each request. The model loads while it already listens: until
// set_model, /health answers 503 {"status": "loading"} and the API 503.
//
//   GET  /                     the chat page (chat_page.hpp)
//   GET  /health               200 {"status": "ok"} once the model is ready, else 503
//   GET  /metrics              Prometheus text (metrics_text.hpp)
//   GET  /v1/models            the model (its file's stem)
//   POST /v1/completions       OpenAI's completions (openai_api.hpp), streamed with stream: true
//   POST /v1/chat/completions  OpenAI's chat completions, through the model's chat template
//
// /v1/* needs `Authorization: Bearer KEY` when an API key is set; /, /health and /metrics never
// do. A client that goes away mid-request (a failed write, or its socket seen closed while the
// reply is computed) cancels it in the engine, which frees its KV blocks.
#pragma once
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "attn/engine.hpp"
#include "serve/openai_api.hpp"

namespace attn::cli::serve {

struct HttpOptions {
  std::string model_name;                 // shown by the chat page before the model is ready
  std::string api_key;                    // empty: none needed
  double timeout_s = 600;                 // each request's (EngineRequest::timeout_s)
  size_t max_body_bytes = size_t{8} << 20;  // larger bodies get 413 before they are parsed
  int threads = 16;                       // connections served at once
};

class HttpServer {
 public:
  explicit HttpServer(const HttpOptions& options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the address (port 0: any free port) and returns the port; an Error when it cannot.
  int bind(const std::string& host, int port);
  // Serves until stop(); false when listening failed.
  bool listen();
  // The model is ready; `model` and `engine` must outlive the server's last request (stop()).
  void set_model(const ServedModel& model, Engine* engine);
  // From now on new API requests get 503 (and /health 503 {"status": "shutting down"}).
  void begin_shutdown();
  // Waits up to `wait` for the completion requests in flight to end; whether they did.
  bool wait_idle(std::chrono::milliseconds wait);
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attn::cli::serve
