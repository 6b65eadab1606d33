// The tile primitives compiled for avx512 (flags set in CMakeLists.txt). Everything lives in
// namespace attn::kernels::avx512 so no symbol from another ISA's copy can be linked here.
#include <cmath>
#include <cstdint>
#include <immintrin.h>

#include "kernels/kernel_table.hpp"

namespace attn::kernels::avx512 {
#include "kernels/vec_avx512.inl"
#include "kernels/tile_kernels.inl"
}  // namespace attn::kernels::avx512

namespace attn::kernels {
const TileKernels& avx512_kernels() { return avx512::table(Isa::avx512); }
}  // namespace attn::kernels
