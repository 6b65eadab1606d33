// A 64-byte aligned float buffer for tiles (aligned vector loads need it).
#pragma once
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
    void* p = std::aligned_alloc(64, bytes);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    data_.reset(static_cast<float*>(p));
    size_ = n;
  }
  float* data() { return data_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
  size_t size_ = 0;
};

}  // namespace attn
