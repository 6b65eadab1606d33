// A small .npy reader/writer (owned, fuzzed): header dict with descr, fortran_order, shape.
#include "attn/npy.hpp"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <sstream>

#include "attn/error.hpp"
#include "base/checked_math.hpp"
#include "io/input_file.hpp"
#include "io/npy_header.hpp"
#include "io/output_file.hpp"

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

namespace {

// numpy writes headers of a few hundred bytes; anything near this is not a real header.
constexpr size_t kMaxHeaderBytes = size_t{1} << 20;

// Bytes before the header dict (magic, version, header length) and the dict's length; reads
// only `size` bytes of `data` (at least 12 are needed for versions 2 and 3).
struct Preamble {
  size_t start = 0, header_len = 0;
};

Preamble parse_preamble(const uint8_t* data, size_t size, const std::string& name) {
  static const char magic[] = "\x93NUMPY";
  if (size < 10 || std::memcmp(data, magic, 6) != 0) fail(name, "not a .npy file (bad magic)");
  const int major = data[6];
  Preamble p;
  if (major == 1) {
    p.header_len = data[8] | (data[9] << 8);
    p.start = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) fail(name, "truncated .npy header");
    p.header_len = static_cast<size_t>(data[8]) | (static_cast<size_t>(data[9]) << 8) |
                   (static_cast<size_t>(data[10]) << 16) | (static_cast<size_t>(data[11]) << 24);
    p.start = 12;
  } else {
    fail(name, ".npy format version " + std::to_string(major) + " is not supported (1, 2 or 3)");
  }
  if (p.header_len > kMaxHeaderBytes)
    fail(name, "npy header length " + std::to_string(p.header_len) + " is larger than any real header (at most " +
                   std::to_string(kMaxHeaderBytes) + " bytes)");
  return p;
}

// The header dict: dtype and shape; sets a.bytes' expected size in `payload_bytes`.
void parse_header(std::string_view header, const std::string& name, NpyArray& a, int64_t& payload_bytes) {
  if (header.empty() || header.back() != '\n')
    fail(name, "npy header length (" + std::to_string(header.size()) +
                   " bytes) does not match the header (a header ends with a newline)");
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
  payload_bytes = checked_mul(numel, static_cast<int64_t>(dtype_size(a.dtype)), name + ": payload bytes");
}

std::string payload_mismatch(uint64_t have, int64_t need) {
  return "payload has " + std::to_string(have) + " bytes, shape and dtype need " + std::to_string(need);
}

}  // namespace

NpyArray parse_npy(const uint8_t* data, size_t size, const std::string& name) {
  const Preamble p = parse_preamble(data, size, name);
  if (p.header_len > size - p.start) fail(name, "truncated .npy header");
  NpyArray a;
  int64_t bytes = 0;
  parse_header(std::string_view(reinterpret_cast<const char*>(data + p.start), p.header_len), name, a, bytes);
  const size_t payload = size - p.start - p.header_len;
  if (static_cast<uint64_t>(bytes) != payload) fail(name, payload_mismatch(payload, bytes));
  a.bytes.assign(data + p.start + p.header_len, data + size);
  return a;
}

// Reads the header first and then exactly the payload it promises, in bounded chunks, so a
// hostile file (a lying header) costs no more memory or time than the data it has. Only regular
// files are read (io::InputFile): a FIFO or /dev/zero is refused before anything is read.
NpyArray read_npy(const std::string& path) {
  io::InputFile f(path);
  auto read_some = [&](uint8_t* dst, size_t n) { return f.read(dst, n); };
  uint8_t pre[12] = {};
  size_t got = read_some(pre, 10);
  if (got == 10 && (pre[6] == 2 || pre[6] == 3)) got += read_some(pre + 10, 2);  // 4-byte header length
  const Preamble p = parse_preamble(pre, got, path);
  std::string header(p.header_len, '\0');
  if (read_some(reinterpret_cast<uint8_t*>(header.data()), p.header_len) != p.header_len)
    fail(path, "truncated .npy header");
  NpyArray a;
  int64_t bytes = 0;
  parse_header(header, path, a, bytes);
  const uint64_t file_size = f.size();  // check before allocating
  if (file_size != p.start + p.header_len + static_cast<uint64_t>(bytes))
    fail(path, payload_mismatch(file_size - std::min<uint64_t>(file_size, p.start + p.header_len), bytes));
  constexpr size_t kChunk = size_t{1} << 24;
  while (a.bytes.size() < static_cast<size_t>(bytes)) {
    const size_t want = std::min(kChunk, static_cast<size_t>(bytes) - a.bytes.size());
    const size_t at = a.bytes.size();
    a.bytes.resize(at + want);
    const size_t n = read_some(a.bytes.data() + at, want);
    if (n < want) fail(path, payload_mismatch(at + n, bytes));
  }
  uint8_t extra;
  if (read_some(&extra, 1) != 0) fail(path, "payload is longer than shape and dtype need (" + std::to_string(bytes) + " bytes)");
  return a;
}

namespace io {
std::string npy_header(const std::string& path, DType dtype, const std::vector<int64_t>& shape, size_t& payload) {
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
  const uint16_t len = static_cast<uint16_t>(header.size());
  payload = static_cast<size_t>(n) * dtype_size(dtype);
  std::string out("\x93NUMPY\x01\x00\x00\x00", 10);
  out[8] = static_cast<char>(len & 0xff);
  out[9] = static_cast<char>(len >> 8);
  return out + header;
}
}  // namespace io

// Through io::OutputFile: a temporary renamed over the path once whole (a device or FIFO is
// written in place), every write and the fsync checked.
void write_npy(const std::string& path, DType dtype, const std::vector<int64_t>& shape, const void* data) {
  size_t payload = 0;
  const std::string header = io::npy_header(path, dtype, shape, payload);
  io::OutputFile f(path);
  f.write(header.data(), header.size());
  f.write(data, payload);
  f.commit();
}

}  // namespace attn
