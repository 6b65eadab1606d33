#include "model/ops.hpp"

#include <algorithm>
#include <cmath>

#include "base/parallel.hpp"
#include "kernels/kernel_table.hpp"

namespace attn::model {

// Blocks of 64 weight rows (a thread's item; 64 x cols stays in L2 for typical widths) against
// blocks of 16 input rows (in L1), four input rows sharing each weight-row load. Quantized rows
// are dequantized in registers for a few input rows (decode); for more, a thread dequantizes its
// 64 rows once into a float panel and runs the float kernel over every input row.
void matmul(const float* x, int64_t n, const Matrix& w, float* y, int threads, Isa isa) {
  constexpr int64_t kRowsOfW = 64, kRowsOfX = 16, kPanelFromRows = 8;
  const kernels::TileKernels& k = kernels::kernels_for(isa);
  const int64_t blocks = (w.rows + kRowsOfW - 1) / kRowsOfW;
  const int t = resolve_threads(threads, blocks);
  const bool panel = w.quant && n >= kPanelFromRows;
  std::vector<std::vector<float>> panels(panel ? static_cast<size_t>(t) : 0);
  for (auto& p : panels) p.resize(static_cast<size_t>(kRowsOfW * w.cols));
  parallel_for(blocks, t, [&](int64_t b, int thread) {
    const int64_t j0 = b * kRowsOfW, nj = std::min(kRowsOfW, w.rows - j0);
    const void* const* rows = w.row_ptrs.data() + j0;
    DType dtype = w.dtype;
    const void* panel_rows[kRowsOfW];
    if (panel) {
      float* p = panels[static_cast<size_t>(thread)].data();
      k.dequantize_rows(rows, *w.quant, nj, w.cols, p, w.cols);
      for (int64_t j = 0; j < nj; ++j) panel_rows[j] = p + j * w.cols;
      rows = panel_rows, dtype = DType::f32;
    } else if (w.quant) {
      k.qdot_rows(x, n, w.cols, rows, *w.quant, nj, y + j0, w.rows);
      return;
    }
    for (int64_t i0 = 0; i0 < n; i0 += kRowsOfX)
      k.qk_rows(x + i0 * w.cols, std::min(kRowsOfX, n - i0), w.cols, rows, dtype, nj, y + i0 * w.rows + j0, w.rows,
                nullptr, 0);
  });
}

// dst[c] = W[r][c] for c < W.cols.
void matrix_row(const Matrix& w, int64_t r, float* dst, Isa isa) {
  const kernels::TileKernels& k = kernels::kernels_for(isa);
  const void* row = w.row(r);
  if (w.quant) k.dequantize_rows(&row, *w.quant, 1, w.cols, dst, w.cols);
  else k.to_float(row, w.dtype, 1, w.cols, dst);
}

void rms_norm(const float* x, int64_t n, int64_t cols, int64_t ld, const std::vector<float>& weight, double eps,
              float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * ld;
    double ss = 0;
    for (int64_t c = 0; c < cols; ++c) ss += static_cast<double>(xi[c]) * xi[c];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(cols) + eps));
    float* yi = y + i * ld;
    for (int64_t c = 0; c < cols; ++c) yi[c] = xi[c] * inv * weight[static_cast<size_t>(c)];
  }
}

}  // namespace attn::model
