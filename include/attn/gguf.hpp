// GGUF files (llama.cpp's model format, versions 2 and 3): a header, typed metadata (key ->
// value), a tensor directory (name, dimensions, ggml type, offset) and the aligned tensor data.
// Read by mapping the file; every count, length, offset, size, alignment and type is checked
// against the file before anything is read, so a truncated, corrupted or hostile file is an Error
// naming the file, the place and what is wrong.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace attn {

enum class GgufType : uint32_t {
  uint8 = 0, int8 = 1, uint16 = 2, int16 = 3, uint32 = 4, int32 = 5, float32 = 6, boolean = 7,
  string = 8, array = 9, uint64 = 10, int64 = 11, float64 = 12
};
std::string gguf_type_name(GgufType t);

// A metadata value. Numbers (and booleans) are kept as double and, exactly, as int64 when they
// are integers; arrays of numbers in `numbers`, arrays of strings in `strings`.
struct GgufValue {
  GgufType type = GgufType::uint8;
  GgufType element_type = GgufType::uint8;  // arrays
  double number = 0;
  int64_t integer = 0;
  std::string text;
  std::vector<double> numbers;
  std::vector<std::string> strings;
};

// ggml tensor types attn knows the block layout of (the rest are refused by name).
struct GgmlTypeInfo {
  const char* name;
  int64_t block_elements;  // elements per block (1 for F32/F16/BF16)
  int64_t block_bytes;
};
// Layout of ggml type `type`, or nullptr when attn does not know it.
const GgmlTypeInfo* ggml_type_info(uint32_t type);
constexpr uint32_t kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ4_0 = 2, kGgmlQ4_1 = 3, kGgmlQ8_0 = 8, kGgmlBF16 = 30;
constexpr uint32_t kGgmlQ5_0 = 6, kGgmlQ5_1 = 7, kGgmlQ4_K = 12, kGgmlQ5_K = 13, kGgmlQ6_K = 14;

struct GgufTensor {
  std::string name;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the contiguous (row) length
  uint32_t type = 0;
  uint64_t offset = 0;        // from the start of the data section
  int64_t bytes = 0;
  const uint8_t* data = nullptr;
  int64_t elements() const;
};

class GgufFile {
 public:
  static GgufFile open(const std::string& path);
  // Checks a file image the caller keeps alive (fuzzing, tests); `name` prefixes errors.
  static GgufFile parse(const uint8_t* data, size_t size, const std::string& name = "gguf");

  uint32_t version() const { return version_; }
  int64_t alignment() const { return alignment_; }
  const std::string& name() const { return name_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  // Lookups that name the file and the key when it is missing or of another kind.
  const GgufValue& value(const std::string& key) const;
  const GgufTensor& tensor(const std::string& name) const;
  bool has(const std::string& key) const { return metadata_.count(key) != 0; }
  int64_t integer(const std::string& key) const;
  double number(const std::string& key) const;
  const std::string& text(const std::string& key) const;
  // Tells the OS that a mapped file's pages wholly inside tensor t are not needed any more (after
  // a copy): they leave the process's memory and are read from the file again if touched. Does
  // nothing for a parsed image.
  void drop_pages(const GgufTensor& t) const;

 private:
  std::shared_ptr<const void> mapping_;
  std::string name_;
  uint32_t version_ = 0;
  int64_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> by_name_;
};

}  // namespace attn
