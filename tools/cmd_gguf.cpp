// attn gguf: what a GGUF file holds (checked as attn reads it): metadata and the tensor directory.
#include <fmt/core.h>

#include <algorithm>
#include <map>
#include <vector>

#include "attn/error.hpp"
#include "attn/gguf.hpp"
#include "commands.hpp"
#include "quant/ggml_blocks.hpp"
#include "output_files.hpp"

namespace attn::cli {
namespace {

struct GgufArgs {
  std::string path, dequantize, out;
  bool tensors = false;
};

std::string value_text(const GgufValue& v) {
  switch (v.type) {
    case GgufType::string: return v.text.size() > 80 ? "\"" + v.text.substr(0, 77) + "...\"" : "\"" + v.text + "\"";
    case GgufType::array: {
      const size_t n = v.element_type == GgufType::string ? v.strings.size() : v.numbers.size();
      std::string s = fmt::format("[{} x {}]", n, gguf_type_name(v.element_type));
      for (size_t i = 0; i < std::min<size_t>(n, 4); ++i)
        s += " " + (v.element_type == GgufType::string ? "\"" + v.strings[i] + "\"" : fmt::format("{}", v.numbers[i]));
      return s + (n > 4 ? " ..." : "");
    }
    case GgufType::float32:
    case GgufType::float64: return fmt::format("{}", v.number);
    case GgufType::boolean: return v.integer ? "true" : "false";
    default: return fmt::format("{}", v.integer);
  }
}

// --dequantize NAME --out FILE: the tensor decoded to float32, in numpy order (dims reversed).
int dequantize(const GgufFile& f, const GgufArgs& a) {
  if (a.out.empty()) throw Error("--dequantize: give --out FILE.npy");
  const GgufTensor& t = f.tensor(a.dequantize);
  if (!model::can_dequantize(t.type))
    throw Error("--dequantize: tensor '" + t.name + "' is " + ggml_type_info(t.type)->name +
                ", which attn does not decode yet (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)");
  std::vector<float> values(static_cast<size_t>(t.elements()));
  const int64_t row = t.dims[0], rows = t.elements() / std::max<int64_t>(row, 1);
  const int64_t row_bytes = row / ggml_type_info(t.type)->block_elements * ggml_type_info(t.type)->block_bytes;
  for (int64_t r = 0; r < rows; ++r) model::dequantize_row(t.type, t.data + r * row_bytes, row, values.data() + r * row);
  const std::vector<int64_t> shape(t.dims.rbegin(), t.dims.rend());
  OutputFiles files({{"file", a.path}}, {{"--out", a.out}});
  files.write(a.out, DType::f32, shape, values.data());
  files.commit();
  fmt::print("{}: {} {} -> {} float32\n", t.name, ggml_type_info(t.type)->name, t.elements(), a.out);
  return 0;
}

int run(const GgufArgs& a) {
  const GgufFile f = GgufFile::open(a.path);
  if (!a.dequantize.empty()) return dequantize(f, a);
  int64_t bytes = 0;
  std::map<std::string, int> by_type;
  for (const GgufTensor& t : f.tensors()) bytes += t.bytes, ++by_type[ggml_type_info(t.type)->name];
  fmt::print("{}: GGUF v{}, alignment {}, {} metadata entries, {} tensors ({:.1f} MB)\n", a.path, f.version(),
             f.alignment(), f.metadata().size(), f.tensors().size(), static_cast<double>(bytes) / 1e6);
  std::string types;
  for (const auto& [name, count] : by_type) types += fmt::format(" {} x{}", name, count);
  fmt::print("tensor types:{}\n", types);
  for (const auto& [key, v] : f.metadata()) fmt::print("  {:<40} {:<8} {}\n", key, gguf_type_name(v.type), value_text(v));
  if (a.tensors)
    for (const GgufTensor& t : f.tensors()) {
      std::string dims;
      for (size_t i = 0; i < t.dims.size(); ++i) dims += (i ? " x " : "") + std::to_string(t.dims[i]);
      fmt::print("  {:<40} {:<6} {:<16} {:>12} bytes at {}\n", t.name, ggml_type_info(t.type)->name, dims, t.bytes, t.offset);
    }
  return 0;
}

}  // namespace

Runner add_gguf(CLI::App& app) {
  auto a = std::make_shared<GgufArgs>();
  CLI::App* c = app.add_subcommand("gguf", "What a GGUF model file holds: metadata and (--tensors) the tensor directory");
  c->add_option("file", a->path, "A .gguf file")->required()->check(CLI::ExistingFile);
  c->add_flag("--tensors", a->tensors, "Also list every tensor: type, dimensions (ggml order), bytes, offset");
  c->add_option("--dequantize", a->dequantize, "Decode this tensor (F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K) to float32 ...");
  c->add_option("--out", a->out, "... into this .npy file (numpy order: the ggml dimensions reversed)");
  return [a] { return run(*a); };
}

}  // namespace attn::cli
