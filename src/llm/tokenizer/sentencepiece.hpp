// SentencePiece BPE as a GGUF file stores it (tokenizer.ggml.model "llama"): a vocabulary of
// strings in which '▁' (U+2581) stands for the space, one score per token, byte tokens <0x00>..
// <0xFF> and no merges. One piece of plain text (special tokens are split off before) is encoded:
//
//   1. every space becomes '▁', and with `prefix` a '▁' goes first (as SentencePiece and
//      llama.cpp do; Hugging Face's Metaspace adds none to text that starts with a space);
//   2. the piece starts as its UTF-8 characters; a character that is not a token becomes the byte
//      tokens of its UTF-8 bytes (or the unknown token, one for a run, when a byte has none), which
//      take no further part;
//   3. while two adjacent symbols concatenate to a token, the best such pair is merged: the
//      highest priority (score), then the longer left part, the longer right part (in characters),
//      the lower id, the leftmost. That is the order of the merges Hugging Face's GGUF conversion
//      derives from the vocabulary (transformers' generate_merges); llama.cpp's llm_tokenizer_spm
//      takes the leftmost among equal scores, which differs only when two different tokens, or
//      two splits of one token, tie.
//
// Candidate merges wait in a priority queue and are checked when they come out, O(n log n).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace attn::tokenizer {

inline constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // '▁', U+2581

class SentencePiece {
 public:
  // tokens[i] has merge priority priority[i] (higher merges first). Tokens must be distinct.
  // unk: the id for a character none of whose forms exists, or -1 (the character is dropped).
  SentencePiece(const std::vector<std::string>& tokens, std::vector<double> priority, int32_t unk);

  // Appends the ids of `text` to out.
  void encode(std::string_view text, bool prefix, std::vector<int32_t>& out) const;
  // The id of the byte token "<0xHH>" for byte b, or -1.
  int32_t byte_token(uint8_t b) const { return byte_token_[b]; }
  // The byte a token spelled "<0xHH>" (uppercase hex) stands for, or -1.
  static int byte_of(std::string_view token);

 private:
  int32_t find(std::string_view text) const {
    const auto it = id_of_.find(text);
    return it == id_of_.end() ? -1 : it->second;
  }

  std::string text_;  // every token, one after another: the keys of id_of_ view into it
  std::unordered_map<std::string_view, int32_t> id_of_;
  std::vector<double> priority_;
  int32_t byte_token_[256] = {};
  int32_t unk_ = -1;
};

}  // namespace attn::tokenizer
