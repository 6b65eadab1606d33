// Llama (and the models shaped like it: SmolLM2, ...): pre-norm layers of attention and a SwiGLU
// feed-forward, each added to the residual stream.
//   h = RMSNorm(x) · attn_norm;  x = x + Attention(h)
//   h = RMSNorm(x) · ffn_norm;   x = x + (silu(h W1^T) ⊙ h W3^T) W2^T
// Any layer may be a lightning layer (hybrid layouts): the attention block handles it.
//
// GGUF files (llama.cpp's format): keys llama.*; tensors token_embd, blk.N.{attn_norm, attn_q,
// attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}, output_norm, output (absent:
// tied to the embedding). llama.cpp's converter reorders the rows of each head of Wq and Wk so that
// RoPE rotates adjacent pairs (2i, 2i+1) instead of Hugging Face's halves (i, i + hd/2): file row
// h*hd + 2i + s holds Hugging Face row h*hd + s*hd/2 + i. Rows are addressed by pointer, so the
// loader puts them back in Hugging Face order for free and the model runs rotate-half RoPE.
#include "model/architecture.hpp"
#include "arch/blocks.hpp"
#include "attn/error.hpp"

namespace attn::model {
namespace {

void validate(const DecoderConfig& c) {
  if (c.moe_experts != 0)
    fail("decoder config", "a llama layer's feed-forward is one SwiGLU: moe_experts must be 0, got " +
                               std::to_string(c.moe_experts));
}

void layer_tensors(const DecoderConfig& c, size_t i, LayerWeights& l, std::vector<LayerTensor>& out) {
  norm_tensor("input_layernorm.weight", c.dim, l.attn_norm, out);
  attention_tensors(c, i, l, out);
  norm_tensor("post_attention_layernorm.weight", c.dim, l.ffn_norm, out);
  swiglu_tensors(c, l, out);
}

WeightCount layer_weight_count(const DecoderConfig& c, size_t i, const SizeCheck& size) {
  return add(add(attention_weight_count(c, i, size), swiglu_weight_count(c, size), size), norms(2, c.dim, size), size);
}

void run_layer(LayerRun& run, size_t i) {
  const LayerWeights& l = run.layer(i);
  run.norm(l.attn_norm);
  run.attention(i);
  run.residual();
  run.norm(l.ffn_norm);
  run.swiglu(i);
  run.residual();
}

double residual_scale(const DecoderConfig&) { return 1.0; }

void layout(DecoderConfig& c, const LayerLayout& a) {
  const bool hybrid = a.hybrid_linear != 0 || a.hybrid_softmax != 0;
  c.layers = hybrid ? DecoderConfig::hybrid_layers(a.layers, a.hybrid_linear, a.hybrid_softmax, a.softmax)
                    : DecoderConfig::softmax_layers(a.layers, a.softmax);
}

// ---- GGUF ----------------------------------------------------------------------------------

std::string gguf_tensor_name(const std::string& hf) {
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  static const std::pair<const char*, const char*> kLayer[] = {
      {"input_layernorm.weight", "attn_norm.weight"}, {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},   {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"}, {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},    {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  const std::string prefix = "model.layers.";
  const size_t dot = hf.find('.', prefix.size());
  if (hf.rfind(prefix, 0) == 0 && dot != std::string::npos) {
    const std::string rest = hf.substr(dot + 1);
    for (const auto& [from, to] : kLayer)
      if (rest == from) return "blk." + hf.substr(prefix.size(), dot - prefix.size()) + "." + to;
  }
  fail("gguf", "tensor '" + hf + "' has no GGUF name (lightning layers are not in llama GGUF files)");
}

// Hugging Face row order of a Wq/Wk whose file rows pair up adjacent channels (see above).
void arrange_rows(const std::string& hf, Matrix& m, const DecoderConfig& c) {
  if (hf.find("q_proj") == std::string::npos && hf.find("k_proj") == std::string::npos) return;
  const std::vector<const void*> file = m.row_ptrs;
  const int64_t half = c.head_dim / 2;
  for (int64_t r = 0; r < m.rows; ++r) {
    const int64_t h = r / c.head_dim, s = (r % c.head_dim) / half, j = r % half;
    m.row_ptrs[static_cast<size_t>(r)] = file[static_cast<size_t>(h * c.head_dim + 2 * j + s)];
  }
}

DecoderConfig gguf_config(const GgufFile& f, int64_t max_seq_len) {
  const std::string& where = f.name();
  if (f.has("llama.rope.scaling.type") && f.text("llama.rope.scaling.type") != "none")
    fail(where, "llama.rope.scaling.type '" + f.text("llama.rope.scaling.type") + "' is not supported (only none)");
  DecoderConfig c;
  c.architecture = "llama";
  gguf_common_config(f, "llama", max_seq_len, c);
  if (c.heads < 1 || c.dim % c.heads != 0)
    fail(where, "llama.embedding_length " + std::to_string(c.dim) + " must be a multiple of llama.attention.head_count " +
                    std::to_string(c.heads));
  c.head_dim = c.dim / c.heads;
  if (f.has("llama.rope.dimension_count") && f.integer("llama.rope.dimension_count") != c.head_dim)
    fail(where, "llama.rope.dimension_count " + std::to_string(f.integer("llama.rope.dimension_count")) +
                    " must equal the head dimension " + std::to_string(c.head_dim) + " (partial RoPE is not supported)");
  c.rope_style = RopeStyle::half;
  c.layers = DecoderConfig::softmax_layers(gguf_block_count(f, "llama"), Softmax{.causal = true});
  c.validate();
  return c;
}

const GgufReading kGguf{gguf_config, gguf_tensor_name, arrange_rows};

}  // namespace

extern const Architecture kLlama{
    .name = "llama",
    .summary = "pre-norm attention and SwiGLU layers, each added to the residual (SmolLM2, Llama)",
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
