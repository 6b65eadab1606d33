// Decoder weights from a safetensors file (checked against the config) or from a seed.
#include "model/weights.hpp"

#include <cmath>
#include <cstring>
#include <functional>
#include <set>

#include "attn/error.hpp"
#include "base/counter_random.hpp"
#include "base/parallel.hpp"
#include "core/shape_text.hpp"

namespace attn::model {
namespace {

std::string layer_prefix(size_t i) { return "model.layers." + std::to_string(i) + "."; }

int64_t layer_kv_heads(const DecoderConfig& c, const DecoderLayerSpec& l) { return l.lightning ? c.heads : c.kv_heads; }

}  // namespace

Matrix matrix_over(const uint8_t* data, DType dtype, int64_t rows, int64_t cols) {
  return matrix_over(data, dtype, std::nullopt, rows, cols, cols * static_cast<int64_t>(dtype_size(dtype)));
}

Matrix matrix_over(const uint8_t* data, DType dtype, std::optional<kernels::BlockQuant> quant, int64_t rows,
                   int64_t cols, int64_t row_bytes) {
  Matrix m{dtype, quant, rows, cols, data, {}, nullptr};
  m.row_ptrs.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) m.row_ptrs[static_cast<size_t>(r)] = data + r * row_bytes;
  return m;
}

Matrix packed_matrix(const Matrix& m) {
  Matrix p{m.dtype, m.quant, m.rows, m.cols, nullptr, {}, nullptr};
  p.packed = std::make_shared<const kernels::PackedMatrix>(m.row_ptrs.data(), *m.quant, m.rows, m.cols);
  return p;
}

std::string shape_text(const std::vector<int64_t>& s) { return core::shape_text(s); }

DecoderWeights bind_weights(const DecoderConfig& config, const std::function<Matrix(const WeightSpec&)>& matrix,
                            const std::function<std::vector<float>(const WeightSpec&)>& vector) {
  DecoderWeights w;
  w.config = config;
  const std::vector<WeightSpec> specs = weight_specs(config);
  auto next = specs.begin();
  auto take_matrix = [&](Matrix& m) { m = matrix(*next++); };
  auto take_vector = [&](std::vector<float>& v) { v = vector(*next++); };
  take_matrix(w.embed);
  w.layers.resize(config.layers.size());
  for (size_t i = 0; i < config.layers.size(); ++i) {
    LayerWeights& l = w.layers[i];
    const DecoderLayerSpec& spec = config.layers[i];
    l.kv_heads = layer_kv_heads(config, spec);
    take_vector(l.attn_norm);
    take_matrix(l.wq), take_matrix(l.wk), take_matrix(l.wv), take_matrix(l.wo);
    if (spec.lightning) {
      take_vector(l.out_norm), take_matrix(l.gate);
      l.decays = lightning_decays(config.heads, static_cast<int64_t>(i), static_cast<int64_t>(config.layers.size()));
    }
    take_vector(l.ffn_norm);
    if (config.moe_experts > 0) {
      take_matrix(l.moe.router);
      for (int64_t e = 0; e < config.moe_experts; ++e)
        take_matrix(l.moe.w1.emplace_back()), take_matrix(l.moe.w2.emplace_back()), take_matrix(l.moe.w3.emplace_back());
      continue;
    }
    take_matrix(l.w1), take_matrix(l.w3), take_matrix(l.w2);
  }
  take_vector(w.final_norm);
  if (config.tied_embeddings) w.output = w.embed;
  else take_matrix(w.output);
  return w;
}

