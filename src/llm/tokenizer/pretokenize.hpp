// Pre-tokenization: the text between special tokens is cut into the pieces BPE runs on, each
// piece on its own (no merge crosses a piece boundary).
//
//   smollm: Hugging Face's Sequence([Digits(individual_digits=True), ByteLevel(use_regex=True)]):
//           every \p{N} character is a piece by itself, then the GPT-2 regex below cuts the text
//           between them;
//   gpt2:   the GPT-2 regex on the whole text.
//
// The GPT-2 regex, matched leftmost-first as a backtracking engine (Oniguruma) does:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Every character belongs to one alternative, so the matches tile the text. Bytes that are not
// UTF-8 count as characters of none of the classes (like punctuation); they keep round trips exact.
#pragma once
#include <string_view>
#include <vector>

namespace attn::tokenizer {

enum class PreTokenizer { gpt2, smollm };

// Appends the pieces of `text` (views into it, in order, covering it) to `pieces`.
void pretokenize(std::string_view text, PreTokenizer kind, std::vector<std::string_view>& pieces);

}  // namespace attn::tokenizer
