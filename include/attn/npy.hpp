// NumPy .npy files (format 1.0–3.0): little-endian float32/float16 (and bool for masks),
// C order. Anything else is rejected with an Error naming the file and the problem.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "attn/dtype.hpp"

namespace attn {

struct NpyArray {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // C-order payload
  int64_t numel() const;
};

NpyArray parse_npy(const uint8_t* data, size_t size, const std::string& name = "npy");
NpyArray read_npy(const std::string& path);
void write_npy(const std::string& path, DType dtype, const std::vector<int64_t>& shape,
               const void* data);

}  // namespace attn
