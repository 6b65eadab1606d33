// GGUF: a bounds-checked cursor over the mapped file. Nothing is read before the bytes it needs
// are known to be inside the file, every count is weighed against the bytes left (an element of
// any type takes at least one byte, so a count larger than what is left cannot be honest), and
// sizes are computed with overflow checks.
#include "attn/gguf.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "attn/error.hpp"
#include "base/checked_math.hpp"
#include "formats/mapped_file.hpp"

namespace attn {
namespace {

constexpr uint32_t kMaxDims = 4;           // GGML_MAX_DIMS
constexpr int64_t kMaxAlignment = 1 << 20;  // a generous bound on general.alignment

class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& name) : data_(data), size_(size), name_(name) {}

  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }

  [[noreturn]] void bad(const std::string& what) const {
    fail(name_, what + " (at byte " + std::to_string(pos_) + " of " + std::to_string(size_) + ")");
  }
  void need(size_t n, const std::string& what) const {
    if (n > left()) bad(what + " needs " + std::to_string(n) + " bytes, " + std::to_string(left()) + " are left: the file is truncated");
  }
  template <class T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));  // little-endian, as GGUF is on the CPUs we run
    pos_ += sizeof(T);
    return v;
  }
  std::string string(const std::string& what) {
    const uint64_t n = read<uint64_t>(what + " length");
    if (n > left()) bad(what + " length " + std::to_string(n) + " runs past the end of the file");
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  // A count of items of at least `min_bytes` each that must fit in what is left.
  uint64_t count(const std::string& what, size_t min_bytes) {
    const uint64_t n = read<uint64_t>(what);
    if (n > left() / min_bytes)
      bad(what + " " + std::to_string(n) + " cannot fit in the " + std::to_string(left()) + " bytes left");
    return n;
  }

 private:
  const uint8_t* data_;
  size_t size_, pos_ = 0;
  const std::string& name_;
};

size_t scalar_bytes(GgufType t) {
  switch (t) {
    case GgufType::uint8: case GgufType::int8: case GgufType::boolean: return 1;
    case GgufType::uint16: case GgufType::int16: return 2;
    case GgufType::uint32: case GgufType::int32: case GgufType::float32: return 4;
    case GgufType::uint64: case GgufType::int64: case GgufType::float64: return 8;
    default: return 0;  // string, array
  }
}

// A scalar number of type t as (double, exact int64 when integral).
void read_number(Cursor& c, GgufType t, const std::string& what, double& number, int64_t& integer) {
  switch (t) {
    case GgufType::uint8: integer = c.read<uint8_t>(what); break;
    case GgufType::int8: integer = c.read<int8_t>(what); break;
    case GgufType::boolean: {
      const uint8_t b = c.read<uint8_t>(what);
      if (b > 1) c.bad(what + " is a bool with value " + std::to_string(b));
      integer = b;
      break;
    }
    case GgufType::uint16: integer = c.read<uint16_t>(what); break;
    case GgufType::int16: integer = c.read<int16_t>(what); break;
    case GgufType::uint32: integer = c.read<uint32_t>(what); break;
    case GgufType::int32: integer = c.read<int32_t>(what); break;
    case GgufType::int64: integer = c.read<int64_t>(what); break;
    case GgufType::uint64: {
      const uint64_t u = c.read<uint64_t>(what);
      integer = u > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);
      number = static_cast<double>(u);
      return;
    }
    case GgufType::float32: number = c.read<float>(what), integer = 0; return;
    case GgufType::float64: number = c.read<double>(what), integer = 0; return;
    default: c.bad(what + " is not a number");
  }
  number = static_cast<double>(integer);
}

GgufType value_type(Cursor& c, const std::string& what) {
  const uint32_t t = c.read<uint32_t>(what + " type");
  if (t > static_cast<uint32_t>(GgufType::float64)) c.bad(what + " has unknown value type " + std::to_string(t));
  return static_cast<GgufType>(t);
}

