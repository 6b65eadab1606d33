// Mix-FFN's backward (attn/sana.hpp): the float form and the entry points (the double one runs the
// plain reference of sana_backward_reference.cpp).
//
// The float form recomputes the forward's activations (pre = x W_in^T + b_in, u = silu(pre), the
// depthwise conv's output d and the gated product), then goes back: d point = dout^T gated and
// dx = dpre W_in by the kernel table's gemm, the gate and the silus elementwise, the depthwise
// conv's transpose per block of rows (each row gathers from the outputs its pixel fed), and its
// taps' and bias's gradients per block of channels (each task sums its channels over all rows in
// row order). No task adds into another's elements, so the results are bitwise the same for any
// thread count. Every buffer is allocated before the parallel regions.
#include <algorithm>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/isa.hpp"
#include "attn/sana.hpp"
#include "base/parallel.hpp"
#include "kernels/kernel_table.hpp"
#include "sana/sana_internal.hpp"

namespace attn {
namespace {

using sana::silu;
using sana::silu_grad;

constexpr const char* kWhere = "mix_ffn_backward";
constexpr int64_t kBlockRows = 64;
constexpr int64_t kBlockChannels = 16;

template <class T>
void check_buffers(const T* dout, const T* x, int64_t rows, const MixFfnGradients<T>& g) {
  if (rows > 0 && (dout == nullptr || x == nullptr))
    fail(kWhere, std::string(x == nullptr ? "x" : "dout") + " is null (batch * tokens * C values expected)");
  if (rows > 0 && g.x == nullptr) fail(kWhere, "grads.x is null (batch * tokens * C values expected)");
  const std::pair<const T*, const char*> need[] = {
      {g.inverted, "grads.inverted is null ((2h, C) values expected)"},
      {g.inverted_bias, "grads.inverted_bias is null (2h values expected)"},
      {g.depth, "grads.depth is null ((2h, 9) values expected)"},
      {g.depth_bias, "grads.depth_bias is null (2h values expected)"},
      {g.point, "grads.point is null ((C, h) values expected)"}};
  for (const auto& [p, text] : need)
    if (p == nullptr) fail(kWhere, text);
}

// out (m, n) = a^T b for a (rows, m) and b (rows, n): blocks of out's rows in parallel, each
// element summed over the rows in order
void transposed_product(const kernels::TileKernels& kern, const float* a, int64_t m, const float* b, int64_t n,
                        int64_t rows, float* out, int threads) {
  const int64_t blocks = (m + kBlockRows - 1) / kBlockRows;
  parallel_for(blocks, resolve_threads(threads, blocks), [&](int64_t blk, int) {
    const int64_t c0 = blk * kBlockRows, nb = std::min(kBlockRows, m - c0);
    kern.gemm(nb, n, rows, a + c0, 1, m, b, n, out + c0 * n, n, false);
  });
}

void mix_ffn_backward_fast(const float* dout, const float* x, int64_t batch, int64_t tokens, int64_t C, int64_t H,
                           int64_t W, int64_t h, const MixFfnWeights<float>& w, const MixFfnGradients<float>& g,
                           int threads) {
  const kernels::TileKernels& kern = kernels::kernels_for(active_isa());
  const int64_t rows = batch * tokens, h2 = 2 * h;
  const auto sz = [](int64_t e) { return static_cast<size_t>(e); };
  const std::vector<float> in_t = sana::transposed_float(w.inverted), dw_t = sana::transposed_float(w.depth);
  std::vector<float> pre(sz(rows * h2)), u(pre.size()), d(pre.size()), dd(pre.size()), du(pre.size());
  std::vector<float> gated(sz(rows * h)), dg(gated.size());
  sana::linear_rows(kern, x, rows, C, in_t.data(), h2, w.inverted_bias, pre.data(), threads);
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  const int nt = resolve_threads(threads, blocks);
  parallel_for(blocks, nt, [&](int64_t b, int) {
    const int64_t r0 = b * kBlockRows, nb = std::min(kBlockRows, rows - r0);
    for (int64_t e = r0 * h2; e < (r0 + nb) * h2; ++e) u[e] = silu(pre[e]);
  });
  // the depthwise conv (as the forward) and the gate
  parallel_for(blocks, nt, [&](int64_t blk, int) {
    const int64_t r0 = blk * kBlockRows, nb = std::min(kBlockRows, rows - r0);
    for (int64_t row = r0; row < r0 + nb; ++row) {
      const int64_t b = row / tokens, p = row % tokens, y = p / W, xx = p % W;
      float* dr = d.data() + row * h2;
      for (int64_t c = 0; c < h2; ++c) dr[c] = w.depth_bias[c];
      for (int64_t ky = 0; ky < 3; ++ky) {
        const int64_t yy = y + ky - 1;
        if (yy < 0 || yy >= H) continue;
        for (int64_t kx = 0; kx < 3; ++kx) {
          const int64_t xs = xx + kx - 1;
          if (xs < 0 || xs >= W) continue;
          const float* src = u.data() + (b * tokens + yy * W + xs) * h2;
          const float* k = dw_t.data() + (ky * 3 + kx) * h2;
          for (int64_t c = 0; c < h2; ++c) dr[c] += k[c] * src[c];
        }
      }
      for (int64_t c = 0; c < h; ++c) gated[row * h + c] = dr[c] * silu(dr[h + c]);
    }
  });
  // out = gated point^T: d point = dout^T gated, d gated = dout point
  transposed_product(kern, dout, C, gated.data(), h, rows, g.point, threads);
  sana::linear_rows(kern, dout, rows, C, w.point.data, h, {}, dg.data(), threads);
  parallel_for(blocks, nt, [&](int64_t blk, int) {
    const int64_t r0 = blk * kBlockRows, nb = std::min(kBlockRows, rows - r0);
    for (int64_t row = r0; row < r0 + nb; ++row)
      for (int64_t c = 0; c < h; ++c) {
        const float a = d[row * h2 + c], gt = d[row * h2 + h + c], e = dg[row * h + c];
        dd[row * h2 + c] = e * silu(gt);
        dd[row * h2 + h + c] = e * a * silu_grad(gt);
      }
  });
  // the depthwise conv's taps and bias: per block of channels, over every row in order
  const int64_t cblocks = (h2 + kBlockChannels - 1) / kBlockChannels;
  parallel_for(cblocks, resolve_threads(threads, cblocks), [&](int64_t blk, int) {
    const int64_t c0 = blk * kBlockChannels, c1 = std::min(h2, c0 + kBlockChannels);
    std::fill(g.depth_bias + c0, g.depth_bias + c1, 0.0f);
    std::fill(g.depth + c0 * 9, g.depth + c1 * 9, 0.0f);
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t b = row / tokens, p = row % tokens, y = p / W, xx = p % W;
      const float* e = dd.data() + row * h2;
      for (int64_t c = c0; c < c1; ++c) g.depth_bias[c] += e[c];
      for (int64_t ky = 0; ky < 3; ++ky) {
        const int64_t yy = y + ky - 1;
        if (yy < 0 || yy >= H) continue;
        for (int64_t kx = 0; kx < 3; ++kx) {
          const int64_t xs = xx + kx - 1;
          if (xs < 0 || xs >= W) continue;
          const float* src = u.data() + (b * tokens + yy * W + xs) * h2;
          for (int64_t c = c0; c < c1; ++c) g.depth[c * 9 + ky * 3 + kx] += e[c] * src[c];
        }
      }
    }
  });
  // its transpose: the pixel (y, x) fed the output (y + 1 - ky, x + 1 - kx) through tap (ky, kx);
  // then silu's derivative
  parallel_for(blocks, nt, [&](int64_t blk, int) {
    const int64_t r0 = blk * kBlockRows, nb = std::min(kBlockRows, rows - r0);
    for (int64_t row = r0; row < r0 + nb; ++row) {
      const int64_t b = row / tokens, p = row % tokens, y = p / W, xx = p % W;
      float* dr = du.data() + row * h2;
      std::fill(dr, dr + h2, 0.0f);
      for (int64_t ky = 0; ky < 3; ++ky) {
        const int64_t yo = y + 1 - ky;
        if (yo < 0 || yo >= H) continue;
        for (int64_t kx = 0; kx < 3; ++kx) {
          const int64_t xo = xx + 1 - kx;
          if (xo < 0 || xo >= W) continue;
          const float* e = dd.data() + (b * tokens + yo * W + xo) * h2;
          const float* k = dw_t.data() + (ky * 3 + kx) * h2;
          for (int64_t c = 0; c < h2; ++c) dr[c] += k[c] * e[c];
        }
      }
      for (int64_t c = 0; c < h2; ++c) dr[c] *= silu_grad(pre[row * h2 + c]);
    }
  });
  // pre = x W_in^T + b_in: d b_in = the rows' sum, d W_in = dpre^T x, dx = dpre W_in
  std::fill(g.inverted_bias, g.inverted_bias + h2, 0.0f);
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t c = 0; c < h2; ++c) g.inverted_bias[c] += du[row * h2 + c];
  transposed_product(kern, du.data(), h2, x, C, rows, g.inverted, threads);
  sana::linear_rows(kern, du.data(), rows, h2, w.inverted.data, C, {}, g.x, threads);
}

