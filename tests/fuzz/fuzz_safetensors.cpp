// libFuzzer: the safetensors reader either returns tensors that lie inside the input, with sizes
// that match their shapes, or throws Error; a decoder config in the metadata either parses into
// a valid config (whose byte need is computed without overflow) or throws Error.
#include <cstdint>

#include "attn/error.hpp"
#include "attn/model.hpp"
#include "attn/safetensors.hpp"
#include "model/memory_need.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const attn::SafetensorsFile f = attn::SafetensorsFile::parse(data, size, "fuzz");
    uint8_t sum = 0;
    for (const auto& [name, t] : f.tensors()) {
      if (t.bytes < 0 || t.data < data || t.data + t.bytes > data + size) __builtin_trap();
      for (int64_t i = 0; i < t.bytes; ++i) sum ^= t.data[i];  // ASan sees any read outside
    }
    (void)sum;
    if (const auto it = f.metadata().find("attn.decoder"); it != f.metadata().end()) {
      const attn::DecoderConfig c = attn::DecoderConfig::from_json(it->second, "fuzz");
      c.validate();
      attn::model::memory_need(c, 64, "fuzz");
    }
  } catch (const attn::Error&) {
  }
  return 0;
}
