#include "serve/http_server.hpp"

#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <fmt/core.h>
#include <httplib.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "attn/error.hpp"
#include "log_level.hpp"
#include "serve/chat_page.hpp"
#include "serve/metrics_text.hpp"
#include "serve/text_stream.hpp"

namespace attn::cli::serve {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::milliseconds(50);  // how often a waiting request looks at its client

// What the log line of the request this thread serves says beside method, path and status. A
// request is served on one of httplib's threads from the pre-routing handler to the logger, its
// streamed body included, so a thread-local record follows it.
struct RequestLog {
  Clock::time_point start;
  bool started = false;
  int64_t prompt = -1, generated = -1;
  std::string finish;  // the reply's finish_reason; "cancelled" when the client went away
};
thread_local RequestLog t_log;

// The server's socket of the connection `req` came on: the one whose ports are the request's
// (httplib does not hand its socket to handlers). -1 if none is found.
int connection_socket(const httplib::Request& req) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  for (dirent* e; found < 0 && (e = readdir(dir)) != nullptr;) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof local, pl = sizeof peer;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    auto port = [](const sockaddr_storage& a) {
      if (a.ss_family == AF_INET) return static_cast<int>(ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port));
      if (a.ss_family == AF_INET6) return static_cast<int>(ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port));
      return -1;
    };
    if (port(local) == req.local_port && port(peer) == req.remote_port) found = static_cast<int>(fd);
  }
  closedir(dir);
  return found;
}

// Whether the client of socket `fd` is still there (it has not closed its end).
bool client_there(int fd) {
  if (fd < 0) return true;
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return true;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return false;
  char c;
  return !(p.revents & POLLIN) || recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) != 0;
}

// httplib's own error statuses: their code and message
std::string status_code(int status) {
  return status == 404 ? "not_found" : status == 413 ? "payload_too_large" : status == 414 ? "uri_too_long" : "";
}

std::string status_message(int status) {
  switch (status) {
    case 400: return "the request is not valid HTTP";
    case 414: return "the request's URI is too long";
    case 416: return "the requested range cannot be satisfied";
    default: return fmt::format("HTTP status {}", status);
  }
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 429) res.set_header("Retry-After", "1");
  if (e.status == 401) res.set_header("WWW-Authenticate", "Bearer");
  res.set_content(dump(error_body(e)), "application/json");
}

}  // namespace

// One completion request from its submission to its last event.
struct Job {
  CompletionRequest request;
  const ServedModel& model;
  std::shared_ptr<EngineStream> stream;
  std::atomic<int>& in_flight;
  std::set<int32_t> stop_tokens;
  int socket = -1;
  TextStream text;
  Reply reply;
  bool finished = false;
  size_t logged = 0;  // generated tokens whose logprobs were sent (streams)

  Job(CompletionRequest r, const ServedModel& m, std::shared_ptr<EngineStream> s, std::atomic<int>& count, int sock)
      : request(std::move(r)),
        model(m),
        stream(std::move(s)),
        in_flight(count),
        stop_tokens(request.ignore_eos ? std::set<int32_t>{} : std::set<int32_t>(m.stop_tokens.begin(), m.stop_tokens.end())),
        socket(sock),
        text(*m.tokenizer, request.stop) {
    ++in_flight;
    reply.id = new_id(request.chat);
    reply.created = static_cast<int64_t>(std::time(nullptr));
    reply.prompt_tokens = static_cast<int64_t>(request.prompt.size());
  }
  ~Job() {
    if (!finished) stream->cancel();
    --in_flight;
  }

  // The next event; false when the client went away first (the request is then cancelled).
  // The client is looked at every kPoll, whether events come faster or not.
  bool next(EngineEvent& event, const std::function<bool()>& client) {
    for (;;) {
      const bool got = stream->next(event, kPoll);
      if (Clock::now() - last_look >= kPoll) {
        last_look = Clock::now();
        if (!client()) {
          stream->cancel();
          return false;
        }
      }
      if (got) return true;
    }
  }
  Clock::time_point last_look = Clock::now();