template <class T>
void zero_weights(int64_t C, int64_t h, const MixFfnGradients<T>& g) {
  std::fill(g.inverted, g.inverted + 2 * h * C, T(0));
  std::fill(g.inverted_bias, g.inverted_bias + 2 * h, T(0));
  std::fill(g.depth, g.depth + 2 * h * 9, T(0));
  std::fill(g.depth_bias, g.depth_bias + 2 * h, T(0));
  std::fill(g.point, g.point + C * h, T(0));
}

}  // namespace

void mix_ffn_backward(const float* dout, const float* x, int64_t batch, int64_t tokens, int64_t channels,
                      int64_t height, int64_t width, const MixFfnWeights<float>& w, const MixFfnGradients<float>& grads,
                      int threads) {
  const int64_t h = sana::check_mix_ffn_inputs(kWhere, batch, tokens, channels, height, width, threads, w);
  check_buffers(dout, x, batch * tokens, grads);
  if (batch * tokens == 0) return zero_weights(channels, h, grads);
  mix_ffn_backward_fast(dout, x, batch, tokens, channels, height, width, h, w, grads, threads);
}

void mix_ffn_backward(const double* dout, const double* x, int64_t batch, int64_t tokens, int64_t channels,
                      int64_t height, int64_t width, const MixFfnWeights<double>& w,
                      const MixFfnGradients<double>& grads, int threads) {
  const int64_t h = sana::check_mix_ffn_inputs(kWhere, batch, tokens, channels, height, width, threads, w);
  check_buffers(dout, x, batch * tokens, grads);
  sana::mix_ffn_backward_plain(dout, x, batch, tokens, channels, height, width, h, w, grads);
}

}  // namespace attn
