// SANA's float64 references: LiteLA with its N x N weights written out per head, and
// Mix-FFN as loops over pixels, channels and taps. The float forms (sana.cpp) are tested against them.
#include <algorithm>
#include <vector>

#include "sana/sana_internal.hpp"

namespace attn::sana {

void lite_la_reference(const double* x, int64_t batch, int64_t tokens, int64_t C, const LiteLaWeights<double>& w,
                       double* out) {
  const int64_t hd = w.head_dim;
  std::vector<double> qkv(static_cast<size_t>(tokens * 3 * C)), o(static_cast<size_t>(tokens * C));
  std::vector<double> wt(static_cast<size_t>(tokens));
  for (int64_t b = 0; b < batch; ++b) {
    const double* xb = x + b * tokens * C;
    for (int64_t n = 0; n < tokens; ++n)
      for (int64_t c = 0; c < 3 * C; ++c) {
        double s = 0;
        for (int64_t k = 0; k < C; ++k) s += w.qkv.data[c * C + k] * xb[n * C + k];
        qkv[n * 3 * C + c] = s;
      }
    for (int64_t h = 0; h < C / hd; ++h)
      for (int64_t i = 0; i < tokens; ++i) {
        double z = 0;
        for (int64_t j = 0; j < tokens; ++j) {
          double s = 0;
          for (int64_t d = 0; d < hd; ++d)
            s += std::max(qkv[i * 3 * C + h * hd + d], 0.0) * std::max(qkv[j * 3 * C + C + h * hd + d], 0.0);
          wt[j] = s;
          z += s;
        }
        for (int64_t d = 0; d < hd; ++d) {
          double s = 0;
          for (int64_t j = 0; j < tokens; ++j) s += wt[j] * qkv[j * 3 * C + 2 * C + h * hd + d];
          o[i * C + h * hd + d] = s / (z + w.eps);
        }
      }
    for (int64_t n = 0; n < tokens; ++n)
      for (int64_t c = 0; c < C; ++c) {
        double s = w.proj_bias.empty() ? 0.0 : w.proj_bias[c];
        for (int64_t k = 0; k < C; ++k) s += w.proj.data[c * C + k] * o[n * C + k];
        out[(b * tokens + n) * C + c] = s;
      }
  }
}

void mix_ffn_reference(const double* x, int64_t batch, int64_t tokens, int64_t C, int64_t H, int64_t W, int64_t h,
                       const MixFfnWeights<double>& w, double* out) {
  const int64_t h2 = 2 * h;
  std::vector<double> u(static_cast<size_t>(tokens * h2)), d(static_cast<size_t>(h2));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t n = 0; n < tokens; ++n)
      for (int64_t c = 0; c < h2; ++c) {
        double s = w.inverted_bias[c];
        for (int64_t k = 0; k < C; ++k) s += w.inverted.data[c * C + k] * x[(b * tokens + n) * C + k];
        u[n * h2 + c] = silu(s);
      }
    for (int64_t y = 0; y < H; ++y)
      for (int64_t xx = 0; xx < W; ++xx) {
        for (int64_t c = 0; c < h2; ++c) {
          double s = w.depth_bias[c];
          for (int64_t ky = 0; ky < 3; ++ky)
            for (int64_t kx = 0; kx < 3; ++kx) {
              const int64_t yy = y + ky - 1, xs = xx + kx - 1;
              if (yy >= 0 && yy < H && xs >= 0 && xs < W)
                s += w.depth.data[c * 9 + ky * 3 + kx] * u[(yy * W + xs) * h2 + c];
            }
          d[c] = s;
        }
        for (int64_t c = 0; c < C; ++c) {
          double s = 0;
          for (int64_t k = 0; k < h; ++k) s += w.point.data[c * h + k] * (d[k] * silu(d[h + k]));
          out[(b * tokens + y * W + xx) * C + c] = s;
        }
      }
  }
}

}  // namespace attn::sana