std::vector<WeightSpec> weight_specs(const DecoderConfig& c) {
  const int64_t q_out = c.heads * c.head_dim;
  std::vector<WeightSpec> s;
  s.push_back({"model.embed_tokens.weight", {c.vocab_size, c.dim}, true});
  for (size_t i = 0; i < c.layers.size(); ++i) {
    const std::string p = layer_prefix(i);
    const int64_t kv_out = layer_kv_heads(c, c.layers[i]) * c.head_dim;
    s.push_back({p + "input_layernorm.weight", {c.dim}, false});
    s.push_back({p + "self_attn.q_proj.weight", {q_out, c.dim}, true});
    s.push_back({p + "self_attn.k_proj.weight", {kv_out, c.dim}, true});
    s.push_back({p + "self_attn.v_proj.weight", {kv_out, c.dim}, true});
    s.push_back({p + "self_attn.o_proj.weight", {c.dim, q_out}, true});
    if (c.layers[i].lightning) {
      s.push_back({p + "self_attn.norm.weight", {q_out}, false});
      s.push_back({p + "self_attn.output_gate.weight", {q_out, c.dim}, true});
    }
    s.push_back({p + "post_attention_layernorm.weight", {c.dim}, false});
    if (c.moe_experts > 0) {  // MiniMax-01's names (block_sparse_moe, as Mixtral's)
      s.push_back({p + "block_sparse_moe.gate.weight", {c.moe_experts, c.dim}, true});
      for (int64_t e = 0; e < c.moe_experts; ++e) {
        const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
        s.push_back({x + "w1.weight", {c.hidden_dim, c.dim}, true});
        s.push_back({x + "w2.weight", {c.dim, c.hidden_dim}, true});
        s.push_back({x + "w3.weight", {c.hidden_dim, c.dim}, true});
      }
      continue;
    }
    s.push_back({p + "mlp.gate_proj.weight", {c.hidden_dim, c.dim}, true});
    s.push_back({p + "mlp.up_proj.weight", {c.hidden_dim, c.dim}, true});
    s.push_back({p + "mlp.down_proj.weight", {c.dim, c.hidden_dim}, true});
  }
  s.push_back({"model.norm.weight", {c.dim}, false});
  if (!c.tied_embeddings) s.push_back({"lm_head.weight", {c.vocab_size, c.dim}, true});
  return s;
}

DecoderWeights load_weights(std::shared_ptr<const SafetensorsFile> file, const DecoderConfig& config) {
  const std::string& where = file->name();
  std::set<std::string> expected;
  for (const WeightSpec& s : weight_specs(config)) expected.insert(s.name);
  for (const auto& [name, t] : file->tensors())
    if (!expected.count(name)) fail(where, "has tensor '" + name + "', which this decoder config does not use");
  auto checked = [&](const WeightSpec& s) -> const SafetensorsTensor& {
    const SafetensorsTensor& t = file->at(s.name);
    if (t.shape != s.shape)
      fail(where, "tensor '" + s.name + "' has shape " + shape_text(t.shape) + ", expected " + shape_text(s.shape));
    return t;
  };
  DecoderWeights w = bind_weights(
      config,
      [&](const WeightSpec& s) {
        const SafetensorsTensor& t = checked(s);
        return matrix_over(t.data, t.float_dtype(where + ": tensor '" + s.name + "'"), s.shape[0], s.shape[1]);
      },
      [&](const WeightSpec& s) {
        const SafetensorsTensor& t = checked(s);
        const DType dt = t.float_dtype(where + ": tensor '" + s.name + "'");
        std::vector<float> v(static_cast<size_t>(t.numel()));
        for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_float(t.data, dt, static_cast<int64_t>(i));
        return v;
      });
  w.file = std::move(file);
  return w;
}

