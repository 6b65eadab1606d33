// A decoder whose every attention layer is a mechanism of this library. Its architecture (a name
// the registry knows: architectures(); one file each under src/llm/arch/) says how a layer strings
// together the shared blocks; llama's, for example:
//
//   x = embed(token)
//   per layer:  h = RMSNorm(x) · w_attn_norm
//               q, k, v = h Wq^T, h Wk^T, h Wv^T         (GQA: k, v have kv_heads heads)
//               RoPE on q and k (at the tokens' positions)   -- softmax layers
//               o = attention(q, k, v) with the layer's mechanism, against the layer's cache
//               x = x + o Wo^T
//               h = RMSNorm(x) · w_ffn_norm
//               x = x + (silu(h W1^T) ⊙ h W3^T) W2^T       (SwiGLU)
//   logits = (RMSNorm(x) · w_final) Wout^T                  (Wout = the embedding when tied)
//
// A layer whose mechanism carries a recurrent state (linear attention and its relatives) keeps
// that state instead of a KV cache, so its memory does not grow with the context. A "lightning"
// layer is MiniMax-01's: silu on q, k and v, no RoPE, per-head decays
// lambda_h = exp(-2^(-8h/H) (1 - l/(L - 1 + 1e-5) + 1e-5)) (h = 1..H, layer l of L), the output
// RMS-normalised over all its channels (weighted) and gated by sigmoid(h Wg^T). The MiniMax
// hybrid (every 8th layer softmax, the others lightning) is then a list of layer specs.
//
// MiniMax-01's block (architecture "minimax") keeps the normed input as the residual,
// scaled: h = RMSNorm(x); x = a·h + Attn(h); h = RMSNorm(x); x = a·h + FFN(h), a = (2L)^(1/4) for
// L layers. Its feed-forward is a mixture of experts (moe_experts > 0: a router picks moe_top_k
// of moe_experts SwiGLU experts of width hidden_dim per token, attn/moe.hpp).
//
// Config, weights and run state are separate: weights are read-only (mapped from a safetensors
// file where they lie, or generated), the run state (activations, caches) is allocated once, for
// max_seq_len tokens, when the Decoder is made.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "attn/mechanism.hpp"
#include "attn/rope.hpp"

namespace attn {

struct DecoderLayerSpec {
  Mechanism mechanism;     // must be causal
  bool rope = true;        // rotate q and k (off for lightning layers and for DCA, which rotates itself)
  bool lightning = false;  // MiniMax's lightning block (see above); needs a linear mechanism
  // A layer trained with a sliding window ("local"; the others "global"). It stays local when its
  // mechanism is replaced: the kind names how the layer was trained, the mechanism how it runs.
  bool local = false;
  double rope_theta = 0.0;  // this layer's RoPE base; 0: DecoderConfig::rope_theta
};

// A random model's layout (attn generate-random): its layer count, the softmax layers'
// mechanism, an optional hybrid of lightning and softmax layers, and the mixture of experts of
// architectures whose feed-forward is one. DecoderConfig::lay_out applies it as the config's
// architecture does.
struct LayerLayout {
  int64_t layers = 0;
  Mechanism softmax;
  int64_t hybrid_linear = 0, hybrid_softmax = 0;  // L:S lightning:softmax layers per group; 0:0: none
  int64_t experts = 8, top_k = 2;
  int64_t expert_hidden = 0;  // each expert's SwiGLU width; 0: 1.5 x dim
};

struct DecoderConfig {
  // The architecture (architectures()): how each layer strings the shared blocks together.
  std::string architecture = "llama";
  int64_t vocab_size = 0;
  int64_t dim = 0;          // model width
  int64_t hidden_dim = 0;   // SwiGLU width
  int64_t heads = 0;
  int64_t kv_heads = 0;     // softmax layers (lightning layers use `heads` for k and v)
  int64_t head_dim = 0;
  int64_t max_seq_len = 0;  // positions the run state is allocated for
  double rope_theta = 10000.0;
  RopeStyle rope_style = RopeStyle::half;  // Hugging Face llama's rotate-half
  double norm_eps = 1e-5;
  bool tied_embeddings = false;  // logits use the embedding matrix
  double embed_scale = 1.0;      // the embedding rows are multiplied by it (float32), e.g. Gemma's sqrt(dim)
  double final_softcap = 0.0;    // > 0: logits = cap * tanh(logits / cap)
  std::vector<DecoderLayerSpec> layers;
  // For architectures whose feed-forward is a mixture of experts: 0, one SwiGLU; > 0, a mixture of
  // this many SwiGLU experts (each hidden_dim wide), moe_top_k of them per token.
  int64_t moe_experts = 0;
  int64_t moe_top_k = 2;
  static constexpr int64_t kMaxExperts = 4096;

