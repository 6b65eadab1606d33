// The one place a quant kernel set is picked for an ISA: the float-activation kernels of that ISA
// level with the best integer-dot variant of the level this CPU runs.
#include "quant/quant_kernels.hpp"

#include "attn/error.hpp"
#include "quant/q8_dot.hpp"

namespace attn::kernels {

// Defined in quant_kernels_isa.cpp, compiled once per ISA.
namespace portable::quant { QuantKernels quant_kernel_table(); }
namespace avx2::quant { QuantKernels quant_kernel_table(); }
namespace avx512::quant { QuantKernels quant_kernel_table(); }

namespace {

QuantKernels with_q8_dot(QuantKernels t) {
  for (const Q8DotVariant& v : q8_dot_variants())  // best first
    if (v.isa == t.isa) {
      t.q8_dot_rows = v.rows;
      t.q8_dot_name = v.name;
      t.q8_packed_rows = v.packed;
      t.quantize_q8_rows = v.quantize;
      break;
    }
  return t;
}

}  // namespace

const QuantKernels& quant_kernels_for(Isa isa) {
  if (isa > best_supported_isa())
    fail("kernels", "this CPU cannot run " + isa_name(isa) + " kernels (best is " + isa_name(best_supported_isa()) + ")");
  switch (isa) {
    case Isa::avx512: {
      static const QuantKernels t = with_q8_dot(avx512::quant::quant_kernel_table());
      return t;
    }
    case Isa::avx2: {
      static const QuantKernels t = with_q8_dot(avx2::quant::quant_kernel_table());
      return t;
    }
    case Isa::portable: {
      static const QuantKernels t = with_q8_dot(portable::quant::quant_kernel_table());
      return t;
    }
  }
  fail("kernels", "unknown isa");
}

}  // namespace attn::kernels