  // A token event: its text ready to send (the stop token itself adds none).
  std::string take(const EngineEvent& e) {
    if (stop_tokens.count(e.token) || text.stopped()) return {};
    TokenLogprob lp = e.logprob;
    lp.token = e.token;
    reply.tokens.push_back(lp);
    ++reply.completion_tokens;
    std::string piece = text.push(e.token);
    if (text.hit_stop()) {  // a stop string: the reply ends here
      reply.finish_reason = "stop";
      stream->cancel();
    }
    return piece;
  }

  void end(const EngineEvent& e) {
    if (reply.finish_reason.empty()) reply.finish_reason = finish_reason(e.finish_reason);
    if (e.finish_reason == "error") throw ApiError(500, "the engine failed: " + e.error, "", "server_error");
  }

  // Non-streamed: the whole reply (false: the client went away).
  bool run() {
    const auto client = [this] { return client_there(socket); };
    EngineEvent e;
    while (reply.finish_reason.empty()) {
      if (!next(e, client)) return false;
      if (e.kind == EngineEvent::Kind::token) take(e);
      else end(e);
    }
    text.finish();
    if (text.hit_stop()) reply.finish_reason = "stop";  // one that waited for an earlier one to complete or not
    reply.text = text.sent();
    if (request.echo && request.logprobs >= 0) reply.prompt_logprobs = stream->prompt_logprobs();
    finished = true;
    return true;
  }

  // The logprobs of the tokens taken since the last chunk (null when not asked).
  Json new_logprobs() {
    if (request.logprobs < 0) return nullptr;
    std::vector<TokenLogprob> rows(reply.tokens.begin() + static_cast<std::ptrdiff_t>(logged), reply.tokens.end());
    const size_t from = logged;
    logged = reply.tokens.size();
    if (request.chat) return chat_logprobs(*model.tokenizer, rows);
    std::vector<int32_t> ids = request.echo ? request.prompt : std::vector<int32_t>{};
    const size_t base = ids.size();
    for (const TokenLogprob& t : reply.tokens) ids.push_back(t.token);
    std::vector<std::optional<TokenLogprob>> opt(rows.begin(), rows.end());
    return completion_logprobs(*model.tokenizer, ids, base + from, opt);
  }

  Json chunk(const std::string& piece, Json logprobs, const std::string& finish) {
    if (!request.chat) return completion_chunk(reply, model, piece, logprobs, finish);
    return chat_chunk(reply, model, piece.empty() && !finish.empty() ? Json::object() : Json{{"content", piece}}, logprobs,
                      finish);
  }

  // Streamed: server-sent events until [DONE] (false: the client went away).
  bool stream_to(httplib::DataSink& sink) {
    const auto send = [&](const std::string& data) {
      const std::string event = "data: " + data + "\n\n";
      return sink.write(event.data(), event.size());
    };
    const auto client = [&] { return sink.is_writable() && client_there(socket); };
    const auto gone = [&] {
      stream->cancel();
      t_log.generated = reply.completion_tokens, t_log.finish = "cancelled";
      return false;
    };
    if (request.chat && !send(dump(chat_chunk(reply, model, {{"role", "assistant"}, {"content", ""}}, nullptr, ""))))
      return gone();
    EngineEvent e;
    bool first = true;
    try {
      while (reply.finish_reason.empty()) {
        if (!next(e, client)) return gone();
        if (first && request.echo) {  // the prompt first (its logprobs are ready with the first event)
          Json lp = nullptr;
          if (request.logprobs >= 0) {
            std::vector<std::optional<TokenLogprob>> rows{std::nullopt};
            for (const TokenLogprob& t : stream->prompt_logprobs()) rows.push_back(t);
            rows.resize(request.prompt.size());
            lp = completion_logprobs(*model.tokenizer, request.prompt, 0, rows);
          }
          if (!send(dump(completion_chunk(reply, model, request.prompt_text, lp, "")))) return gone();
        }
        first = false;
        if (e.kind == EngineEvent::Kind::done) {
          end(e);
          break;
        }
        const size_t before = reply.tokens.size();
        const std::string piece = take(e);
        const bool new_rows = request.logprobs >= 0 && reply.tokens.size() > before;
        if ((!piece.empty() || new_rows) && !send(dump(chunk(piece, new_logprobs(), "")))) return gone();
      }
    } catch (const ApiError& error) {  // the headers are gone: the error as an event
      t_log.generated = reply.completion_tokens, t_log.finish = "error";
      send(dump(error_body(error)));
      send("[DONE]");
      sink.done();
      finished = true;
      return true;
    }
    const std::string tail = text.finish();
    if (text.hit_stop()) reply.finish_reason = "stop";
    reply.text = text.sent();
    if (request.chat) {
      if (!tail.empty() && !send(dump(chunk(tail, nullptr, "")))) return gone();
      if (!send(dump(chunk("", nullptr, reply.finish_reason)))) return gone();
    } else if (!send(dump(chunk(tail, nullptr, reply.finish_reason)))) {
      return gone();
    }
    if (request.include_usage && !send(dump(usage_chunk(request, reply, model)))) return gone();
    if (!send("[DONE]")) return gone();
    finished = true;
    t_log.generated = reply.completion_tokens, t_log.finish = reply.finish_reason;
    sink.done();
    return true;
  }
};

