// The chat template of a GGUF file (tokenizer.chat_template, Jinja), when it is the ChatML
// template, read into what it does so that C++ can produce exactly what Jinja would:
//
//   {% for message in messages %}
//     {% if loop.first and messages[0]['role'] != 'system' %}{{ DEFAULT_SYSTEM }}{% endif %}   (optional)
//     {{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}
//   {% endfor %}
//   {% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}                   (optional)
//
// Spacing inside the tags, quotes (' or "), message.role for message['role'] and the way the
// literals are cut into + terms are free; DEFAULT_SYSTEM must be a ChatML system turn. Any other
// template is refused with an Error that says where it differs.
#pragma once
#include <string>
#include <vector>

namespace attn {
struct ChatMessage;
}

namespace attn::tokenizer {

class ChatTemplate {
 public:
  // Reads `source`; `where` names it in errors.
  static ChatTemplate parse(const std::string& source, const std::string& where);
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  // The turn written before a first message that is not a system message ("" when none).
  const std::string& default_system() const { return default_system_; }

 private:
  std::string default_system_;
  std::string generation_prompt_;  // "" when the template has no add_generation_prompt block
};

}  // namespace attn::tokenizer
