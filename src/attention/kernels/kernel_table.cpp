// The one place a kernel set is picked for an ISA.
#include "kernels/kernel_table.hpp"

#include "base/cpu_features.hpp"
#include "kernels/bf16_tiles.hpp"

#include "attn/error.hpp"

namespace attn::kernels {

// Defined in tile_kernels_isa.cpp, compiled once per ISA.
namespace portable { const TileKernels& kernel_table(); }
namespace avx2 { const TileKernels& kernel_table(); }
namespace avx512 { const TileKernels& kernel_table(); }
namespace avx512_bf16 { const Bf16TileKernels& kernel_table(); }  // bf16_tiles_avx512.cpp

const TileKernels& kernels_for(Isa isa) {
  if (isa > best_supported_isa())
    fail("kernels", "this CPU cannot run " + isa_name(isa) + " kernels (best is " + isa_name(best_supported_isa()) + ")");
  switch (isa) {
    case Isa::avx512: return avx512::kernel_table();
    case Isa::avx2: return avx2::kernel_table();
    case Isa::portable: return portable::kernel_table();
  }
  fail("kernels", "unknown isa");
}

const Bf16TileKernels* bf16_kernels_for(Isa isa) {
  kernels_for(isa);  // this CPU runs isa
  return isa == Isa::avx512 && cpu_extras().avx512_bf16 ? &avx512_bf16::kernel_table() : nullptr;
}

}  // namespace attn::kernels
