// The SentencePiece tokenizer (model "llama") on a small vocabulary built here, whose scores make
// the merge order matter; expected ids are worked out by hand in the comments. Byte fallback, the
// unknown token, special tokens, the space prefix on and off, decoding, round trips of random text,
// Gemma files as Hugging Face reads them, and bad vocabularies and metadata.
// python/tests/test_tokenizer_sentencepiece.py checks the real Gemma 3 vocabulary against
// Hugging Face's tokenizer built from the same file.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "attn/gguf.hpp"
#include "attn/tokenizer.hpp"
#include "support/expect_error.hpp"
#include "support/gguf_image.hpp"

namespace attn {
namespace {

using testing::expect_error;
using Ids = std::vector<int32_t>;

// Ids 0..5 special, 6..16 normal (scores below), 17 + b the byte token of byte b.
//   6 ▁ -1   7 a -2   8 b -3   9 c -4   10 é -5   11 ab -10   12 bc -6   13 ▁a -7   14 aa -8
//   15 ▁ab -9   16 ▁▁ -11
TokenizerVocab tiny_spm(bool add_space_prefix, bool bytes = true) {
  TokenizerVocab v;
  v.model = "llama";
  v.tokens = {"<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<tool>"};
  v.types = {3, 3, 3, 2, 3, 4};
  v.scores = {0, 0, 0, 0, 0, 0};
  const std::pair<const char*, float> normal[] = {{"▁", -1}, {"a", -2},  {"b", -3},   {"c", -4},  {"é", -5},  {"ab", -10},
                                                  {"bc", -6}, {"▁a", -7}, {"aa", -8}, {"▁ab", -9}, {"▁▁", -11}};
  for (const auto& [t, score] : normal) v.tokens.push_back(t), v.types.push_back(1), v.scores.push_back(score);
  static const char* const kHex = "0123456789ABCDEF";
  for (int b = 0; bytes && b < 256; ++b)
    v.tokens.push_back(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">"), v.types.push_back(6), v.scores.push_back(0);
  v.add_space_prefix = add_space_prefix;
  v.bos_id = 2, v.eos_id = 1, v.unk_id = 3, v.pad_id = 0;
  v.add_bos = true;
  return v;
}
constexpr int32_t byte_id(uint8_t b) { return 17 + b; }

TEST(SentencePiece, MergesByScore) {
  const Tokenizer t(tiny_spm(false));
  EXPECT_EQ(t.encode("abc"), (Ids{7, 12}));         // bc (-6) before ab (-10); "abc" is no token
  EXPECT_EQ(t.encode("aaa"), (Ids{14, 7}));         // equal pairs: the leftmost
  EXPECT_EQ(t.encode("aaaa"), (Ids{14, 14}));
  EXPECT_EQ(t.encode(" ab"), (Ids{15}));            // ▁a (-7) before ab (-10), then ▁a + b = ▁ab
  EXPECT_EQ(t.encode("  a"), (Ids{6, 13}));         // ▁a (-7) before ▁▁ (-11); ▁▁a is no token
  EXPECT_EQ(t.encode("ab c"), (Ids{11, 6, 9}));     // no prefix: ab, ▁, c (▁c is no token)
  EXPECT_EQ(t.encode(""), Ids{});
  TokenizerVocab by_id = tiny_spm(false);
  by_id.merge_by_id = true;
  EXPECT_EQ(Tokenizer(by_id).encode("abc"), (Ids{11, 9}));  // ab (id 11) before bc (id 12)
  by_id.scores.clear();                                     // not needed when ranking by id
  EXPECT_EQ(Tokenizer(by_id).encode("abc"), (Ids{11, 9}));
}

TEST(SentencePiece, SpacePrefix) {
  const Tokenizer t(tiny_spm(true));
  EXPECT_EQ(t.encode("ab c"), (Ids{15, 6, 9}));       // ▁ab▁c: ▁a, then ▁ab
  EXPECT_EQ(t.encode("<bos>ab"), (Ids{2, 11}));       // only text that starts the input
  EXPECT_EQ(t.encode("ab<bos>ab"), (Ids{15, 2, 11}));
  EXPECT_EQ(t.encode(" a"), (Ids{6, 13}));            // ▁▁a: the prefix even before a space
  EXPECT_EQ(t.decode({15, 6, 9}), "ab c");            // the prefix's space removed
  EXPECT_EQ(t.decode({6, 13}), " a");
  EXPECT_EQ(t.decode({2, 15}), "<bos> ab");           // a special token first: nothing removed
  EXPECT_EQ(Tokenizer(tiny_spm(false)).decode({15, 6, 9}), " ab c");
}

TEST(SentencePiece, ByteFallbackAndUnknown) {
  const Tokenizer t(tiny_spm(false));
  EXPECT_EQ(t.encode("x\xC3\xA9"), (Ids{byte_id('x'), 10}));             // x has no token, é has
  EXPECT_EQ(t.encode("\xC3\xBC"), (Ids{byte_id(0xC3), byte_id(0xBC)}));  // ü: its two bytes
  EXPECT_EQ(t.encode("\xFF" "a"), (Ids{byte_id(0xFF), 7}));              // not UTF-8: the byte
  EXPECT_EQ(t.decode({byte_id(0xC3), byte_id(0xBC), 10}), "\xC3\xBC\xC3\xA9");
  EXPECT_EQ(t.decode({byte_id(0xC3)}), "\xC3");  // partial UTF-8 kept as it is
  // Without byte tokens: the unknown token, one for a run of characters
  EXPECT_EQ(Tokenizer(tiny_spm(false, false)).encode("xay"), (Ids{3, 7, 3}));
  EXPECT_EQ(Tokenizer(tiny_spm(false, false)).encode("x\xC3\xBCz" "a"), (Ids{3, 7}));
  TokenizerVocab no_unk = tiny_spm(false, false);
  no_unk.unk_id = -1;
  EXPECT_EQ(Tokenizer(no_unk).encode("xay"), (Ids{7}));  // dropped
}

TEST(SentencePiece, SpecialTokens) {
  const Tokenizer t(tiny_spm(false));
  EXPECT_EQ(t.encode("a<tool>b<bos>"), (Ids{7, 5, 8, 2}));
  EXPECT_EQ(t.encode("<start_of_turn>a"), (Ids{4, 7}));
  EXPECT_EQ(t.encode("a<tool>b", false),
            (Ids{7, byte_id('<'), byte_id('t'), byte_id('o'), byte_id('o'), byte_id('l'), byte_id('>'), 8}));
  EXPECT_EQ(t.decode({4, 7, 5, 1}), "<start_of_turn>a<tool><eos>");
  EXPECT_TRUE(t.is_special(5));
  EXPECT_FALSE(t.is_special(byte_id(0)));
  EXPECT_EQ(t.token_text(15), "▁ab");
  EXPECT_EQ(t.bos_id(), 2);
  EXPECT_TRUE(t.add_bos());
}

TEST(SentencePiece, RoundTripsRandomText) {
  const char* const pieces[] = {"a", "b", "c", " ", "  ", "\xC3\xA9", "\xC3\xBC", "x", "<tool>", "<bos>", "\n", "\xE6\x9D\xB1", "\xF0\x9F\x99\x82"};
  std::mt19937 rng(7);
  for (const bool prefix : {false, true}) {
    const Tokenizer t(tiny_spm(prefix));
    for (int trial = 0; trial < 3000; ++trial) {
      std::string text;
      const int n = static_cast<int>(rng() % 40);
      for (int k = 0; k < n; ++k) {
        const uint32_t r = rng() % 16;
        if (r < 13) text += pieces[r];
        else if (r == 13) text += static_cast<char>(rng() % 256);  // any byte, UTF-8 or not
        else {
          char32_t c = static_cast<char32_t>(rng() % 0x10FFFF);
          if ((c >= 0xD800 && c < 0xE000) || c == 0x2581) c = 'q';
          if (c < 0x80) text += static_cast<char>(c);
          else if (c < 0x800) text += static_cast<char>(0xC0 | (c >> 6)), text += static_cast<char>(0x80 | (c & 63));
          else if (c < 0x10000)
            text += static_cast<char>(0xE0 | (c >> 12)), text += static_cast<char>(0x80 | ((c >> 6) & 63)), text += static_cast<char>(0x80 | (c & 63));
          else
            text += static_cast<char>(0xF0 | (c >> 18)), text += static_cast<char>(0x80 | ((c >> 12) & 63)),
                text += static_cast<char>(0x80 | ((c >> 6) & 63)), text += static_cast<char>(0x80 | (c & 63));
        }
      }
      if (text.find("\xE2\x96\x81") != std::string::npos) continue;  // '▁' itself decodes to a space
      for (const bool special : {true, false}) ASSERT_EQ(t.decode(t.encode(text, special)), text) << "prefix " << prefix;
    }
  }
}

TEST(SentencePiece, LongTextIsFast) {
  const Tokenizer t(tiny_spm(false));
  std::string text;
  for (int i = 0; i < 50000; ++i) text += "abc aab ";
  const Ids ids = t.encode(text);  // one piece of 400k characters: O(n log n)
  EXPECT_EQ(t.decode(ids), text);
  // a|bc ▁a|ab ▁a|bc ▁a|ab ...: bc (-6) before ▁a (-7) before aa (-8) before ab (-10)
  EXPECT_EQ(Ids(ids.begin(), ids.begin() + 6), (Ids{7, 12, 13, 11, 13, 12}));
}

TEST(SentencePiece, BadVocabulariesAreRefused) {
  const auto refused = [](TokenizerVocab v, const std::string& fragment) { expect_error([&] { Tokenizer t(v, "s.gguf"); }, fragment); };
  TokenizerVocab v = tiny_spm(false);
  v.scores.pop_back();
  refused(v, "s.gguf: scores has 272 entries, expected one per token (273)");
  v = tiny_spm(false);
  v.scores[7] = std::nanf("");
  refused(v, "s.gguf: scores[7] is NaN");
  v = tiny_spm(false);
  v.merges = {"a b"};
  refused(v, "s.gguf: merges: a SentencePiece ('llama') tokenizer takes none (it merges by token score), got 1");
  v = tiny_spm(false);
  v.types[7] = 6;
  refused(v, "s.gguf: tokens[7] 'a' has token_type 6 (byte) but is not spelled <0xHH>");
  v = tiny_spm(false);
  v.unk_id = 273;
  refused(v, "s.gguf: unknown_token_id 273 is not a token id in [0, 273)");
  v = tiny_spm(false);
  v.pad_id = -2;
  refused(v, "s.gguf: padding_token_id -2 is not a token id in [0, 273)");
  v = tiny_spm(false);
  v.model = "t5";
  refused(v, "s.gguf: model 't5' is not one attn knows (gpt2, llama)");
}

// A metadata-only GGUF image, read as a tokenizer.
struct GgufImage : testing::GgufImage {
  Tokenizer read(const std::string& name) const {
    const std::vector<uint8_t> f = file();
    return Tokenizer::from_gguf(GgufFile::parse(f.data(), f.size(), name));
  }
};

// The tiny vocabulary as a Gemma file stores it: "▁▁" written "  " and typed user-defined.
GgufImage spm_file(const std::string& arch, const std::function<void(GgufImage&)>& extra = {}) {
  TokenizerVocab v = tiny_spm(false);
  v.tokens[16] = "  ", v.types[16] = 4;
  GgufImage g;
  g.text("general.architecture", arch);
  g.text("tokenizer.ggml.model", "llama");
  g.text("tokenizer.ggml.pre", "default");
  g.strings("tokenizer.ggml.tokens", v.tokens);
  g.floats("tokenizer.ggml.scores", v.scores);
  g.ints("tokenizer.ggml.token_type", v.types);
  g.u32("tokenizer.ggml.bos_token_id", 2);
  g.u32("tokenizer.ggml.eos_token_id", 1);
  g.u32("tokenizer.ggml.unknown_token_id", 3);
  g.u32("tokenizer.ggml.padding_token_id", 0);
  g.flag("tokenizer.ggml.add_bos_token", true);
  if (extra) extra(g);
  else g.flag("tokenizer.ggml.add_space_prefix", false);
  return g;
}

TEST(SentencePiece, FromGguf) {
  const Tokenizer llama = spm_file("llama").read("l.gguf");
  EXPECT_EQ(llama.vocab_size(), 273);
  EXPECT_EQ(llama.bos_id(), 2);
  EXPECT_TRUE(llama.add_bos());
  EXPECT_EQ(llama.encode("abc"), (Ids{7, 12}));   // by score
  EXPECT_EQ(llama.token_text(16), "  ");
  EXPECT_TRUE(llama.is_special(16));               // matched verbatim
  EXPECT_EQ(llama.encode("a  b"), (Ids{7, 16, 8}));
  expect_error([&] { llama.chat_prompt({{"user", "hi"}}); }, "l.gguf: has no chat template");

  // Gemma, as Hugging Face reads it: "  " becomes "▁▁", a normal token; merges rank by id.
  const Tokenizer gemma = spm_file("gemma3").read("g.gguf");
  EXPECT_EQ(gemma.encode("abc"), (Ids{11, 9}));
  EXPECT_EQ(gemma.token_text(16), "▁▁");
  EXPECT_FALSE(gemma.is_special(16));
  EXPECT_EQ(gemma.encode("a  b"), (Ids{7, 16, 8}));  // ▁▁ (id 16) merges; ▁b is no token
  EXPECT_EQ(gemma.decode({7, 16, 8}), "a  b");

  // add_space_prefix defaults to true, add_bos_token to true
  const Tokenizer defaults = spm_file("llama", [](GgufImage&) {}).read("d.gguf");
  EXPECT_EQ(defaults.encode("ab c"), (Ids{15, 6, 9}));
}

TEST(SentencePiece, BadMetadataIsRefused) {
  expect_error([] { spm_file("llama", [](GgufImage& g) { g.u32("tokenizer.ggml.add_space_prefix", 1); }).read("b.gguf"); },
               "b.gguf: metadata 'tokenizer.ggml.add_space_prefix' must be a bool, got uint32");
  GgufImage no_scores;
  no_scores.text("tokenizer.ggml.model", "llama");
  no_scores.strings("tokenizer.ggml.tokens", {"a", "b"});
  expect_error([&] { no_scores.read("n.gguf"); }, "n.gguf: has no metadata 'tokenizer.ggml.scores'");
  GgufImage int_scores = no_scores;
  int_scores.ints("tokenizer.ggml.scores", {1, 2});
  expect_error([&] { int_scores.read("i.gguf"); },
               "i.gguf: metadata 'tokenizer.ggml.scores' must be an array of float32, got an array of int32");
  GgufImage short_scores = no_scores;
  short_scores.floats("tokenizer.ggml.scores", {1});
  expect_error([&] { short_scores.read("s.gguf"); }, "s.gguf: scores has 1 entries, expected one per token (2)");
  GgufImage merges = no_scores;
  merges.floats("tokenizer.ggml.scores", {1, 2});
  merges.strings("tokenizer.ggml.merges", {"a b"});
  expect_error([&] { merges.read("m.gguf"); }, "m.gguf: metadata 'tokenizer.ggml.merges' is given, but a SentencePiece");
  GgufImage unk = no_scores;
  unk.floats("tokenizer.ggml.scores", {1, 2});
  unk.u32("tokenizer.ggml.unknown_token_id", 2);
  expect_error([&] { unk.read("u.gguf"); }, "u.gguf: unknown_token_id 2 is not a token id in [0, 2)");
  GgufImage t5;
  t5.text("tokenizer.ggml.model", "t5");
  expect_error([&] { t5.read("t.gguf"); },
               "t.gguf: tokenizer.ggml.model is 't5'; attn reads byte-level BPE ('gpt2') and SentencePiece BPE ('llama') tokenizers");
}

}  // namespace
}  // namespace attn
