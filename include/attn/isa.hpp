// Instruction-set selection: detected once from CPU features, overridable with the
// environment variable ATTN_ISA=portable|avx2|avx512 (or set_isa() in tests).
#pragma once
#include <string>
#include <vector>

namespace attn {

enum class Isa { portable, avx2, avx512 };

std::string isa_name(Isa isa);
Isa best_supported_isa();                 // from CPUID, ignores ATTN_ISA
std::vector<Isa> supported_isas();        // every ISA this CPU can run, portable first
Isa active_isa();                         // ATTN_ISA if set (and supported), else best
void set_isa(Isa isa);                    // throws Error if this CPU cannot run it

}  // namespace attn
