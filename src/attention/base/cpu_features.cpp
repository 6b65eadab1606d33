#include <cpuid.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "attn/error.hpp"
#include "attn/isa.hpp"
#include "base/cpu_features.hpp"

namespace attn {

std::string isa_name(Isa isa) {
  switch (isa) {
    case Isa::portable: return "portable";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "?";
}

static uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

namespace {

Isa detect_isa() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return Isa::portable;
  const bool osxsave = c & (1u << 27), fma = c & (1u << 12), f16c = c & (1u << 29);
  if (!osxsave) return Isa::portable;
  const uint64_t xcr0 = xgetbv0();
  const bool ymm_os = (xcr0 & 0x6) == 0x6, zmm_os = (xcr0 & 0xe6) == 0xe6;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return Isa::portable;
  const bool avx2 = b & (1u << 5);
  const bool avx512f = b & (1u << 16), avx512dq = b & (1u << 17), avx512bw = b & (1u << 30),
             avx512vl = b & (1u << 31);
  if (zmm_os && avx512f && avx512dq && avx512bw && avx512vl && fma && f16c && avx2)
    return Isa::avx512;
  if (ymm_os && avx2 && fma && f16c) return Isa::avx2;
  return Isa::portable;
}

}  // namespace

static CpuExtras detect_extras() {
  CpuExtras e;
  unsigned a, b, c, d;
  const Isa level = detect_isa();  // the OS saves the registers the extras use
  if (level >= Isa::avx512 && __get_cpuid_count(7, 0, &a, &b, &c, &d)) e.avx512_vnni = c & (1u << 11);
  if (level >= Isa::avx2 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) {
    e.avx_vnni = a & (1u << 4);
    e.avx512_bf16 = level >= Isa::avx512 && (a & (1u << 5));
  }
  return e;
}

// Detected once: CPUID can trap to the hypervisor on a virtual machine (17 us per instruction
// measured on one), and every attend() call asks.
Isa best_supported_isa() {
  static const Isa best = detect_isa();
  return best;
}

const CpuExtras& cpu_extras() {
  static const CpuExtras extras = detect_extras();
  return extras;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out{Isa::portable};
  const Isa best = best_supported_isa();
  if (best >= Isa::avx2) out.push_back(Isa::avx2);
  if (best >= Isa::avx512) out.push_back(Isa::avx512);
  return out;
}

static std::atomic<int> g_forced{-1};

Isa parse_isa(const std::string& s, const std::string& where) {
  if (s == "portable" || s == "scalar") return Isa::portable;
  if (s == "avx2") return Isa::avx2;
  if (s == "avx512") return Isa::avx512;
  fail(where, "expected portable (or scalar), avx2 or avx512, got '" + s + "'");
}

void set_isa(Isa isa) {
  if (isa > best_supported_isa())
    fail("set_isa", "this CPU cannot run " + isa_name(isa) + " (best is " +
                        isa_name(best_supported_isa()) + ")");
  g_forced = static_cast<int>(isa);
}

Isa active_isa() {
  const int forced = g_forced.load();
  if (forced >= 0) return static_cast<Isa>(forced);
  static const Isa from_env = [] {
    const char* env = std::getenv("ATTN_ISA");
    if (!env || !*env) return best_supported_isa();
    const Isa want = parse_isa(env, "ATTN_ISA");
    if (want > best_supported_isa())
      fail("ATTN_ISA", "this CPU cannot run " + isa_name(want) + " (best is " +
                           isa_name(best_supported_isa()) + ")");
    return want;
  }();
  return from_env;
}

}  // namespace attn