  // The most layers a decoder may have (checked before a layer list is made, so a file's or a
  // caller's layer count of 10^8 is an error, not an allocation). Real models have ~100.
  static constexpr int64_t kMaxLayers = 4096;

  // Every layer softmax:causal (RoPE on). count in [0, kMaxLayers].
  static std::vector<DecoderLayerSpec> softmax_layers(int64_t count, const Mechanism& softmax);
  // `linear` lightning layers, then one softmax layer, repeated (7:1 is MiniMax-01's layout:
  // layer i is softmax iff (i + 1) % 8 == 0).
  static std::vector<DecoderLayerSpec> hybrid_layers(int64_t count, int64_t linear, int64_t softmax,
                                                     const Mechanism& softmax_mechanism);
  // The mechanism of lightning layers: linear:map=identity,causal,normalize=0,chunk=256.
  static Mechanism lightning_mechanism();
  // MiniMax-01's model: architecture "minimax", hybrid_layers(count, 7, 1, softmax) and a mixture
  // of `experts` experts, top_k per token.
  void make_minimax(int64_t count, const Mechanism& softmax, int64_t experts, int64_t top_k);
  // Sets the layers (and feed-forward) of a random model as `architecture` lays them out.
  void lay_out(const LayerLayout& layout);
  // The scale a of the architecture's residual x = a·RMSNorm(x) + f: 1 for the standard
  // x = x + f (llama), (2L)^(1/4) for MiniMax-01's.
  double residual_scale() const;

