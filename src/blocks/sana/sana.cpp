// SANA's LiteLA, Mix-FFN (GLUMBConv) and their block: the checks, the float forms (gemm
// from the kernel table, LiteLA's attention by the library's `sana` mechanism) and the entry points
// (the double ones run the references of sana_reference.cpp).
#include "core/shape_text.hpp"
#include "attn/sana.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attn/attend.hpp"
#include "attn/error.hpp"
#include "attn/isa.hpp"
#include "base/parallel.hpp"
#include "kernels/kernel_table.hpp"
#include "sana/sana_internal.hpp"

namespace attn {
namespace {

using sana::lite_la_reference;
using sana::mix_ffn_reference;
using sana::silu;

constexpr int64_t kBlockRows = 64;

std::string shape(int64_t r, int64_t c) { return core::shape_text({r, c}); }

template <class T>
void check_matrix(const char* where, const MatrixRef<T>& m, const std::string& name, int64_t rows, int64_t cols,
                  const std::string& expect) {
  if (m.rows != rows || m.cols != cols)
    fail(where, name + " must have shape " + expect + " = " + shape(rows, cols) + ", got " + shape(m.rows, m.cols));
  if (m.data == nullptr && rows * cols > 0) fail(where, name + " has no data");
}

template <class T>
void check_bias(const char* where, std::span<const T> b, const std::string& name, int64_t n, const std::string& expect,
                bool optional) {
  if (optional && b.empty()) return;
  if (static_cast<int64_t>(b.size()) != n)
    fail(where, name + " must have " + expect + " = " + std::to_string(n) + " values, got " + std::to_string(b.size()));
}

void check_common(const char* where, int64_t batch, int64_t tokens, int64_t channels, int threads) {
  if (batch < 0 || tokens < 0)
    fail(where, "x must have non-negative (B, N), got (" + std::to_string(batch) + ", " + std::to_string(tokens) + ")");
  if (channels < 1) fail(where, "x must have at least one channel (C >= 1), got " + std::to_string(channels));
  if (threads < 0 || threads > kMaxThreads)
    fail(where, "threads must be in [0, " + std::to_string(kMaxThreads) + "], got " + std::to_string(threads));
}

template <class T>
void check_lite_la(const char* where, int64_t channels, const LiteLaWeights<T>& w) {
  if (w.head_dim < 1 || channels % w.head_dim != 0)
    fail(where, "head_dim must divide the channels C = " + std::to_string(channels) + ", got head_dim = " +
                    std::to_string(w.head_dim));
  if (!(w.eps >= 0.0)) fail(where, "eps must be non-negative, got " + std::to_string(w.eps));
  check_matrix(where, w.qkv, "qkv weight", 3 * channels, channels, "(3 C, C)");
  check_matrix(where, w.proj, "proj weight", channels, channels, "(C, C)");
  check_bias(where, w.proj_bias, "proj bias", channels, "C", true);
}

// hidden h of the Mix-FFN, from its first weight
template <class T>
int64_t check_mix_ffn(const char* where, int64_t tokens, int64_t channels, int64_t height, int64_t width,
                      const MixFfnWeights<T>& w) {
  if (height < 0 || width < 0 || tokens != height * width)
    fail(where, "tokens must equal height * width = " + std::to_string(height) + " * " + std::to_string(width) +
                    " = " + std::to_string(height * width) + ", got N = " + std::to_string(tokens));
  if (w.inverted.rows < 2 || w.inverted.rows % 2 != 0)
    fail(where, "inverted weight must have an even number 2h >= 2 of rows (a and the gate), got " +
                    std::to_string(w.inverted.rows));
  const int64_t h2 = w.inverted.rows, h = h2 / 2;
  check_matrix(where, w.inverted, "inverted weight", h2, channels, "(2h, C)");
  check_bias(where, w.inverted_bias, "inverted bias", h2, "2h", false);
  check_matrix(where, w.depth, "depth weight", h2, 9, "(2h, 3 * 3)");
  check_bias(where, w.depth_bias, "depth bias", h2, "2h", false);
  check_matrix(where, w.point, "point weight", channels, h, "(C, h)");
  return h;
}

template <class T>
std::vector<float> transposed(const MatrixRef<T>& a) {
  std::vector<float> b(static_cast<size_t>(a.rows * a.cols));
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t c = 0; c < a.cols; ++c) b[c * a.rows + r] = static_cast<float>(a.data[r * a.cols + c]);
  return b;
}

// out rows = x rows (rows, in) times wt (in, outc) plus bias, in blocks of rows (float, gemm)
void linear_rows(const kernels::TileKernels& kern, const float* x, int64_t rows, int64_t in, const float* wt,
                 int64_t outc, std::span<const float> bias, float* out, int threads) {
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  parallel_for(blocks, resolve_threads(threads, blocks), [&](int64_t b, int) {
    const int64_t r0 = b * kBlockRows, nb = std::min(kBlockRows, rows - r0);
    kern.gemm(nb, outc, in, x + r0 * in, in, 1, wt, outc, out + r0 * outc, outc, false);
    if (!bias.empty())
      for (int64_t r = 0; r < nb; ++r)
        for (int64_t c = 0; c < outc; ++c) out[(r0 + r) * outc + c] += bias[c];
  });
}

// ---- LiteLA ----

void lite_la_fast(const float* x, int64_t batch, int64_t tokens, int64_t C, const LiteLaWeights<float>& w, float* out,
                  int threads) {
  const kernels::TileKernels& kern = kernels::kernels_for(active_isa());
  const int64_t rows = batch * tokens, heads = C / w.head_dim, hd = w.head_dim;
  const std::vector<float> qkv_t = transposed(w.qkv), proj_t = transposed(w.proj);
  std::vector<float> qkv(static_cast<size_t>(rows * 3 * C)), o(static_cast<size_t>(rows * C));
  linear_rows(kern, x, rows, C, qkv_t.data(), 3 * C, {}, qkv.data(), threads);
  // q, k, v: views into the (B, N, 3C) rows; head h owns channels [h hd, (h + 1) hd) of each
  const auto view = [&](const float* base, int64_t row_stride) {
    return sana::head_view(base, batch, heads, tokens, hd, row_stride);
  };
  Sana mech;
  mech.eps = w.eps;
  AttendOptions opt;
  opt.threads = threads;
  attend_into(view(qkv.data(), 3 * C), view(qkv.data() + C, 3 * C), view(qkv.data() + 2 * C, 3 * C), mech, opt,
              view(o.data(), C), nullptr, nullptr);
  linear_rows(kern, o.data(), rows, C, proj_t.data(), C, w.proj_bias, out, threads);
}

// ---- Mix-FFN ----

void mix_ffn_fast(const float* x, int64_t batch, int64_t tokens, int64_t C, int64_t H, int64_t W, int64_t h,
                  const MixFfnWeights<float>& w, float* out, int threads) {
  const kernels::TileKernels& kern = kernels::kernels_for(active_isa());
  const int64_t rows = batch * tokens, h2 = 2 * h;
  // the depthwise taps transposed to (9, 2h): the inner loop runs over channels with unit stride
  const std::vector<float> in_t = transposed(w.inverted), point_t = transposed(w.point), dw_t = transposed(w.depth);
  std::vector<float> u(static_cast<size_t>(rows * h2));
  linear_rows(kern, x, rows, C, in_t.data(), h2, w.inverted_bias, u.data(), threads);
  // silu in place (a pass of its own: the depthwise conv reads neighbours' activations)
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  const int nt = resolve_threads(threads, blocks);
  parallel_for(blocks, nt, [&](int64_t b, int) {
    const int64_t r0 = b * kBlockRows, nb = std::min(kBlockRows, rows - r0);
    for (int64_t e = r0 * h2; e < (r0 + nb) * h2; ++e) u[e] = silu(u[e]);
  });
  std::vector<float> scratch(static_cast<size_t>(nt * (h2 + kBlockRows * h)));
  parallel_for(blocks, nt, [&](int64_t blk, int t) {
    const int64_t r0 = blk * kBlockRows, nb = std::min(kBlockRows, rows - r0);
    float* d = scratch.data() + t * (h2 + kBlockRows * h);  // one token's 2h conv outputs
    float* g = d + h2;                                       // (nb, h) gated
    for (int64_t r = 0; r < nb; ++r) {
      const int64_t row = r0 + r, b = row / tokens, p = row % tokens, y = p / W, xx = p % W;
      for (int64_t c = 0; c < h2; ++c) d[c] = w.depth_bias[c];
      for (int64_t ky = 0; ky < 3; ++ky) {
        const int64_t yy = y + ky - 1;
        if (yy < 0 || yy >= H) continue;
        for (int64_t kx = 0; kx < 3; ++kx) {
          const int64_t xs = xx + kx - 1;
          if (xs < 0 || xs >= W) continue;
          const float* src = u.data() + ((b * tokens) + yy * W + xs) * h2;
          const float* k = dw_t.data() + (ky * 3 + kx) * h2;
          for (int64_t c = 0; c < h2; ++c) d[c] += k[c] * src[c];
        }
      }
      for (int64_t c = 0; c < h; ++c) g[r * h + c] = d[c] * silu(d[h + c]);
    }
    kern.gemm(nb, C, h, g, h, 1, point_t.data(), C, out + r0 * C, C, false);
  });
}

// out rows = LayerNorm(x rows) over C, no affine (sums in double)
template <class T>
void layer_norm_rows(const T* x, int64_t rows, int64_t C, double eps, T* out, int threads) {
  parallel_for(rows, resolve_threads(threads, rows), [&](int64_t r, int) {
    const T* xr = x + r * C;
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) m += xr[c];
    m /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
    const double inv = 1.0 / std::sqrt(v / static_cast<double>(C) + eps);
    for (int64_t c = 0; c < C; ++c) out[r * C + c] = static_cast<T>((xr[c] - m) * inv);
  });
}

