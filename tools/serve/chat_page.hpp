// attn serve's GET /: one self-contained HTML page (no external assets) to chat with the model.
// It keeps the conversation's messages, posts them to /v1/chat/completions with stream: true and
// shows the reply as its server-sent events arrive, then the reply's tokens/s. Elements a test
// can find: #model (the model's name), #messages (the turns, each .user or .assistant), #prompt,
// #send, #reply (the latest reply's text), #speed, #status; an API key typed into #api-key is sent
// as a bearer token.
#pragma once
#include <string>

namespace attn::cli::serve {

std::string chat_page(const std::string& model_name);

}  // namespace attn::cli::serve
