// The decoder's weights: read-only matrices used as stored (float32, bfloat16 or float16), in a
// mapped safetensors file or in memory of their own (random models), plus small float32 vectors
// (norm weights, decays).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attn/model.hpp"
#include "attn/gguf.hpp"
#include "attn/safetensors.hpp"
#include "quant/q8_packed.hpp"

namespace attn::model {

// rows x cols, row-major, unit inner stride; rows by address for the kernel table. Elements are
// `dtype` values, or ggml blocks when `quant` is set (cols a whole number of blocks). A
// quantized matrix may instead be `packed` in 16-row groups for decode's integer dot products
// (quant/q8_packed.hpp); it then has no row addresses (row_ptrs is empty).
struct Matrix {
  DType dtype = DType::f32;
  std::optional<kernels::BlockQuant> quant;
  int64_t rows = 0, cols = 0;
  const uint8_t* data = nullptr;
  std::vector<const void*> row_ptrs;
  std::shared_ptr<const kernels::PackedMatrix> packed;
  const void* row(int64_t r) const { return row_ptrs[static_cast<size_t>(r)]; }
  // Bytes of one row as ggml blocks (quantized matrices).
  int64_t quant_row_bytes() const { return kernels::ggml_row_bytes(*quant, cols); }
};

// A quantized matrix packed in 16-row groups; its row addresses are dropped.
Matrix packed_matrix(const Matrix& m);

// A mixture-of-experts feed-forward (model/moe.hpp): router (E, dim); per expert SwiGLU
// w1, w3 (hidden, dim) and w2 (dim, hidden).
struct MoeExperts {
  Matrix router;
  std::vector<Matrix> w1, w3, w2;
  int64_t experts() const { return router.rows; }
  int64_t dim() const { return router.cols; }
  int64_t hidden() const { return w1.empty() ? 0 : w1.front().rows; }
};

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;
  std::vector<float> attn_out_norm, ffn_out_norm;  // norms of a block's output before its residual (dim)
  std::vector<float> q_norm, k_norm;  // per-head RMSNorm of q and k before RoPE (head_dim); empty: none
  Matrix wq, wk, wv, wo;         // (H*hd, dim), (Hkv*hd, dim) x2, (dim, H*hd)
  Matrix w1, w3, w2;             // SwiGLU: gate (hidden, dim), up (hidden, dim), down (dim, hidden)
  std::vector<float> out_norm;   // lightning: (H*hd)
  Matrix gate;                   // lightning: (H*hd, dim)
  std::vector<float> decays;     // lightning: (H)
  int64_t kv_heads = 0;          // heads of k and v in this layer
  MoeExperts moe;                // config.moe_experts > 0: the feed-forward (w1, w3, w2 unused)
};

struct DecoderWeights {
  DecoderConfig config;
  Matrix embed;                  // (vocab, dim)
  Matrix output;                 // (vocab, dim): lm_head, or the embedding when tied
  std::vector<float> final_norm;
  std::vector<LayerWeights> layers;
  std::shared_ptr<const void> file;                 // keeps the mapped file alive
  std::vector<std::vector<uint8_t>> owned;          // random weights' storage
};

// The tensor names (Hugging Face's) and shapes a config implies, in a stable order (its
// architecture lists each layer's).
struct WeightSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool matrix;  // false: a float32 vector (norms)
};
std::vector<WeightSpec> weight_specs(const DecoderConfig& config);

// A Matrix over rows of `row_bytes` at `data` (float `dtype` elements, or ggml blocks).
Matrix matrix_over(const uint8_t* data, DType dtype, int64_t rows, int64_t cols);
Matrix matrix_over(const uint8_t* data, DType dtype, std::optional<kernels::BlockQuant> quant, int64_t rows,
                   int64_t cols, int64_t row_bytes);
// "(2, 3)", "(4,)": shapes in error messages.
std::string shape_text(const std::vector<int64_t>& shape);

// Builds DecoderWeights by asking for every spec'd tensor in weight_specs() order (the embedding,
// each layer's norms and matrices, the final norm, lm_head unless tied).
DecoderWeights bind_weights(const DecoderConfig& config, const std::function<Matrix(const WeightSpec&)>& matrix,
                            const std::function<std::vector<float>(const WeightSpec&)>& vector);

// Every tensor is checked against its spec (present, shape, a float dtype); an unexpected
// tensor is an Error too (a file for another architecture should not half-load).
DecoderWeights load_weights(std::shared_ptr<const SafetensorsFile> file, const DecoderConfig& config);
DecoderWeights random_weights(const DecoderConfig& config, uint64_t seed, DType dtype, int threads = 0);
// A GGUF file (see gguf_weights.cpp) of an architecture that reads them: its config (from
// general.architecture's reading; max_seq_len 0 = the file's context length) and its weights,
// used as stored (F32/F16/BF16 and
// Q4_0/Q4_1/Q8_0 blocks; other block types as Q8_0) or, with `dequantize`, copied to float32 once.
// With `repack` (and not `dequantize`) quantized matrices are packed in 16-row groups
// (packed_matrix; Q5_0, Q5_1, Q4_K, Q5_K, Q6_K as stored too) and their pages of the mapping dropped, so
// the model's memory stays near the file's size.
DecoderConfig gguf_config(const GgufFile& file, int64_t max_seq_len);
// For the architectures' GGUF readings: "<arch>.block_count", checked against the blocks the
// file's tensors name (blk.0 .. blk.N-1) before a layer list is made from it (a count of 10^8 in
// a small file is an error, not an allocation); and the fields every such file states the same
// way (vocab from token_embd, "<arch>.embedding_length", feed_forward_length, head counts,
// rope.freq_base, layer_norm_rms_epsilon, context_length; tied embeddings when output is absent).
int64_t gguf_block_count(const GgufFile& file, const std::string& arch);
void gguf_common_config(const GgufFile& file, const std::string& arch, int64_t max_seq_len, DecoderConfig& config);
DecoderWeights load_gguf_weights(std::shared_ptr<const GgufFile> file, const DecoderConfig& config, bool dequantize,
                                 bool repack = false);
// The packed form of a ggml block type (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), or none.
std::optional<kernels::BlockQuant> packed_quant(uint32_t ggml_type);

// Every weight of `w` in weight_specs() order with where it lives: a matrix or a float32 vector
// (the tied output matrix is not listed: it is the embedding). For Decoder::weight / set_weight.
struct WeightSlot {
  WeightSpec spec;
  Matrix* matrix = nullptr;
  std::vector<float>* vector = nullptr;
};
std::vector<WeightSlot> weight_slots(DecoderWeights& w);

// The tensors of `w` by name (for write_safetensors); Error naming the first block-quantized one.
std::map<std::string, SafetensorsEntry> weight_entries(const DecoderWeights& w);

}  // namespace attn::model
