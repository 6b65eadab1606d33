#include "kernels/kernel_table.hpp"

#include "attn/error.hpp"

namespace attn::kernels {

const TileKernels& kernels_for(Isa isa) {
  if (isa > best_supported_isa())
    fail("kernels", "this CPU cannot run " + isa_name(isa) + " kernels (best is " +
                        isa_name(best_supported_isa()) + ")");
  switch (isa) {
    case Isa::avx512: return avx512_kernels();
    case Isa::avx2: return avx2_kernels();
    case Isa::portable: break;
  }
  return portable_kernels();
}

}  // namespace attn::kernels
