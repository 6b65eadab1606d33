// The shared blocks' tensors and weight counts, for the architecture files: each block's forward
// pass is model::LayerRun's (model/layer_run.hpp states what each computes); an architecture
// strings them together per layer (Architecture::run_layer), lists their tensors with these
// helpers, and counts their weights.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/architecture.hpp"
#include "model/layer_run.hpp"

namespace attn::model {

// The attention block's tensors of layer i (self_attn.{q,k,v,o}_proj; lightning layers add
// self_attn.norm and self_attn.output_gate), with l.kv_heads and a lightning layer's decays set
// (once: a bound layer's are kept).
void attention_tensors(const DecoderConfig& c, size_t i, LayerWeights& l, std::vector<LayerTensor>& out);
// A dense SwiGLU's (mlp.{gate,up,down}_proj, hidden_dim wide).
void swiglu_tensors(const DecoderConfig& c, LayerWeights& l, std::vector<LayerTensor>& out);
// A mixture of moe_experts SwiGLU experts' (block_sparse_moe.gate, block_sparse_moe.experts.<e>.w1/w2/w3).
void moe_tensors(const DecoderConfig& c, LayerWeights& l, std::vector<LayerTensor>& out);
// Per-head RMSNorm weights of q and k (self_attn.q_norm, self_attn.k_norm, head_dim each).
void qk_norm_tensors(const DecoderConfig& c, LayerWeights& l, std::vector<LayerTensor>& out);
// A norm vector of `dim` (e.g. "input_layernorm.weight").
void norm_tensor(const std::string& name, int64_t dim, std::vector<float>& v, std::vector<LayerTensor>& out);

// Weight elements of those blocks (sizes through `size`, which reports an overflow).
WeightCount attention_weight_count(const DecoderConfig& c, size_t i, const SizeCheck& size);
WeightCount swiglu_weight_count(const DecoderConfig& c, const SizeCheck& size);
WeightCount moe_weight_count(const DecoderConfig& c, const SizeCheck& size);
// Two layers' or blocks' counts together; norms: `count` vectors of `dim`.
WeightCount add(const WeightCount& a, const WeightCount& b, const SizeCheck& size);
WeightCount norms(int64_t count, int64_t dim, const SizeCheck& size);

}  // namespace attn::model
