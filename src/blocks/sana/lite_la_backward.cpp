// LiteLA's backward (attn/sana.hpp): the float form and the entry points (the double one runs the
// plain reference of sana_backward_reference.cpp).
//
// The float form recomputes q, k, v and the attention output o as the forward does, then goes back
// through the output projection (gemm), the attention (the `sana` mechanism's own backward, the
// linear family's "right" form) and the qkv projection (gemm). The weights' gradients are one gemm
// over all batch * tokens rows per block of the weight's rows (the kernel sums over the rows in
// order, per element), the bias's a sum over the rows in order: no task adds into another's
// elements, so the results are bitwise the same for any thread count. Every buffer is allocated
// before the parallel regions.
#include <algorithm>
#include <string>
#include <vector>

#include "attn/attend.hpp"
#include "attn/backward.hpp"
#include "attn/error.hpp"
#include "attn/isa.hpp"
#include "attn/sana.hpp"
#include "base/parallel.hpp"
#include "kernels/kernel_table.hpp"
#include "sana/sana_internal.hpp"

namespace attn {
namespace {

constexpr const char* kWhere = "lite_la_backward";
constexpr int64_t kBlockRows = 64;

template <class T>
void check_buffers(const T* dout, const T* x, int64_t rows, const LiteLaWeights<T>& w, const LiteLaGradients<T>& g) {
  if (rows > 0 && (dout == nullptr || x == nullptr))
    fail(kWhere, std::string(x == nullptr ? "x" : "dout") + " is null (batch * tokens * C values expected)");
  if (rows > 0 && g.x == nullptr) fail(kWhere, "grads.x is null (batch * tokens * C values expected)");
  if (g.qkv == nullptr) fail(kWhere, "grads.qkv is null ((3 C, C) values expected)");
  if (g.proj == nullptr) fail(kWhere, "grads.proj is null ((C, C) values expected)");
  if (!w.proj_bias.empty() && g.proj_bias == nullptr)
    fail(kWhere, "grads.proj_bias is null, but the weights have a proj bias (C values expected)");
}

// out (m, n) = a^T b for a (rows, m) and b (rows, n), row-major: blocks of out's rows in parallel,
// each element summed over the rows in order
void transposed_product(const kernels::TileKernels& kern, const float* a, int64_t m, const float* b, int64_t n,
                        int64_t rows, float* out, int threads) {
  const int64_t blocks = (m + kBlockRows - 1) / kBlockRows;
  parallel_for(blocks, resolve_threads(threads, blocks), [&](int64_t blk, int) {
    const int64_t c0 = blk * kBlockRows, nb = std::min(kBlockRows, m - c0);
    kern.gemm(nb, n, rows, a + c0, 1, m, b, n, out + c0 * n, n, false);
  });
}

void lite_la_backward_fast(const float* dout, const float* x, int64_t batch, int64_t tokens, int64_t C,
                           const LiteLaWeights<float>& w, const LiteLaGradients<float>& g, int threads) {
  const kernels::TileKernels& kern = kernels::kernels_for(active_isa());
  const int64_t rows = batch * tokens, heads = C / w.head_dim, hd = w.head_dim, C3 = 3 * C;
  const std::vector<float> qkv_t = sana::transposed_float(w.qkv);
  std::vector<float> qkv(static_cast<size_t>(rows * C3)), o(static_cast<size_t>(rows * C));
  std::vector<float> d_o(static_cast<size_t>(rows * C)), dqkv(static_cast<size_t>(rows * C3));
  sana::linear_rows(kern, x, rows, C, qkv_t.data(), C3, {}, qkv.data(), threads);
  const auto view = [&](const float* base, int64_t row_stride) {
    return sana::head_view(base, batch, heads, tokens, hd, row_stride);
  };
  Sana mech;
  mech.eps = w.eps;
  AttendOptions opt;
  opt.threads = threads;
  const TensorView q = view(qkv.data(), C3), k = view(qkv.data() + C, C3), v = view(qkv.data() + 2 * C, C3);
  attend_into(q, k, v, mech, opt, view(o.data(), C), nullptr, nullptr);
  // y = o proj^T + b: d proj = dout^T o, d b = the rows' sum, dO = dout proj
  transposed_product(kern, dout, C, o.data(), C, rows, g.proj, threads);
  if (!w.proj_bias.empty()) {
    std::fill(g.proj_bias, g.proj_bias + C, 0.0f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < C; ++c) g.proj_bias[c] += dout[r * C + c];
  }
  sana::linear_rows(kern, dout, rows, C, w.proj.data, C, {}, d_o.data(), threads);
  // the attention: the linear family's backward of the `sana` mechanism (no lse)
  const AttendGradients grads = attend_backward(view(d_o.data(), C), q, k, v, view(o.data(), C), TensorView{}, mech,
                                                opt);
  const Tensor* parts[3] = {&grads.dq, &grads.dk, &grads.dv};
  parallel_for(rows, resolve_threads(threads, rows), [&](int64_t row, int) {
    const int64_t b = row / tokens, n = row % tokens;
    for (int p = 0; p < 3; ++p) {
      const TensorView& t = parts[p]->view();
      const float* src = static_cast<const float*>(t.data);
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < hd; ++d) dqkv[row * C3 + p * C + h * hd + d] = src[t.offset(b, h, n, d)];
    }
  });
  // qkv = x W^T: d W = dqkv^T x, dx = dqkv W
  transposed_product(kern, dqkv.data(), C3, x, C, rows, g.qkv, threads);
  sana::linear_rows(kern, dqkv.data(), rows, C3, w.qkv.data, C, {}, g.x, threads);
}

}  // namespace

void lite_la_backward(const float* dout, const float* x, int64_t batch, int64_t tokens, int64_t channels,
                      const LiteLaWeights<float>& w, const LiteLaGradients<float>& grads, int threads) {
  sana::check_lite_la_inputs(kWhere, batch, tokens, channels, threads, w);
  check_buffers(dout, x, batch * tokens, w, grads);
  if (batch * tokens == 0) {
    std::fill(grads.qkv, grads.qkv + 3 * channels * channels, 0.0f);
    std::fill(grads.proj, grads.proj + channels * channels, 0.0f);
    if (!w.proj_bias.empty()) std::fill(grads.proj_bias, grads.proj_bias + channels, 0.0f);
    return;
  }
  lite_la_backward_fast(dout, x, batch, tokens, channels, w, grads, threads);
}

void lite_la_backward(const double* dout, const double* x, int64_t batch, int64_t tokens, int64_t channels,
                      const LiteLaWeights<double>& w, const LiteLaGradients<double>& grads, int threads) {
  sana::check_lite_la_inputs(kWhere, batch, tokens, channels, threads, w);
  check_buffers(dout, x, batch * tokens, w, grads);
  sana::lite_la_backward_plain(dout, x, batch, tokens, channels, w, grads);
}

}  // namespace attn
