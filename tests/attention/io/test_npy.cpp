#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "support/expect_error.hpp"
#include "attn/error.hpp"
#include "attn/npy.hpp"

namespace attn {
namespace {

std::vector<uint8_t> npy_bytes(const std::string& header_dict, size_t payload) {
  std::string h = header_dict;
  while ((10 + h.size() + 1) % 64) h.push_back(' ');
  h.push_back('\n');
  std::vector<uint8_t> b = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<uint8_t>(h.size()), 0};
  b.insert(b.end(), h.begin(), h.end());
  b.resize(b.size() + payload, 0);
  return b;
}

TEST(Npy, WriteThenReadRoundTrips) {
  const std::string path = ::testing::TempDir() + "/attn_npy_test.npy";
  std::vector<float> data = {1, 2, 3, 4, 5, 6};
  write_npy(path, DType::f32, {2, 3}, data.data());
  const NpyArray a = read_npy(path);
  EXPECT_EQ(a.dtype, DType::f32);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(a.bytes.size(), 24u);
  EXPECT_EQ(reinterpret_cast<const float*>(a.bytes.data())[5], 6.0f);
  std::remove(path.c_str());
}

TEST(Npy, ParsesNumpyHeaders) {
  auto b = npy_bytes("{'descr': '<f2', 'fortran_order': False, 'shape': (4,), }", 8);
  const NpyArray a = parse_npy(b.data(), b.size());
  EXPECT_EQ(a.dtype, DType::f16);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{4}));
  auto s = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4);
  EXPECT_EQ(parse_npy(s.data(), s.size()).numel(), 1);
}

TEST(Npy, RejectsWithClearMessages) {
  auto expect = [](const std::vector<uint8_t>& b, const char* fragment) {
    testing::expect_error([&] { parse_npy(b.data(), b.size(), "x.npy"); }, fragment);
  };
  expect(npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", 16), "dtype '<f8' is not supported");
  expect(npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", 8), "Fortran-ordered");
  expect(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 8), "payload has 8 bytes, shape and dtype need 12");
  expect(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999, 99999999999), }", 8), "overflows");
  expect({1, 2, 3}, "not a .npy file");
  EXPECT_THROW(read_npy("/nonexistent/file.npy"), Error);
}

// Hardening, class 5: headers are validated first, reads are bounded by what the header promises.
TEST(Npy, HostileFilesFailBeforeReadingMuch) {
  auto message = [](const std::string& path) {
    try {
      read_npy(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("parsed");
  };
  EXPECT_NE(message("/dev/zero").find("is a character device, not a regular file"), std::string::npos);  // would read forever
  const std::string path = ::testing::TempDir() + "/attn_npy_hostile.npy";
  auto write = [&](const std::vector<uint8_t>& b) {
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  };
  // a payload shorter than the header promises (2^40 floats): refused before allocating
  write(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }", 16));
  EXPECT_NE(message(path).find("payload has 16 bytes, shape and dtype need 4398046511104"), std::string::npos)
      << message(path);
  // a header length that lies (shorter than the dict): named as such, not as "dtype ''"
  auto lying = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8);
  lying[8] = 12;
  write(lying);
  EXPECT_NE(message(path).find("npy header length (12 bytes) does not match the header"), std::string::npos)
      << message(path);
  // a version-2 header length of 4 GB
  std::vector<uint8_t> huge = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0xff, 0xff, 0xff, 0xff};
  write(huge);
  EXPECT_NE(message(path).find("is larger than any real header"), std::string::npos) << message(path);
  // trailing bytes after the payload
  write(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 12));
  EXPECT_NE(message(path).find("payload has 12 bytes, shape and dtype need 8"), std::string::npos) << message(path);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace attn
