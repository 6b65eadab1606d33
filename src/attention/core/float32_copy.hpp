// A contiguous float32 copy of a view (any dtype and strides), row by row through the kernels'
// conversion: for forms that transform their inputs (RoPE-rotated copies, projected problems).
#pragma once
#include "attn/tensor.hpp"
#include "kernels/kernel_table.hpp"

namespace attn::core {

inline Tensor float32_copy(const kernels::TileKernels& kern, const TensorView& x) {
  Tensor t(DType::f32, {x.batch(), x.heads(), x.tokens(), x.dim()});
  const TensorView& o = t.view();
  for (int64_t b = 0; b < x.batch(); ++b)
    for (int64_t h = 0; h < x.heads(); ++h)
      for (int64_t n = 0; n < x.tokens(); ++n)
        kern.to_float(x.ptr(b, h, n), x.dtype, x.strides[3], x.dim(), reinterpret_cast<float*>(o.ptr(b, h, n)));
  return t;
}

}  // namespace attn::core
