// Gemma 3: five sliding-window ("local") layers for every full-attention ("global") layer; each
// block's output is normed before its residual add; q and k normed per head before RoPE; a GeGLU
// feed-forward; the embedding scaled by sqrt(dim).
//   x = embed(token) · sqrt(dim)                        (in float32, the weights' precision)
//   h = RMSNorm(x) · input_layernorm
//   q, k, v = h Wq^T, h Wk^T, h Wv^T;  q, k = RMSNorm per head · q_norm, k_norm;  RoPE
//   x = x + RMSNorm(Attention(q, k, v) Wo^T) · post_attention_layernorm
//   h = RMSNorm(x) · pre_feedforward_layernorm
//   x = x + RMSNorm((gelu_tanh(h W1^T) ⊙ h W3^T) W2^T) · post_feedforward_layernorm
//   logits = (RMSNorm(x) · w_final) Embed^T
// Layer i is global when (i + 1) % 6 == 0. Local layers see the keys of the last `sliding_window`
// positions (key j is seen by query i when i - j < window: softmax:causal,window=<window - 1>:0,
// whose cache holds a window's rows) and rotate with RoPE base 10,000; global layers see every key
// and rotate with the file's rope.freq_base. The attention scale is 1/sqrt(head_dim).
//
// GGUF files (llama.cpp's format): keys gemma3.*; tensors token_embd, blk.N.{attn_norm, attn_q,
// attn_k, attn_v, attn_q_norm, attn_k_norm, attn_output, post_attention_norm, ffn_norm, ffn_gate,
// ffn_up, ffn_down, post_ffw_norm}, output_norm; the output is tied to the embedding. The norm
// weights already include Gemma's + 1 (Hugging Face's RMSNorm multiplies by 1 + w), and q and k
// rows are in Hugging Face's order (llama.cpp's converter reorders them only for llama).
#include <cmath>

#include "model/architecture.hpp"
#include "arch/blocks.hpp"
#include "attn/error.hpp"

