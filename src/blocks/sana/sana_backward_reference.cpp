// SANA's backwards written plainly (attn/sana.hpp's formulas): LiteLA with its N x N weights
// written out per head, Mix-FFN as loops over pixels, channels and taps; each the forward again,
// then every step's derivative by hand, sums in T. T = double is the reference the fast forms
// (lite_la_backward.cpp, mix_ffn_backward.cpp) are tested against; T = float the plain float32
// implementation whose error sets the tests' tolerance.
#include <algorithm>
#include <vector>

#include "sana/sana_internal.hpp"

namespace attn::sana {

template <class T>
void lite_la_backward_plain(const T* dout, const T* x, int64_t batch, int64_t tokens, int64_t C,
                            const LiteLaWeights<T>& w, const LiteLaGradients<T>& g) {
  const int64_t hd = w.head_dim, C3 = 3 * C, N = tokens;
  const T eps = static_cast<T>(w.eps);
  std::fill(g.qkv, g.qkv + C3 * C, T(0));
  std::fill(g.proj, g.proj + C * C, T(0));
  if (!w.proj_bias.empty()) std::fill(g.proj_bias, g.proj_bias + C, T(0));
  std::vector<T> qkv(static_cast<size_t>(N * C3)), o(static_cast<size_t>(N * C)), dO(static_cast<size_t>(N * C));
  std::vector<T> dqkv(static_cast<size_t>(N * C3)), wt(static_cast<size_t>(N * N)), z(static_cast<size_t>(N));
  std::vector<T> dw(static_cast<size_t>(N * N));
  const auto relu = [](T s) { return s > 0 ? s : T(0); };
  for (int64_t b = 0; b < batch; ++b) {
    const T* xb = x + b * N * C;
    const T* dy = dout + b * N * C;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C3; ++c) {
        T s = 0;
        for (int64_t k = 0; k < C; ++k) s += w.qkv.data[c * C + k] * xb[n * C + k];
        qkv[n * C3 + c] = s;
      }
    const auto q = [&](int64_t n, int64_t c) { return qkv[n * C3 + c]; };
    const auto k = [&](int64_t n, int64_t c) { return qkv[n * C3 + C + c]; };
    const auto v = [&](int64_t n, int64_t c) { return qkv[n * C3 + 2 * C + c]; };
    // forward per head: w_ij, z_i, o_i
    for (int64_t h = 0; h < C / hd; ++h)
      for (int64_t i = 0; i < N; ++i) {
        z[i] = 0;
        for (int64_t j = 0; j < N; ++j) {
          T s = 0;
          for (int64_t d = 0; d < hd; ++d) s += relu(q(i, h * hd + d)) * relu(k(j, h * hd + d));
          wt[i * N + j] = s;
          z[i] += s;
        }
        for (int64_t d = 0; d < hd; ++d) {
          T s = 0;
          for (int64_t j = 0; j < N; ++j) s += wt[i * N + j] * v(j, h * hd + d);
          o[i * C + h * hd + d] = s / (z[i] + eps);
        }
      }
    // the output projection: d proj += dy^T o, d bias += dy, dO = dy proj
    for (int64_t c = 0; c < C; ++c)
      for (int64_t e = 0; e < C; ++e) {
        T s = 0;
        for (int64_t n = 0; n < N; ++n) s += dy[n * C + c] * o[n * C + e];
        g.proj[c * C + e] += s;
      }
    if (!w.proj_bias.empty())
      for (int64_t c = 0; c < C; ++c) {
        T s = 0;
        for (int64_t n = 0; n < N; ++n) s += dy[n * C + c];
        g.proj_bias[c] += s;
      }
    for (int64_t n = 0; n < N; ++n)
      for (int64_t e = 0; e < C; ++e) {
        T s = 0;
        for (int64_t c = 0; c < C; ++c) s += dy[n * C + c] * w.proj.data[c * C + e];
        dO[n * C + e] = s;
      }
    // the attention per head (w_ij and z_i again)
    for (int64_t h = 0; h < C / hd; ++h) {
      const int64_t c0 = h * hd;
      for (int64_t i = 0; i < N; ++i) {
        z[i] = 0;
        for (int64_t j = 0; j < N; ++j) {
          T s = 0;
          for (int64_t d = 0; d < hd; ++d) s += relu(q(i, c0 + d)) * relu(k(j, c0 + d));
          wt[i * N + j] = s;
          z[i] += s;
        }
      }
      // dw_ij = dO_i . (v_j - o_i) / (z_i + eps)
      for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < N; ++j) {
          T s = 0;
          for (int64_t d = 0; d < hd; ++d) s += dO[i * C + c0 + d] * (v(j, c0 + d) - o[i * C + c0 + d]);
          dw[i * N + j] = s / (z[i] + eps);
        }
      for (int64_t j = 0; j < N; ++j)
        for (int64_t d = 0; d < hd; ++d) {
          T s = 0;
          for (int64_t i = 0; i < N; ++i) s += wt[i * N + j] * dO[i * C + c0 + d] / (z[i] + eps);
          dqkv[j * C3 + 2 * C + c0 + d] = s;  // dv
        }
      for (int64_t i = 0; i < N; ++i)
        for (int64_t d = 0; d < hd; ++d) {
          T sq = 0, sk = 0;
          for (int64_t j = 0; j < N; ++j) {
            sq += dw[i * N + j] * relu(k(j, c0 + d));
            sk += dw[j * N + i] * relu(q(j, c0 + d));
          }
          dqkv[i * C3 + c0 + d] = q(i, c0 + d) > 0 ? sq : T(0);
          dqkv[i * C3 + C + c0 + d] = k(i, c0 + d) > 0 ? sk : T(0);
        }
    }
    // qkv = x W^T: d W += dqkv^T x, dx = dqkv W
    for (int64_t c = 0; c < C3; ++c)
      for (int64_t e = 0; e < C; ++e) {
        T s = 0;
        for (int64_t n = 0; n < N; ++n) s += dqkv[n * C3 + c] * xb[n * C + e];
        g.qkv[c * C + e] += s;
      }
    for (int64_t n = 0; n < N; ++n)
      for (int64_t e = 0; e < C; ++e) {
        T s = 0;
        for (int64_t c = 0; c < C3; ++c) s += dqkv[n * C3 + c] * w.qkv.data[c * C + e];
        g.x[(b * N + n) * C + e] = s;
      }
  }
}

