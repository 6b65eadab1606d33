// libFuzzer: any bytes as the body of POST /v1/completions or /v1/chat/completions (the first byte
// picks which) either parse into a request the engine accepts or throw an ApiError of status 400
// that names a field or the body; nothing else escapes. A parsed request's prompt, read back as
// generated tokens with its stop strings, streams pieces of complete UTF-8 whose concatenation
// is the decoded text cut before the first stop string.
#include <cstdint>
#include <string>

#include "attn/engine.hpp"
#include "attn/error.hpp"
#include "attn/sampler.hpp"
#include "attn/tokenizer.hpp"
#include "serve/openai_api.hpp"
#include "serve/text_stream.hpp"
#include "tokenizer/byte_level.hpp"

namespace {

const attn::Tokenizer& tokenizer() {
  static const attn::Tokenizer t = [] {
    attn::TokenizerVocab v;
    v.tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    v.types = {3, 3, 3};
    for (int b = 0; b < 256; ++b)
      v.tokens.push_back(attn::tokenizer::utf8_of(attn::tokenizer::byte_to_char(static_cast<uint8_t>(b)))), v.types.push_back(1);
    for (const char* m : {"Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "Ã ©"}) {
      const std::string s = m;
      v.tokens.push_back(s.substr(0, s.find(' ')) + s.substr(s.find(' ') + 1)), v.types.push_back(1);
      v.merges.push_back(s);
    }
    v.eos_id = 2;
    v.chat_template =
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
        "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    return attn::Tokenizer(v, "fuzz");
  }();
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  namespace serve = attn::cli::serve;
  const bool chat = data[0] & 1;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  serve::ServedModel m;
  m.name = "fuzz", m.tokenizer = &tokenizer(), m.stop_tokens = {2}, m.max_context = 512;
  serve::CompletionRequest r;
  try {
    r = serve::parse_completion_request(body, chat, m);
  } catch (const serve::ApiError& e) {
    if (e.status != 400 || std::string(e.what()).empty()) __builtin_trap();
    (void)serve::dump(serve::error_body(e));
    return 0;
  }
  // what the engine's submit checks, and the sampler's options
  const int64_t n = static_cast<int64_t>(r.prompt.size());
  if (n == 0 || r.max_tokens < 0 || n + r.max_tokens > m.max_context) __builtin_trap();
  for (const int32_t id : r.prompt)
    if (id < 0 || id >= tokenizer().vocab_size()) __builtin_trap();
  if (r.logprobs < -1 || r.logprobs > 5) __builtin_trap();
  try {
    attn::Sampler s(r.sampling);
    (void)s;
  } catch (const attn::Error&) {
    __builtin_trap();  // parse_completion_request let through options the sampler refuses
  }
  const attn::EngineRequest er = serve::engine_request(r, m, 30.0);
  if (er.prompt != r.prompt || er.max_tokens != r.max_tokens) __builtin_trap();
  // the prompt's ids as a reply: pieces of complete UTF-8, joined = the text cut at the first stop
  serve::TextStream stream(tokenizer(), r.stop);
  std::string joined;
  for (const int32_t id : r.prompt) {
    const std::string piece = stream.push(id);
    if (serve::complete_utf8_prefix(piece) != piece.size()) __builtin_trap();
    joined += piece;
  }
  joined += stream.finish();
  std::string want = tokenizer().decode(r.prompt);
  size_t cut = std::string::npos;
  for (const std::string& s : r.stop)
    if (!s.empty()) cut = std::min(cut, want.find(s));
  if (cut != std::string::npos) want.resize(cut);
  if (joined != want) __builtin_trap();
  return 0;
}
