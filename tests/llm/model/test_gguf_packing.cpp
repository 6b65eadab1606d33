// Loading a GGUF whose matrices are Q5_0, Q5_1, Q4_K and Q6_K: packed as stored when repacking
// (about the file's bytes, the ggml rows back bit for bit), converted to Q8_0 rows otherwise.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>

#include "attn/dtype.hpp"
#include "attn/gguf.hpp"
#include "model/weights.hpp"
#include "support/gguf_image.hpp"

namespace attn::model {
namespace {

using kernels::BlockQuant;

// Random blocks of `type` for a rows x cols matrix, every block's float16 scale set to 2^-6 (d
// of Q5_0/Q5_1/Q4_K at byte 0, Q6_K's at byte 208), Q4_K's dmin and Q5_1's m to 2^-8.
std::vector<uint8_t> random_blocks(uint32_t type, int64_t rows, int64_t cols, std::mt19937& rng) {
  const GgmlTypeInfo& info = *ggml_type_info(type);
  std::vector<uint8_t> b(static_cast<size_t>(rows * cols / info.block_elements * info.block_bytes));
  for (uint8_t& v : b) v = static_cast<uint8_t>(rng());
  const uint16_t d = float_to_f16(0x1p-6f), m = float_to_f16(0x1p-8f);
  for (size_t at = 0; at < b.size(); at += static_cast<size_t>(info.block_bytes)) {
    std::memcpy(&b[at + (type == kGgmlQ6_K ? 208 : 0)], &d, 2);
    if (type == kGgmlQ4_K || type == kGgmlQ5_1) std::memcpy(&b[at + 2], &m, 2);
  }
  return b;
}

// A one-block llama GGUF (dim = hidden = 256, one head, vocab 3) with the given matrix types;
// returns the image (its tensors: what the file holds).
testing::GgufImage write_gguf(const std::string& path) {
  std::mt19937 rng(5);
  const std::map<std::string, uint32_t> types = {{"attn_q", kGgmlQ4_K},   {"attn_k", kGgmlQ5_0},
                                                 {"attn_v", kGgmlQ6_K},   {"attn_output", kGgmlQ5_1},
                                                 {"ffn_gate", kGgmlQ5_0}, {"ffn_up", kGgmlQ4_K},
                                                 {"ffn_down", kGgmlQ6_K}};
  testing::GgufImage g;
  g.text("general.architecture", "llama");
  g.u64("llama.block_count", 1), g.u64("llama.context_length", 64);
  g.u32("llama.embedding_length", 256), g.u32("llama.feed_forward_length", 256);
  g.u32("llama.attention.head_count", 1);
  auto floats = [&](const std::string& name, std::vector<uint64_t> dims, float v) {
    std::vector<uint8_t> b(static_cast<size_t>(dims[0] * (dims.size() > 1 ? dims[1] : 1)) * 4);
    for (size_t i = 0; i < b.size(); i += 4) std::memcpy(&b[i], &v, 4);
    g.tensor(name, dims, kGgmlF32, b);
  };
  floats("token_embd.weight", {256, 3}, 0.25f);
  floats("output_norm.weight", {256}, 1.0f);
  floats("blk.0.attn_norm.weight", {256}, 1.0f);
  floats("blk.0.ffn_norm.weight", {256}, 1.0f);
  for (const auto& [name, type] : types)
    g.tensor("blk.0." + name + ".weight", {256, 256}, type, random_blocks(type, 256, 256, rng));
  EXPECT_TRUE(g.write(path)) << path;
  return g;
}

TEST(GgufPacking, Q5AndKQuantsArePackedAsStored) {
  const std::string path = ::testing::TempDir() + "attn_gguf_packing.gguf";
  const testing::GgufImage image = write_gguf(path);
  auto bytes_of = [&](const std::string& name) -> const std::vector<uint8_t>& {
    for (const auto& t : image.tensors)
      if (t.name == name) return t.bytes;
    throw std::runtime_error("no tensor " + name);
  };
  auto file = std::make_shared<const GgufFile>(GgufFile::open(path));
  const DecoderConfig config = gguf_config(*file, 0);

  const DecoderWeights packed = load_gguf_weights(file, config, false, true);
  const LayerWeights& l = packed.layers.at(0);
  const std::pair<const Matrix*, BlockQuant> want[] = {{&l.wq, BlockQuant::q4_k}, {&l.wk, BlockQuant::q5_0},
                                                       {&l.wv, BlockQuant::q6_k}, {&l.wo, BlockQuant::q5_1},
                                                       {&l.w1, BlockQuant::q5_0}, {&l.w3, BlockQuant::q4_k},
                                                       {&l.w2, BlockQuant::q6_k}};
  for (const auto& [m, q] : want) {
    ASSERT_TRUE(m->packed) << static_cast<int>(q);
    EXPECT_EQ(*m->quant, q);
    EXPECT_LE(m->packed->bytes(), kernels::ggml_row_bytes(q, 256) * 256 * 103 / 100) << static_cast<int>(q);
  }
  // rows as the file has them (the llama reading reorders only wq and wk's rows)
  const std::pair<const Matrix*, const char*> same[] = {
      {&l.wv, "attn_v"}, {&l.wo, "attn_output"}, {&l.w1, "ffn_gate"}, {&l.w3, "ffn_up"}, {&l.w2, "ffn_down"}};
  for (const auto& [m, name] : same) {
    const std::vector<uint8_t>& bytes = bytes_of(std::string("blk.0.") + name + ".weight");
    std::vector<uint8_t> back(bytes.size());
    m->packed->ggml_rows(0, 256, back.data(), m->quant_row_bytes());
    EXPECT_EQ(back, bytes) << name;
  }

  const DecoderWeights in_place = load_gguf_weights(file, config, false, false);
  for (const Matrix* m : {&in_place.layers[0].wq, &in_place.layers[0].wk, &in_place.layers[0].wv,
                          &in_place.layers[0].wo, &in_place.layers[0].w2}) {
    EXPECT_FALSE(m->packed);
    EXPECT_EQ(*m->quant, BlockQuant::q8_0);
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace attn::model
