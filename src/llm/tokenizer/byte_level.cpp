#include "tokenizer/byte_level.hpp"

#include <array>

namespace attn::tokenizer {
namespace {

constexpr bool stands_for_itself(int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

constexpr std::array<char32_t, 256> alphabet() {
  std::array<char32_t, 256> a{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) a[b] = stands_for_itself(b) ? static_cast<char32_t>(b) : next++;
  return a;
}
constexpr std::array<char32_t, 256> kAlphabet = alphabet();
static_assert(kAlphabet[' '] == 0x120 && kAlphabet['\n'] == 0x10A && kAlphabet[0xAD] == 0x143);

}  // namespace

char32_t byte_to_char(uint8_t byte) { return kAlphabet[byte]; }

int char_to_byte(char32_t c) {
  if (c < 256) return stands_for_itself(static_cast<int>(c)) ? static_cast<int>(c) : -1;
  if (c < 256 + 68) {  // the 68 bytes that do not stand for themselves, in order
    int k = static_cast<int>(c - 256);
    for (int b = 0; b < 256; ++b)
      if (!stands_for_itself(b) && k-- == 0) return b;
  }
  return -1;
}

std::string utf8_of(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

}  // namespace attn::tokenizer
