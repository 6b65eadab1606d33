// The tile primitives compiled for portable (flags set in CMakeLists.txt). Everything lives in
// namespace attn::kernels::portable so no symbol from another ISA's copy can be linked here.
#include <cmath>
#include <cstdint>


#include "kernels/kernel_table.hpp"

namespace attn::kernels::portable {
#include "kernels/vec_portable.inl"
#include "kernels/tile_kernels.inl"
}  // namespace attn::kernels::portable

namespace attn::kernels {
const TileKernels& portable_kernels() { return portable::table(Isa::portable); }
}  // namespace attn::kernels
