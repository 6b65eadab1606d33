#include "serve/openai_api.hpp"

#include <fmt/core.h>

#include <chrono>
#include <cmath>
#include <random>

#include "serve/text_stream.hpp"
#include "text_model.hpp"

namespace attn::cli::serve {

ApiError::ApiError(int status_, const std::string& message, std::string param_, std::string type_, std::string code_)
    : std::runtime_error(message), status(status_), param(std::move(param_)), type(std::move(type_)), code(std::move(code_)) {}

Json error_body(const ApiError& e) {
  auto or_null = [](const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); };
  return {{"error", {{"message", e.what()}, {"type", e.type}, {"param", or_null(e.param)}, {"code", or_null(e.code)}}}};
}

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, param + ": " + message, param);
}

std::string kind(const Json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

// The field, absent or null as nullopt; of another type than asked, an ApiError naming it.
const Json* field(const Json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::optional<double> number(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad(name, "expected a number, got " + kind(*v));
  return v->get<double>();
}

std::optional<int64_t> integer(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float() && std::nearbyint(v->get<double>()) == v->get<double>() && std::abs(v->get<double>()) < 9e15)
    return static_cast<int64_t>(v->get<double>());
  bad(name, "expected an integer, got " + kind(*v));
}

std::optional<bool> boolean(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad(name, "expected a boolean, got " + kind(*v));
  return v->get<bool>();
}

// A list of token ids, each in the vocabulary.
std::vector<int32_t> token_ids(const Json& list, int32_t vocab) {
  std::vector<int32_t> ids;
  for (const Json& t : list) {
    if (!t.is_number_integer()) bad("prompt", "a list of token ids holds " + kind(t));
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= vocab)
      bad("prompt", fmt::format("token id {} is outside the vocabulary [0, {})", id, vocab));
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// prompt: a string, a list of token ids, or a list holding one of those.
void parse_prompt(const Json& body, const ServedModel& m, CompletionRequest& r) {
  const Json* p = field(body, "prompt");
  if (!p) throw ApiError(400, "prompt: required (a string or a list of token ids)", "prompt");
  Json one = *p;
  if (one.is_array() && !one.empty() && (one[0].is_string() || one[0].is_array())) {
    if (one.size() != 1) bad("prompt", fmt::format("one prompt per request, got a list of {}", one.size()));
    one = Json(one[0]);
  }
  if (one.is_string()) {
    r.prompt_text = one.get<std::string>();
    r.prompt = text_prompt_ids(*m.tokenizer, r.prompt_text);
  } else if (one.is_array()) {
    r.prompt = token_ids(one, m.tokenizer->vocab_size());
    r.prompt_text = m.tokenizer->decode(r.prompt);
  } else {
    bad("prompt", "expected a string or a list of token ids, got " + kind(one));
  }
  if (r.prompt.empty()) bad("prompt", "must hold at least one token");
}

std::string content_text(const Json& content, size_t i) {
  const std::string where = fmt::format("messages[{}].content", i);
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {  // parts: [{"type": "text", "text": "..."}]
    std::string text;
    for (const Json& part : content) {
      const bool text_part = part.is_object() && part.contains("type") && part["type"] == "text" && part.contains("text") &&
                             part["text"].is_string();
      if (!text_part)
        bad(where, "expected a string or a list of {\"type\": \"text\", \"text\": ...} parts");
      text += part["text"].get<std::string>();
    }
    return text;
  }
  bad(where, "expected a string, got " + kind(content));
}

void parse_messages(const Json& body, const ServedModel& m, CompletionRequest& r) {
  const Json* list = field(body, "messages");
  if (!list) throw ApiError(400, "messages: required (a list of {role, content})", "messages");
  if (!list->is_array()) bad("messages", "expected a list of {role, content}, got " + kind(*list));
  if (list->empty()) bad("messages", "must hold at least one message");
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& msg = (*list)[i];
    if (!msg.is_object()) bad("messages", fmt::format("messages[{}] must be an object, got {}", i, kind(msg)));
    const Json* role = field(msg, "role");
    if (!role || !role->is_string()) bad("messages", fmt::format("messages[{}].role must be a string", i));
    const std::string who = role->get<std::string>();
    if (who != "system" && who != "user" && who != "assistant" && who != "developer")
      bad("messages", fmt::format("messages[{}].role must be system, user or assistant, got '{}'", i, who));
    const Json* content = field(msg, "content");
    messages.push_back({who == "developer" ? "system" : who, content ? content_text(*content, i) : ""});
  }
  try {
    r.prompt_text = m.tokenizer->chat_prompt(messages, true);
  } catch (const std::exception& e) {
    bad("messages", std::string("the model has no chat template this server can apply: ") + e.what());
  }
  r.prompt = text_prompt_ids(*m.tokenizer, r.prompt_text);
}

void parse_stop(const Json& body, CompletionRequest& r) {
  const Json* v = field(body, "stop");
  if (!v) return;
  if (v->is_string()) {
    r.stop.push_back(v->get<std::string>());
    return;
  }
  if (!v->is_array()) bad("stop", "expected a string or a list of up to 4 strings, got " + kind(*v));
  if (v->size() > 4) bad("stop", fmt::format("at most 4 stop strings, got {}", v->size()));
  for (const Json& s : *v) {
    if (!s.is_string()) bad("stop", "expected a list of strings, got one holding " + kind(s));
    r.stop.push_back(s.get<std::string>());
  }
}

}  // namespace

