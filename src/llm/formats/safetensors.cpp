// safetensors: checked parsing of the header, mapping of the file, and an atomic writer.
//
// The checks follow the format's own rules: the header length fits the file, the header is one
// JSON object, every tensor names a known dtype, a shape of non-negative integers and a
// [begin, end) range whose length is the shape's element count times the dtype's size, and the
// ranges tile the data region exactly (sorted by begin, no gap, no overlap, the last ending at
// the file's end). attn adds one rule of its own: a tensor's data is aligned to its element size
// (the format's writers pad the header to 8 bytes, so real files satisfy it), so kernels may
// read it in place.
#include "attn/safetensors.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "attn/error.hpp"
#include "io/output_file.hpp"
#include "formats/json_limits.hpp"
#include "base/checked_math.hpp"
#include "formats/mapped_file.hpp"

namespace attn {
namespace {

// The element sizes of the format's dtypes (its full list; attn computes with the float ones).
int64_t element_size(const std::string& dtype) {
  static const std::map<std::string, int64_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

std::string json_kind(const nlohmann::json& j) { return j.type_name(); }

// A non-negative integer that fits int64 (JSON numbers may be negative, fractional or huge).
int64_t json_count(const nlohmann::json& j, const std::string& where, const std::string& what) {
  if (j.is_number_unsigned() && j.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX))
    return static_cast<int64_t>(j.get<uint64_t>());
  if (j.is_number_integer() && j.get<int64_t>() >= 0) return j.get<int64_t>();
  fail(where, what + " must be a non-negative integer, got " + io::json_excerpt(j));
}

struct Range {
  int64_t begin, end;
  const std::string* name;
};

}  // namespace

DType SafetensorsTensor::float_dtype(const std::string& name) const {
  if (dtype == "F32") return DType::f32;
  if (dtype == "BF16") return DType::bf16;
  if (dtype == "F16") return DType::f16;
  fail(name, "dtype " + dtype + " is not a float type attn computes with (F32, BF16 or F16)");
}

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (const int64_t s : shape) n *= s;  // checked when the file was read
  return n;
}

const SafetensorsTensor& SafetensorsFile::at(const std::string& tensor) const {
  const auto it = tensors_.find(tensor);
  if (it == tensors_.end()) fail(name_, "has no tensor '" + tensor + "'");
  return it->second;
}

