// libFuzzer: the GGUF reader either returns tensors that lie inside the input, with sizes that
// match their dimensions and types, or throws Error. A file that parses is then read as a llama
// decoder the way Decoder::from_gguf does (config from the metadata: block_count against the
// blk.N tensors, sizes against the machine; then every weight, mapped and dequantized), which
// either succeeds or throws Error; the run state is not allocated here. Every tensor of a type
// attn decodes (the K-quants and Q5 blocks included) is first decoded whole, model or not.
#include <cstdint>
#include <memory>
#include <vector>

#include "attn/error.hpp"
#include "attn/gguf.hpp"
#include "model/memory_need.hpp"
#include "model/weights.hpp"
#include "quant/ggml_blocks.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = std::make_shared<const attn::GgufFile>(attn::GgufFile::parse(data, size, "fuzz"));
    uint8_t sum = 0;
    for (const attn::GgufTensor& t : f->tensors()) {
      if (t.bytes < 0 || t.data < data || t.data + t.bytes > data + size) __builtin_trap();
      const attn::GgmlTypeInfo* info = attn::ggml_type_info(t.type);
      if (!info || t.elements() / info->block_elements * info->block_bytes != t.bytes) __builtin_trap();
      for (int64_t i = 0; i < t.bytes; ++i) sum ^= t.data[i];  // ASan sees any read outside
    }
    (void)sum;
    std::vector<float> values;
    for (const attn::GgufTensor& t : f->tensors())
      if (attn::model::can_dequantize(t.type) && t.elements() <= (int64_t{1} << 20)) {
        values.resize(static_cast<size_t>(t.elements()));
        attn::model::dequantize_row(t.type, t.data, t.elements(), values.data());
      }
    const attn::DecoderConfig config = attn::model::gguf_config(*f, 0);
    if (config.layers.empty() || config.layers.size() > static_cast<size_t>(attn::DecoderConfig::kMaxLayers))
      __builtin_trap();
    for (const bool dequantize : {false, true}) {
      attn::model::memory_need(config, dequantize ? 128 : 34, "fuzz");
      (void)attn::model::load_gguf_weights(f, config, dequantize);
    }
  } catch (const attn::Error&) {
  }
  return 0;
}
