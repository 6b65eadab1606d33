// Decoder weights from a safetensors file (checked against the config) or from a seed.
#include "model/weights.hpp"

#include <cmath>
#include <cstring>
#include <functional>
#include <set>

#include "attn/error.hpp"
#include "base/counter_random.hpp"
#include "base/parallel.hpp"
#include "model/architecture.hpp"
#include "core/shape_text.hpp"

namespace attn::model {
namespace {

std::string layer_prefix(size_t i) { return "model.layers." + std::to_string(i) + "."; }

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

namespace {

// Every weight of `w` in order (the embedding, each layer's tensors as its architecture lists
// them, the final norm, lm_head unless tied), pointing into `w`; layers' vectors sized.
std::vector<WeightSlot> slots_of(DecoderWeights& w) {
  const DecoderConfig& c = w.config;
  const Architecture& arch = architecture(c.architecture, "decoder weights");
  std::vector<WeightSlot> out;
  out.push_back({{"model.embed_tokens.weight", {c.vocab_size, c.dim}, true}, &w.embed, nullptr});
  w.layers.resize(c.layers.size());
  std::vector<LayerTensor> tensors;
  for (size_t i = 0; i < c.layers.size(); ++i) {
    tensors.clear();
    arch.layer_tensors(c, i, w.layers[i], tensors);
    for (LayerTensor& t : tensors)
      out.push_back({{layer_prefix(i) + t.name, std::move(t.shape), t.matrix != nullptr}, t.matrix, t.vector});
  }
  out.push_back({{"model.norm.weight", {c.dim}, false}, nullptr, &w.final_norm});
  if (!c.tied_embeddings) out.push_back({{"lm_head.weight", {c.vocab_size, c.dim}, true}, &w.output, nullptr});
  return out;
}

}  // namespace

DecoderWeights bind_weights(const DecoderConfig& config, const std::function<Matrix(const WeightSpec&)>& matrix,
                            const std::function<std::vector<float>(const WeightSpec&)>& vector) {
  DecoderWeights w;
  w.config = config;
  for (const WeightSlot& s : slots_of(w)) {
    if (s.matrix) *s.matrix = matrix(s.spec);
    else *s.vector = vector(s.spec);
  }
  if (config.tied_embeddings) w.output = w.embed;
  return w;
}

std::vector<WeightSpec> weight_specs(const DecoderConfig& c) {
  DecoderWeights shapes;  // nothing bound: only the names and shapes are read
  shapes.config = c;
  std::vector<WeightSpec> out;
  for (WeightSlot& s : slots_of(shapes)) out.push_back(std::move(s.spec));
  return out;
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

std::vector<WeightSlot> weight_slots(DecoderWeights& w) { return slots_of(w); }

std::map<std::string, SafetensorsEntry> weight_entries(const DecoderWeights& w) {
  std::map<std::string, SafetensorsEntry> out;
  // slots_of writes nothing a bound model does not hold already (its layers are sized and set)
  for (const WeightSlot& s : slots_of(const_cast<DecoderWeights&>(w))) {
    if (s.vector) {
      out[s.spec.name] = {DType::f32, s.spec.shape, s.vector->data()};
      continue;
    }
    const Matrix& m = *s.matrix;
    if (m.quant)  // ggml blocks (in place or packed) are not a safetensors dtype
      fail("save", "tensor '" + s.spec.name + "' is block-quantized (ggml Q4_0/Q4_1/Q8_0 blocks) and safetensors holds "
                   "float tensors: load the GGUF file dequantized (dtype \"f32\") to save it");
    out[s.spec.name] = {m.dtype, s.spec.shape, m.data};
  }
  return out;
}

}  // namespace attn::model
