// The one place a kernel set is picked for an ISA.
#include "kernels/kernel_table.hpp"

#include "attn/error.hpp"
#include "kernels/q8_dot.hpp"

namespace attn::kernels {

// Defined in tile_kernels_isa.cpp, compiled once per ISA.
namespace portable { const TileKernels& kernel_table(); }
namespace avx2 { const TileKernels& kernel_table(); }
namespace avx512 { const TileKernels& kernel_table(); }

namespace {

// An ISA level's table with the best integer-dot variant of that level this CPU runs.
TileKernels with_q8_dot(const TileKernels& base) {
  TileKernels t = base;
  for (const Q8DotVariant& v : q8_dot_variants())  // best first
    if (v.isa == base.isa) {
      t.q8_dot_rows = v.rows;
      t.q8_dot_name = v.name;
      t.q8_packed_rows = v.packed;
      t.quantize_q8_rows = v.quantize;
      break;
    }
  return t;
}

}  // namespace

const TileKernels& kernels_for(Isa isa) {
  if (isa > best_supported_isa())
    fail("kernels", "this CPU cannot run " + isa_name(isa) + " kernels (best is " + isa_name(best_supported_isa()) + ")");
  switch (isa) {
    case Isa::avx512: {
      static const TileKernels t = with_q8_dot(avx512::kernel_table());
      return t;
    }
    case Isa::avx2: {
      static const TileKernels t = with_q8_dot(avx2::kernel_table());
      return t;
    }
    case Isa::portable: {
      static const TileKernels t = with_q8_dot(portable::kernel_table());
      return t;
    }
  }
  fail("kernels", "unknown isa");
}

}  // namespace attn::kernels
