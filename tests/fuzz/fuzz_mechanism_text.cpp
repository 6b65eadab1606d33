// libFuzzer: the mechanism text parser either returns a mechanism that round-trips or throws Error.
#include <cstdint>
#include <string>

#include "attn/error.hpp"
#include "attn/mechanism.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const attn::Mechanism m = attn::parse_mechanism(text);
    if (!(attn::parse_mechanism(attn::to_string(m)) == m)) __builtin_trap();
  } catch (const attn::Error&) {
  }
  return 0;
}
