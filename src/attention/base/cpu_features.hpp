// CPU features beyond the ISA levels of attn/isa.hpp, for kernel variants inside a level (read
// by kernels_for, the one place kernels are picked). Detected once, from CPUID.
#pragma once

namespace attn {

struct CpuExtras {
  bool avx512_vnni = false;  // vpdpbusd on 512/256/128-bit registers (EVEX)
  bool avx_vnni = false;     // vpdpbusd in its VEX form (256/128-bit), on some CPUs without AVX-512
  bool avx512_bf16 = false;  // vdpbf16ps, vcvtne2ps2bf16 (AVX512-BF16: Zen 4 and later, Sapphire Rapids and later)
};
const CpuExtras& cpu_extras();

}  // namespace attn
