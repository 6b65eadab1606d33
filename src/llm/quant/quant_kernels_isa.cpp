// The float-activation quant kernels (block_quant_kernels.inl) for one instruction set. CMake
// compiles this file once per ISA with the same ATTN_KERNEL_ISA / ATTN_KERNEL_VEC definitions and
// -m flags as the attention's tile kernels (kernels/tile_kernels_isa.cpp); each copy lives in
// namespace attn::kernels::<isa>::quant, apart from the tile kernels' own copy of the vector type.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#if !defined(ATTN_KERNEL_ISA) || !defined(ATTN_KERNEL_VEC)
#error "compile with -DATTN_KERNEL_ISA=<isa> -DATTN_KERNEL_VEC=\"kernels/vec_<isa>.inl\" (see CMakeLists.txt)"
#endif
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "attn/dtype.hpp"
#include "quant/block_pieces.hpp"
#include "quant/quant_kernels.hpp"

namespace attn::kernels::ATTN_KERNEL_ISA::quant {
#include ATTN_KERNEL_VEC
#include "quant/block_quant_kernels.inl"

QuantKernels quant_kernel_table() {
  return QuantKernels{.isa = Isa::ATTN_KERNEL_ISA,
                      .qdot_rows = qdot_rows,
                      .dequantize_rows = dequantize_rows,
                      .q8_dot_rows = nullptr,  // set by quant_kernels_for (q8_dot.hpp)
                      .q8_dot_name = "",
                      .q8_packed_rows = nullptr,
                      .quantize_q8_rows = nullptr};
}
}  // namespace attn::kernels::ATTN_KERNEL_ISA::quant