template <class T>
void block_impl(const T* x, int64_t batch, int64_t tokens, int64_t C, int64_t H, int64_t W,
                const LiteLaWeights<T>& aw, const MixFfnWeights<T>& fw, T* out, int threads, double norm_eps) {
  const char* where = "sana_block";
  check_common(where, batch, tokens, C, threads);
  check_lite_la(where, C, aw);
  check_mix_ffn(where, tokens, C, H, W, fw);
  if (!(norm_eps >= 0.0)) fail(where, "norm_eps must be non-negative, got " + std::to_string(norm_eps));
  const int64_t n = batch * tokens * C;
  std::vector<T> ln(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  layer_norm_rows(x, batch * tokens, C, norm_eps, ln.data(), threads);
  lite_la(ln.data(), batch, tokens, C, aw, y.data(), threads);
  for (int64_t e = 0; e < n; ++e) y[e] += x[e];
  layer_norm_rows(y.data(), batch * tokens, C, norm_eps, ln.data(), threads);
  mix_ffn(ln.data(), batch, tokens, C, H, W, fw, out, threads);
  for (int64_t e = 0; e < n; ++e) out[e] += y[e];
}

}  // namespace

namespace sana {
template <class T>
void check_lite_la_inputs(const char* where, int64_t batch, int64_t tokens, int64_t C, int threads,
                          const LiteLaWeights<T>& w) {
  check_common(where, batch, tokens, C, threads);
  check_lite_la(where, C, w);
}
template <class T>
int64_t check_mix_ffn_inputs(const char* where, int64_t batch, int64_t tokens, int64_t C, int64_t H, int64_t W,
                             int threads, const MixFfnWeights<T>& w) {
  check_common(where, batch, tokens, C, threads);
  return check_mix_ffn(where, tokens, C, H, W, w);
}
template void check_lite_la_inputs<float>(const char*, int64_t, int64_t, int64_t, int, const LiteLaWeights<float>&);
template void check_lite_la_inputs<double>(const char*, int64_t, int64_t, int64_t, int,
                                           const LiteLaWeights<double>&);
template int64_t check_mix_ffn_inputs<float>(const char*, int64_t, int64_t, int64_t, int64_t, int64_t, int,
                                             const MixFfnWeights<float>&);
template int64_t check_mix_ffn_inputs<double>(const char*, int64_t, int64_t, int64_t, int64_t, int64_t, int,
                                              const MixFfnWeights<double>&);

std::vector<float> transposed_float(const MatrixRef<float>& a) { return transposed(a); }

void linear_rows(const kernels::TileKernels& kern, const float* x, int64_t rows, int64_t in, const float* wt,
                 int64_t outc, std::span<const float> bias, float* out, int threads) {
  attn::linear_rows(kern, x, rows, in, wt, outc, bias, out, threads);
}
}  // namespace sana

