// The byte-level BPE tokenizer on small vocabularies built here: merge order, digits, the GPT-2
// regex (expected pieces are what Hugging Face's pre-tokenizers give), special tokens, decoding of
// partial UTF-8, round trips of arbitrary bytes, the ChatML template, and bad vocabularies.
// python/tests/test_tokenizer.py checks the real SmolLM2 vocabulary against the tokenizers library;
// test_sentencepiece.cpp tests the SentencePiece model ("llama").
#include <gtest/gtest.h>

#include <random>

#include "attn/gguf.hpp"
#include "attn/tokenizer.hpp"
#include "tokenizer/byte_level.hpp"
#include "tokenizer/pretokenize.hpp"
#include "tokenizer/unicode_class.hpp"
#include "support/expect_error.hpp"
#include "support/gguf_image.hpp"

namespace attn {
namespace {

using testing::expect_error;

const std::string kSmolTemplate =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' "
    "+ message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

std::string byte_token(uint8_t b) { return tokenizer::utf8_of(tokenizer::byte_to_char(b)); }

// Ids 0..2 are control tokens, 3..258 the 256 bytes (id = 3 + byte), then one token per merge.
TokenizerVocab tiny(const std::vector<std::string>& merges, const std::string& pre = "smollm") {
  TokenizerVocab v;
  v.tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  v.types = {3, 3, 3};
  for (int b = 0; b < 256; ++b) v.tokens.push_back(byte_token(static_cast<uint8_t>(b))), v.types.push_back(1);
  for (const std::string& m : merges) {
    const size_t space = m.find(' ');
    v.tokens.push_back(m.substr(0, space) + m.substr(space + 1));
    v.types.push_back(1);
  }
  v.merges = merges;
  v.pre = pre;
  v.bos_id = 1, v.eos_id = 2;
  v.chat_template = kSmolTemplate;
  return v;
}
int32_t id_of_byte(char c) { return 3 + static_cast<uint8_t>(c); }

// The texts of the tokens `text` encodes to.
std::vector<std::string> token_texts(const Tokenizer& t, std::string_view text, bool special = true) {
  std::vector<std::string> out;
  for (const int32_t id : t.encode(text, special)) out.push_back(t.token_text(id));
  return out;
}

std::vector<std::string> pieces(std::string_view text, tokenizer::PreTokenizer kind = tokenizer::PreTokenizer::smollm) {
  std::vector<std::string_view> p;
  tokenizer::pretokenize(text, kind, p);
  return {p.begin(), p.end()};
}

using Strings = std::vector<std::string>;

TEST(TokenizerUnicode, ClassesAndUtf8) {
  using tokenizer::CharClass;
  EXPECT_EQ(tokenizer::char_class(U'a'), CharClass::letter);
  EXPECT_EQ(tokenizer::char_class(U'東'), CharClass::letter);
  EXPECT_EQ(tokenizer::char_class(U'5'), CharClass::number);
  EXPECT_EQ(tokenizer::char_class(U'\u0661'), CharClass::number);  // Arabic-Indic one
  EXPECT_EQ(tokenizer::char_class(U'\u00BD'), CharClass::number);  // one half (No)
  EXPECT_EQ(tokenizer::char_class(U'\u216B'), CharClass::number);  // Roman twelve (Nl)
  EXPECT_EQ(tokenizer::char_class(U'\u3000'), CharClass::space);
  EXPECT_EQ(tokenizer::char_class(U'\u00A0'), CharClass::space);
  EXPECT_EQ(tokenizer::char_class(U'\u0085'), CharClass::space);
  EXPECT_EQ(tokenizer::char_class(U'\u000B'), CharClass::space);
  EXPECT_EQ(tokenizer::char_class(U'\u200B'), CharClass::other);  // zero width space is Cf
  EXPECT_EQ(tokenizer::char_class(U'\u0301'), CharClass::other);  // combining acute is Mn
  EXPECT_EQ(tokenizer::char_class(U'!'), CharClass::other);
  EXPECT_EQ(tokenizer::char_class(U'\U0001F642'), CharClass::other);
  EXPECT_EQ(tokenizer::char_class(U'\U0010FFFF'), CharClass::other);
  EXPECT_STREQ(Tokenizer::unicode_version(), "16.0.0");

  const std::string s = "a\xC3\xA9\xE6\x9D\xB1\xF0\x9F\x99\x82";  // a é 東 🙂
  EXPECT_EQ(tokenizer::utf8_at(s, 0).code, U'a');
  EXPECT_EQ(tokenizer::utf8_at(s, 1).code, U'é');
  EXPECT_EQ(tokenizer::utf8_at(s, 1).length, 2u);
  EXPECT_EQ(tokenizer::utf8_at(s, 3).code, U'東');
  EXPECT_EQ(tokenizer::utf8_at(s, 6).code, U'\U0001F642');
  EXPECT_EQ(tokenizer::utf8_at(s, 6).length, 4u);
  for (const std::string bad : {"\x80", "\xC0\xAF", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xF0\x9F\x99",
                                "\xC3", "\xFF"}) {
    EXPECT_EQ(tokenizer::utf8_at(bad, 0).code, tokenizer::kNotUtf8) << bad;
    EXPECT_EQ(tokenizer::utf8_at(bad, 0).length, 1u) << bad;
  }
}

TEST(TokenizerUnicode, ByteLevelAlphabet) {
  EXPECT_EQ(tokenizer::byte_to_char(' '), U'Ġ');
  EXPECT_EQ(tokenizer::byte_to_char('\n'), U'Ċ');
  EXPECT_EQ(tokenizer::byte_to_char('a'), U'a');
  EXPECT_EQ(tokenizer::byte_to_char(0xE9), U'é');
  EXPECT_EQ(tokenizer::byte_to_char(0), U'\u0100');
  EXPECT_EQ(tokenizer::byte_to_char(0xAD), U'\u0143');
  for (int b = 0; b < 256; ++b) EXPECT_EQ(tokenizer::char_to_byte(tokenizer::byte_to_char(static_cast<uint8_t>(b))), b);
  EXPECT_EQ(tokenizer::char_to_byte(U' '), -1);
  EXPECT_EQ(tokenizer::char_to_byte(U'\u0144'), -1);
}

// Expected pieces: Hugging Face's pre_tokenize_str with the same pre-tokenizers.
TEST(TokenizerPieces, Gpt2RegexAndDigits) {
  EXPECT_EQ(pieces("it's  hello  world\n\n x"), (Strings{"it", "'s", " ", " hello", " ", " world", "\n\n", " x"}));
  EXPECT_EQ(pieces("I'LL we'll 're 've'm'd't"),
            (Strings{"I", "'", "LL", " we", "'ll", " '", "re", " '", "ve", "'m", "'d", "'t"}));
  EXPECT_EQ(pieces("a12 3.5x"), (Strings{"a", "1", "2", " ", "3", ".", "5", "x"}));
  EXPECT_EQ(pieces("a12 3.5x", tokenizer::PreTokenizer::gpt2), (Strings{"a", "12", " 3", ".", "5", "x"}));
  EXPECT_EQ(pieces("  \t end  "), (Strings{"  \t", " end", "  "}));
  EXPECT_EQ(pieces("Ünïcödé 東京 🙂👍🏽!!"), (Strings{"Ünïcödé", " 東京", " 🙂👍🏽!!"}));
  EXPECT_EQ(pieces("x\u3000\u3000y\u00a0 z"), (Strings{"x", "\u3000", "\u3000", "y", "\u00a0", " z"}));
  EXPECT_EQ(pieces("١٢٣ ½ Ⅻ"), (Strings{"١", "٢", "٣", " ", "½", " ", "Ⅻ"}));
  EXPECT_EQ(pieces("١٢٣ ½ Ⅻ", tokenizer::PreTokenizer::gpt2), (Strings{"١٢٣", " ½", " Ⅻ"}));
  EXPECT_EQ(pieces(""), Strings{});
  EXPECT_EQ(pieces(" "), Strings{" "});
  // bytes that are not UTF-8 count as punctuation
  EXPECT_EQ(pieces("ab\xFF\xFE cd\x80"), (Strings{"ab", "\xFF\xFE", " cd", "\x80"}));
}

TEST(Tokenizer, MergesApplyByRankThenLeftmost) {
  // "b c" before "a b": abc -> a + bc; the other order: ab + c
  const Tokenizer bc_first(tiny({"b c", "a b"}));
  EXPECT_EQ(token_texts(bc_first, "abc"), (Strings{"a", "bc"}));
  const Tokenizer ab_first(tiny({"a b", "b c"}));
  EXPECT_EQ(token_texts(ab_first, "abc"), (Strings{"ab", "c"}));
  // equal pairs: the leftmost first
  const Tokenizer aa(tiny({"a a"}));
  EXPECT_EQ(token_texts(aa, "aaaaa"), (Strings{"aa", "aa", "a"}));
  // merges build on merges, and the space leads a word
  const Tokenizer hello(tiny({"l l", "h e", "he ll", "hell o", "Ġ w", "Ġw o"}));
  EXPECT_EQ(token_texts(hello, "hello wor"), (Strings{"hello", "Ġwo", "r"}));
  EXPECT_EQ(hello.encode("hello"), (std::vector<int32_t>{259 + 3}));
  // no merge crosses a piece: "l l" never joins the two words
  EXPECT_EQ(token_texts(hello, "l l"), (Strings{"l", "Ġ", "l"}));
  // a long word (the queue, not a quadratic scan, decides)
  const std::string long_word(10001, 'a');
  const std::vector<int32_t> ids = aa.encode(long_word);
  ASSERT_EQ(ids.size(), 5001u);
  EXPECT_EQ(aa.token_text(ids.front()), "aa");
  EXPECT_EQ(aa.token_text(ids.back()), "a");
}

TEST(Tokenizer, DigitsOneByOne) {
  const std::vector<std::string> merges = {"1 2", "Ġ 3", "Ġ a"};
  const Tokenizer smollm(tiny(merges));
  EXPECT_EQ(token_texts(smollm, "a12 3"), (Strings{"a", "1", "2", "Ġ", "3"}));
  const Tokenizer gpt2(tiny(merges, "gpt2"));
  EXPECT_EQ(token_texts(gpt2, "a12 3"), (Strings{"a", "12", "Ġ3"}));
}

TEST(Tokenizer, SpecialTokens) {
  const Tokenizer t(tiny({"h i", "Ġ h"}));
  const std::string text = "<|im_start|>user\nhi<|im_end|>";
  EXPECT_EQ(t.encode(text), (std::vector<int32_t>{1, id_of_byte('u'), id_of_byte('s'), id_of_byte('e'),
                                                   id_of_byte('r'), id_of_byte('\n'), 259, 2}));
  EXPECT_EQ(token_texts(t, "a<|endoftext|><|endoftext|> hi"), (Strings{"a", "<|endoftext|>", "<|endoftext|>", "Ġ", "hi"}));
  // special=false: the same text is text
  const std::vector<int32_t> plain = t.encode(text, false);
  for (const int32_t id : plain) EXPECT_GE(id, 3);
  EXPECT_EQ(token_texts(t, "<|im_end|>", false), (Strings{"<", "|", "i", "m", "_", "e", "n", "d", "|", ">"}));
  EXPECT_EQ(t.decode(plain), text);
  EXPECT_EQ(t.decode(t.encode(text)), text);
  EXPECT_TRUE(t.is_special(1));
  EXPECT_FALSE(t.is_special(3));
  // a prefix of a special token is text; leftmost, then longest
  EXPECT_EQ(token_texts(t, "<|im_end"), (Strings{"<", "|", "i", "m", "_", "e", "n", "d"}));
  TokenizerVocab v = tiny({});
  v.tokens.push_back("<x>"), v.types.push_back(4);   // user-defined tokens match too
  v.tokens.push_back("<x>y"), v.types.push_back(3);
  const Tokenizer longest(v);
  EXPECT_EQ(token_texts(longest, "<x><x>y<x>z"), (Strings{"<x>", "<x>y", "<x>", "z"}));
}

TEST(Tokenizer, BytesWithoutTokensAreDropped) {
  // As Hugging Face's BPE without an unk_token: the byte goes, and its neighbours may merge.
  TokenizerVocab v = tiny({"! !"});
  v.tokens.erase(v.tokens.begin() + 3 + '~');
  v.types.pop_back();
  const Tokenizer t(v);
  EXPECT_EQ(token_texts(t, "a~b"), (Strings{"a", "b"}));
  EXPECT_EQ(token_texts(t, "!~!"), (Strings{"!!"}));
  EXPECT_EQ(token_texts(t, "~"), Strings{});
  EXPECT_EQ(t.decode(t.encode("x~y")), "xy");
}

TEST(Tokenizer, DecodeKeepsPartialUtf8) {
  const Tokenizer t(tiny({}));
  const std::vector<int32_t> e_acute = t.encode("é");  // two byte tokens
  ASSERT_EQ(e_acute.size(), 2u);
  EXPECT_EQ(t.token_text(e_acute[0]), "Ã");
  EXPECT_EQ(t.decode({e_acute[0]}), "\xC3");
  EXPECT_EQ(t.decode({e_acute[1]}), "\xA9");
  EXPECT_EQ(t.decode(e_acute), "é");
  EXPECT_EQ(t.decode({}), "");
  EXPECT_EQ(t.decode({1, id_of_byte(' '), 2}), "<|im_start|> <|im_end|>");
}

TEST(Tokenizer, RoundTripsAnyBytes) {
  const Tokenizer t(tiny({"Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "Ġ Ġ", "1 2"}));
  std::mt19937 rng(7);
  const std::vector<std::string> alphabet = {"a", "e", "h", "t", " ", "  ", "\n", "\t", "1", "2", "'s", "é", "東",
                                             "🙂", "\u3000", "\u00a0", "\u0301", "\xFF", "\x80", "\xC3", "<|im_end|>",
                                             "<|", "|>", "٣", "."};
  for (int trial = 0; trial < 500; ++trial) {
    std::string text;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) text += alphabet[rng() % alphabet.size()];
    EXPECT_EQ(t.decode(t.encode(text)), text) << text;
    EXPECT_EQ(t.decode(t.encode(text, false)), text) << text;
  }
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes += static_cast<char>(b);
  EXPECT_EQ(t.decode(t.encode(all_bytes)), all_bytes);
}

TEST(TokenizerChat, SmolLM2Template) {
  const Tokenizer t(tiny({}));
  const std::string system = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";
  EXPECT_EQ(t.chat_prompt({{"user", "Hi!"}}, true), system + "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.chat_prompt({{"user", "Hi!"}, {"assistant", "Hello."}}, false),
            system + "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n");
  EXPECT_EQ(t.chat_prompt({{"system", "Be brief."}, {"user", "2+2?"}}, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.chat_prompt({}, true), "<|im_start|>assistant\n");  // the loop never runs: no system turn
  EXPECT_EQ(t.chat_prompt({}, false), "");
  // a system message later on is just a turn
  EXPECT_EQ(t.chat_prompt({{"user", "a"}, {"system", "b"}}, false),
            system + "<|im_start|>user\na<|im_end|>\n<|im_start|>system\nb<|im_end|>\n");
}

TEST(TokenizerChat, OtherSpellingsOfChatML) {
  TokenizerVocab v = tiny({});
  v.chat_template =
      "{%- for message in messages -%}{{ \"<|im_start|>\" + message.role + \"\\n\" + message.content + \"<|im_end|>\\n\" }}"
      "{%- endfor %}{% if add_generation_prompt %}{{ '<|im_start|>' + 'assistant\\n' }}{% endif %}";
  const Tokenizer t(v);
  EXPECT_EQ(t.chat_prompt({{"user", "x"}}, true), "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
  v.chat_template = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}{% endfor %}";
  EXPECT_EQ(Tokenizer(v).chat_prompt({{"user", "x"}}, true), "<|im_start|>user\nx<|im_end|>\n");
}

TEST(TokenizerChat, OtherTemplatesAreRefused) {
  TokenizerVocab v = tiny({});
  const auto refused = [&](const std::string& tmpl, const std::string& fragment) {
    v.chat_template = tmpl;
    const Tokenizer t(v);                          // tokenizing still works
    EXPECT_EQ(t.decode(t.encode("ok")), "ok");
    expect_error([&] { t.chat_prompt({{"user", "x"}}, true); }, fragment);
  };
  refused("{% for message in messages %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endfor %}",
          "tokenizer: tokenizer.chat_template: writes a message as {{ '[INST] ' + message['content'] + ' [/INST]' }}, not as "
          "'<|im_start|>' + role");
  refused("{{ bos_token }}{% for message in messages %}",
          "is not the ChatML template attn replicates: expected {% for message in messages %} (at character 0");
  refused("{% for message in messages %}{{ bos_token }}", "has the expression {{ bos_token }}; the ChatML template joins");
  refused("{% for m in messages %}", "expected {% for message in messages %}");
  refused("hello {% for message in messages %}", "has text outside {% %} and {{ }} tags; the ChatML template has none (at character 0: 'hello");
  refused("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}",
          "has the generation prompt {{ '<|assistant|>' }}, not '<|im_start|>assistant\\n' (ChatML)");
  refused("{% for message in messages %}{{ 'abc }}", "string literal that is never closed");
  v.chat_template = "";
  expect_error([&] { Tokenizer(v).chat_prompt({}, true); }, "tokenizer: has no chat template (tokenizer.chat_template)");
}

TEST(Tokenizer, BadVocabulariesAreRefused) {
  const auto refused = [](TokenizerVocab v, const std::string& fragment) { expect_error([&] { Tokenizer t(v, "tiny.gguf"); }, fragment); };
  TokenizerVocab v = tiny({});
  v.merges = {"a q"};
  refused(v, "tiny.gguf: merges[0] 'a q' makes 'aq', which is not in the vocabulary");
  v = tiny({"a b"});
  v.merges = {"a b", "a zz"};
  refused(v, "tiny.gguf: merges[1] 'a zz' names the token 'zz', which is not in the vocabulary");
  v.merges = {"ab"};
  refused(v, "merges[0] 'ab' is not two tokens separated by one space");
  v.merges = {"a b", "a b"};
  refused(v, "merges[1] 'a b' repeats merges[0]");
  v = tiny({});
  v.tokens.push_back("a"), v.types.push_back(1);
  refused(v, "tokens[259] 'a' repeats tokens[100]");
  v = tiny({});
  v.types.pop_back();
  refused(v, "token_type has 258 entries, expected one per token (259)");
  v = tiny({});
  v.pre = "llama3";
  refused(v, "pre-tokenizer 'llama3' is not one attn knows (smollm, gpt2)");
  v = tiny({});
  v.eos_id = 259;
  refused(v, "eos_token_id 259 is not a token id in [0, 259)");
  refused(TokenizerVocab{}, "tiny.gguf: tokens: the vocabulary is empty");
}

TEST(Tokenizer, BadIdsAreRefused) {
  const Tokenizer t(tiny({}));
  EXPECT_EQ(t.vocab_size(), 259);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  expect_error([&] { t.decode({5, 259}); }, "Tokenizer::decode: ids[1] = 259 is not a token id in [0, 259)");
  expect_error([&] { t.decode({-1}); }, "Tokenizer::decode: ids[0] = -1 is not a token id in [0, 259)");
  expect_error([&] { t.token_text(300); }, "Tokenizer::token_text: id 300 is not a token id in [0, 259)");
}

using testing::GgufImage;

TEST(Tokenizer, FromGguf) {
  const TokenizerVocab v = tiny({"h i", "Ġ hi"});
  GgufImage g;
  g.text("general.architecture", "llama");
  g.text("tokenizer.ggml.model", "gpt2");
  g.text("tokenizer.ggml.pre", "smollm");
  g.strings("tokenizer.ggml.tokens", v.tokens);
  g.ints("tokenizer.ggml.token_type", v.types);
  g.strings("tokenizer.ggml.merges", v.merges);
  g.u32("tokenizer.ggml.bos_token_id", 1);
  g.u32("tokenizer.ggml.eos_token_id", 2);
  g.text("tokenizer.chat_template", kSmolTemplate);
  const std::vector<uint8_t> file = g.file();
  const Tokenizer t = Tokenizer::from_gguf(GgufFile::parse(file.data(), file.size(), "t.gguf"));
  EXPECT_EQ(t.vocab_size(), 261);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(token_texts(t, "<|im_start|>hi hi"), (Strings{"<|im_start|>", "hi", "Ġhi"}));
  EXPECT_EQ(t.chat_prompt({{"system", "s"}}, false), "<|im_start|>system\ns<|im_end|>\n");

  GgufImage none;
  none.text("general.architecture", "llama");
  const std::vector<uint8_t> bare = none.file();
  expect_error([&] { Tokenizer::from_gguf(GgufFile::parse(bare.data(), bare.size(), "bare.gguf")); },
               "bare.gguf: has no tokenizer: the metadata 'tokenizer.ggml.model' is missing");
  GgufImage unigram;
  unigram.text("tokenizer.ggml.model", "t5");
  const std::vector<uint8_t> unigram_file = unigram.file();
  expect_error([&] { Tokenizer::from_gguf(GgufFile::parse(unigram_file.data(), unigram_file.size(), "t5.gguf")); },
               "t5.gguf: tokenizer.ggml.model is 't5'; attn reads byte-level BPE ('gpt2') and SentencePiece BPE ('llama') tokenizers");
  GgufImage wrong;
  wrong.text("tokenizer.ggml.model", "gpt2");
  wrong.ints("tokenizer.ggml.tokens", {1, 2});
  const std::vector<uint8_t> wrong_file = wrong.file();
  expect_error([&] { Tokenizer::from_gguf(GgufFile::parse(wrong_file.data(), wrong_file.size(), "w.gguf")); },
               "w.gguf: metadata 'tokenizer.ggml.tokens' must be an array of string, got an array of int32");
  GgufImage no_merges;
  no_merges.text("tokenizer.ggml.model", "gpt2");
  no_merges.strings("tokenizer.ggml.tokens", v.tokens);
  const std::vector<uint8_t> no_merges_file = no_merges.file();
  expect_error([&] { Tokenizer::from_gguf(GgufFile::parse(no_merges_file.data(), no_merges_file.size(), "m.gguf")); },
               "m.gguf: has no metadata 'tokenizer.ggml.merges'");
}

}  // namespace
}  // namespace attn
