// The tile primitives compiled for avx2 (flags set in CMakeLists.txt). Everything lives in
// namespace attn::kernels::avx2 so no symbol from another ISA's copy can be linked here.
#include <cmath>
#include <cstdint>
#include <immintrin.h>

#include "kernels/kernel_table.hpp"

namespace attn::kernels::avx2 {
#include "kernels/vec_avx2.inl"
#include "kernels/tile_kernels.inl"
}  // namespace attn::kernels::avx2

namespace attn::kernels {
const TileKernels& avx2_kernels() { return avx2::table(Isa::avx2); }
}  // namespace attn::kernels
