// safetensors: round trips through the writer, and every kind of bad file is an Error naming
// what is wrong (never a crash or a read outside the file: the ASan build runs these too).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "attn/dtype.hpp"
#include "attn/model.hpp"
#include "attn/safetensors.hpp"
#include "support/expect_error.hpp"

namespace attn {
namespace {

using testing::expect_error;

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "attn_st_" + name; }

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

// A file image from a header text (padded to 8 bytes, as writers do) and a zeroed data section.
std::vector<uint8_t> image(std::string header, size_t data_bytes) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0);
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

void expect_bad(const std::string& header, size_t data_bytes, const std::string& fragment) {
  const std::vector<uint8_t> img = image(header, data_bytes);
  expect_error([&] { SafetensorsFile::parse(img.data(), img.size(), "t.safetensors"); }, fragment);
}

TEST(Safetensors, WritesAndMapsTensorsOfEachFloatType) {
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, -7.0f};
  std::vector<uint16_t> b(5), h(3);
  for (size_t i = 0; i < b.size(); ++i) b[i] = float_to_bf16(0.5f * static_cast<float>(i) - 1.0f);
  for (size_t i = 0; i < h.size(); ++i) h[i] = float_to_f16(2.0f + static_cast<float>(i));
  const std::string path = temp_path("roundtrip.safetensors");
  write_safetensors(path,
                    {{"a", {DType::f32, {2, 3}, a.data()}},
                     {"b.weight", {DType::bf16, {5}, b.data()}},
                     {"h", {DType::f16, {1, 3}, h.data()}},
                     {"empty", {DType::f32, {0, 4}, nullptr}}},
                    {{"format", "pt"}, {"note", "{\"json\": [1, 2]}"}});
  const SafetensorsFile f = SafetensorsFile::open(path);
  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "{\"json\": [1, 2]}");
  const SafetensorsTensor& ta = f.at("a");
  EXPECT_EQ(ta.dtype, "F32");
  EXPECT_EQ(ta.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ta.float_dtype("a"), DType::f32);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(load_as_float(ta.data, DType::f32, i), a[static_cast<size_t>(i)]);
  const SafetensorsTensor& tb = f.at("b.weight");
  EXPECT_EQ(tb.float_dtype("b"), DType::bf16);
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(load_as_float(tb.data, DType::bf16, i), 0.5f * static_cast<float>(i) - 1.0f);
  const SafetensorsTensor& th = f.at("h");
  EXPECT_EQ(th.float_dtype("h"), DType::f16);
  EXPECT_EQ(load_as_float(th.data, DType::f16, 2), 4.0f);
  EXPECT_EQ(f.at("empty").bytes, 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ta.data) % 8, 0u);  // the header is padded to 8 bytes
  expect_error([&] { f.at("missing"); }, "has no tensor 'missing'");
  std::remove(path.c_str());
}

TEST(Safetensors, EveryTruncationOfAValidFileIsAnError) {
  const std::vector<float> a = {1, 2, 3, 4};
  const std::string path = temp_path("trunc.safetensors");
  write_safetensors(path, {{"w", {DType::f32, {2, 2}, a.data()}}, {"v", {DType::f32, {1}, a.data()}}});
  const std::vector<uint8_t> full = read_all(path);
  std::remove(path.c_str());
  EXPECT_NO_THROW(SafetensorsFile::parse(full.data(), full.size()));
  for (size_t n = 0; n < full.size(); ++n)
    EXPECT_THROW(SafetensorsFile::parse(full.data(), n), Error) << "prefix of " << n << " bytes";
}