  // Throws Error naming the first inconsistent field. Sizes are checked for consistency here;
  // the bytes they need are checked (against this machine's memory) when a Decoder is made.
  void validate() const;
  // The JSON form stored in a safetensors file's metadata under "attn.decoder" (mechanisms as text).
  std::string to_json() const;
  static DecoderConfig from_json(const std::string& json, const std::string& where);
};

// Per-head decays of lightning layer `layer` of `layers` (MiniMax-01's formula, heads h = 1..H).
std::vector<float> lightning_decays(int64_t heads, int64_t layer, int64_t layers);

// An architecture the decoder knows (one file each under src/llm/arch/).
struct ArchitectureInfo {
  std::string name;      // DecoderConfig::architecture, a GGUF file's general.architecture
  std::string summary;   // one line
  std::string baseline;  // the architecture `attn generate` compares a random model of it with ("": none)
  bool gguf = false;     // GGUF files of it can be loaded
};
std::vector<ArchitectureInfo> architectures();

// Loading a GGUF file (llama.cpp's format) of an architecture that reads them (ArchitectureInfo::gguf).
struct GgufLoadOptions {
  int threads = 0;
  // false: matrices used as stored (Q4_0/Q4_1/Q8_0 blocks read in place, F16/BF16/F32);
  // true: dequantized to float32 once at load ("--dtype f32").
  bool dequantize = false;
  int64_t max_seq_len = 0;  // positions of context the caches hold; 0: the model's context length
  std::string activations = "auto";  // products with quantized matrices: "f32", "q8", "q8-decode" or "auto" (set_activations)
  DType cache_dtype = DType::f32;     // the KV caches' storage (set_cache_dtype)
  // Q4_0/Q4_1/Q8_0 matrices packed once at load in groups of 16 rows, the layout decode's integer
  // dot products read fastest (unless activations is "f32", which reads the blocks in place);
  // their pages of the mapped file are dropped, so memory stays near the file's size.
  bool repack = true;
};

// One layer's cache as allocated (Decoder::layer_caches).
struct LayerCache {
  std::string mechanism;
  std::string kind;   // "kv" (every position), "kv-bounded" (a window's rows), "state"
  int64_t rows = 0;   // KV rows held (capacity); 0 for a state
  int64_t bytes = 0;  // K and V, or the state
};

// One weight of a decoder as float32 values (Decoder::weight): row-major, `shape` (rows, cols) for a
// matrix, (n,) for a norm vector.
struct WeightValues {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// One sequence's part of a paged step (Decoder::forward_paged): its new tokens at positions
// pos.., read and written through its block table in the decoder's KV pool.
struct PagedSequence {
  std::span<const int32_t> tokens;  // at least one
  int64_t pos = 0;                  // positions of this sequence already in its blocks
  // Block i of the table holds positions i*block_size .. (i+1)*block_size - 1; it must cover
  // pos + tokens.size() positions. Block 0 is the pool's null block (zeros, never written): a
  // table may name it for positions no query of the step sees (a window's past).
  std::span<const int32_t> blocks;
  bool all_logits = false;  // logits of every new token; else of the last one
};

class Decoder {
 public:
  // Loads a safetensors file: the config from its metadata ("attn.decoder"), the tensors by
  // Hugging Face llama names (model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight,
  // ...; lightning layers add self_attn.norm.weight and self_attn.output_gate.weight). F32, BF16
  // or F16 tensors are used as stored. `layers`, when given, replaces the file's layer specs
  // (same count; lightning layers stay lightning: their weights differ).
  static Decoder from_safetensors(const std::string& path, int threads = 0,
                                  const std::vector<DecoderLayerSpec>* layers = nullptr);
  // Loads a GGUF file (mapped) of an architecture that reads them (general.architecture): config
  // from its metadata, every layer softmax:causal, tensors by llama.cpp's names (output tied to
  // the embedding when absent).
  static Decoder from_gguf(const std::string& path, const GgufLoadOptions& options = {});
  // Random weights (counter-based from `seed`: the same on every machine and thread count),
  // float32 or bfloat16 matrices.
  static Decoder random(const DecoderConfig& config, uint64_t seed, DType dtype = DType::f32, int threads = 0);

  Decoder(Decoder&&) noexcept;
  Decoder& operator=(Decoder&&) noexcept;
  ~Decoder();

  const DecoderConfig& config() const;
  // Runs tokens[0..n) at positions pos..pos+n-1 (pos = the tokens already run since reset();
  // anything else is an Error) and returns the logits of the last token, or of every token
  // (n x vocab_size, row-major) when all_logits. The view is valid until the next call.
  const std::vector<float>& forward(const std::vector<int32_t>& tokens, int64_t pos, bool all_logits = false);
  // Paged KV memory for many sequences (attn/engine.hpp serves with it): `blocks` blocks of
  // `block_size` positions, each holding those positions' K and V rows of every layer, in the
  // cache dtype (set_cache_dtype: it must be set first). Block 0 is the null block. Every layer
  // must keep a KV cache (a recurrent layer: Error). 0 blocks frees the pool.
  void set_kv_pool(int64_t blocks, int64_t block_size);
  // Bytes one block of the pool takes (every layer's K and V rows, int8 rows' scales included).
  int64_t kv_pool_block_bytes(int64_t block_size) const;
  // Runs one step over several sequences of the pool at once: each weight matrix is read once for
  // every sequence's rows; attention runs per sequence against its own blocks. The rows of all
  // sequences together are at most max_step_tokens(). Returns the logits (vocab_size each) of each
  // sequence's last token, or of all its tokens when all_logits, sequence after sequence. A
  // sequence's results do not depend on the others in the step (row-wise products, per-sequence
  // attention: the same bits alone or batched). Checked before anything is written: an Error
  // leaves the pool as it was. The decoder's own position and caches are not touched.
  const std::vector<float>& forward_paged(std::span<const PagedSequence> sequences);
  int64_t max_step_tokens() const;  // rows one step holds (forward() splits longer inputs)
  // Forgets the context (caches and states to zero).
  void reset();
  int64_t position() const;  // tokens run since reset()

