// A GGUF file image built in memory for tests of what reads GGUF files (the tokenizers, the
// model loaders): typed keys and tensors appended in order, then file() gives the bytes, or
// write() puts them in a file.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
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
  void u64(const std::string& key, uint64_t value) { str(key), put<uint32_t>(10), put<uint64_t>(value), ++count; }
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
  // A tensor of ggml type `type`, dims in ggml order (dims[0] the row length), its bytes as stored.
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::vector<uint8_t> bytes;
  };
  std::vector<Tensor> tensors;
  void tensor(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type, std::vector<uint8_t> bytes) {
    tensors.push_back({name, dims, type, std::move(bytes)});
  }
  // The file: GGUF v3, the entries above, the tensors' infos, then their data (32-byte aligned).
  std::vector<uint8_t> file() const {
    GgufImage f;
    f.b = {'G', 'G', 'U', 'F'};
    f.put<uint32_t>(3), f.put<uint64_t>(tensors.size()), f.put<uint64_t>(count);
    f.b.insert(f.b.end(), b.begin(), b.end());
    uint64_t offset = 0;
    for (const Tensor& t : tensors) {
      f.str(t.name), f.put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) f.put<uint64_t>(d);
      f.put<uint32_t>(t.type), f.put<uint64_t>(offset);
      offset = (offset + t.bytes.size() + 31) / 32 * 32;
    }
    f.b.resize((f.b.size() + 31) / 32 * 32, 0);
    const size_t data = f.b.size();
    f.b.resize(data + offset, 0);
    offset = 0;
    for (const Tensor& t : tensors) {
      if (!t.bytes.empty()) std::memcpy(&f.b[data + offset], t.bytes.data(), t.bytes.size());
      offset = (offset + t.bytes.size() + 31) / 32 * 32;
    }
    return f.b;
  }
  // file() into `path`; false if it cannot be written.
  bool write(const std::string& path) const {
    const std::vector<uint8_t> bytes = file();
    FILE* out = std::fopen(path.c_str(), "wb");
    if (!out) return false;
    const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), out) == bytes.size();
    return std::fclose(out) == 0 && ok;
  }
};

}  // namespace attn::testing