CompletionRequest parse_completion_request(const std::string& text, bool chat, const ServedModel& m) {
  Json body;
  try {
    body = Json::parse(text);
  } catch (const Json::exception& e) {  // a syntax error, a number out of double's range
    throw ApiError(400, std::string("the body is not valid JSON: ") + e.what());
  }
  if (!body.is_object()) throw ApiError(400, "the body must be a JSON object, got " + kind(body));
  CompletionRequest r;
  r.chat = chat;
  if (const Json* model = field(body, "model"); model && !model->is_string())
    bad("model", "expected a string, got " + kind(*model));
  if (const auto n = integer(body, "n"); n && *n != 1)
    bad("n", fmt::format("only one choice per request is supported (n = 1), got {}", *n));
  if (chat) parse_messages(body, m, r);
  else parse_prompt(body, m, r);

  std::optional<int64_t> max_tokens = integer(body, chat ? "max_completion_tokens" : "max_tokens");
  const char* max_name = chat && max_tokens ? "max_completion_tokens" : "max_tokens";
  if (!max_tokens && chat) max_tokens = integer(body, "max_tokens");
  if (max_tokens && *max_tokens < 0) bad(max_name, fmt::format("must be >= 0, got {}", *max_tokens));
  const int64_t n = static_cast<int64_t>(r.prompt.size());
  const char* prompt_name = chat ? "messages" : "prompt";
  if (n > m.max_context || (max_tokens && n + *max_tokens > m.max_context))
    throw ApiError(400,
                   fmt::format("this server's context is {} tokens (--ctx-size); the prompt's {} tokens{} exceed it",
                               m.max_context, n, max_tokens ? fmt::format(" and max_tokens {}", *max_tokens) : ""),
                   n >= m.max_context ? prompt_name : max_name, "invalid_request_error", "context_length_exceeded");
  // OpenAI's defaults: 16 tokens for a completion, the rest of the context for a chat
  r.max_tokens = max_tokens ? *max_tokens : chat ? m.max_context - n : std::min<int64_t>(16, m.max_context - n);

  r.sampling.temperature = number(body, "temperature").value_or(1.0);
  if (!(r.sampling.temperature >= 0 && r.sampling.temperature <= 2))
    bad("temperature", fmt::format("must be in [0, 2], got {}", r.sampling.temperature));
  r.sampling.top_p = number(body, "top_p").value_or(1.0);
  if (!(r.sampling.top_p > 0 && r.sampling.top_p <= 1)) bad("top_p", fmt::format("must be in (0, 1], got {}", r.sampling.top_p));
  // llama.cpp's server's extras
  r.sampling.top_k = integer(body, "top_k").value_or(0);
  if (r.sampling.top_k < 0) bad("top_k", fmt::format("must be >= 0, got {}", r.sampling.top_k));
  r.sampling.min_p = number(body, "min_p").value_or(0.0);
  if (!(r.sampling.min_p >= 0 && r.sampling.min_p <= 1)) bad("min_p", fmt::format("must be in [0, 1], got {}", r.sampling.min_p));
  r.ignore_eos = boolean(body, "ignore_eos").value_or(false);
  r.sampling.repeat_penalty = number(body, "repeat_penalty").value_or(1.0);
  if (!(r.sampling.repeat_penalty > 0 && r.sampling.repeat_penalty <= 100))
    bad("repeat_penalty", fmt::format("must be in (0, 100], got {}", r.sampling.repeat_penalty));
  if (const auto seed = integer(body, "seed")) r.sampling.seed = static_cast<uint64_t>(*seed);
  else r.sampling.seed = std::random_device{}() * uint64_t{0x100000000} + std::random_device{}();

  parse_stop(body, r);
  r.stream = boolean(body, "stream").value_or(false);
  if (const Json* so = field(body, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "expected an object, got " + kind(*so));
    r.include_usage = boolean(*so, "include_usage").value_or(false);
  }
  if (chat) {
    const bool want = boolean(body, "logprobs").value_or(false);
    const int64_t top = integer(body, "top_logprobs").value_or(0);
    if (top < 0 || top > 5) bad("top_logprobs", fmt::format("must be in [0, 5], got {}", top));
    if (top > 0 && !want) bad("top_logprobs", "needs logprobs: true");
    r.logprobs = want ? static_cast<int>(top) : -1;
  } else {
    r.echo = boolean(body, "echo").value_or(false);
    if (const Json* lp = field(body, "logprobs"); lp && lp->is_boolean()) bad("logprobs", "expected an integer in [0, 5], got a boolean");
    if (const auto lp = integer(body, "logprobs")) {
      if (*lp < 0 || *lp > 5) bad("logprobs", fmt::format("must be in [0, 5], got {}", *lp));
      r.logprobs = static_cast<int>(*lp);
    }
  }
  return r;
}

