// MiniMax-01: seven lightning (linear attention) layers, then one softmax layer, repeated; a
// residual that keeps the normed input, scaled: h = RMSNorm(x); x = a·h + Attn(h); h = RMSNorm(x);
// x = a·h + FFN(h), with a = (2L)^(1/4) for L layers; a mixture of SwiGLU experts as the
// feed-forward (moe_experts of them, moe_top_k per token; 0 experts: one dense SwiGLU).
// Tensors use Hugging Face's names (the experts' as Mixtral's: block_sparse_moe.*); there is no
// GGUF reading.
#include <cmath>

#include "model/architecture.hpp"
#include "arch/blocks.hpp"
#include "attn/error.hpp"

namespace attn::model {
namespace {

void validate(const DecoderConfig&) {}  // the experts' fields are DecoderConfig::validate's

void layer_tensors(const DecoderConfig& c, size_t i, LayerWeights& l, std::vector<LayerTensor>& out) {
  norm_tensor("input_layernorm.weight", c.dim, l.attn_norm, out);
  attention_tensors(c, i, l, out);
  norm_tensor("post_attention_layernorm.weight", c.dim, l.ffn_norm, out);
  if (c.moe_experts > 0) moe_tensors(c, l, out);
  else swiglu_tensors(c, l, out);
}

WeightCount layer_weight_count(const DecoderConfig& c, size_t i, const SizeCheck& size) {
  const WeightCount ffn = c.moe_experts > 0 ? moe_weight_count(c, size) : swiglu_weight_count(c, size);
  return add(add(attention_weight_count(c, i, size), ffn, size), norms(2, c.dim, size), size);
}

double residual_scale(const DecoderConfig& c) { return std::pow(2.0 * static_cast<double>(c.layers.size()), 0.25); }

void run_layer(LayerRun& run, size_t i) {
  const LayerWeights& l = run.layer(i);
  const double a = residual_scale(run.config());
  run.norm(l.attn_norm);
  run.attention(i);
  run.residual(a);
  run.norm(l.ffn_norm);
  if (run.config().moe_experts > 0) run.moe(i);
  else run.swiglu(i);
  run.residual(a);
}

void layout(DecoderConfig& c, const LayerLayout& a) {
  if (a.hybrid_linear != 0 || a.hybrid_softmax != 0)
    fail("decoder config", "minimax has its own layout (7 lightning layers, then 1 softmax layer): it takes no hybrid");
  c.make_minimax(a.layers, a.softmax, a.experts, a.top_k);
  c.hidden_dim = a.expert_hidden > 0 ? a.expert_hidden : (3 * c.dim + 1) / 2;
}

}  // namespace

extern const Architecture kMinimax{
    .name = "minimax",
    .summary = "MiniMax-01: 7 lightning + 1 softmax layers per 8, residual x = (2L)^(1/4) RMSNorm(x) + f, "
               "a mixture of SwiGLU experts",
    .baseline = "llama",
    .validate = validate,
    .layer_tensors = layer_tensors,
    .layer_weight_count = layer_weight_count,
    .run_layer = run_layer,
    .residual_scale = residual_scale,
    .layout = layout,
    .gguf = nullptr,
};

}  // namespace attn::model

namespace attn {

void DecoderConfig::make_minimax(int64_t count, const Mechanism& softmax, int64_t experts, int64_t top_k) {
  layers = hybrid_layers(count, 7, 1, softmax);
  architecture = "minimax";
  moe_experts = experts, moe_top_k = top_k;
}

}  // namespace attn