namespace attn::model {
namespace {

constexpr int64_t kLayersPerGlobal = 6;    // five local layers, then one global
constexpr double kLocalRopeTheta = 10000.0;
constexpr int64_t kDefaultWindow = 512;    // keys a local layer sees (a random model's)

bool is_global(size_t i) { return (static_cast<int64_t>(i) + 1) % kLayersPerGlobal == 0; }

void validate(const DecoderConfig& c) {
  if (c.moe_experts != 0)
    fail("decoder config", "a gemma3 layer's feed-forward is one GeGLU: moe_experts must be 0, got " +
                               std::to_string(c.moe_experts));
  for (size_t i = 0; i < c.layers.size(); ++i)
    if (c.layers[i].lightning) fail("decoder config", "gemma3 has no lightning layers (layer " + std::to_string(i) + ")");
}

void layer_tensors(const DecoderConfig& c, size_t i, LayerWeights& l, std::vector<LayerTensor>& out) {
  norm_tensor("input_layernorm.weight", c.dim, l.attn_norm, out);
  attention_tensors(c, i, l, out);
  qk_norm_tensors(c, l, out);
  norm_tensor("post_attention_layernorm.weight", c.dim, l.attn_out_norm, out);
  norm_tensor("pre_feedforward_layernorm.weight", c.dim, l.ffn_norm, out);
  swiglu_tensors(c, l, out);  // the same three matrices; GeGLU multiplies them
  norm_tensor("post_feedforward_layernorm.weight", c.dim, l.ffn_out_norm, out);
}

WeightCount layer_weight_count(const DecoderConfig& c, size_t i, const SizeCheck& size) {
  const WeightCount matrices = add(attention_weight_count(c, i, size), swiglu_weight_count(c, size), size);
  return add(add(matrices, norms(4, c.dim, size), size), norms(2, c.head_dim, size), size);
}

void run_layer(LayerRun& run, size_t i) {
  const LayerWeights& l = run.layer(i);
  run.norm(l.attn_norm);
  run.attention(i);
  run.norm_output(l.attn_out_norm);
  run.residual();
  run.norm(l.ffn_norm);
  run.geglu(i);
  run.norm_output(l.ffn_out_norm);
  run.residual();
}

double residual_scale(const DecoderConfig&) { return 1.0; }

// The 5:1 local:global layers: local ones `local` at RoPE base 10,000, global ones `global` at the
// config's base.
std::vector<DecoderLayerSpec> gemma3_layers(int64_t count, const Mechanism& local, const Mechanism& global) {
  std::vector<DecoderLayerSpec> layers = DecoderConfig::softmax_layers(count, global);
  for (size_t i = 0; i < layers.size(); ++i)
    if (!is_global(i)) layers[i] = {local, true, false, true, kLocalRopeTheta};
  return layers;
}

// softmax:causal,window=<window - 1>:0
Softmax sliding_window(int64_t window) {
  Softmax m;
  m.causal = true, m.window_left = window - 1, m.window_right = 0;
  return m;
}

void layout(DecoderConfig& c, const LayerLayout& a) {
  if (a.hybrid_linear != 0 || a.hybrid_softmax != 0)
    fail("decoder config", "gemma3 has its own layout (5 local layers, then 1 global): it takes no hybrid");
  c.layers = gemma3_layers(a.layers, sliding_window(kDefaultWindow), a.softmax);
  c.embed_scale = std::sqrt(static_cast<double>(c.dim));
}

// ---- GGUF ----------------------------------------------------------------------------------

std::string gguf_tensor_name(const std::string& hf) {
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  static const std::pair<const char*, const char*> kLayer[] = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"post_attention_layernorm.weight", "post_attention_norm.weight"},
      {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"}};
  const std::string prefix = "model.layers.";
  const size_t dot = hf.find('.', prefix.size());
  if (hf.rfind(prefix, 0) == 0 && dot != std::string::npos) {
    const std::string rest = hf.substr(dot + 1);
    for (const auto& [from, to] : kLayer)
      if (rest == from) return "blk." + hf.substr(prefix.size(), dot - prefix.size()) + "." + to;
  }
  fail("gguf", "tensor '" + hf + "' has no gemma3 GGUF name");
}

DecoderConfig gguf_config(const GgufFile& f, int64_t max_seq_len) {
  const std::string& where = f.name();
  if (f.has("gemma3.rope.scaling.type") && f.text("gemma3.rope.scaling.type") != "none")
    fail(where, "gemma3.rope.scaling.type '" + f.text("gemma3.rope.scaling.type") + "' is not supported (only none)");
  DecoderConfig c;
  c.architecture = "gemma3";
  gguf_common_config(f, "gemma3", max_seq_len, c);
  c.head_dim = f.has("gemma3.attention.key_length") ? f.integer("gemma3.attention.key_length")
                                                    : (c.heads > 0 ? c.dim / c.heads : 0);
  if (f.has("gemma3.attention.value_length") && f.integer("gemma3.attention.value_length") != c.head_dim)
    fail(where, "gemma3.attention.value_length " + std::to_string(f.integer("gemma3.attention.value_length")) +
                    " must equal key_length " + std::to_string(c.head_dim));
  c.rope_style = RopeStyle::half;
  c.embed_scale = std::sqrt(static_cast<double>(c.dim));
  if (f.has("gemma3.final_logit_softcapping")) c.final_softcap = f.number("gemma3.final_logit_softcapping");
  const int64_t window = f.integer("gemma3.attention.sliding_window");
  if (window < 1) fail(where, "gemma3.attention.sliding_window must be >= 1, got " + std::to_string(window));
  Softmax global;
  global.causal = true;
  Softmax local = sliding_window(window);
  if (f.has("gemma3.attn_logit_softcapping")) global.softcap = local.softcap = f.number("gemma3.attn_logit_softcapping");
  c.layers = gemma3_layers(gguf_block_count(f, "gemma3"), local, global);
  c.validate();
  return c;
}

const GgufReading kGguf{gguf_config, gguf_tensor_name, nullptr};

}  // namespace

extern const Architecture kGemma3{
    .name = "gemma3",
    .summary = "Gemma 3: 5 sliding-window + 1 global layers per 6, block outputs normed before the residual, "
               "q/k norms, GeGLU",
    .baseline = "",
    .validate = validate,
    .layer_tensors = layer_tensors,
    .layer_weight_count = layer_weight_count,
    .run_layer = run_layer,
    .residual_scale = residual_scale,
    .layout = layout,
    .gguf = &kGguf,
};

}  // namespace attn::model