TEST(Safetensors, BadHeadersNameTheProblem) {
  const std::string ok = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::vector<uint8_t> valid = image(ok, 8);  // the helper builds valid files
  EXPECT_NO_THROW(SafetensorsFile::parse(valid.data(), valid.size()));
  const std::vector<uint8_t> short_img = {1, 2, 3};
  expect_error([&] { SafetensorsFile::parse(short_img.data(), short_img.size(), "t"); }, "shorter than the 8-byte header length");
  std::vector<uint8_t> long_len = image(ok, 8);
  long_len[7] = 0x7f;
  expect_error([&] { SafetensorsFile::parse(long_len.data(), long_len.size(), "t"); }, "runs past the end of the file");
  expect_bad("{\"w\": ", 0, "header is not valid JSON");
  expect_bad("[1, 2]", 0, "header must be a JSON object, got array");
  expect_bad(R"({"w": 3})", 0, "tensor 'w': must be an object");
  expect_bad(R"({"w":{"dtype":"F32","shape":[2]}})", 8, "tensor 'w': has no 'data_offsets'");
  expect_bad(R"({"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8, "unknown dtype 'Q4'");
  expect_bad(R"({"w":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", 8, "dtype must be a string");
  expect_bad(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "each shape entry must be a non-negative integer, got -2");
  expect_bad(R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8, "non-negative integer, got 2.5");
  expect_bad(R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", 8, "shape must be an array");
  expect_bad(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,8]}})", 8, "overflows 64-bit sizes");
  expect_bad(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8, "data_offsets must be [begin, end]");
  expect_bad(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "end before they begin");
  expect_bad(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8, "is past the data (8 bytes)");
  expect_bad(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "holds 8 bytes, but F32 of its shape needs 12");
  expect_bad(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12, "tensors end at data offset 8 but the file holds 12");
  expect_bad(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8,
             "tensor 'b' starts at data offset 4, expected 8 (it overlaps the tensor before it)");
  expect_bad(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12,
             "expected 4 (a gap)");
  expect_bad(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}})", 5,
             "is not aligned to its 4-byte elements");
  expect_bad(R"({"__metadata__":{"k":1},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8,
             "__metadata__['k'] must be a string, got number");
  expect_bad(R"({"__metadata__":[],"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8, "__metadata__ must be an object");
}

TEST(Safetensors, HostileJsonIsBoundedInDepthAndInTheMessage) {
  // 100000 nested arrays: refused while parsing (printing or freeing them would recurse).
  expect_bad(std::string(100000, '[') + std::string(100000, ']'), 0, "nested deeper than 64 levels");
  expect_bad(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":)" + std::string(65, '[') +
                 std::string(65, ']') + "}}",
             8, "nested deeper than 64 levels");
  // A huge value in a message is cut.
  const std::string big = "[" + std::string(100000, '1') + "]";
  try {
    const std::vector<uint8_t> img = image(R"({"w":{"dtype":"F32","shape":)" + big + R"(,"data_offsets":[0,8]}})", 8);
    SafetensorsFile::parse(img.data(), img.size(), "t");
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 300u) << e.what();
  }
  // The decoder config in the metadata: the same bound.
  expect_error([] { DecoderConfig::from_json(std::string(200, '[') + std::string(200, ']'), "m"); },
               "nested deeper than 64 levels");
}

TEST(Safetensors, NonFloatTensorsLoadButAreRefusedForCompute) {
  const std::vector<uint8_t> img = image(R"({"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8);
  const SafetensorsFile f = SafetensorsFile::parse(img.data(), img.size(), "t");
  expect_error([&] { f.at("ids").float_dtype("t: tensor 'ids'"); }, "dtype I64 is not a float type attn computes with");
}

TEST(Safetensors, MissingFilesAndFailedWritesAreErrors) {
  expect_error([] { SafetensorsFile::open(temp_path("does_not_exist")); }, "cannot open");
  expect_error([] { SafetensorsFile::open(::testing::TempDir()); }, "is a directory, not a regular file");
  const float x = 1;
  expect_error([&] { write_safetensors("/nonexistent-dir/x.safetensors", {{"x", {DType::f32, {1}, &x}}}); },
               "/nonexistent-dir/x.safetensors: cannot create a file beside it");
  expect_error([&] { write_safetensors(temp_path("bool"), {{"x", {DType::boolean, {1}, &x}}}); }, "cannot write bool");
}

}  // namespace
}  // namespace attn
