// A GGUF file (llama.cpp's format) as decoder config and weights, for any architecture whose file
// (arch/) says how its files read: the config from the metadata, the tensors' names. ggml lists
// dimensions contiguous-first, so a (rows, cols) matrix has dims [cols, rows].
#include <algorithm>
#include <set>

#include "attn/error.hpp"
#include "attn/gguf.hpp"
#include "quant/ggml_blocks.hpp"
#include "quant/q8_0_rows.hpp"
#include "model/architecture.hpp"
#include "model/weights.hpp"

namespace attn::model {
namespace {

// The block types the kernels multiply in place (their rows as stored in the file).
std::optional<kernels::BlockQuant> block_quant(uint32_t type) {
  switch (type) {
    case kGgmlQ4_0: return kernels::BlockQuant::q4_0;
    case kGgmlQ4_1: return kernels::BlockQuant::q4_1;
    case kGgmlQ8_0: return kernels::BlockQuant::q8_0;
    default: return std::nullopt;
  }
}

}  // namespace

// The block types packed as they are (quant/q8_packed.hpp): those and Q5_0, Q5_1, Q4_K, Q5_K, Q6_K.
std::optional<kernels::BlockQuant> packed_quant(uint32_t type) {
  switch (type) {
    case kGgmlQ5_0: return kernels::BlockQuant::q5_0;
    case kGgmlQ5_1: return kernels::BlockQuant::q5_1;
    case kGgmlQ4_K: return kernels::BlockQuant::q4_k;
    case kGgmlQ5_K: return kernels::BlockQuant::q5_k;
    case kGgmlQ6_K: return kernels::BlockQuant::q6_k;
    default: return block_quant(type);
  }
}

namespace {

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

}  // namespace

int64_t gguf_block_count(const GgufFile& f, const std::string& arch) {
  const std::string key = arch + ".block_count";
  const int64_t count = f.integer(key);
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
    fail(f.name(), key + " is " + std::to_string(count) + ", but the file's tensors name " + std::to_string(in_file) +
                       " blocks" + (in_file ? " (blk.0 .. blk." + std::to_string(in_file - 1) + ")" : std::string()));
  return count;
}

void gguf_common_config(const GgufFile& f, const std::string& arch, int64_t max_seq_len, DecoderConfig& c) {
  const std::string& where = f.name();
  const GgufTensor& embed = f.tensor("token_embd.weight");
  if (embed.dims.size() != 2) fail(where, "token_embd.weight must have 2 dimensions, got " + std::to_string(embed.dims.size()));
  c.vocab_size = embed.dims[1];
  c.dim = f.integer(arch + ".embedding_length");
  c.hidden_dim = f.integer(arch + ".feed_forward_length");
  c.heads = f.integer(arch + ".attention.head_count");
  c.kv_heads = f.has(arch + ".attention.head_count_kv") ? f.integer(arch + ".attention.head_count_kv") : c.heads;
  c.rope_theta = f.has(arch + ".rope.freq_base") ? f.number(arch + ".rope.freq_base") : 10000.0;
  const std::string eps = arch + ".attention.layer_norm_rms_epsilon";
  c.norm_eps = f.has(eps) ? f.number(eps) : 1e-5;
  const int64_t context = f.integer(arch + ".context_length");
  if (max_seq_len < 0) fail(where, "max_seq_len must be >= 0 (0: the model's context length), got " + std::to_string(max_seq_len));
  c.max_seq_len = max_seq_len ? max_seq_len : context;
  c.tied_embeddings = true;
  for (const GgufTensor& t : f.tensors()) c.tied_embeddings &= t.name != "output.weight";
}

DecoderConfig gguf_config(const GgufFile& f, int64_t max_seq_len) {
  const std::string name = f.text("general.architecture");
  std::string readable;
  for (const Architecture* a : all_architectures())
    if (a->gguf) {
      if (a->name == name) return a->gguf->config(f, max_seq_len);
      readable += (readable.empty() ? "" : ", ") + std::string(a->name);
    }
  fail(f.name(), "general.architecture is '" + name + "'; attn reads GGUF files of: " + readable);
}

DecoderWeights load_gguf_weights(std::shared_ptr<const GgufFile> file, const DecoderConfig& config, bool dequantize,
                                 bool repack) {
  const GgufFile& f = *file;
  const std::string& where = f.name();
  const Architecture& arch = architecture(config.architecture, where);
  if (!arch.gguf) fail(where, "architecture '" + config.architecture + "' has no GGUF reading");
  const GgufReading& reading = *arch.gguf;
  std::set<std::string> expected;
  for (const WeightSpec& s : weight_specs(config)) expected.insert(reading.tensor_name(s.name));
  for (const GgufTensor& t : f.tensors())
    if (!expected.count(t.name))
      fail(where, "has tensor '" + t.name + "', which a " + config.architecture + " decoder does not use");
  auto checked = [&](const WeightSpec& s) -> const GgufTensor& {
    const GgufTensor& t = f.tensor(reading.tensor_name(s.name));
    const std::vector<int64_t> shape(t.dims.rbegin(), t.dims.rend());
    if (shape != s.shape)
      fail(where, "tensor '" + t.name + "' has shape " + shape_text(shape) + " (rows, cols), expected " + shape_text(s.shape));
    // The decoder multiplies F32/F16/BF16 and Q4_0/Q4_1/Q8_0 as stored; packed (repack) it also
    // multiplies Q5_0, Q5_1, Q4_K, Q5_K and Q6_K as stored. When not packing, those five (which
    // have no fast kernels in place) become Q8_0 blocks at load (quant/q8_0_rows.hpp: Q5_0
    // exactly, the others rounded as ggml rounds Q8_0); float32 when dequantizing.
    if (!float_type(t.type) && !block_quant(t.type) && !can_dequantize(t.type))
      fail(where, "tensor '" + t.name + "' is " + type_name(t.type) +
                      "; attn reads F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K");
    return t;
  };
  std::vector<std::vector<uint8_t>> owned;
  auto matrix = [&](const WeightSpec& s) {
    const GgufTensor& t = checked(s);
    const int64_t rows = s.shape[0], cols = s.shape[1], row_bytes = t.bytes / rows;
    const std::optional<kernels::BlockQuant> quant =
        repack && !dequantize ? packed_quant(t.type) : block_quant(t.type);
    // types read only at load: rows addressed as raw bytes until they are decoded below
    const bool decode_only = !float_type(t.type) && !quant;
    Matrix m = float_type(t.type) ? matrix_over(t.data, *float_type(t.type), std::nullopt, rows, cols, row_bytes)
                                  : matrix_over(t.data, DType::f32, quant, rows, cols, row_bytes);
    if (reading.arrange_rows) reading.arrange_rows(s.name, m, config);
    std::vector<uint8_t> q8_0;  // decode-only types as Q8_0 rows, in the order the model uses them
    if (decode_only && !dequantize) {
      const int64_t q8_row = cols / 32 * kQ8_0BlockBytes;
      q8_0.resize(static_cast<size_t>(rows * q8_row));
      for (int64_t r = 0; r < rows; ++r)
        to_q8_0_row(t.type, static_cast<const uint8_t*>(m.row(r)), cols, q8_0.data() + r * q8_row);
      m = matrix_over(q8_0.data(), DType::f32, kernels::BlockQuant::q8_0, rows, cols, q8_row);
      f.drop_pages(t);
      if (!repack) return matrix_over(owned.emplace_back(std::move(q8_0)).data(), DType::f32,
                                      kernels::BlockQuant::q8_0, rows, cols, q8_row);
    }
    if (repack && !dequantize && m.quant) {
      m = packed_matrix(m);  // a copy: the Q8_0 rows above (if any) are freed on return
      f.drop_pages(t);
      return m;
    }
    if (!decode_only && (!dequantize || (!m.quant && m.dtype == DType::f32))) return m;
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
