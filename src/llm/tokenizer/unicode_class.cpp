// Character classes: ASCII from a small table, the rest by binary search over the generated ranges.
#include "tokenizer/unicode_class.hpp"

#include <algorithm>
#include <array>

namespace attn::tokenizer {
namespace {

struct CharRange {
  char32_t first, last;
  CharClass cls;
};
constexpr CharClass l = CharClass::letter, n = CharClass::number, s = CharClass::space;
#include "tokenizer/unicode_tables.inc"

constexpr std::array<CharClass, 128> ascii_classes() {
  std::array<CharClass, 128> t{};
  for (const CharRange& r : kCharRanges)
    for (char32_t c = r.first; c <= r.last && c < 128; ++c) t[c] = r.cls;
  return t;
}
constexpr std::array<CharClass, 128> kAscii = ascii_classes();

}  // namespace

CharClass char_class(char32_t c) {
  if (c < 128) return kAscii[c];
  const auto* end = std::end(kCharRanges);
  const auto* it = std::upper_bound(std::begin(kCharRanges), end, c,
                                    [](char32_t x, const CharRange& r) { return x < r.first; });
  if (it == std::begin(kCharRanges)) return CharClass::other;
  --it;  // the last range starting at or before c
  return c <= it->last ? it->cls : CharClass::other;
}

const char* unicode_version() { return ATTN_UNICODE_VERSION; }

Utf8Char utf8_at(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) return {b0, 1};
  uint32_t length;
  char32_t code, min;
  if (b0 >= 0xC2 && b0 <= 0xDF) length = 2, code = b0 & 0x1F, min = 0x80;
  else if (b0 >= 0xE0 && b0 <= 0xEF) length = 3, code = b0 & 0x0F, min = 0x800;
  else if (b0 >= 0xF0 && b0 <= 0xF4) length = 4, code = b0 & 0x07, min = 0x10000;
  else return {kNotUtf8, 1};  // a continuation byte, C0/C1 (always overlong) or F5..FF
  if (s.size() - i < length) return {kNotUtf8, 1};
  for (uint32_t k = 1; k < length; ++k) {
    const uint8_t b = byte(i + k);
    if ((b & 0xC0) != 0x80) return {kNotUtf8, 1};
    code = (code << 6) | (b & 0x3F);
  }
  if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return {kNotUtf8, 1};
  return {code, length};
}

}  // namespace attn::tokenizer
