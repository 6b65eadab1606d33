// libFuzzer: any bytes encode and decode back to themselves (a vocabulary with every byte, merges
// and special tokens), with and without special tokens; the same bytes read as a chat template
// either render or throw Error.
#include <cstdint>
#include <string>

#include "attn/error.hpp"
#include "attn/tokenizer.hpp"
#include "tokenizer/byte_level.hpp"
#include "tokenizer/chat_template.hpp"

namespace {

const attn::Tokenizer& tokenizer() {
  static const attn::Tokenizer t = [] {
    attn::TokenizerVocab v;
    v.tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<x>", "<x>y"};
    v.types = {3, 3, 3, 4, 3};
    for (int b = 0; b < 256; ++b)
      v.tokens.push_back(attn::tokenizer::utf8_of(attn::tokenizer::byte_to_char(static_cast<uint8_t>(b)))), v.types.push_back(1);
    for (const char* m : {"Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "Ġ Ġ", "ĠĠ ĠĠ", "1 2", "Ã ©", "< |", "a a", "aa aa"}) {
      const std::string s = m;
      v.tokens.push_back(s.substr(0, s.find(' ')) + s.substr(s.find(' ') + 1)), v.types.push_back(1);
      v.merges.push_back(s);
    }
    return attn::Tokenizer(v, "fuzz");
  }();
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const attn::Tokenizer& t = tokenizer();
  for (const bool special : {true, false}) {
    const std::vector<int32_t> ids = t.encode(text, special);
    if (ids.size() > text.size() || t.decode(ids) != text) __builtin_trap();
  }
  try {
    const auto chat = attn::tokenizer::ChatTemplate::parse(text, "fuzz");
    (void)chat.render({{"user", "hi"}, {"assistant", "ok"}}, true);
  } catch (const attn::Error&) {
  }
  return 0;
}
