// attn mask: the dense boolean mask a mechanism's pattern implies, as .npy and as a picture in
// the terminal.
#include <fmt/core.h>

#include <algorithm>

#include "attn/attn.hpp"
#include "commands.hpp"
#include "usage.hpp"
#include "output_files.hpp"

namespace attn::cli {
namespace {

struct MaskArgs {
  std::string mechanism, out;
  int64_t n = 64, m = -1;
  bool show = false;
};

// Down-sampled to at most 64 columns and 32 rows: '#' all visible, '+' some, '.' none.
void draw(const uint8_t* mask, int64_t n, int64_t m) {
  const int64_t cols = std::min<int64_t>(m, 64), rows = std::min<int64_t>(n, 32);
  fmt::print("rows: queries 0..{} (top to bottom), columns: keys 0..{} (left to right){}\n", n - 1, m - 1,
             n > rows || m > cols ? fmt::format(", each cell {}x{}", (n + rows - 1) / rows, (m + cols - 1) / cols) : "");
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i0 = r * n / rows, i1 = (r + 1) * n / rows;
    std::string line;
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t j0 = c * m / cols, j1 = (c + 1) * m / cols;
      int64_t seen = 0;
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = j0; j < j1; ++j) seen += mask[i * m + j];
      line += seen == 0 ? '.' : seen == (i1 - i0) * (j1 - j0) ? '#' : '+';
    }
    fmt::print("  {}\n", line);
  }
}

int run(const MaskArgs& a) {
  const int64_t m = a.m < 0 ? a.n : a.m;
  const Mechanism mech = parse_mechanism(a.mechanism);
  OutputFiles files({}, {{"--out", a.out}});
  const Tensor t = mask_of(mech, a.n, m);
  const auto* data = static_cast<const uint8_t*>(t.view().data);
  const int64_t visible = std::count(data, data + a.n * m, uint8_t{1});
  fmt::print("{}: N = {}, M = {}: {} of {} pairs visible ({:.2f} %), {:.1f} keys per query\n",
             to_string(mech), a.n, m, visible, a.n * m, a.n * m ? 100.0 * visible / (a.n * m) : 0.0,
             a.n ? static_cast<double>(visible) / a.n : 0.0);
  if (a.show || a.out.empty()) draw(data, a.n, m);
  if (!a.out.empty()) {
    files.write(a.out, DType::boolean, {a.n, m}, data);
    files.commit();
    fmt::print("wrote {} (bool, {} x {}; true = query i sees key j)\n", a.out, a.n, m);
  }
  return 0;
}

}  // namespace

Runner add_mask(CLI::App& app) {
  auto args = std::make_shared<MaskArgs>();
  auto* c = app.add_subcommand("mask", "The dense boolean mask a mechanism's key pattern implies (.npy and a picture)");
  c->add_option("-m,--mechanism", args->mechanism,
                "Mechanism text form, e.g. softmax:causal,window=256:0,sinks=4 or bigbird:block=64,random=3")
      ->required();
  c->add_option("--n", args->n, "Queries N")->capture_default_str()->check(in_range(int64_t{0}, int64_t{1} << 32));
  c->add_option("--m", args->m, "Keys M (default: N); query i sits at position i + M - N")
      ->check(in_range(int64_t{0}, int64_t{1} << 32));
  c->add_option("--out", args->out, "Write the (N, M) bool mask to this .npy file");
  c->add_flag("--show", args->show, "Also draw it when writing --out (it is drawn anyway without --out)");
  c->footer(
      "Key padding and the caller's masks are not part of it.\n"
      "Example: attn mask -m softmax:causal,window=8:0,sinks=2 --n 32");
  return [args] { return run(*args); };
}

}  // namespace attn::cli
