// Gemma's chat turns (files without a template): the text Gemma's own template writes, the
// system message folded into the first user turn, roles in order or an error naming the message.
#include <gtest/gtest.h>

#include "support/expect_error.hpp"
#include "tokenizer/gemma_turns.hpp"

namespace attn::tokenizer {
namespace {

TEST(GemmaTurns, WritesGemmasTemplate) {
  EXPECT_EQ(gemma_turns({{"user", "Hi"}}, true, "t"), "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(gemma_turns({{"user", "Hi"}}, false, "t"), "<start_of_turn>user\nHi<end_of_turn>\n");
  EXPECT_EQ(gemma_turns({{"system", " Be brief. "}, {"user", "  Hi\n"}, {"assistant", "Hello."}, {"user", "Bye"}}, true, "t"),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(gemma_turns({}, true, "t"), "<start_of_turn>model\n");
}

TEST(GemmaTurns, RolesOutOfOrderAreNamed) {
  testing::expect_error([] { gemma_turns({{"assistant", "x"}}, true, "f.gguf: chat turns"); },
                        "f.gguf: chat turns: Gemma's turns alternate user and assistant after an optional first system "
                        "message: message 0 should be user, got 'assistant'");
  testing::expect_error([] { gemma_turns({{"user", "a"}, {"user", "b"}}, true, "t"); },
                        "message 1 should be assistant, got 'user'");
  testing::expect_error([] { gemma_turns({{"user", "a"}, {"system", "b"}}, true, "t"); },
                        "message 1 should be assistant, got 'system'");
}

}  // namespace
}  // namespace attn::tokenizer
