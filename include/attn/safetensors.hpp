// safetensors files (Hugging Face's weight format): an 8-byte little-endian header length N, N
// bytes of JSON naming each tensor's dtype, shape and [begin, end) byte range in the data that
// follows, and an optional "__metadata__" map of strings. Read by mapping the file, so tensors are
// used where they lie; every length, offset, shape and dtype is checked against the file before
// anything is read, and a bad file is an Error naming the file and what is wrong.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "attn/dtype.hpp"

namespace attn {

struct SafetensorsTensor {
  std::string dtype;            // as written: "F32", "BF16", "F16", "I64", ...
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapped file
  int64_t bytes = 0;
  // The storage type for the float dtypes attn computes with (F32, BF16, F16); Error otherwise.
  DType float_dtype(const std::string& name) const;
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps and checks `path`.
  static SafetensorsFile open(const std::string& path);
  // Checks a file image held by the caller (not copied: it must outlive the result). `name`
  // prefixes error messages.
  static SafetensorsFile parse(const uint8_t* data, size_t size, const std::string& name = "safetensors");

  const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& name() const { return name_; }
  bool contains(const std::string& tensor) const { return tensors_.count(tensor) != 0; }
  // The tensor, or an Error naming the file and the missing tensor.
  const SafetensorsTensor& at(const std::string& tensor) const;

 private:
  std::shared_ptr<const void> mapping_;  // keeps an mmap alive (open()); empty for parse()
  std::string name_;
  std::map<std::string, SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: float32/bfloat16/float16 values, C order.
struct SafetensorsEntry {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes a safetensors file (larger elements first, then by name; the header padded to 8 bytes,
// so every tensor is aligned to its element size). The file appears complete or not at all: it
// is written beside `path` and renamed into place.
void write_safetensors(const std::string& path, const std::map<std::string, SafetensorsEntry>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace attn
