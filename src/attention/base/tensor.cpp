#include "attn/tensor.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "attn/error.hpp"
#include "base/checked_math.hpp"

namespace attn {

TensorView make_view(void* data, DType dtype, int64_t batch, int64_t heads, int64_t tokens,
                     int64_t dim, Layout layout) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.shape = {batch, heads, tokens, dim};
  if (layout == Layout::bhnd)
    v.strides = {heads * tokens * dim, tokens * dim, dim, 1};
  else
    v.strides = {tokens * heads * dim, dim, heads * dim, 1};
  return v;
}

std::string describe(const TensorView& v) {
  auto s = dtype_name(v.dtype) + " (";
  for (int i = 0; i < 4; ++i) s += std::to_string(v.shape[i]) + (i < 3 ? ", " : ")");
  s += " strides (";
  for (int i = 0; i < 4; ++i) s += std::to_string(v.strides[i]) + (i < 3 ? ", " : ")");
  return s;
}

void Tensor::Free::operator()(void* p) const {
  if (mapped) munmap(p, mapped);
  else std::free(p);
}

Tensor::Tensor(DType dtype, std::array<int64_t, 4> shape, Layout layout) {
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0) fail("Tensor", "negative dimension " + std::to_string(s));
    n = checked_mul(n, s, "Tensor: number of elements");
  }
  const int64_t bytes = checked_mul(n, static_cast<int64_t>(dtype_size(dtype)), "Tensor: bytes");
  const size_t alloc = (static_cast<size_t>(bytes) + 63) / 64 * 64 + 64;
  // Large blocks are mapped from the system, zeroed and untouched, so memory such as a decoder's
  // KV cache for its whole context or a serving pool becomes resident only as it is used. (calloc
  // promises that only while glibc serves the size by mmap: once a block that large was freed,
  // its threshold rises and calloc zeroes heap pages, touching them all.)
  constexpr size_t kMapFrom = size_t{1} << 20;
  void* raw = nullptr;
  if (alloc >= kMapFrom) {
    raw = mmap(nullptr, alloc, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) fail("Tensor", "out of memory: could not allocate " + std::to_string(bytes) + " bytes");
    storage_ = std::unique_ptr<void, Free>(raw, Free{alloc});
  } else {
    raw = std::calloc(alloc + 64, 1);
    if (!raw) fail("Tensor", "out of memory: could not allocate " + std::to_string(bytes) + " bytes");
    storage_ = std::unique_ptr<void, Free>(raw, Free{0});
  }
  void* p = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(raw) + 63) / 64 * 64);
  view_ = make_view(p, dtype, shape[0], shape[1], shape[2], shape[3], layout);
}

}  // namespace attn
