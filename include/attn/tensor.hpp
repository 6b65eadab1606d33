// A non-owning strided view over (batch, heads, tokens, head_dim) and an owning tensor.
// Strides are in elements, so (B,H,N,D) and (B,N,H,D) layouts are both plain views.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "attn/dtype.hpp"

namespace attn {

enum class Layout : uint8_t { bhnd, bnhd };

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::array<int64_t, 4> shape{0, 0, 0, 0};    // (batch, heads, tokens, head_dim)
  std::array<int64_t, 4> strides{0, 0, 0, 0};  // in elements, same order as shape

  int64_t batch() const { return shape[0]; }
  int64_t heads() const { return shape[1]; }
  int64_t tokens() const { return shape[2]; }
  int64_t dim() const { return shape[3]; }
  int64_t numel() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
  // Element offset of (b, h, n, c); 64-bit throughout.
  int64_t offset(int64_t b, int64_t h, int64_t n, int64_t c) const {
    return b * strides[0] + h * strides[1] + n * strides[2] + c * strides[3];
  }
  float at(int64_t b, int64_t h, int64_t n, int64_t c) const {
    return load_as_float(data, dtype, offset(b, h, n, c));
  }
  // Address of element (b, h, n, c).
  char* ptr(int64_t b, int64_t h, int64_t n, int64_t c = 0) const {
    return static_cast<char*>(data) + offset(b, h, n, c) * static_cast<int64_t>(dtype_size(dtype));
  }
  bool empty() const { return data == nullptr; }
};

// Contiguous views of a raw buffer in either layout. `shape` is always (B, H, N, D).
TensorView make_view(void* data, DType dtype, int64_t batch, int64_t heads, int64_t tokens,
                     int64_t dim, Layout layout = Layout::bhnd);
std::string describe(const TensorView& v);  // "f32 (2, 8, 128, 64) strides (…)"

// Owning, 64-byte aligned, zero-initialised storage with a contiguous layout.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, std::array<int64_t, 4> shape, Layout layout = Layout::bhnd);
  const TensorView& view() const { return view_; }
  TensorView& view() { return view_; }
  float at(int64_t b, int64_t h, int64_t n, int64_t c) const { return view_.at(b, h, n, c); }
  bool defined() const { return static_cast<bool>(storage_); }

 private:
  struct Free {
    size_t mapped;  // bytes of an mmap'ed block (large tensors); 0 (value-initialised): malloc'ed
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> storage_;
  TensorView view_;
};

}  // namespace attn