EngineRequest engine_request(const CompletionRequest& r, const ServedModel& m, double timeout_s) {
  EngineRequest e;
  e.prompt = r.prompt;
  e.max_tokens = r.max_tokens;
  e.sampling = r.sampling;
  if (!r.ignore_eos) e.stop_tokens = m.stop_tokens;
  e.logprobs = r.logprobs;
  e.prompt_logprobs = r.echo && r.logprobs >= 0;
  e.timeout_s = timeout_s;
  return e;
}

std::string new_id(bool chat) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:08x}", chat ? "chatcmpl-" : "cmpl-", rng(), static_cast<uint32_t>(rng()));
}

std::string finish_reason(const std::string& engine_reason) { return engine_reason; }

Json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

Json completion_logprobs(const Tokenizer& tok, const std::vector<int32_t>& ids, size_t from,
                         const std::vector<std::optional<TokenLogprob>>& rows) {
  Json tokens = Json::array(), logprobs = Json::array(), tops = Json::array(), offsets = Json::array();
  std::vector<int32_t> before(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(from));
  for (size_t i = 0; i < rows.size(); ++i) {
    const int32_t id = ids[from + i];
    offsets.push_back(utf8_length(tok.decode(before)));
    tokens.push_back(tok.decode({id}));
    if (rows[i]) {
      logprobs.push_back(rows[i]->logprob);
      Json top = Json::object();
      for (const auto& [alt, lp] : rows[i]->top) top[tok.decode({alt})] = lp;
      tops.push_back(top);
    } else {
      logprobs.push_back(nullptr), tops.push_back(nullptr);
    }
    before.push_back(id);
  }
  return {{"tokens", tokens}, {"token_logprobs", logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

namespace {

Json token_entry(const Tokenizer& tok, int32_t id, float logprob) {
  const std::string text = tok.decode({id});
  Json bytes = Json::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return {{"token", text}, {"logprob", logprob}, {"bytes", bytes}};
}

}  // namespace

Json chat_logprobs(const Tokenizer& tok, const std::vector<TokenLogprob>& tokens) {
  Json content = Json::array();
  for (const TokenLogprob& t : tokens) {
    Json e = token_entry(tok, t.token, t.logprob);
    Json top = Json::array();
    for (const auto& [alt, lp] : t.top) top.push_back(token_entry(tok, alt, lp));
    e["top_logprobs"] = top;
    content.push_back(e);
  }
  return {{"content", content}, {"refusal", nullptr}};
}

namespace {

Json null_or(const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); }

// The fields every response and stream chunk carries around its choices (usage: the token counts).
Json envelope(const Reply& reply, const ServedModel& m, const char* object, Json choices, bool usage) {
  Json j = {{"id", reply.id},
            {"object", object},
            {"created", reply.created},
            {"model", m.name},
            {"system_fingerprint", nullptr},
            {"choices", std::move(choices)}};
  if (usage) j["usage"] = usage_json(reply.prompt_tokens, reply.completion_tokens);
  return j;
}

}  // namespace

Json completion_response(const CompletionRequest& r, const Reply& reply, const ServedModel& m) {
  Json logprobs = nullptr;
  if (r.logprobs >= 0) {
    std::vector<int32_t> ids;
    std::vector<std::optional<TokenLogprob>> rows;
    if (r.echo) {
      ids = r.prompt;
      rows.push_back(std::nullopt);
      for (const TokenLogprob& t : reply.prompt_logprobs) rows.push_back(t);
      rows.resize(r.prompt.size());
    }
    for (const TokenLogprob& t : reply.tokens) ids.push_back(t.token), rows.push_back(t);
    logprobs = completion_logprobs(*m.tokenizer, ids, 0, rows);
  }
  Json choice = {{"index", 0},
                 {"text", (r.echo ? r.prompt_text : "") + reply.text},
                 {"logprobs", logprobs},
                 {"finish_reason", null_or(reply.finish_reason)}};
  return envelope(reply, m, "text_completion", Json::array({choice}), true);
}

Json chat_response(const CompletionRequest& r, const Reply& reply, const ServedModel& m) {
  Json choice = {{"index", 0},
                 {"message", {{"role", "assistant"}, {"content", reply.text}, {"refusal", nullptr}}},
                 {"logprobs", r.logprobs >= 0 ? chat_logprobs(*m.tokenizer, reply.tokens) : Json(nullptr)},
                 {"finish_reason", null_or(reply.finish_reason)}};
  return envelope(reply, m, "chat.completion", Json::array({choice}), true);
}

Json completion_chunk(const Reply& reply, const ServedModel& m, const std::string& text, const Json& logprobs,
                      const std::string& finish) {
  Json choice = {{"index", 0}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", null_or(finish)}};
  return envelope(reply, m, "text_completion", Json::array({choice}), false);
}

Json chat_chunk(const Reply& reply, const ServedModel& m, const Json& delta, const Json& logprobs,
                const std::string& finish) {
  Json choice = {{"index", 0}, {"delta", delta}, {"logprobs", logprobs}, {"finish_reason", null_or(finish)}};
  return envelope(reply, m, "chat.completion.chunk", Json::array({choice}), false);
}

Json usage_chunk(const CompletionRequest& r, const Reply& reply, const ServedModel& m) {
  return envelope(reply, m, r.chat ? "chat.completion.chunk" : "text_completion", Json::array(), true);
}

Json models_json(const ServedModel& m) {
  return {{"object", "list"},
          {"data", Json::array({{{"id", m.name}, {"object", "model"}, {"created", m.created}, {"owned_by", "attn"}}})}};
}

}  // namespace attn::cli::serve
