// Instruction-set selection: detected once from CPU features, overridable with the
// environment variable ATTN_ISA=portable|avx2|avx512 (or set_isa(), AttendOptions::isa).
// Names are parsed in one place (parse_isa): the CLI's --isa, Python and ATTN_ISA agree.
#pragma once
#include <string>
#include <vector>

namespace attn {

enum class Isa { portable, avx2, avx512 };

std::string isa_name(Isa isa);
// "portable" (alias "scalar"), "avx2" or "avx512"; anything else throws Error naming `where`.
Isa parse_isa(const std::string& name, const std::string& where);
Isa best_supported_isa();                 // from CPUID, ignores ATTN_ISA
std::vector<Isa> supported_isas();        // every ISA this CPU can run, portable first
Isa active_isa();                         // ATTN_ISA if set (and supported), else best
void set_isa(Isa isa);                    // throws Error if this CPU cannot run it

}  // namespace attn