SafetensorsFile SafetensorsFile::parse(const uint8_t* data, size_t size, const std::string& name) {
  SafetensorsFile f;
  f.name_ = name;
  if (size < 8) fail(name, "is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | data[i];
  if (header_len > size - 8)
    fail(name, "header length " + std::to_string(header_len) + " runs past the end of the file (" +
                   std::to_string(size - 8) + " bytes follow the length)");
  const auto* header = reinterpret_cast<const char*>(data + 8);
  const nlohmann::json j = io::parse_json(header, header + header_len, name, "header is not valid JSON");
  if (!j.is_object()) fail(name, "header must be a JSON object, got " + json_kind(j));
  const int64_t data_start = 8 + static_cast<int64_t>(header_len);
  const int64_t data_size = static_cast<int64_t>(size) - data_start;
  std::vector<Range> ranges;
  for (const auto& [key, entry] : j.items()) {
    if (key == "__metadata__") {
      if (!entry.is_object()) fail(name, "__metadata__ must be an object of strings, got " + json_kind(entry));
      for (const auto& [mk, mv] : entry.items()) {
        if (!mv.is_string())
          fail(name, "__metadata__['" + mk + "'] must be a string, got " + json_kind(mv));
        f.metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    const std::string where = name + ": tensor '" + key + "'";
    if (!entry.is_object()) fail(where, "must be an object with dtype, shape and data_offsets, got " + json_kind(entry));
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!entry.contains(field)) fail(where, std::string("has no '") + field + "'");
    SafetensorsTensor t;
    if (!entry["dtype"].is_string()) fail(where, "dtype must be a string, got " + io::json_excerpt(entry["dtype"]));
    t.dtype = entry["dtype"].get<std::string>();
    const int64_t elem = element_size(t.dtype);
    if (elem == 0) fail(where, "has unknown dtype '" + t.dtype + "'");
    const auto& shape = entry["shape"];
    if (!shape.is_array()) fail(where, "shape must be an array, got " + json_kind(shape));
    int64_t numel = 1;
    for (const auto& s : shape) {
      t.shape.push_back(json_count(s, where, "each shape entry"));
      numel = checked_mul(numel, t.shape.back(), where + " shape");
    }
    const auto& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2)
      fail(where, "data_offsets must be [begin, end], got " + io::json_excerpt(off));
    const int64_t begin = json_count(off[0], where, "data_offsets[0]");
    const int64_t end = json_count(off[1], where, "data_offsets[1]");
    if (end < begin) fail(where, "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] end before they begin");
    if (end > data_size)
      fail(where, "data_offsets end " + std::to_string(end) + " is past the data (" + std::to_string(data_size) + " bytes)");
    const int64_t bytes = checked_mul(numel, elem, where + " size");
    if (end - begin != bytes)
      fail(where, "holds " + std::to_string(end - begin) + " bytes, but " + t.dtype + " of its shape needs " +
                      std::to_string(bytes));
    if (bytes > 0 && (data_start + begin) % elem != 0)
      fail(where, "data at file offset " + std::to_string(data_start + begin) + " is not aligned to its " +
                      std::to_string(elem) + "-byte elements");
    t.data = data + data_start + begin;
    t.bytes = bytes;
    const auto [it, inserted] = f.tensors_.emplace(key, std::move(t));
    if (!inserted) fail(where, "appears twice");
    ranges.push_back({begin, end, &it->first});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  int64_t at = 0;
  for (const Range& r : ranges) {
    if (r.begin != at)
      fail(name, "tensor '" + *r.name + "' starts at data offset " + std::to_string(r.begin) + ", expected " +
                     std::to_string(at) + (r.begin < at ? " (it overlaps the tensor before it)" : " (a gap)"));
    at = r.end;
  }
  if (at != data_size)
    fail(name, "tensors end at data offset " + std::to_string(at) + " but the file holds " + std::to_string(data_size) +
                   " bytes of data");
  return f;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  io::MappedFile m = io::map_file(path);
  SafetensorsFile f = parse(m.data, m.size, path);
  f.mapping_ = std::move(m.mapping);
  return f;
}

void write_safetensors(const std::string& path, const std::map<std::string, SafetensorsEntry>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  // Larger elements first (then by name), as the format's own writer orders them: with the
  // header padded to 8 bytes, every tensor is then aligned to its element size.
  std::vector<std::pair<const std::string*, const SafetensorsEntry*>> order;
  for (const auto& [name, t] : tensors) order.emplace_back(&name, &t);
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return dtype_size(a.second->dtype) > dtype_size(b.second->dtype); });
  int64_t offset = 0;
  std::vector<int64_t> sizes;
  for (const auto& [name_ptr, t_ptr] : order) {
    const std::string& name = *name_ptr;
    const SafetensorsEntry& t = *t_ptr;
    const char* dtype = t.dtype == DType::f32 ? "F32" : t.dtype == DType::bf16 ? "BF16" : t.dtype == DType::f16 ? "F16" : nullptr;
    if (!dtype) fail(path, "tensor '" + name + "': cannot write " + dtype_name(t.dtype) + " (float32, bfloat16, float16)");
    int64_t bytes = static_cast<int64_t>(dtype_size(t.dtype));
    for (const int64_t s : t.shape) {
      if (s < 0) fail(path, "tensor '" + name + "' has a negative dimension " + std::to_string(s));
      bytes = checked_mul(bytes, s, path + ": tensor '" + name + "'");
    }
    header[name] = {{"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    sizes.push_back(bytes);
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps every tensor 8-byte aligned in the file
  // A temporary renamed over the path once whole and fsync'ed (a device or FIFO is written in
  // place): a full disk is an error and leaves the old file as it was.
  io::OutputFile f(path);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  f.write(len, 8);
  f.write(text.data(), text.size());
  size_t i = 0;
  for (const auto& entry : order) f.write(entry.second->data, static_cast<size_t>(sizes[i++]));
  f.commit();
}

}  // namespace attn