struct HttpServer::Impl {
  HttpOptions options;
  httplib::Server svr;
  enum State { loading, ready, stopping };
  std::atomic<int> state{loading};
  ServedModel model;
  std::atomic<Engine*> engine{nullptr};  // set (with the model) before state becomes ready
  std::atomic<int> in_flight{0};
  std::mutex mu;
  std::map<int, int64_t> responses;  // by status

  explicit Impl(const HttpOptions& o) : options(o) {
    const size_t threads = static_cast<size_t>(std::max(o.threads, 4));
    svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    svr.set_payload_max_length(o.max_body_bytes);
    // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which lets a second server bind the
    // same port (and take half the connections) instead of failing
    svr.set_socket_options([](int sock) {
      const int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    svr.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
      t_log = {Clock::now(), true, -1, -1, ""};
      return httplib::Server::HandlerResponse::Unhandled;
    });
    svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) { log(req, res); });
    svr.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty() || res.status < 400) return httplib::Server::HandlerResponse::Unhandled;
      std::string message = status_message(res.status);
      if (res.status == 404) message = "no such route: " + req.method + " " + req.path;
      if (res.status == 413)
        message = fmt::format("the request body is larger than {} bytes, the most this server reads", options.max_body_bytes);
      res.set_content(dump(error_body(ApiError(res.status, message, "", "invalid_request_error", status_code(res.status)))),
                      "application/json");
      return httplib::Server::HandlerResponse::Handled;
    }));
    svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      send_error(res, ApiError(500, "internal error: " + what, "", "server_error"));
    });

    svr.Get("/", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(chat_page(options.model_name), "text/html; charset=utf-8");
    });
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const int s = state.load();
      res.status = s == ready ? 200 : 503;
      res.set_content(dump({{"status", s == ready ? "ok" : s == loading ? "loading" : "shutting down"}}), "application/json");
    });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      std::map<int, int64_t> counts;
      {
        std::lock_guard<std::mutex> lock(mu);
        counts = responses;
      }
      EngineMetrics m;
      Engine* e = engine.load();
      if (e) m = e->metrics();
      res.set_content(metrics_text(e ? &m : nullptr, counts), "text/plain; version=0.0.4; charset=utf-8");
    });
    svr.Get("/v1/models", api([this](const httplib::Request&, httplib::Response& res) {
      res.set_content(dump(models_json(model)), "application/json");
    }));
    svr.Post("/v1/completions", api([this](const httplib::Request& req, httplib::Response& res) { complete(req, res, false); }));
    svr.Post("/v1/chat/completions",
             api([this](const httplib::Request& req, httplib::Response& res) { complete(req, res, true); }));
  }

  // An API route: the key, the model's state and errors as OpenAI's error objects.
  httplib::Server::Handler api(std::function<void(const httplib::Request&, httplib::Response&)> handler) {
    return [this, handler](const httplib::Request& req, httplib::Response& res) {
      try {
        if (!options.api_key.empty()) {
          const std::string auth = req.get_header_value("Authorization");
          const std::string want = "Bearer " + options.api_key;
          bool same = auth.size() == want.size();
          unsigned char diff = 0;  // compared in time independent of where they differ
          for (size_t i = 0; same && i < want.size(); ++i) diff |= static_cast<unsigned char>(auth[i] ^ want[i]);
          if (!same || diff != 0)
            throw ApiError(401, auth.empty() ? "an API key is needed: send Authorization: Bearer KEY" : "the API key is wrong",
                           "", "authentication_error", "invalid_api_key");
        }
        const int s = state.load();
        if (s == loading) throw ApiError(503, "the model is still loading; retry when GET /health says ok", "", "server_error", "loading");
        if (s == stopping) throw ApiError(503, "the server is shutting down", "", "server_error", "shutting_down");
        handler(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const Error& e) {
        send_error(res, ApiError(400, e.what()));
      }
    };
  }

  void complete(const httplib::Request& req, httplib::Response& res, bool chat) {
    CompletionRequest r = parse_completion_request(req.body, chat, model);
    t_log.prompt = static_cast<int64_t>(r.prompt.size());
    std::shared_ptr<EngineStream> stream;
    try {
      stream = engine.load()->submit(engine_request(r, model, options.timeout_s));
    } catch (const EngineBusy& e) {
      if (e.shutting_down) throw ApiError(503, "the server is shutting down", "", "server_error", "shutting_down");
      throw ApiError(429, std::string("too many requests: ") + e.what(), "", "rate_limit_error", "queue_full");
    } catch (const Error& e) {
      throw ApiError(400, e.what());
    }
    auto job = std::make_shared<Job>(std::move(r), model, std::move(stream), in_flight, connection_socket(req));
    if (!job->request.stream) {
      const bool there = job->run();
      t_log.generated = job->reply.completion_tokens, t_log.finish = there ? job->reply.finish_reason : "cancelled";
      if (!there) {
        res.status = 499;  // nginx's "client closed request": nobody reads it
        return;
      }
      res.set_content(dump(chat ? chat_response(job->request, job->reply, model)
                                : completion_response(job->request, job->reply, model)),
                      "application/json");
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [job](size_t, httplib::DataSink& sink) { return job->stream_to(sink); },
        [job](bool success) {
          if (!success) job->stream->cancel();
        });
  }

  void log(const httplib::Request& req, const httplib::Response& res) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++responses[res.status];
    }
    const RequestLog l = t_log;
    t_log = {};
    if (!logs(LogLevel::info)) return;
    const double ms = l.started ? std::chrono::duration<double, std::milli>(Clock::now() - l.start).count() : 0.0;
    std::string tokens;
    if (l.prompt >= 0) tokens += fmt::format(" prompt {}", l.prompt);
    if (l.generated >= 0) tokens += fmt::format(" generated {}", l.generated);
    if (!l.finish.empty()) tokens += " " + l.finish;
    const std::string line = fmt::format("{} {} {}{} {:.0f} ms\n", req.method, req.path, res.status, tokens, ms);
    std::fwrite(line.data(), 1, line.size(), stderr);  // one write: lines of threads do not mix
    std::fflush(stderr);
  }
};

HttpServer::HttpServer(const HttpOptions& options) : impl_(std::make_unique<Impl>(options)) {}
HttpServer::~HttpServer() = default;

int HttpServer::bind(const std::string& host, int port) {
  const int bound = port == 0 ? impl_->svr.bind_to_any_port(host) : (impl_->svr.bind_to_port(host, port) ? port : -1);
  if (bound < 0) fail("--host/--port", fmt::format("cannot listen on {}:{} (in use, or not an address of this machine)", host, port));
  return bound;
}

bool HttpServer::listen() { return impl_->svr.listen_after_bind(); }

void HttpServer::set_model(const ServedModel& model, Engine* engine) {
  impl_->model = model;
  impl_->engine.store(engine);
  int expected = Impl::loading;
  impl_->state.compare_exchange_strong(expected, Impl::ready);
}

void HttpServer::begin_shutdown() { impl_->state = Impl::stopping; }

bool HttpServer::wait_idle(std::chrono::milliseconds wait) {
  const auto deadline = Clock::now() + wait;
  while (impl_->in_flight.load() > 0) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

void HttpServer::stop() { impl_->svr.stop(); }

}  // namespace attn::cli::serve
