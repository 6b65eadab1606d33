#include "tokenizer/gemma_turns.hpp"

#include "attn/error.hpp"

namespace attn::tokenizer {
namespace {

std::string trimmed(const std::string& s) {
  const char* space = " \t\n\r\f\v";
  const size_t a = s.find_first_not_of(space);
  if (a == std::string::npos) return {};
  return s.substr(a, s.find_last_not_of(space) - a + 1);
}

}  // namespace

std::string gemma_turns(const std::vector<ChatMessage>& messages, bool add_generation_prompt, const std::string& where) {
  size_t first = 0;
  std::string system;
  if (!messages.empty() && messages[0].role == "system") system = trimmed(messages[0].content) + "\n\n", first = 1;
  std::string out;
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool user_turn = (i - first) % 2 == 0;
    if (m.role != (user_turn ? "user" : "assistant"))
      fail(where, "Gemma's turns alternate user and assistant after an optional first system message: message " +
                      std::to_string(i) + " should be " + (user_turn ? "user" : "assistant") + ", got '" + m.role + "'");
    out += "<start_of_turn>" + std::string(user_turn ? "user" : "model") + "\n" + (i == first ? system : "") +
           trimmed(m.content) + "<end_of_turn>\n";
  }
  if (add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

}  // namespace attn::tokenizer
