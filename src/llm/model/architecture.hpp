// A model architecture: which tensors a decoder layer holds, how the layer runs them through the
// shared blocks (model/layer_run.hpp, arch/blocks.hpp: norms, the attention layer with its cache
// and RoPE, SwiGLU, the mixture of experts, residuals), how a random model of it is laid out, and
// how its GGUF files read. The decoder declares this interface; one file per architecture
// (arch/llama.cpp, arch/minimax.cpp, ...) defines one, and arch/registry.cpp lists them. The
// decoder, the loaders, the CLI and Python ask the registry by name (DecoderConfig::architecture,
// a GGUF file's general.architecture) and name none.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "attn/gguf.hpp"
#include "attn/model.hpp"
#include "model/memory_need.hpp"
#include "model/weights.hpp"

namespace attn::model {

class LayerRun;  // model/layer_run.hpp

// One tensor of a layer: its name after "model.layers.<i>." (Hugging Face's names), its shape
// ((rows, cols) or (n,)), and where the loaders put it (a matrix or a float32 vector of `l`).
struct LayerTensor {
  std::string name;
  std::vector<int64_t> shape;
  Matrix* matrix = nullptr;
  std::vector<float>* vector = nullptr;
};

// Elements of a layer's weights, counted before anything is allocated (overflow: an Error).
struct WeightCount {
  int64_t matrix = 0;  // elements of matrices (stored as the file has them, or converted)
  int64_t vector = 0;  // elements of float32 vectors (norms, decays), always copied
};

// Reading a GGUF file of this architecture (llama.cpp's format: keys "<name>.*", tensors
// token_embd, blk.<i>.<name>, output_norm, output).
struct GgufReading {
  // The config from the file's metadata, every layer's mechanism set; max_seq_len 0: the file's
  // context length.
  DecoderConfig (*config)(const GgufFile& file, int64_t max_seq_len);
  // The file's name for a Hugging Face tensor name (an Error when the file cannot hold it).
  std::string (*tensor_name)(const std::string& hf);
  // Puts a matrix's rows in the order the layer multiplies with (by address, nothing copied), or
  // null when the file's order is already that.
  void (*arrange_rows)(const std::string& hf, Matrix& m, const DecoderConfig& config);
};

struct Architecture {
  std::string_view name;     // as DecoderConfig::architecture and GGUF general.architecture hold it
  std::string_view summary;  // one line: the block, for --help and docs
  // The architecture `attn generate` runs beside a random model of this one ("": none).
  std::string_view baseline;
  // Checks the config fields only this architecture reads (DecoderConfig::validate checks the rest).
  void (*validate)(const DecoderConfig& config);
  // Layer i's tensors, pointing into `l` (which it sizes and fills with what is not a tensor:
  // kv_heads, decays).
  void (*layer_tensors)(const DecoderConfig& config, size_t i, LayerWeights& l, std::vector<LayerTensor>& out);
  // Layer i's weight elements, computed from the config alone (sizes through `size`, which
  // reports an overflow).
  WeightCount (*layer_weight_count)(const DecoderConfig& config, size_t i, const SizeCheck& size);
  // Runs layer i on the step's rows (the residual stream x) through the shared blocks.
  void (*run_layer)(LayerRun& run, size_t i);
  // The scale a of a residual x = a·RMSNorm(x) + f (1: the standard x = x + f).
  double (*residual_scale)(const DecoderConfig& config);
  // Lays out a random model's layers and feed-forward (attn generate-random).
  void (*layout)(DecoderConfig& config, const LayerLayout& layout);
  const GgufReading* gguf = nullptr;  // null: no GGUF files of this architecture
};

// The registry (arch/registry.cpp). The architecture named `name`; an Error from `where` naming
// the known ones otherwise.
const Architecture& architecture(std::string_view name, const std::string& where = "architecture");
// Every architecture, in the registry's order.
const std::vector<const Architecture*>& all_architectures();

}  // namespace attn::model
