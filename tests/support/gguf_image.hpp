// A GGUF file image built in memory, metadata only (no tensors), for tests of what reads GGUF
// metadata (the tokenizers): typed keys appended in order, then file() gives the bytes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace attn::testing {

struct GgufImage {
  std::vector<uint8_t> b;  // the metadata entries
  uint64_t count = 0;
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  void text(const std::string& key, const std::string& value) { str(key), put<uint32_t>(8), str(value), ++count; }
  void u32(const std::string& key, uint32_t value) { str(key), put<uint32_t>(4), put<uint32_t>(value), ++count; }
  void flag(const std::string& key, bool value) { str(key), put<uint32_t>(7), put<uint8_t>(value), ++count; }
  void strings(const std::string& key, const std::vector<std::string>& values) {
    str(key), put<uint32_t>(9), put<uint32_t>(8), put<uint64_t>(values.size()), ++count;
    for (const auto& s : values) str(s);
  }
  void ints(const std::string& key, const std::vector<int32_t>& values) {
    str(key), put<uint32_t>(9), put<uint32_t>(5), put<uint64_t>(values.size()), ++count;
    for (const int32_t v : values) put<int32_t>(v);
  }
  void floats(const std::string& key, const std::vector<float>& values) {
    str(key), put<uint32_t>(9), put<uint32_t>(6), put<uint64_t>(values.size()), ++count;
    for (const float v : values) put<float>(v);
  }
  // The file: GGUF v3, no tensors, the entries above.
  std::vector<uint8_t> file() const {
    std::vector<uint8_t> f = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
    for (int i = 0; i < 8; ++i) f.push_back(0);  // no tensors
    for (int i = 0; i < 8; ++i) f.push_back(static_cast<uint8_t>(count >> (8 * i)));
    f.insert(f.end(), b.begin(), b.end());
    return f;
  }
};

}  // namespace attn::testing
