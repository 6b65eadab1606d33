// The tile primitives for one instruction set. CMake compiles this file once per ISA with
//   ATTN_KERNEL_ISA = portable | avx2 | avx512   (the namespace, and the Isa enumerator)
//   ATTN_KERNEL_VEC = "kernels/vec_<isa>.inl"    (the thin vector type the kernels are written in)
// and that ISA's -m flags. Each copy lives in namespace attn::kernels::<isa>, so no symbol built
// with AVX-512 can be picked by the linker for the portable path.
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

#include "kernels/bf16_tiles.hpp"
#include "kernels/kernel_table.hpp"

namespace attn::kernels::ATTN_KERNEL_ISA {
#include ATTN_KERNEL_VEC
#include "kernels/tile_kernels.inl"

const TileKernels& kernel_table() { return table(Isa::ATTN_KERNEL_ISA); }
}  // namespace attn::kernels::ATTN_KERNEL_ISA
