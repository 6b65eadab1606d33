// attn serve's OpenAI API: a request's JSON body checked and turned into an EngineRequest
// (POST /v1/completions and /v1/chat/completions), and the JSON of responses, stream chunks,
// model lists and errors, in OpenAI's schema (what the official clients parse).
//
// Bad requests are ApiErrors naming the field (OpenAI's `param`): a body that is not a JSON
// object, a field of the wrong type, a missing prompt or messages, max_tokens < 0, temperature
// outside [0, 2], top_p outside (0, 1], logprobs outside 0..5, n other than 1, a prompt and
// max_tokens beyond the context.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/engine.hpp"
#include "attn/sampler.hpp"
#include "attn/tokenizer.hpp"

namespace attn::cli::serve {

using Json = nlohmann::json;

// An HTTP error with OpenAI's error object: {"error": {"message", "type", "param", "code"}}.
struct ApiError : std::runtime_error {
  ApiError(int status, const std::string& message, std::string param = "", std::string type = "invalid_request_error",
           std::string code = "");
  int status;
  std::string param, type, code;  // "" is written as null
};
Json error_body(const ApiError& e);
// The text of a JSON value for the wire: invalid UTF-8 (a token cut mid-character) becomes U+FFFD.
std::string dump(const Json& j);

// What the API needs of the loaded model.
struct ServedModel {
  std::string name;  // the model file's stem: /v1/models' id and every response's `model`
  const Tokenizer* tokenizer = nullptr;
  std::vector<int32_t> stop_tokens;  // EOS and end-of-turn tokens: the reply ends at them
  int64_t max_context = 0;           // positions per sequence (prompt + generated)
  int64_t created = 0;               // Unix seconds of the load
};

struct CompletionRequest {
  bool chat = false;
  std::vector<int32_t> prompt;  // token ids (a chat's through the model's template; BOS when the file asks)
  std::string prompt_text;      // for echo: the prompt as given (token ids decoded)
  int64_t max_tokens = 16;
  SamplingOptions sampling;
  std::vector<std::string> stop;  // strings that end the text, cut before them
  bool stream = false, include_usage = false, echo = false;
  bool ignore_eos = false;  // llama.cpp's server's extra: the end-of-sequence tokens do not end the reply
  int logprobs = -1;  // -1: none; else alternatives per token (completions: logprobs; chat: top_logprobs)
};

// Parses and checks a body (ApiError 400 naming the field); the prompt is tokenized and checked
// against the context.
CompletionRequest parse_completion_request(const std::string& body, bool chat, const ServedModel& model);
EngineRequest engine_request(const CompletionRequest& r, const ServedModel& model, double timeout_s);

// A finished (or growing) reply.
struct Reply {
  std::string id;  // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;
  std::string text;                      // the generated text (stop string cut), without the echo
  std::vector<TokenLogprob> tokens;      // generated tokens, with logprobs when asked
  std::vector<TokenLogprob> prompt_logprobs;  // echo with logprobs: every prompt token after the first
  std::string finish_reason;
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

std::string new_id(bool chat);
// OpenAI's finish_reason of an engine's: stop, length; the engine's others as they are.
std::string finish_reason(const std::string& engine_reason);

Json usage_json(int64_t prompt_tokens, int64_t completion_tokens);
Json completion_response(const CompletionRequest& r, const Reply& reply, const ServedModel& m);
Json chat_response(const CompletionRequest& r, const Reply& reply, const ServedModel& m);
// Completions' logprobs object {tokens, token_logprobs, top_logprobs, text_offset} of ids[from..]:
// rows[i] is ids[from + i]'s (nullopt: null, as echo's first prompt token). A token's text offset
// counts the characters of decode(ids[0..its index)).
Json completion_logprobs(const Tokenizer& tok, const std::vector<int32_t>& ids, size_t from,
                         const std::vector<std::optional<TokenLogprob>>& rows);
// Chat's logprobs object {content: [{token, logprob, bytes, top_logprobs}]}.
Json chat_logprobs(const Tokenizer& tok, const std::vector<TokenLogprob>& tokens);

// Stream chunks. `finish` empty: null.
Json completion_chunk(const Reply& reply, const ServedModel& m, const std::string& text, const Json& logprobs,
                      const std::string& finish);
Json chat_chunk(const Reply& reply, const ServedModel& m, const Json& delta, const Json& logprobs,
                const std::string& finish);
Json usage_chunk(const CompletionRequest& r, const Reply& reply, const ServedModel& m);

Json models_json(const ServedModel& m);

}  // namespace attn::cli::serve