void lite_la(const float* x, int64_t batch, int64_t tokens, int64_t channels, const LiteLaWeights<float>& w,
             float* out, int threads) {
  check_common("lite_la", batch, tokens, channels, threads);
  check_lite_la("lite_la", channels, w);
  if (batch * tokens == 0) return;
  lite_la_fast(x, batch, tokens, channels, w, out, threads);
}
void lite_la(const double* x, int64_t batch, int64_t tokens, int64_t channels, const LiteLaWeights<double>& w,
             double* out, int threads) {
  check_common("lite_la", batch, tokens, channels, threads);
  check_lite_la("lite_la", channels, w);
  lite_la_reference(x, batch, tokens, channels, w, out);
}

void mix_ffn(const float* x, int64_t batch, int64_t tokens, int64_t channels, int64_t height, int64_t width,
             const MixFfnWeights<float>& w, float* out, int threads) {
  check_common("mix_ffn", batch, tokens, channels, threads);
  const int64_t h = check_mix_ffn("mix_ffn", tokens, channels, height, width, w);
  if (batch * tokens == 0) return;
  mix_ffn_fast(x, batch, tokens, channels, height, width, h, w, out, threads);
}
void mix_ffn(const double* x, int64_t batch, int64_t tokens, int64_t channels, int64_t height, int64_t width,
             const MixFfnWeights<double>& w, double* out, int threads) {
  check_common("mix_ffn", batch, tokens, channels, threads);
  const int64_t h = check_mix_ffn("mix_ffn", tokens, channels, height, width, w);
  mix_ffn_reference(x, batch, tokens, channels, height, width, h, w, out);
}

void sana_block(const float* x, int64_t batch, int64_t tokens, int64_t channels, int64_t height, int64_t width,
                const LiteLaWeights<float>& attention, const MixFfnWeights<float>& ffn, float* out, int threads,
                double norm_eps) {
  block_impl(x, batch, tokens, channels, height, width, attention, ffn, out, threads, norm_eps);
}
void sana_block(const double* x, int64_t batch, int64_t tokens, int64_t channels, int64_t height, int64_t width,
                const LiteLaWeights<double>& attention, const MixFfnWeights<double>& ffn, double* out, int threads,
                double norm_eps) {
  block_impl(x, batch, tokens, channels, height, width, attention, ffn, out, threads, norm_eps);
}

}  // namespace attn
