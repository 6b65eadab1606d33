// A 64-byte aligned float buffer for tiles (aligned vector loads need it). Allocated through the
// aligned operator new, so failure is std::bad_alloc like every other allocation (and a test's
// replacement operator new sees it).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

namespace attn {

class AlignedFloats {
 public:
  AlignedFloats() = default;
  explicit AlignedFloats(size_t n) { resize(n); }
  void resize(size_t n) {
    if (n <= size_) return;
    const size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    void* p = ::operator new(bytes, std::align_val_t{64});
    std::memset(p, 0, bytes);
    data_.reset(static_cast<float*>(p));
    size_ = n;
  }
  float* data() { return data_.get(); }
  // The same storage as 32-bit words (bf16 pairs).
  uint32_t* data_u32() { return reinterpret_cast<uint32_t*>(data_.get()); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(float* p) const { ::operator delete(p, std::align_val_t{64}); }
  };
  std::unique_ptr<float, Free> data_;
  size_t size_ = 0;
};

}  // namespace attn
