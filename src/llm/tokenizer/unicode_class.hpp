// The three character classes the GPT-2 pre-tokenizer regex tells apart (\p{L}, \p{N}, \s),
// looked up in range tables generated from Unicode data (scripts/gen_unicode_tables.py ->
// unicode_tables.inc; unicode_version() says which version), and UTF-8 stepping that never fails.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace attn::tokenizer {

enum class CharClass : uint8_t {
  other,   // none of the below
  letter,  // \p{L}: general categories Lu Ll Lt Lm Lo
  number,  // \p{N}: Nd Nl No (Rust's char::is_numeric, which the Digits pre-tokenizer splits on)
  space    // \s as Oniguruma means it in Unicode: White_Space (U+0009..U+000D, U+0085, Zs Zl Zp)
};

CharClass char_class(char32_t c);
// The Unicode version the tables were generated from, e.g. "16.0.0".
const char* unicode_version();

// The character starting at byte i of s (i < s.size()). A byte that does not start a well-formed
// UTF-8 sequence (a stray continuation byte, an overlong form, a surrogate, a value above
// U+10FFFF, a sequence cut short) is a character of its own, one byte long, code kNotUtf8.
constexpr char32_t kNotUtf8 = 0xFFFFFFFF;
struct Utf8Char {
  char32_t code;
  uint32_t length;  // bytes, 1 to 4
};
Utf8Char utf8_at(std::string_view s, size_t i);

}  // namespace attn::tokenizer
