// A llama-architecture GGUF file (llama.cpp's format) as decoder config and weights.
//
// Names: token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate,
// ffn_up, ffn_down}, output_norm, output (absent: tied to the embedding). ggml lists dimensions
// contiguous-first, so a (rows, cols) matrix has dims [cols, rows].
//
// llama.cpp's converter reorders the rows of each head of Wq and Wk so that RoPE rotates adjacent
// pairs (2i, 2i+1) instead of Hugging Face's halves (i, i + hd/2): file row h*hd + 2i + s holds
// Hugging Face row h*hd + s*hd/2 + i. The rows are addressed by pointer, so the loader puts them
// back in Hugging Face order for free and the model runs rotate-half RoPE like the original.
#include <algorithm>
#include <set>

#include "attn/error.hpp"
#include "attn/gguf.hpp"
#include "model/ggml_blocks.hpp"
#include "model/weights.hpp"

namespace attn::model {
namespace {

std::string gguf_name(const std::string& hf) {
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

std::optional<kernels::BlockQuant> block_quant(uint32_t type) {
  switch (type) {
    case kGgmlQ4_0: return kernels::BlockQuant::q4_0;
    case kGgmlQ4_1: return kernels::BlockQuant::q4_1;
    case kGgmlQ8_0: return kernels::BlockQuant::q8_0;
    default: return std::nullopt;
  }
}

std::optional<DType> float_type(uint32_t type) {
  switch (type) {
    case kGgmlF32: return DType::f32;
    case kGgmlF16: return DType::f16;
    case kGgmlBF16: return DType::bf16;
    default: return std::nullopt;
  }
}

std::string type_name(uint32_t type) {
  const GgmlTypeInfo* info = ggml_type_info(type);
  return info ? info->name : "type " + std::to_string(type);
}

// Hugging Face row order of a Wq/Wk whose file rows pair up adjacent channels (see above).
void unpermute_rope_rows(Matrix& m, int64_t head_dim) {
  const std::vector<const void*> file = m.row_ptrs;
  const int64_t half = head_dim / 2;
  for (int64_t r = 0; r < m.rows; ++r) {
    const int64_t h = r / head_dim, s = (r % head_dim) / half, i = r % half;
    m.row_ptrs[static_cast<size_t>(r)] = file[static_cast<size_t>(h * head_dim + 2 * i + s)];
  }
}

// llama.block_count, checked against the blocks the file's tensors name (blk.0 .. blk.N-1)
// before a layer list is made from it: a count of 10^8 in a small file is an error, not an
// allocation.
int64_t block_count(const GgufFile& f) {
  const int64_t count = f.integer("llama.block_count");
  int64_t in_file = 0;  // 1 + the highest block index a tensor names
  for (const GgufTensor& t : f.tensors()) {
    if (t.name.rfind("blk.", 0) != 0) continue;
    const size_t dot = t.name.find('.', 4);
    const std::string index = t.name.substr(4, dot == std::string::npos ? std::string::npos : dot - 4);
    if (index.empty() || index.size() > 9 || index.find_first_not_of("0123456789") != std::string::npos)
      fail(f.name(), "tensor '" + t.name + "' names no block index (blk.<N>.<name>)");
    in_file = std::max<int64_t>(in_file, std::stoll(index) + 1);
  }
  if (count != in_file)
    fail(f.name(), "llama.block_count is " + std::to_string(count) + ", but the file's tensors name " +
                       std::to_string(in_file) + " blocks" +
                       (in_file ? " (blk.0 .. blk." + std::to_string(in_file - 1) + ")" : std::string()));
  return count;
}

}  // namespace

DecoderConfig gguf_config(const GgufFile& f, int64_t max_seq_len) {
  const std::string& where = f.name();
  const std::string arch = f.text("general.architecture");
  if (arch != "llama")
    fail(where, "general.architecture is '" + arch + "'; attn runs llama-architecture GGUF files");
  if (f.has("llama.rope.scaling.type") && f.text("llama.rope.scaling.type") != "none")
    fail(where, "llama.rope.scaling.type '" + f.text("llama.rope.scaling.type") + "' is not supported (only none)");
  DecoderConfig c;
  const GgufTensor& embed = f.tensor("token_embd.weight");
  if (embed.dims.size() != 2) fail(where, "token_embd.weight must have 2 dimensions, got " + std::to_string(embed.dims.size()));
  c.vocab_size = embed.dims[1];
  c.dim = f.integer("llama.embedding_length");
  c.hidden_dim = f.integer("llama.feed_forward_length");
  c.heads = f.integer("llama.attention.head_count");
  c.kv_heads = f.has("llama.attention.head_count_kv") ? f.integer("llama.attention.head_count_kv") : c.heads;
  if (c.heads < 1 || c.dim % c.heads != 0)
    fail(where, "llama.embedding_length " + std::to_string(c.dim) + " must be a multiple of llama.attention.head_count " +
                    std::to_string(c.heads));
  c.head_dim = c.dim / c.heads;
  if (f.has("llama.rope.dimension_count") && f.integer("llama.rope.dimension_count") != c.head_dim)
    fail(where, "llama.rope.dimension_count " + std::to_string(f.integer("llama.rope.dimension_count")) +
                    " must equal the head dimension " + std::to_string(c.head_dim) + " (partial RoPE is not supported)");
  c.rope_theta = f.has("llama.rope.freq_base") ? f.number("llama.rope.freq_base") : 10000.0;
  c.rope_style = RopeStyle::half;
  c.norm_eps = f.has("llama.attention.layer_norm_rms_epsilon") ? f.number("llama.attention.layer_norm_rms_epsilon") : 1e-5;
  const int64_t context = f.integer("llama.context_length");
  if (max_seq_len < 0) fail(where, "max_seq_len must be >= 0 (0: the model's context length), got " + std::to_string(max_seq_len));
  c.max_seq_len = max_seq_len ? max_seq_len : context;
  c.tied_embeddings = true;
  for (const GgufTensor& t : f.tensors()) c.tied_embeddings &= t.name != "output.weight";
  c.layers = DecoderConfig::softmax_layers(block_count(f), Softmax{.causal = true});
  c.validate();
  return c;
}

DecoderWeights load_gguf_weights(std::shared_ptr<const GgufFile> file, const DecoderConfig& config, bool dequantize,
                                 bool repack) {
  const GgufFile& f = *file;
  const std::string& where = f.name();
  std::set<std::string> expected;
  for (const WeightSpec& s : weight_specs(config)) expected.insert(gguf_name(s.name));
  for (const GgufTensor& t : f.tensors())
    if (!expected.count(t.name)) fail(where, "has tensor '" + t.name + "', which a llama decoder does not use");
  auto checked = [&](const WeightSpec& s) -> const GgufTensor& {
    const GgufTensor& t = f.tensor(gguf_name(s.name));
    const std::vector<int64_t> shape(t.dims.rbegin(), t.dims.rend());
    if (shape != s.shape)
      fail(where, "tensor '" + t.name + "' has shape " + shape_text(shape) + " (rows, cols), expected " + shape_text(s.shape));
    if (!can_dequantize(t.type))
      fail(where, "tensor '" + t.name + "' is " + type_name(t.type) + "; attn reads F32, F16, BF16, Q4_0, Q4_1 and Q8_0");
    return t;
  };
  std::vector<std::vector<uint8_t>> owned;
  auto matrix = [&](const WeightSpec& s) {
    const GgufTensor& t = checked(s);
    const int64_t rows = s.shape[0], cols = s.shape[1], row_bytes = t.bytes / rows;
    Matrix m = float_type(t.type) ? matrix_over(t.data, *float_type(t.type), std::nullopt, rows, cols, row_bytes)
                                  : matrix_over(t.data, DType::f32, block_quant(t.type), rows, cols, row_bytes);
    const bool rope_rows = s.name.find("q_proj") != std::string::npos || s.name.find("k_proj") != std::string::npos;
    if (rope_rows) unpermute_rope_rows(m, config.head_dim);
    if (repack && !dequantize && m.quant) {
      m = packed_matrix(m);
      f.drop_pages(t);
      return m;
    }
    if (!dequantize || (!m.quant && m.dtype == DType::f32)) return m;
    // float32 copy, rows in the order the model uses them
    std::vector<uint8_t>& buf = owned.emplace_back(static_cast<size_t>(rows * cols) * sizeof(float));
    float* dst = reinterpret_cast<float*>(buf.data());
    for (int64_t r = 0; r < rows; ++r)
      dequantize_row(t.type, static_cast<const uint8_t*>(m.row(r)), cols, dst + r * cols);
    return matrix_over(buf.data(), DType::f32, rows, cols);
  };
  auto vector = [&](const WeightSpec& s) {
    const GgufTensor& t = checked(s);
    std::vector<float> v(static_cast<size_t>(s.shape[0]));
    dequantize_row(t.type, t.data, s.shape[0], v.data());
    return v;
  };
  DecoderWeights w = bind_weights(config, matrix, vector);
  w.owned = std::move(owned);
  w.file = std::move(file);
  return w;
}

}  // namespace attn::model
