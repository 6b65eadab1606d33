#include "model/ops.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/aligned_buffer.hpp"
#include "base/parallel.hpp"
#include "kernels/kernel_table.hpp"
#include "quant/q8_dot.hpp"

namespace attn::model {

namespace {

// Rows j0 .. j0+nj-1 of quantized w by address: its own rows, or a packed w's rows rebuilt as
// ggml rows in buf (nj * w.quant_row_bytes() bytes), addresses in ptrs (nj of them).
const void* const* ggml_rows(const Matrix& w, int64_t j0, int64_t nj, uint8_t* buf, const void** ptrs) {
  if (!w.packed) return w.row_ptrs.data() + j0;
  const int64_t row_bytes = w.quant_row_bytes();
  w.packed->ggml_rows(j0, nj, buf, row_bytes);
  for (int64_t j = 0; j < nj; ++j) ptrs[j] = buf + j * row_bytes;
  return ptrs;
}

constexpr int64_t kRowsOfW = 64;  // a thread's item: 64 weight rows (64 x cols stays in L2)
constexpr int64_t kTokens = kernels::kQueryTile;

// Prefill-sized inputs: the attention engine's QK^T micro-kernel is a GEMM. Input rows are packed
// once, 64 at a time, as transposed tiles (the "queries"); each thread turns its 64 weight rows
// into a float panel (the "keys": dequantized or converted once; a packed matrix's rows straight
// from its groups) and multiplies it with every tile, then writes the 64 x 64 result back
// transposed.
void matmul_tiles(const float* x, int64_t n, const Matrix& w, float* y, int t, const kernels::TileKernels& k,
                  const kernels::QuantKernels& qk) {
  const int64_t cols = w.cols, tiles = (n + kTokens - 1) / kTokens;
  AlignedFloats packed(static_cast<size_t>(tiles * cols * kTokens));
  alignas(64) float ones[kTokens];
  std::fill(ones, ones + kTokens, 1.0f);
  parallel_for(tiles, t, [&](int64_t b, int) {
    k.pack_qt(x + b * kTokens * cols, cols, static_cast<int>(std::min(kTokens, n - b * kTokens)), cols, ones,
              packed.data() + b * cols * kTokens);
  });
  std::vector<AlignedFloats> panels(static_cast<size_t>(t)), tiles_out(static_cast<size_t>(t));
  for (int i = 0; i < t; ++i)  // before the region, which must not allocate
    panels[static_cast<size_t>(i)].resize(static_cast<size_t>(kRowsOfW * cols)),
        tiles_out[static_cast<size_t>(i)].resize(static_cast<size_t>(kRowsOfW * kTokens));
  const int64_t blocks = (w.rows + kRowsOfW - 1) / kRowsOfW;
  parallel_for(blocks, t, [&](int64_t b, int thread) {
    const int64_t j0 = b * kRowsOfW, nj = std::min(kRowsOfW, w.rows - j0);
    AlignedFloats& panel = panels[static_cast<size_t>(thread)];
    AlignedFloats& st = tiles_out[static_cast<size_t>(thread)];
    if (w.packed)
      w.packed->float_rows(j0, nj, panel.data(), cols);
    else if (w.quant)
      qk.dequantize_rows(w.row_ptrs.data() + j0, *w.quant, nj, cols, panel.data(), cols);
    else
      for (int64_t j = 0; j < nj; ++j) k.to_float(w.row(j0 + j), w.dtype, 1, cols, panel.data() + j * cols);
    for (int64_t tb = 0; tb < tiles; ++tb) {
      const int64_t lanes = std::min(kTokens, n - tb * kTokens);
      const int hi = static_cast<int>((lanes + kernels::kLaneGroup - 1) / kernels::kLaneGroup * kernels::kLaneGroup);
      k.qk(packed.data() + tb * cols * kTokens, cols, panel.data(), cols, nj, st.data(), 0, hi);
      for (int64_t i = 0; i < lanes; ++i)
        for (int64_t j = 0; j < nj; ++j) y[(tb * kTokens + i) * w.rows + j0 + j] = st.data()[j * kTokens + i];
    }
  });
}

}  // namespace

// Few input rows (decode): blocks of 64 weight rows against blocks of 16 input rows, four input
// rows sharing each weight-row load; quantized rows are dequantized in registers (or multiplied
// as integers with 8-bit inputs). From 16 input rows on, matmul_tiles, except quantized rows with
// q8 activations: the integer products serve any number of input rows (each output summed in the
// same order as for one row).
void matmul(const float* x, int64_t n, const Matrix& w, float* y, int threads, Isa isa, Activations activations,
            bool row_wise) {
  matmul_many(x, n, {{&w, y}}, threads, isa, activations, row_wise);
}

void matmul_many(const float* x, int64_t n, const std::vector<Product>& products, int threads, Isa isa,
                 Activations activations, bool row_wise) {
  const kernels::TileKernels& k = kernels::kernels_for(isa);
  const kernels::QuantKernels& qk = kernels::quant_kernels_for(isa);
  const bool prompt = n >= kPromptRows && !row_wise;
  const bool integer = activations == Activations::q8 || (activations == Activations::q8_decode && !prompt);
  // Products of the rows path below: every one for decode, the integer ones for a prompt.
  thread_local std::vector<Product> rows_path;
  rows_path.clear();
  for (const Product& p : products) {
    if (!prompt || (p.w->quant && integer)) {
      rows_path.push_back(p);
      continue;
    }
    const int64_t blocks = (p.w->rows + kRowsOfW - 1) / kRowsOfW;
    matmul_tiles(x, n, *p.w, p.y, resolve_threads(threads, blocks), k, qk);
  }
  if (rows_path.empty()) return;
  // Work items: the blocks of weight rows of every product, in order: 64 rows for one to three
  // input rows (a decode step: the weights stream from memory), 32 (two packed groups) from four
  // on, where the products are compute-bound and finer items balance the threads (SmolLM2's
  // 576-row matrices are 9 items of 64, 18 of 32: 16 serving streams ~4 % faster on Zen 5). A
  // row's sums do not depend on the split.
  const int64_t per_item = n >= 4 ? 32 : kRowsOfW;
  thread_local std::vector<int64_t> first_block;
  first_block.assign(1, 0);
  bool any_q8 = false;
  int64_t rebuilt_bytes = 0;  // float activations with a packed matrix: its rows rebuilt per item
  for (const Product& p : rows_path) {
    first_block.push_back(first_block.back() + (p.w->rows + per_item - 1) / per_item);
    any_q8 |= p.w->quant && integer;
    if (p.w->packed && !integer) rebuilt_bytes = std::max(rebuilt_bytes, kRowsOfW * p.w->quant_row_bytes());
  }
  const int64_t cols = rows_path.front().w->cols;
  thread_local std::vector<kernels::Q8Block> xq;  // x as 8-bit blocks, once for every product
  if (any_q8) {
    xq.resize(static_cast<size_t>(n * cols / 32));
    qk.quantize_q8_rows(x, n, cols, cols, xq.data());
  }
  const kernels::Q8Block* xb = xq.data();
  const int64_t* starts = first_block.data();
  const int64_t items = first_block.back();
  const int t = resolve_threads(threads, items);
  thread_local std::vector<std::vector<uint8_t>> rebuilt;  // before the region, which must not allocate
  if (rebuilt.size() < static_cast<size_t>(t)) rebuilt.resize(static_cast<size_t>(t));
  for (int i = 0; i < t && rebuilt_bytes; ++i) rebuilt[static_cast<size_t>(i)].resize(static_cast<size_t>(rebuilt_bytes));
  std::vector<uint8_t>* buffers = rebuilt.data();
  thread_local std::vector<std::vector<float>> row_pads;  // row_wise: a padded group of four rows and its outputs
  int64_t widest = 0;
  for (const Product& p : rows_path) widest = std::max(widest, p.w->rows);
  if (row_wise && row_pads.size() < static_cast<size_t>(t)) row_pads.resize(static_cast<size_t>(t));
  for (int i = 0; i < t && row_wise; ++i) row_pads[static_cast<size_t>(i)].resize(static_cast<size_t>(4 * (cols + widest)));
  std::vector<float>* pads = row_pads.data();
  const Product* work = rows_path.data();
  const size_t count = rows_path.size();
  parallel_for(items, t, [&](int64_t item, int thread) {
    const size_t pi = static_cast<size_t>(std::upper_bound(starts, starts + count + 1, item) - starts - 1);
    const Matrix& w = *work[pi].w;
    float* y = work[pi].y;
    const int64_t j0 = (item - starts[pi]) * per_item, nj = std::min(per_item, w.rows - j0);
    if (w.quant && integer) {
      if (w.packed) return qk.q8_packed_rows(xb, n, w.packed->view(), j0 / kernels::kPackedRows, nj, y + j0, w.rows);
      return qk.q8_dot_rows(xb, n, w.cols / 32, w.row_ptrs.data() + j0, *w.quant, nj, y + j0, w.rows);
    }
    const void* ptrs[kRowsOfW];
    const void* const* rows = w.quant ? ggml_rows(w, j0, nj, buffers[thread].data(), ptrs) : w.row_ptrs.data() + j0;
    auto float_rows = [&](const float* xr, int64_t m, float* yr) {
      if (!w.quant) return k.qk_rows(xr, m, w.cols, rows, w.dtype, nj, yr, w.rows, nullptr, 0);
      qk.qdot_rows(xr, m, w.cols, rows, *w.quant, nj, yr, w.rows);
    };
    if (!row_wise) return float_rows(x, n, y + j0);
    // row-wise: every group of four input rows in its own call, the last one padded with zero
    // rows (a kernel sums a row of a full group alike at any of its four places; fewer rows, or
    // more per call, take other paths)
    const int64_t full = n / 4 * 4;
    for (int64_t r = 0; r < full; r += 4) float_rows(x + r * cols, 4, y + r * w.rows + j0);
    if (full == n) return;
    float* pad_x = pads[thread].data();
    float* pad_y = pad_x + 4 * cols;
    std::fill(pad_x, pad_x + 4 * cols, 0.0f);
    std::copy(x + full * cols, x + n * cols, pad_x);
    float_rows(pad_x, 4, pad_y);
    for (int64_t r = full; r < n; ++r) std::copy(pad_y + (r - full) * w.rows, pad_y + (r - full) * w.rows + nj, y + r * w.rows + j0);
  });
}

// dst[c] = W[r][c] for c < W.cols.
void matrix_row(const Matrix& w, int64_t r, float* dst, Isa isa) {
  if (!w.quant) return kernels::kernels_for(isa).to_float(w.row(r), w.dtype, 1, w.cols, dst);
  if (w.packed) return w.packed->float_rows(r, 1, dst, w.cols);
  kernels::quant_kernels_for(isa).dequantize_rows(w.row_ptrs.data() + r, *w.quant, 1, w.cols, dst, w.cols);
}

void gated_activation(GateActivation act, float* gate, const float* up, int64_t rows, int64_t width, int threads,
                      Isa isa) {
  const kernels::TileKernels& k = kernels::kernels_for(isa);
  const auto fn = act == GateActivation::silu ? k.silu_gate : k.gelu_tanh_gate;
  constexpr int64_t kGroupValues = 4096;  // values per work item (whole rows, one at least)
  const int64_t per_item = std::max<int64_t>(1, kGroupValues / std::max<int64_t>(width, 1));
  const int64_t items = (rows + per_item - 1) / per_item;
  parallel_for(items, resolve_threads(threads, items), [&](int64_t item, int) {
    for (int64_t r = item * per_item; r < std::min(rows, (item + 1) * per_item); ++r)
      fn(gate + r * width, up + r * width, width);
  });
}

void rms_norm(const float* x, int64_t n, int64_t cols, int64_t ld, const std::vector<float>& weight, double eps,
              float* y, int threads) {
  auto norm_row = [&](int64_t i) {
    const float* xi = x + i * ld;
    // eight running sums (each square exact in double), added in a fixed order: the same bits on
    // every thread count and ISA, without one long chain of dependent additions
    double part[8] = {};
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8)
      for (int l = 0; l < 8; ++l) part[l] += static_cast<double>(xi[c + l]) * xi[c + l];
    for (; c < cols; ++c) part[c % 8] += static_cast<double>(xi[c]) * xi[c];
    const double ss = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(cols) + eps));
    float* yi = y + i * ld;
    for (int64_t c = 0; c < cols; ++c) yi[c] = xi[c] * inv * weight[static_cast<size_t>(c)];
  };
  constexpr int64_t kRowValues = 16384;  // values per work item: small norms stay on the caller
  const int64_t per_item = std::max<int64_t>(1, kRowValues / std::max<int64_t>(cols, 1));
  const int64_t items = (n + per_item - 1) / per_item;
  parallel_for(items, resolve_threads(threads, items), [&](int64_t item, int) {
    for (int64_t i = item * per_item; i < std::min(n, (item + 1) * per_item); ++i) norm_row(i);
  });
}

}  // namespace attn::model
