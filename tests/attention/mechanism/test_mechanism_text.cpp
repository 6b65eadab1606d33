#include <gtest/gtest.h>

#include "support/expect_error.hpp"
#include "attn/error.hpp"
#include "attn/info.hpp"
#include "attn/mechanism.hpp"

namespace attn {
namespace {

TEST(MechanismText, ParsesEveryOption) {
  const auto m = std::get<Softmax>(parse_mechanism(
      "softmax:causal,scale=0.1,window=128:0,softcap=30,score=cosine,entropy_scale=512,dropout=0.1,seed=7"));
  EXPECT_TRUE(m.causal);
  EXPECT_DOUBLE_EQ(*m.scale, 0.1);
  EXPECT_EQ(m.window_left, 128);
  EXPECT_EQ(m.window_right, 0);
  EXPECT_DOUBLE_EQ(m.softcap, 30);
  EXPECT_EQ(m.score, ScoreKind::cosine);
  EXPECT_EQ(m.entropy_train_len, 512);
  EXPECT_DOUBLE_EQ(m.dropout, 0.1);
  EXPECT_EQ(m.seed, 7u);
  EXPECT_EQ(std::get<Softmax>(parse_mechanism("softmax")), Softmax{});
}

TEST(MechanismText, UnknownOptionListsTheKnownOnes) {
  try {
    parse_mechanism("softmax:causal,windw=3:0");
    ADD_FAILURE() << "parsed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(known: causal, score=dot|cosine|additive, scale=X"), std::string::npos)
        << e.what();
  }
}

TEST(MechanismText, KindsComeFromTheVariant) {
  // Every alternative of the variant, in its order, each once.
  std::string expected;
  for (const MechanismInfo& f : family_infos()) expected += (expected.empty() ? "" : ", ") + f.family;
  EXPECT_EQ(known_kinds(), expected);
  EXPECT_EQ(known_kinds().rfind("softmax, longformer, bigbird, linformer, lsh, dca, linear", 0), 0u);
  EXPECT_EQ(kind_of(parse_mechanism("softmax:causal")), "softmax");
  EXPECT_EQ(kind_of(parse_mechanism("linformer:k=64")), "linformer");
}

TEST(MechanismText, ManyOptionsAreCheckedInOnePass) {
  // 60000 options (the duplicate check is a hash set, not a quadratic scan): the repeat is named.
  std::string text = "softmax:";
  for (int i = 0; i < 60000; ++i) text += "o" + std::to_string(i) + "=1,";
  text += "o7=2";
  testing::expect_error([&] { parse_mechanism(text); }, "softmax option 'o7' is given twice ('o7=1' and 'o7=2')");
  text.resize(text.size() - 5);
  testing::expect_error([&] { parse_mechanism(text); }, "unknown softmax option 'o0=1'");
}

TEST(MechanismText, MessagesQuoteABoundedEscapedPieceOfTheText) {
  // 1 MB of text gave a 1 MB message (2 MB when quoted twice); a NUL ended it where C reads it
  const std::string huge = "softmax:" + std::string(1 << 20, 'a');
  try {
    parse_mechanism(huge);
    ADD_FAILURE() << "1 MB option was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_LT(m.size(), 600u) << m.substr(0, 600);
    EXPECT_NE(m.find("unknown softmax option '" + std::string(80, 'a') + "'... (1048576 characters)"), std::string::npos)
        << m.substr(0, 600);
  }
  testing::expect_error([] { parse_mechanism(std::string("softmax:cau\0sal", 15)); },
                        "unknown softmax option 'cau\\x00sal'");
  testing::expect_error([] { parse_mechanism("soft\nmax"); }, "unknown mechanism 'soft\\x0amax' in 'soft\\x0amax'");
  testing::expect_error([] { parse_mechanism("nosuch:" + std::string(5000, 'b')); },
                        "'... (5007 characters) (known: softmax,");
}

TEST(MechanismText, RoundTrips) {
  for (const char* text : {"softmax", "softmax:causal", "softmax:causal,scale=0.125,window=-1:0,softcap=30",
                           "softmax:score=additive", "softmax:dropout=0.5,seed=3", "linformer",
                           "linformer:k=64,seed=9,scale=0.25", "lsh", "lsh:buckets=8,rounds=3,chunk=16,seed=2,causal,shared_qk,scale=0.5",
                           "dca", "dca:chunk=512,local=64,theta=500000,interleaved,scale=0.1"}) {
    const Mechanism m = parse_mechanism(text);
    EXPECT_EQ(parse_mechanism(to_string(m)), m) << text;
  }
  EXPECT_EQ(to_string(parse_mechanism("softmax:causal,scale=0.5")), "softmax:causal,scale=0.5");
}

TEST(MechanismText, ErrorsNameTheBadToken) {
  auto expect = [](const char* text, const char* fragment) {
    testing::expect_error([&] { parse_mechanism(text); }, fragment);
  };
  expect("softmax:casual", "unknown softmax option 'casual'");
  expect("softmax:scale=abc", "in 'scale=abc': expected a number (plain decimal), got 'abc'");
  expect("softmax:scale", "option 'scale' needs a value");
  expect("softmax:window=5", "expected window=LEFT:RIGHT");
  expect("softmax:causal,,scale=1", "empty option");
  expect("softmax:causal=1", "is a flag and takes no value");
  expect("softmax:score=dot2", "score must be dot, cosine or additive");
  expect("sofmax", "unknown mechanism 'sofmax'");
  expect("softmax:", "nothing after ':'");
  expect("softmax:scale=inf", "expected a number");
  // Strict parsing (hardening issue, class 7): duplicates, hex, spaces, stray signs.
  expect("softmax:scale=1,scale=2", "option 'scale' is given twice");
  expect("softmax:causal,causal", "option 'causal' is given twice");
  expect("softmax:scale=0x10", "in 'scale=0x10': expected a number");
  expect("softmax:scale= 1", "expected a number");
  expect("softmax:scale=1 ", "expected a number");
  expect("softmax:window=1.5:0", "expected an integer");
  expect("softmax:seed=-1", "expected a non-negative integer");
  expect("softmax:entropy_scale=99999999999999999999", "out of range");
  expect("softmax:=3", "has no name");
}

}  // namespace
}  // namespace attn