template <class T>
void mix_ffn_backward_plain(const T* dout, const T* x, int64_t batch, int64_t tokens, int64_t C, int64_t H, int64_t W,
                            int64_t h, const MixFfnWeights<T>& w, const MixFfnGradients<T>& g) {
  const int64_t h2 = 2 * h, N = tokens;
  std::fill(g.inverted, g.inverted + h2 * C, T(0));
  std::fill(g.inverted_bias, g.inverted_bias + h2, T(0));
  std::fill(g.depth, g.depth + h2 * 9, T(0));
  std::fill(g.depth_bias, g.depth_bias + h2, T(0));
  std::fill(g.point, g.point + C * h, T(0));
  std::vector<T> pre(static_cast<size_t>(N * h2)), u(pre.size()), d(pre.size()), dd(pre.size()), du(pre.size());
  const auto inside = [&](int64_t yy, int64_t xs) { return yy >= 0 && yy < H && xs >= 0 && xs < W; };
  for (int64_t b = 0; b < batch; ++b) {
    const T* xb = x + b * N * C;
    const T* dy = dout + b * N * C;
    // forward: pre = x W_in^T + b_in, u = silu(pre), d = dwconv(u) + b_dw
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < h2; ++c) {
        T s = w.inverted_bias[c];
        for (int64_t k = 0; k < C; ++k) s += w.inverted.data[c * C + k] * xb[n * C + k];
        pre[n * h2 + c] = s;
        u[n * h2 + c] = silu(s);
      }
    for (int64_t y = 0; y < H; ++y)
      for (int64_t xx = 0; xx < W; ++xx)
        for (int64_t c = 0; c < h2; ++c) {
          T s = w.depth_bias[c];
          for (int64_t ky = 0; ky < 3; ++ky)
            for (int64_t kx = 0; kx < 3; ++kx)
              if (inside(y + ky - 1, xx + kx - 1))
                s += w.depth.data[c * 9 + ky * 3 + kx] * u[((y + ky - 1) * W + xx + kx - 1) * h2 + c];
          d[(y * W + xx) * h2 + c] = s;
        }
    // out = (a * silu(g)) W_point^T, [a | g] = d
    for (int64_t c = 0; c < C; ++c)
      for (int64_t k = 0; k < h; ++k) {
        T s = 0;
        for (int64_t n = 0; n < N; ++n) s += dy[n * C + c] * (d[n * h2 + k] * silu(d[n * h2 + h + k]));
        g.point[c * h + k] += s;
      }
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < h; ++k) {
        T dg = 0;
        for (int64_t c = 0; c < C; ++c) dg += dy[n * C + c] * w.point.data[c * h + k];
        const T a = d[n * h2 + k], gt = d[n * h2 + h + k];
        dd[n * h2 + k] = dg * silu(gt);
        dd[n * h2 + h + k] = dg * a * silu_grad(gt);
      }
    // the depthwise conv: d b_dw += dd, d tap += dd * the input it read, du = its transpose
    std::fill(du.begin(), du.end(), T(0));
    for (int64_t y = 0; y < H; ++y)
      for (int64_t xx = 0; xx < W; ++xx)
        for (int64_t c = 0; c < h2; ++c) {
          const T e = dd[(y * W + xx) * h2 + c];
          g.depth_bias[c] += e;
          for (int64_t ky = 0; ky < 3; ++ky)
            for (int64_t kx = 0; kx < 3; ++kx)
              if (inside(y + ky - 1, xx + kx - 1)) {
                const int64_t src = ((y + ky - 1) * W + xx + kx - 1) * h2 + c;
                g.depth[c * 9 + ky * 3 + kx] += e * u[src];
                du[src] += e * w.depth.data[c * 9 + ky * 3 + kx];
              }
        }
    // silu, then pre = x W_in^T + b_in
    for (int64_t e = 0; e < N * h2; ++e) du[e] *= silu_grad(pre[e]);
    for (int64_t c = 0; c < h2; ++c) {
      T sb = 0;
      for (int64_t n = 0; n < N; ++n) sb += du[n * h2 + c];
      g.inverted_bias[c] += sb;
      for (int64_t k = 0; k < C; ++k) {
        T s = 0;
        for (int64_t n = 0; n < N; ++n) s += du[n * h2 + c] * xb[n * C + k];
        g.inverted[c * C + k] += s;
      }
    }
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < C; ++k) {
        T s = 0;
        for (int64_t c = 0; c < h2; ++c) s += du[n * h2 + c] * w.inverted.data[c * C + k];
        g.x[(b * N + n) * C + k] = s;
      }
  }
}

template void lite_la_backward_plain<float>(const float*, const float*, int64_t, int64_t, int64_t,
                                            const LiteLaWeights<float>&, const LiteLaGradients<float>&);
template void lite_la_backward_plain<double>(const double*, const double*, int64_t, int64_t, int64_t,
                                             const LiteLaWeights<double>&, const LiteLaGradients<double>&);
template void mix_ffn_backward_plain<float>(const float*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                            int64_t, const MixFfnWeights<float>&, const MixFfnGradients<float>&);
template void mix_ffn_backward_plain<double>(const double*, const double*, int64_t, int64_t, int64_t, int64_t,
                                             int64_t, int64_t, const MixFfnWeights<double>&,
                                             const MixFfnGradients<double>&);

}  // namespace attn::sana
