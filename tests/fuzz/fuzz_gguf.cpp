// libFuzzer: the GGUF reader either returns tensors that lie inside the input, with sizes that
// match their dimensions and types, or throws Error.
#include <cstdint>

#include "attn/error.hpp"
#include "attn/gguf.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const attn::GgufFile f = attn::GgufFile::parse(data, size, "fuzz");
    uint8_t sum = 0;
    for (const attn::GgufTensor& t : f.tensors()) {
      if (t.bytes < 0 || t.data < data || t.data + t.bytes > data + size) __builtin_trap();
      const attn::GgmlTypeInfo* info = attn::ggml_type_info(t.type);
      if (!info || t.elements() / info->block_elements * info->block_bytes != t.bytes) __builtin_trap();
      for (int64_t i = 0; i < t.bytes; ++i) sum ^= t.data[i];  // ASan sees any read outside
    }
    (void)sum;
  } catch (const attn::Error&) {
  }
  return 0;
}