  // Memory the caches hold: per token of context, the K and V rows of layers whose cache grows
  // with it (bytes); the fixed bytes of bounded caches (layers whose mechanism sees a bounded
  // past: a window + sinks, a chunk; attn::info) and of recurrent states.
  int64_t kv_bytes_per_token() const;
  int64_t bounded_cache_bytes() const;
  int64_t state_bytes() const;
  // Each layer's memory: its kind ("kv", "kv-bounded", "state"), rows held and bytes allocated.
  std::vector<LayerCache> layer_caches() const;
  // true: every KV layer keeps every row even when its mechanism needs fewer (to check that the
  // bounded caches change no result). Only at position 0.
  void set_full_caches(bool full);
  // Weights in the model (every tensor of its file, the tied embedding once).
  int64_t parameter_count() const;
  // The weight `name` (Hugging Face llama names, as weight files hold them:
  // "model.layers.3.mlp.gate_proj.weight", "model.norm.weight", "model.embed_tokens.weight", ...)
  // as float32: float matrices converted, quantized ones (in place or packed) dequantized.
  // An unknown name is an Error.
  WeightValues weight(const std::string& name) const;
  // Every weight's name in the model's order (the embedding, each layer's norms and matrices, the
  // final norm, lm_head unless tied).
  std::vector<std::string> weight_names() const;
  // Replaces the weight `name` with `values` (row-major, `shape` must be the weight's shape). A
  // matrix becomes a float32 matrix over a copy the decoder owns (a quantized one is quantized no
  // more: its products run the float path); replacing it again frees the previous copy. Setting
  // the embedding of a model with tied embeddings sets its output matrix too. The cached context
  // was computed with the old weights: reset() to start over cleanly. Non-finite values are taken
  // as they are (they propagate to the logits).
  void set_weight(const std::string& name, const std::vector<int64_t>& shape, std::span<const float> values);
  // Writes the weights and config to a safetensors file (random models become files).
  void save(const std::string& path) const;
  // Replaces the attention mechanism of layer `layer` (-1: every layer), e.g. a sliding window on
  // a model trained with full attention. It must be causal and keep the layer's memory kind (a
  // KV-cache layer takes a mechanism without recurrent state, a recurrent layer one with). A
  // mechanism that keeps a different number of cache rows (a window instead of everything)
  // reallocates the layer's cache, which needs position 0 (reset() first). The cached context was
  // computed with the old mechanism: reset() to start over cleanly.
  void set_mechanism(int64_t layer, const Mechanism& mechanism);
  // Sets the forced attention form ("reference", ...; empty: the engine's choice) and threads.
  void set_attention_form(const std::string& form);
  // How products with block-quantized matrices multiply: "f32" (float activations against the
  // weights dequantized: in registers for decode steps, into float panels for prompts), "q8"
  // (activations rounded to 8 bits per block of 32 and integer dot products, as llama.cpp's
  // decode, for prompts and decode steps alike), or "q8-decode" (q8 for decode steps of fewer
  // than 16 tokens, float panels for
  // prompts); "auto" (the default): q8 on every CPU (measured faster on all, perplexity within
  // 0.3 % of the float prompt path, docs/performance.md). Float weights ignore it. Any time.
  void set_activations(const std::string& activations);
  // "f32", "q8" or "q8-decode": what is in use.
  std::string activations() const;
  // The KV caches' storage: float32 (the default), float16 (llama.cpp's default cache) or
  // bfloat16 (attention then takes the queries rounded to it too), or int8: each row of K and V
  // rounded to 8 bits with a float32 scale (attn/kv_quant.hpp), a quarter of float32's bytes
  // (+ 4 per row), read by the softmax family as they are (the queries stay float32). Only at
  // position 0.
  void set_cache_dtype(DType dtype);
  DType cache_dtype() const;

 private:
  struct Impl;
  explicit Decoder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Negative log-likelihood (natural log) of tokens[i] given tokens[0..i), for i = 1..n-1, in one
// pass from an empty context (the decoder is reset before and after). Perplexity is
// exp(mean). `progress(done, total)` is called after each step of tokens.
std::vector<double> token_nll(Decoder& decoder, const std::vector<int32_t>& tokens,
                              const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace attn
