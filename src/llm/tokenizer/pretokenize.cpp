#include "tokenizer/pretokenize.hpp"

#include "tokenizer/unicode_class.hpp"

namespace attn::tokenizer {
namespace {

// The text as characters: where each starts and its class; chars[n].offset == text.size().
struct Char {
  size_t offset;
  CharClass cls;
};

class Splitter {
 public:
  Splitter(std::string_view text, std::vector<std::string_view>& pieces) : text_(text), pieces_(pieces) {
    chars_.reserve(text.size() + 1);
    for (size_t i = 0; i < text.size();) {
      const Utf8Char c = utf8_at(text, i);
      chars_.push_back({i, c.code == kNotUtf8 ? CharClass::other : char_class(c.code)});
      i += c.length;
    }
    chars_.push_back({text.size(), CharClass::other});
  }
  size_t size() const { return chars_.size() - 1; }
  CharClass cls(size_t k) const { return chars_[k].cls; }

  // Characters [begin, end) as one piece.
  void emit(size_t begin, size_t end) {
    pieces_.push_back(text_.substr(chars_[begin].offset, chars_[end].offset - chars_[begin].offset));
  }

  // The GPT-2 regex over characters [begin, end): the regex sees only this stretch.
  void regex_split(size_t begin, size_t end) {
    for (size_t i = begin; i < end;) {
      const size_t j = match_at(i, end);
      emit(i, j);
      i = j;
    }
  }

 private:
  // The first byte of character k (enough: every literal in the regex is ASCII).
  char byte(size_t k) const { return text_[chars_[k].offset]; }
  bool is(size_t k, size_t end, char c) const { return k < end && byte(k) == c; }

  // The end of the match starting at character i (> i).
  size_t match_at(size_t i, size_t end) const {
    // 's|'t|'re|'ve|'m|'ll|'d
    if (byte(i) == '\'' && i + 1 < end) {
      const char c = byte(i + 1);
      if (c == 's' || c == 't' || c == 'm' || c == 'd') return i + 2;
      if ((c == 'r' && is(i + 2, end, 'e')) || (c == 'v' && is(i + 2, end, 'e')) || (c == 'l' && is(i + 2, end, 'l')))
        return i + 3;
    }
    //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+ : a space may lead a run of any class but space
    size_t j = i;
    if (byte(i) == ' ' && i + 1 < end && cls(i + 1) != CharClass::space) j = i + 1;
    if (cls(j) != CharClass::space) {
      const CharClass run = cls(j);
      while (j < end && cls(j) == run) ++j;
      return j;
    }
    // \s+(?!\S) | \s+ : a run of spaces, less its last one when a non-space follows (that one
    // then leads the next piece), unless the run is a single space
    while (j < end && cls(j) == CharClass::space) ++j;
    if (j < end && j - i >= 2) return j - 1;
    return j;
  }

  std::string_view text_;
  std::vector<std::string_view>& pieces_;
  std::vector<Char> chars_;
};

}  // namespace

void pretokenize(std::string_view text, PreTokenizer kind, std::vector<std::string_view>& pieces) {
  Splitter s(text, pieces);
  if (kind == PreTokenizer::gpt2) return s.regex_split(0, s.size());
  size_t begin = 0;  // Digits(individual_digits=True): each \p{N} character alone
  for (size_t k = 0; k < s.size(); ++k) {
    if (s.cls(k) != CharClass::number) continue;
    s.regex_split(begin, k);
    s.emit(k, k + 1);
    begin = k + 1;
  }
  s.regex_split(begin, s.size());
}

}  // namespace attn::tokenizer
