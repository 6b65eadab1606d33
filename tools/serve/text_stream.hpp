// attn serve: the text of a reply as its tokens arrive, in pieces that are safe to send. Every
// piece push() returns ends in complete UTF-8 (a token may end mid-character), and text that may
// be the start of a stop string is held back until the next tokens say whether it is one. The
// text ends just before the stop string that starts first in it: when one appears while another
// may still be completing at an earlier place, the stream waits for the next tokens. The pieces
// joined (finish() included) are the whole text, so a streamed reply equals the same reply sent
// at once.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "attn/tokenizer.hpp"

namespace attn::cli::serve {

// Bytes of `text` that end with a complete UTF-8 character (an incomplete last one left out).
size_t complete_utf8_prefix(const std::string& text);

// Unicode characters in `text` (bytes that do not continue a UTF-8 sequence): OpenAI's text offsets.
int64_t utf8_length(const std::string& text);

class TextStream {
 public:
  // `stops`: strings that end the text (empty strings are ignored).
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stops);
  // Adds a generated token; returns the text now safe to send (maybe empty). Once the text's end
  // is known (stopped()), further tokens add nothing.
  std::string push(int32_t token);
  // At the end of the reply: the text held back (an incomplete character, or what might have
  // become a stop string), cut before a stop string if one appeared.
  std::string finish();
  bool stopped() const { return stopped_; }
  bool hit_stop() const { return end_ != std::string::npos; }  // a stop string ended the text
  // The tokens pushed until the stop string appeared (that token included).
  const std::vector<int32_t>& tokens() const { return ids_; }
  const std::string& sent() const { return sent_; }  // every piece returned so far, joined

 private:
  const Tokenizer& tokenizer_;
  std::vector<std::string> stops_;
  std::vector<int32_t> ids_;
  std::string text_;  // decode(ids_)
  std::string sent_;
  bool stopped_ = false;
  size_t end_ = std::string::npos;  // where the text ends (the first stop string's place), once known

  size_t first_stop() const;     // the place of the stop string that starts first in text_, or npos
  size_t partial_stop() const;   // where the longest end of text_ that starts a stop string begins (or its size)
};

}  // namespace attn::cli::serve
