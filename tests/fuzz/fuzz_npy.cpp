// libFuzzer: the .npy reader either returns a consistent array or throws Error.
#include <cstdint>

#include "attn/error.hpp"
#include "attn/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const attn::NpyArray a = attn::parse_npy(data, size, "fuzz");
    if (static_cast<int64_t>(a.bytes.size()) != a.numel() * static_cast<int64_t>(attn::dtype_size(a.dtype)))
      __builtin_trap();
  } catch (const attn::Error&) {
  }
  return 0;
}
