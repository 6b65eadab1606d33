// The shared blocks' tensors and weight counts (their forward passes are the decoder's run
// state, decoder.cpp).
#include "arch/blocks.hpp"


namespace attn::model {

void norm_tensor(const std::string& name, int64_t dim, std::vector<float>& v, std::vector<LayerTensor>& out) {
  out.push_back({name, {dim}, nullptr, &v});
}

void qk_norm_tensors(const DecoderConfig& c, LayerWeights& l, std::vector<LayerTensor>& out) {
  out.push_back({"self_attn.q_norm.weight", {c.head_dim}, nullptr, &l.q_norm});
  out.push_back({"self_attn.k_norm.weight", {c.head_dim}, nullptr, &l.k_norm});
}

void attention_tensors(const DecoderConfig& c, size_t i, LayerWeights& l, std::vector<LayerTensor>& out) {
  const DecoderLayerSpec& spec = c.layers[i];
  const int64_t q_out = c.heads * c.head_dim;
  l.kv_heads = spec.lightning ? c.heads : c.kv_heads;  // lightning layers: k and v have every head
  const int64_t kv_out = l.kv_heads * c.head_dim;
  out.push_back({"self_attn.q_proj.weight", {q_out, c.dim}, &l.wq, nullptr});
  out.push_back({"self_attn.k_proj.weight", {kv_out, c.dim}, &l.wk, nullptr});
  out.push_back({"self_attn.v_proj.weight", {kv_out, c.dim}, &l.wv, nullptr});
  out.push_back({"self_attn.o_proj.weight", {c.dim, q_out}, &l.wo, nullptr});
  if (spec.lightning) {
    out.push_back({"self_attn.norm.weight", {q_out}, nullptr, &l.out_norm});
    out.push_back({"self_attn.output_gate.weight", {q_out, c.dim}, &l.gate, nullptr});
    if (l.decays.empty())
      l.decays = lightning_decays(c.heads, static_cast<int64_t>(i), static_cast<int64_t>(c.layers.size()));
  }
}

void swiglu_tensors(const DecoderConfig& c, LayerWeights& l, std::vector<LayerTensor>& out) {
  out.push_back({"mlp.gate_proj.weight", {c.hidden_dim, c.dim}, &l.w1, nullptr});
  out.push_back({"mlp.up_proj.weight", {c.hidden_dim, c.dim}, &l.w3, nullptr});
  out.push_back({"mlp.down_proj.weight", {c.dim, c.hidden_dim}, &l.w2, nullptr});
}

void moe_tensors(const DecoderConfig& c, LayerWeights& l, std::vector<LayerTensor>& out) {
  // Mixtral's and MiniMax-01's names
  const size_t e_count = static_cast<size_t>(c.moe_experts);
  l.moe.w1.resize(e_count), l.moe.w2.resize(e_count), l.moe.w3.resize(e_count);
  out.push_back({"block_sparse_moe.gate.weight", {c.moe_experts, c.dim}, &l.moe.router, nullptr});
  for (size_t e = 0; e < e_count; ++e) {
    const std::string x = "block_sparse_moe.experts." + std::to_string(e) + ".";
    out.push_back({x + "w1.weight", {c.hidden_dim, c.dim}, &l.moe.w1[e], nullptr});
    out.push_back({x + "w2.weight", {c.dim, c.hidden_dim}, &l.moe.w2[e], nullptr});
    out.push_back({x + "w3.weight", {c.hidden_dim, c.dim}, &l.moe.w3[e], nullptr});
  }
}

WeightCount add(const WeightCount& a, const WeightCount& b, const SizeCheck& size) {
  return {size.add(a.matrix, b.matrix), size.add(a.vector, b.vector)};
}

WeightCount norms(int64_t count, int64_t dim, const SizeCheck& size) { return {0, size.mul(count, dim)}; }

WeightCount attention_weight_count(const DecoderConfig& c, size_t i, const SizeCheck& size) {
  const bool lightning = c.layers[i].lightning;
  const int64_t q_out = size.mul(c.heads, c.head_dim), kv_out = size.mul(lightning ? c.heads : c.kv_heads, c.head_dim);
  const int64_t q_elems = size.mul(q_out, c.dim), kv_elems = size.mul(kv_out, c.dim);
  WeightCount w{size.add(size.mul(q_elems, 2), size.mul(kv_elems, 2)), 0};  // Wq, Wo; Wk, Wv
  if (lightning) w = add(w, {q_elems, q_out}, size);                        // the output gate and norm
  return w;
}

WeightCount swiglu_weight_count(const DecoderConfig& c, const SizeCheck& size) {
  return {size.mul(size.mul(c.hidden_dim, c.dim), 3), 0};
}

WeightCount moe_weight_count(const DecoderConfig& c, const SizeCheck& size) {
  const int64_t experts = size.mul(size.mul(size.mul(c.hidden_dim, c.dim), 3), c.moe_experts);
  return {size.add(experts, size.mul(c.moe_experts, c.dim)), 0};  // + the router
}

}  // namespace attn::model