GgufValue read_value(Cursor& c, GgufType t, const std::string& what) {
  GgufValue v;
  v.type = t;
  if (t == GgufType::string) {
    v.text = c.string(what);
  } else if (t == GgufType::array) {
    v.element_type = value_type(c, what + " element");
    if (v.element_type == GgufType::array) c.bad(what + " is an array of arrays, which attn does not read");
    const bool strings = v.element_type == GgufType::string;
    const uint64_t n = c.count(what + " element count", strings ? 8 : scalar_bytes(v.element_type));
    if (strings) {
      v.strings.reserve(static_cast<size_t>(n));
      for (uint64_t i = 0; i < n; ++i) v.strings.push_back(c.string(what + "[" + std::to_string(i) + "]"));
    } else {
      v.numbers.resize(static_cast<size_t>(n));
      int64_t ignored;
      for (uint64_t i = 0; i < n; ++i) read_number(c, v.element_type, what, v.numbers[i], ignored);
    }
  } else {
    read_number(c, t, what, v.number, v.integer);
  }
  return v;
}

}  // namespace

std::string gguf_type_name(GgufType t) {
  static const char* names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                "bool", "string", "array", "uint64", "int64", "float64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? names[i] : "type " + std::to_string(i);
}

const GgmlTypeInfo* ggml_type_info(uint32_t type) {
  static const std::map<uint32_t, GgmlTypeInfo> known = {
      {0, {"F32", 1, 4}},      {1, {"F16", 1, 2}},      {2, {"Q4_0", 32, 18}},   {3, {"Q4_1", 32, 20}},
      {6, {"Q5_0", 32, 22}},   {7, {"Q5_1", 32, 24}},   {8, {"Q8_0", 32, 34}},   {9, {"Q8_1", 32, 36}},
      {10, {"Q2_K", 256, 84}}, {11, {"Q3_K", 256, 110}}, {12, {"Q4_K", 256, 144}}, {13, {"Q5_K", 256, 176}},
      {14, {"Q6_K", 256, 210}}, {15, {"Q8_K", 256, 292}}, {24, {"I8", 1, 1}},     {25, {"I16", 1, 2}},
      {26, {"I32", 1, 4}},     {27, {"I64", 1, 8}},     {28, {"F64", 1, 8}},     {30, {"BF16", 1, 2}}};
  const auto it = known.find(type);
  return it == known.end() ? nullptr : &it->second;
}

int64_t GgufTensor::elements() const {
  int64_t n = 1;
  for (const int64_t d : dims) n *= d;  // checked when the file was read
  return n;
}

