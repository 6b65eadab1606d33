// GPT-2's byte-level alphabet: each of the 256 byte values stands for one printable character, so
// that any byte string is a string of visible characters a vocabulary can list. The bytes that are
// printable in Latin-1 ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for themselves; the other
// 68 (controls, space, DEL, U+00A0, U+00AD) for U+0100, U+0101, ... in byte order, so the space is
// "Ġ" (U+0120) and the newline "Ċ" (U+010A).
#pragma once
#include <cstdint>
#include <string>

namespace attn::tokenizer {

char32_t byte_to_char(uint8_t byte);
// The byte that character c stands for, or -1 when c is not in the alphabet.
int char_to_byte(char32_t c);
// c in UTF-8 (c <= U+10FFFF).
std::string utf8_of(char32_t c);

}  // namespace attn::tokenizer
