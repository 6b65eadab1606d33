// libFuzzer: the GGUF reader either returns tensors that lie inside the input, with sizes that
// match their dimensions and types, or throws Error. A file that parses is then read as a llama
// decoder the way Decoder::from_gguf does (config from the metadata: block_count against the
// blk.N tensors, sizes against the machine; then every weight, mapped and dequantized), which
// either succeeds or throws Error; the run state is not allocated here. Every tensor of a type
// attn decodes (the K-quants and Q5 blocks included) is first decoded whole, model or not, and
// every matrix of a type attn packs is packed in 16-row groups and read back: its ggml rows bit
// for bit, its float rows bit for bit the plain decoding (a mismatch traps).
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "attn/error.hpp"
#include "attn/gguf.hpp"
#include "model/memory_need.hpp"
#include "model/weights.hpp"
#include "quant/block_pieces.hpp"
#include "quant/ggml_blocks.hpp"
#include "quant/q8_packed.hpp"

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
        const std::optional<attn::kernels::BlockQuant> q = attn::model::packed_quant(t.type);
        // a matrix of whole blocks per row (an empty one may claim any row count: [0, 2^40])
        if (!q || t.dims.size() != 2 || t.elements() == 0 || t.dims[0] % attn::ggml_type_info(t.type)->block_elements)
          continue;
        const int64_t cols = t.dims[0], rows = t.dims[1], row_bytes = attn::kernels::ggml_row_bytes(*q, cols);
        std::vector<const void*> ptrs;
        for (int64_t r = 0; r < rows; ++r) ptrs.push_back(t.data + r * row_bytes);
        const attn::kernels::PackedMatrix packed(ptrs.data(), *q, rows, cols);
        std::vector<uint8_t> back(static_cast<size_t>(rows * row_bytes));
        std::vector<float> floats(static_cast<size_t>(rows * cols));
        packed.ggml_rows(0, rows, back.data(), row_bytes);
        packed.float_rows(0, rows, floats.data(), cols);
        if (std::memcmp(back.data(), t.data, back.size()) != 0 ||
            std::memcmp(floats.data(), values.data(), floats.size() * sizeof(float)) != 0)
          __builtin_trap();
      }
    const attn::DecoderConfig config = attn::model::gguf_config(*f, 0);
    if (config.layers.empty() || config.layers.size() > static_cast<size_t>(attn::DecoderConfig::kMaxLayers))
      __builtin_trap();
    for (const bool dequantize : {false, true}) {
      attn::model::memory_need(config, dequantize ? 128 : 34, "fuzz");
      (void)attn::model::load_gguf_weights(f, config, dequantize);
    }
    (void)attn::model::load_gguf_weights(f, config, false, /*repack=*/true);
  } catch (const attn::Error&) {
  }
  return 0;
}
