// GGUF: files written here byte by byte are read back (metadata of every type, tensors of several
// ggml types, alignment); every truncation and each kind of corruption is an Error naming it.
#include <gtest/gtest.h>

#include <cstring>

#include "attn/gguf.hpp"
#include "support/expect_error.hpp"

namespace attn {
namespace {

using testing::expect_error;

// A little GGUF writer for the tests.
struct Writer {
  std::vector<uint8_t> b;
  template <class T>
  Writer& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Writer& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Writer& header(uint64_t tensors, uint64_t kvs, uint32_t version = 3) {
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    return put<uint32_t>(version).put<uint64_t>(tensors).put<uint64_t>(kvs);
  }
  Writer& tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    str(name).put<uint32_t>(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) put<uint64_t>(d);
    return put<uint32_t>(type).put<uint64_t>(offset);
  }
  Writer& pad(size_t alignment) {
    while (b.size() % alignment) b.push_back(0);
    return *this;
  }
};

// Metadata of several kinds, then an F32 (3, 2) tensor and a Q8_0 (64,) tensor, aligned to 32.
std::vector<uint8_t> sample() {
  Writer w;
  w.header(2, 6);
  w.str("general.architecture").put<uint32_t>(8).str("llama");
  w.str("llama.block_count").put<uint32_t>(4).put<uint32_t>(30);
  w.str("llama.rope.freq_base").put<uint32_t>(6).put<float>(100000.0f);
  w.str("tokenizer.ggml.tokens").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(3).str("a").str("bc").str("<s>");
  w.str("tokenizer.ggml.scores").put<uint32_t>(9).put<uint32_t>(6).put<uint64_t>(2).put<float>(-1.5f).put<float>(2.0f);
  w.str("general.flag").put<uint32_t>(7).put<uint8_t>(1);
  w.tensor("w", {3, 2}, kGgmlF32, 0);
  w.tensor("q", {64}, kGgmlQ8_0, 32);
  w.pad(32);
  for (int i = 0; i < 6; ++i) w.put<float>(static_cast<float>(i) + 0.5f);
  w.pad(32);  // q at data offset 32
  for (int i = 0; i < 2 * 34; ++i) w.put<uint8_t>(static_cast<uint8_t>(i));
  return w.b;
}

TEST(Gguf, ReadsMetadataAndTensors) {
  const std::vector<uint8_t> img = sample();
  const GgufFile f = GgufFile::parse(img.data(), img.size(), "m.gguf");
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.text("general.architecture"), "llama");
  EXPECT_EQ(f.integer("llama.block_count"), 30);
  EXPECT_EQ(f.number("llama.rope.freq_base"), 100000.0);
  EXPECT_EQ(f.value("tokenizer.ggml.tokens").strings, (std::vector<std::string>{"a", "bc", "<s>"}));
  EXPECT_EQ(f.value("tokenizer.ggml.scores").numbers, (std::vector<double>{-1.5, 2.0}));
  EXPECT_EQ(f.integer("general.flag"), 1);
  ASSERT_EQ(f.tensors().size(), 2u);
  const GgufTensor& w = f.tensor("w");
  EXPECT_EQ(w.dims, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(w.bytes, 24);
  float x;
  std::memcpy(&x, w.data + 5 * 4, 4);
  EXPECT_EQ(x, 5.5f);
  const GgufTensor& q = f.tensor("q");
  EXPECT_EQ(q.bytes, 68);  // two Q8_0 blocks of 34 bytes
  EXPECT_EQ(q.data - w.data, 32);
  EXPECT_EQ(q.data[67], 67);
  EXPECT_STREQ(ggml_type_info(q.type)->name, "Q8_0");
  expect_error([&] { f.integer("general.architecture"); }, "metadata 'general.architecture' must be an integer, got string");
  expect_error([&] { f.text("missing.key"); }, "has no metadata 'missing.key'");
  expect_error([&] { f.tensor("nope"); }, "has no tensor 'nope'");
}

TEST(Gguf, EveryTruncationIsAnError) {
  const std::vector<uint8_t> img = sample();
  for (size_t n = 0; n < img.size(); ++n)
    EXPECT_THROW(GgufFile::parse(img.data(), n, "t"), Error) << "prefix of " << n << " bytes";
}

TEST(Gguf, CorruptionsNameTheProblem) {
  auto bad = [](const Writer& w, const std::string& fragment) {
    expect_error([&] { GgufFile::parse(w.b.data(), w.b.size(), "t.gguf"); }, fragment);
  };
  bad(Writer().put<uint32_t>(0x46554747 ^ 1).put<uint32_t>(3), "does not start with the magic 'GGUF'");
  bad(Writer().header(0, 0, 7), "has GGUF version 7, expected 2 or 3");
  bad(Writer().header(0, 1u << 30), "metadata count 1073741824 cannot fit");
  bad(Writer().header(uint64_t{1} << 60, 0), "tensor count 1152921504606846976 cannot fit");
  bad(Writer().header(0, 1).str("k").put<uint32_t>(99), "metadata 'k' has unknown value type 99");
  bad(Writer().header(0, 1).str("k").put<uint32_t>(8).put<uint64_t>(1000), "metadata 'k' length 1000 runs past the end");
  bad(Writer().header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(4).put<uint64_t>(1000), "element count 1000 cannot fit");
  bad(Writer().header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(1), "is an array of arrays");
  // Counts and lengths near 2^64 are weighed against the bytes left before anything is reserved
  // (hardening): an allocation of 2^63 doubles or 2^60 strings would end the process.
  bad(Writer().header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(4).put<uint64_t>(uint64_t{1} << 63).put<uint32_t>(1),
      "element count 9223372036854775808 cannot fit in the 4 bytes left");
  bad(Writer().header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(uint64_t{1} << 60).str("a"),
      "element count 1152921504606846976 cannot fit");
  bad(Writer().header(0, 1).str("k").put<uint32_t>(8).put<uint64_t>(~uint64_t{0}).put<uint32_t>(0),
      "metadata 'k' length 18446744073709551615 runs past the end");
  bad(Writer().header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(uint64_t{1} << 62).put<uint32_t>(9),
      "is an array of arrays");
  bad(Writer().header(0, uint64_t{1} << 62), "metadata count 4611686018427387904 cannot fit");
  bad(Writer().header(0, 1).str("k").put<uint32_t>(7).put<uint8_t>(2), "is a bool with value 2");
  bad(Writer().header(0, 2).str("k").put<uint32_t>(4).put<uint32_t>(1).str("k").put<uint32_t>(4).put<uint32_t>(1),
      "metadata key 'k' appears twice");
  bad(Writer().header(0, 1).str("general.alignment").put<uint32_t>(4).put<uint32_t>(24),
      "general.alignment must be a power of two");
  bad(Writer().header(1, 0).tensor("t", {}, 0, 0).pad(32), "tensor 't' has 0 dimensions, expected 1 to 4");
  bad(Writer().header(1, 0).tensor("t", {4}, 99, 0).pad(32), "ggml type 99, which attn does not know");
  bad(Writer().header(1, 0).tensor("t", {40}, kGgmlQ4_1, 0).pad(32), "rows of 40 elements are not whole Q4_1 blocks of 32");
  bad(Writer().header(1, 0).tensor("t", {uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0).pad(32), "overflows 64-bit sizes");
  bad(Writer().header(1, 0).tensor("t", {4}, 0, 3).pad(32), "offset 3 is not a multiple of the alignment 32");
  bad(Writer().header(1, 0).tensor("t", {64}, 0, 0).pad(32), "tensor 't' (256 bytes at data offset 0) runs past the end");
  bad(Writer().header(2, 0).tensor("t", {4}, 0, 0).tensor("t", {4}, 0, 32).pad(32), "tensor 't' appears twice");
  Writer overlap;
  overlap.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {4}, 0, 32).pad(32);
  overlap.b.resize(overlap.b.size() + 64);
  bad(overlap, "tensors 'a' and 'b' overlap");
}

// The types a Gemma 3 Q4_K_M file mixes in besides Q8_0/F32: sized from their block layout, named,
// and laid out back to back at the aligned offsets.
TEST(Gguf, SizesKQuantAndQ5Tensors) {
  struct Expect {
    const char* name;
    std::vector<uint64_t> dims;
    uint32_t type;
    int64_t bytes;
  };
  const Expect want[] = {{"q5_0", {64}, kGgmlQ5_0, 2 * 22},          {"q5_1", {32, 3}, kGgmlQ5_1, 3 * 24},
                         {"q4_k", {256, 2}, kGgmlQ4_K, 2 * 144},     {"q5_k", {512}, kGgmlQ5_K, 2 * 176},
                         {"q6_k", {256, 3, 2}, kGgmlQ6_K, 6 * 210}};
  const char* names[] = {"Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"};
  Writer w;
  w.header(5, 0);
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const Expect& e : want) {
    offsets.push_back(offset);
    w.tensor(e.name, e.dims, e.type, offset);
    offset += (static_cast<uint64_t>(e.bytes) + 31) / 32 * 32;
  }
  w.pad(32);
  w.b.resize(w.b.size() + offset);
  const GgufFile f = GgufFile::parse(w.b.data(), w.b.size(), "k.gguf");
  for (size_t i = 0; i < 5; ++i) {
    const GgufTensor& t = f.tensor(want[i].name);
    EXPECT_EQ(t.bytes, want[i].bytes) << want[i].name;
    EXPECT_EQ(t.offset, offsets[i]) << want[i].name;
    EXPECT_STREQ(ggml_type_info(t.type)->name, names[i]);
  }
  auto bad = [](const Writer& b, const std::string& fragment) {
    expect_error([&] { GgufFile::parse(b.b.data(), b.b.size(), "t.gguf"); }, fragment);
  };
  bad(Writer().header(1, 0).tensor("t", {128, 2}, kGgmlQ4_K, 0).pad(32), "rows of 128 elements are not whole Q4_K blocks of 256");
  bad(Writer().header(1, 0).tensor("t", {48}, kGgmlQ5_1, 0).pad(32), "rows of 48 elements are not whole Q5_1 blocks of 32");
  Writer short_q6;  // one byte short of two Q6_K blocks
  short_q6.header(1, 0).tensor("t", {512}, kGgmlQ6_K, 0).pad(32);
  short_q6.b.resize(short_q6.b.size() + 419);
  bad(short_q6, "tensor 't' (420 bytes at data offset 0) runs past the end");
}

TEST(Gguf, MissingFilesAreErrors) {
  expect_error([] { GgufFile::open(::testing::TempDir() + "attn_no_such.gguf"); }, "cannot open");
}

}  // namespace
}  // namespace attn