GgufFile GgufFile::parse(const uint8_t* data, size_t size, const std::string& name) {
  GgufFile f;
  f.name_ = name;
  Cursor c(data, size, f.name_);
  c.need(4, "the magic 'GGUF'");
  if (std::memcmp(data, "GGUF", 4) != 0) c.bad("does not start with the magic 'GGUF': not a GGUF file");
  c.read<uint32_t>("magic");
  f.version_ = c.read<uint32_t>("version");
  if (f.version_ != 2 && f.version_ != 3) c.bad("has GGUF version " + std::to_string(f.version_) + ", expected 2 or 3");
  // The smallest tensor entry: name length 8, n_dims 4, one dim 8, type 4, offset 8.
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.count("metadata count", 8 + 4 + 1);
  if (n_tensors > c.left() / 32)
    c.bad("tensor count " + std::to_string(n_tensors) + " cannot fit in the " + std::to_string(c.left()) + " bytes left");
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = c.string("metadata key " + std::to_string(i));
    const GgufType t = value_type(c, "metadata '" + key + "'");
    GgufValue v = read_value(c, t, "metadata '" + key + "'");
    if (!f.metadata_.emplace(key, std::move(v)).second) c.bad("metadata key '" + key + "' appears twice");
  }
  if (const auto it = f.metadata_.find("general.alignment"); it != f.metadata_.end()) {
    const GgufValue& a = it->second;
    if (a.type != GgufType::uint32 && a.type != GgufType::uint64 && a.type != GgufType::int32)
      fail(name, "general.alignment must be an integer, got " + gguf_type_name(a.type));
    if (a.integer < 1 || a.integer > kMaxAlignment || (a.integer & (a.integer - 1)) != 0)
      fail(name, "general.alignment must be a power of two up to " + std::to_string(kMaxAlignment) + ", got " +
                     std::to_string(a.integer));
    f.alignment_ = a.integer;
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = c.string("tensor " + std::to_string(i) + " name");
    const std::string what = "tensor '" + t.name + "'";
    const uint32_t n_dims = c.read<uint32_t>(what + " dimension count");
    if (n_dims < 1 || n_dims > kMaxDims)
      c.bad(what + " has " + std::to_string(n_dims) + " dimensions, expected 1 to " + std::to_string(kMaxDims));
    int64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t n = c.read<uint64_t>(what + " dimension");
      if (n > static_cast<uint64_t>(INT64_MAX)) c.bad(what + " dimension " + std::to_string(n) + " is too large");
      t.dims.push_back(static_cast<int64_t>(n));
      elements = checked_mul(elements, t.dims.back(), name + ": " + what + " elements");
    }
    t.type = c.read<uint32_t>(what + " type");
    const GgmlTypeInfo* info = ggml_type_info(t.type);
    if (!info) c.bad(what + " has ggml type " + std::to_string(t.type) + ", which attn does not know");
    if (t.dims[0] % info->block_elements != 0)
      c.bad(what + " rows of " + std::to_string(t.dims[0]) + " elements are not whole " + info->name + " blocks of " +
            std::to_string(info->block_elements));
    t.bytes = checked_mul(elements / info->block_elements, info->block_bytes, name + ": " + what + " size");
    t.offset = c.read<uint64_t>(what + " offset");
    if (t.offset % static_cast<uint64_t>(f.alignment_) != 0)
      c.bad(what + " offset " + std::to_string(t.offset) + " is not a multiple of the alignment " + std::to_string(f.alignment_));
    if (!f.by_name_.emplace(t.name, f.tensors_.size()).second) c.bad(what + " appears twice");
    f.tensors_.push_back(std::move(t));
  }
  const size_t header_end = c.pos();
  const size_t data_start = (header_end + static_cast<size_t>(f.alignment_) - 1) / static_cast<size_t>(f.alignment_) *
                            static_cast<size_t>(f.alignment_);
  if (data_start > size && !f.tensors_.empty())
    fail(name, "the data section would start at byte " + std::to_string(data_start) + ", past the end of the file (" +
                   std::to_string(size) + " bytes)");
  const uint64_t data_size = data_start > size ? 0 : size - data_start;
  std::vector<const GgufTensor*> order;
  for (GgufTensor& t : f.tensors_) {
    if (t.offset > data_size || static_cast<uint64_t>(t.bytes) > data_size - t.offset)
      fail(name, "tensor '" + t.name + "' (" + std::to_string(t.bytes) + " bytes at data offset " + std::to_string(t.offset) +
                     ") runs past the end of the file (" + std::to_string(data_size) + " bytes of data)");
    t.data = data + data_start + t.offset;
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i - 1]->offset + static_cast<uint64_t>(order[i - 1]->bytes) > order[i]->offset)
      fail(name, "tensors '" + order[i - 1]->name + "' and '" + order[i]->name + "' overlap");
  return f;
}

GgufFile GgufFile::open(const std::string& path) {
  io::MappedFile m = io::map_file(path);
  GgufFile f = parse(m.data, m.size, path);
  f.mapping_ = std::move(m.mapping);
  return f;
}

void GgufFile::drop_pages(const GgufTensor& t) const {
  if (!mapping_ || t.bytes <= 0) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(t.data) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(t.data) + static_cast<uintptr_t>(t.bytes)) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);  // advice: failure is harmless
}

const GgufValue& GgufFile::value(const std::string& key) const {
  const auto it = metadata_.find(key);
  if (it == metadata_.end()) fail(name_, "has no metadata '" + key + "'");
  return it->second;
}

const GgufTensor& GgufFile::tensor(const std::string& tensor_name) const {
  const auto it = by_name_.find(tensor_name);
  if (it == by_name_.end()) fail(name_, "has no tensor '" + tensor_name + "'");
  return tensors_[it->second];
}

int64_t GgufFile::integer(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type == GgufType::string || v.type == GgufType::array || v.type == GgufType::float32 || v.type == GgufType::float64)
    fail(name_, "metadata '" + key + "' must be an integer, got " + gguf_type_name(v.type));
  return v.integer;
}

double GgufFile::number(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type == GgufType::string || v.type == GgufType::array)
    fail(name_, "metadata '" + key + "' must be a number, got " + gguf_type_name(v.type));
  return v.number;
}

const std::string& GgufFile::text(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufType::string) fail(name_, "metadata '" + key + "' must be a string, got " + gguf_type_name(v.type));
  return v.text;
}

}  // namespace attn
