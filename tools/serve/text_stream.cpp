#include "serve/text_stream.hpp"

#include <algorithm>

namespace attn::cli::serve {

size_t complete_utf8_prefix(const std::string& text) {
  const size_t n = text.size();
  size_t back = 0;  // continuation bytes at the end
  while (back < n && back < 4 && (static_cast<unsigned char>(text[n - 1 - back]) & 0xC0) == 0x80) ++back;
  if (back == n) return n;
  const unsigned char lead = static_cast<unsigned char>(text[n - 1 - back]);
  const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  return need > back + 1 ? n - 1 - back : n;
}

int64_t utf8_length(const std::string& text) {
  return std::count_if(text.begin(), text.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<std::string> stops) : tokenizer_(tokenizer) {
  for (std::string& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

size_t TextStream::first_stop() const {
  size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    // an occurrence that ends inside the text already sent would have been found before
    const size_t from = sent_.size() >= s.size() ? sent_.size() - s.size() + 1 : 0;
    const size_t at = text_.find(s, std::min(from, text_.size()));
    first = std::min(first, at);
  }
  return first;
}

size_t TextStream::partial_stop() const {
  size_t start = text_.size();
  for (const std::string& s : stops_)
    for (size_t k = std::min(s.size() - 1, text_.size()); k > text_.size() - start; --k)
      if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
        start = text_.size() - k;
        break;
      }
  return start;
}

std::string TextStream::push(int32_t token) {
  if (stopped_) return {};
  ids_.push_back(token);
  // the whole text again, not the token's own: a token's bytes may complete the previous one's
  // character, and SentencePiece decoders treat the first token apart
  text_ = tokenizer_.decode(ids_);
  const size_t stop = first_stop(), partial = partial_stop();
  if (stop != std::string::npos && stop <= partial) stopped_ = true, end_ = stop;  // none can start before it
  const size_t limit = std::min({stop, partial, text_.size()});
  const size_t ready = std::max(complete_utf8_prefix(text_.substr(0, limit)), sent_.size());
  std::string piece = text_.substr(sent_.size(), ready - sent_.size());
  sent_ += piece;
  return piece;
}

std::string TextStream::finish() {
  if (!stopped_) stopped_ = true, end_ = first_stop();  // what was partial will not complete now
  const size_t end = std::min(end_, text_.size());
  if (end <= sent_.size()) return {};
  std::string piece = text_.substr(sent_.size(), end - sent_.size());
  sent_ += piece;
  return piece;
}

}  // namespace attn::cli::serve