DecoderWeights random_weights(const DecoderConfig& config, uint64_t seed, DType dtype, int threads) {
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16)
    fail("random weights", "dtype must be float32, bfloat16 or float16, got " + dtype_name(dtype));
  std::vector<std::vector<uint8_t>> owned;
  uint64_t tensor = 0;
  // Matrices ~ N(0, 1/cols) (unit-variance outputs for unit-variance inputs); the embedding
  // N(0, 1); norm weights 1 + N(0, 0.1^2), so a wrong norm weight shows in the tests.
  auto matrix = [&](const WeightSpec& s) {
    const uint64_t id = tensor++;
    const int64_t rows = s.shape[0], cols = s.shape[1];
    const double sd = id == 0 ? 1.0 : 1.0 / std::sqrt(static_cast<double>(cols));
    std::vector<uint8_t>& buf = owned.emplace_back(static_cast<size_t>(rows * cols) * dtype_size(dtype));
    parallel_for(rows, resolve_threads(threads, rows), [&](int64_t r, int) {  // counter-based: any order
      for (int64_t c = 0; c < cols; ++c)
        store_from_float(buf.data(), dtype, r * cols + c,
                         static_cast<float>(sd * counter_normal(seed, id, static_cast<uint64_t>(r), static_cast<uint64_t>(c))));
    });
    return matrix_over(buf.data(), dtype, rows, cols);
  };
  auto vector = [&](const WeightSpec& s) {
    const uint64_t id = tensor++;
    std::vector<float> v(static_cast<size_t>(s.shape[0]));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(1.0 + 0.1 * counter_normal(seed, id, i, 0));
    return v;
  };
  DecoderWeights w = bind_weights(config, matrix, vector);
  w.owned = std::move(owned);
  return w;
}

std::vector<WeightSlot> weight_slots(DecoderWeights& w) {
  std::vector<WeightSlot> out;
  const std::vector<WeightSpec> specs = weight_specs(w.config);
  auto next = specs.begin();
  auto put_matrix = [&](Matrix& m) { out.push_back({*next++, &m, nullptr}); };
  auto put_vector = [&](std::vector<float>& v) { out.push_back({*next++, nullptr, &v}); };
  put_matrix(w.embed);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    LayerWeights& l = w.layers[i];
    put_vector(l.attn_norm);
    put_matrix(l.wq), put_matrix(l.wk), put_matrix(l.wv), put_matrix(l.wo);
    if (w.config.layers[i].lightning) put_vector(l.out_norm), put_matrix(l.gate);
    put_vector(l.ffn_norm);
    put_matrix(l.w1), put_matrix(l.w3), put_matrix(l.w2);
  }
  put_vector(w.final_norm);
  if (!w.config.tied_embeddings) put_matrix(w.output);
  return out;
}

std::map<std::string, SafetensorsEntry> weight_entries(const DecoderWeights& w) {
  std::map<std::string, SafetensorsEntry> out;
  const std::vector<WeightSpec> specs = weight_specs(w.config);
  auto next = specs.begin();
  auto put_matrix = [&](const Matrix& m) {
    const WeightSpec& s = *next++;
    if (m.quant)  // ggml blocks (in place or packed) are not a safetensors dtype
      fail("save", "tensor '" + s.name + "' is block-quantized (ggml Q4_0/Q4_1/Q8_0 blocks) and safetensors holds "
                   "float tensors: load the GGUF file dequantized (dtype \"f32\") to save it");
    out[s.name] = {m.dtype, s.shape, m.data};
  };
  auto put_vector = [&](const std::vector<float>& v) {
    const WeightSpec& s = *next++;
    out[s.name] = {DType::f32, s.shape, v.data()};
  };
  put_matrix(w.embed);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    put_vector(l.attn_norm);
    put_matrix(l.wq), put_matrix(l.wk), put_matrix(l.wv), put_matrix(l.wo);
    if (w.config.layers[i].lightning) put_vector(l.out_norm), put_matrix(l.gate);
    put_vector(l.ffn_norm);
    if (w.config.moe_experts > 0) {
      put_matrix(l.moe.router);
      for (size_t e = 0; e < l.moe.w1.size(); ++e) put_matrix(l.moe.w1[e]), put_matrix(l.moe.w2[e]), put_matrix(l.moe.w3[e]);
      continue;
    }
    put_matrix(l.w1), put_matrix(l.w3), put_matrix(l.w2);
  }
  put_vector(w.final_norm);
  if (!w.config.tied_embeddings) put_matrix(w.output);
  return out;
}

}  // namespace attn::model
