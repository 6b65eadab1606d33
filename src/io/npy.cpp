// A small .npy reader/writer (owned, fuzzed): header dict with descr, fortran_order, shape.
#include "attn/npy.hpp"

#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "attn/error.hpp"
#include "base/checked_math.hpp"

namespace attn {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

// Value text that follows 'key': in the header dict.
std::string_view dict_value(std::string_view header, std::string_view key, const std::string& name) {
  const std::string pat = "'" + std::string(key) + "'";
  const size_t at = header.find(pat);
  if (at == std::string_view::npos) fail(name, "npy header has no '" + std::string(key) + "' entry");
  size_t p = header.find(':', at + pat.size());
  if (p == std::string_view::npos) fail(name, "npy header entry '" + std::string(key) + "' has no value");
  std::string_view rest = trim(header.substr(p + 1));
  size_t end;
  if (!rest.empty() && rest.front() == '(') {
    end = rest.find(')');
    if (end == std::string_view::npos) fail(name, "npy header shape is not closed by ')'");
    return rest.substr(0, end + 1);
  }
  if (!rest.empty() && rest.front() == '\'') {
    end = rest.find('\'', 1);
    if (end == std::string_view::npos) fail(name, "npy header string is not closed");
    return rest.substr(0, end + 1);
  }
  end = rest.find_first_of(",}");
  return trim(rest.substr(0, end));
}

}  // namespace

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

NpyArray parse_npy(const uint8_t* data, size_t size, const std::string& name) {
  static const char magic[] = "\x93NUMPY";
  if (size < 10 || std::memcmp(data, magic, 6) != 0) fail(name, "not a .npy file (bad magic)");
  const int major = data[6];
  size_t header_len, start;
  if (major == 1) {
    header_len = data[8] | (data[9] << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) fail(name, "truncated .npy header");
    header_len = static_cast<size_t>(data[8]) | (static_cast<size_t>(data[9]) << 8) |
                 (static_cast<size_t>(data[10]) << 16) | (static_cast<size_t>(data[11]) << 24);
    start = 12;
  } else {
    fail(name, ".npy format version " + std::to_string(major) + " is not supported (1, 2 or 3)");
  }
  if (header_len > size - start) fail(name, "truncated .npy header");
  const std::string_view header(reinterpret_cast<const char*>(data + start), header_len);

  NpyArray a;
  const std::string_view descr = dict_value(header, "descr", name);
  if (descr == "'<f4'") a.dtype = DType::f32;
  else if (descr == "'<f2'") a.dtype = DType::f16;
  else if (descr == "'|b1'") a.dtype = DType::boolean;
  else
    fail(name, "dtype " + std::string(descr) + " is not supported (expected float32 '<f4', float16 '<f2' or bool '|b1')");
  if (dict_value(header, "fortran_order", name) != "False")
    fail(name, "Fortran-ordered arrays are not supported (save with np.ascontiguousarray)");
  std::string_view shape = dict_value(header, "shape", name);
  if (shape.size() < 2 || shape.front() != '(') fail(name, "npy shape must be a tuple, got " + std::string(shape));
  shape = shape.substr(1, shape.size() - 2);
  int64_t numel = 1;
  while (!trim(shape).empty()) {
    const size_t comma = shape.find(',');
    const std::string_view tok = trim(shape.substr(0, comma));
    if (tok.empty()) fail(name, "npy shape has an empty entry");
    int64_t d = 0;
    for (char c : tok) {
      if (c < '0' || c > '9') fail(name, "npy shape entry '" + std::string(tok) + "' is not a non-negative integer");
      d = checked_add(checked_mul(d, 10, name + ": shape"), c - '0', name + ": shape");
    }
    a.shape.push_back(d);
    numel = checked_mul(numel, d, name + ": element count");
    if (comma == std::string_view::npos) break;
    shape = shape.substr(comma + 1);
  }
  const int64_t bytes = checked_mul(numel, static_cast<int64_t>(dtype_size(a.dtype)), name + ": payload bytes");
  const size_t payload = size - start - header_len;
  if (static_cast<uint64_t>(bytes) != payload)
    fail(name, "payload has " + std::to_string(payload) + " bytes, shape and dtype need " + std::to_string(bytes));
  a.bytes.assign(data + start + header_len, data + size);
  return a;
}

NpyArray read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, "cannot open file for reading");
  std::vector<uint8_t> buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return parse_npy(buf.data(), buf.size(), path);
}

void write_npy(const std::string& path, DType dtype, const std::vector<int64_t>& shape, const void* data) {
  std::string descr;
  switch (dtype) {
    case DType::f32: descr = "<f4"; break;
    case DType::f16: descr = "<f2"; break;
    case DType::boolean: descr = "|b1"; break;
    default: fail(path, "cannot write " + dtype_name(dtype) + " to .npy (float32, float16, bool)");
  }
  std::ostringstream h;
  h << "{'descr': '" << descr << "', 'fortran_order': False, 'shape': (";
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    h << shape[i] << (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
    n *= shape[i];
  }
  h << "), }";
  std::string header = h.str();
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream f(path, std::ios::binary);
  if (!f) fail(path, "cannot open file for writing");
  f.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  f.put(static_cast<char>(len & 0xff));
  f.put(static_cast<char>(len >> 8));
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n * dtype_size(dtype)));
  if (!f) fail(path, "write failed");
}

}  // namespace attn
