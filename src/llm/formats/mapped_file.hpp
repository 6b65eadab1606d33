// A read-only memory map of a whole file (weight files are used where they lie, not copied).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace attn::io {

struct MappedFile {
  std::shared_ptr<const void> mapping;  // unmaps when the last owner goes
  const uint8_t* data = nullptr;        // a valid address even for an empty file
  size_t size = 0;
};

// Maps `path` read-only; Error naming the path when it cannot be opened, is not a regular file or
// cannot be mapped.
MappedFile map_file(const std::string& path);

}  // namespace attn::io
