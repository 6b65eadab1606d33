// Gemma's chat turns, for a file that carries no chat template but whose vocabulary has Gemma's
// turn markers (<start_of_turn>, <end_of_turn>; Gemma's base models ship so):
//   <start_of_turn>user\n{system}\n\n{content}<end_of_turn>\n<start_of_turn>model\n{content}<end_of_turn>\n ...
//   ... <start_of_turn>model\n           (with add_generation_prompt)
// Roles: an optional first "system" message (folded into the first user turn), then "user" and
// "assistant" (written "model") in turn, starting with "user"; contents trimmed of surrounding
// whitespace, as Gemma's own template does. No BOS (the caller adds it when the file asks).
#pragma once
#include <string>
#include <vector>

#include "attn/tokenizer.hpp"

namespace attn::tokenizer {

// An Error from `where` names a message whose role breaks the order above.
std::string gemma_turns(const std::vector<ChatMessage>& messages, bool add_generation_prompt, const std::string& where);

}  // namespace attn::tokenizer
