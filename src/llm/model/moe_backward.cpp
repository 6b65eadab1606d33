// MoE feed-forward backward, the float32 gathered form (include/attn/moe.hpp states the contract,
// model/moe_backward_reference.cpp the formulas). It re-runs the forward (model::moe_forward) for
// its routing, its gathered inputs Xt (dim, S) and the experts' outputs Yt (dim, S), then:
//   1. per token (blocks of tokens): dw_i = dy . Yt[:, slot_i], the renormalisation and softmax
//      backward into dr (n, E); the scaled dY_i = w_i dy scattered into DYt (dim, S);
//   2. per (expert, block of 64 hidden rows): U = W1 Xt, V = W3 Xt, G = silu(U) V (kept token-major
//      for step 3), dG = W2^T DYt, dU = dG V silu'(U), dV = dG silu(U), and the rows of
//      dW1 = dU X^T and dW3 = dV X^T (X: the same tokens token-major);
//   3. per (expert, block of 64 model channels): the rows of dW2 = DYt G^T and of
//      dXt = W1^T dU + W3^T dV;
//   4. per block of channels: dx[t] = sum_i dXt[:, slot_i] + W_r^T dr_t, and dW_r = dr^T x.
// Every product is the kernel table's gemm with fixed sizes and a fixed summation order, and every
// value is written by one item: the same bits for any thread count. Scratch is sized before the
// parallel regions. Padding columns stay zero in DYt, so they add nothing.
#include <algorithm>
#include <cmath>
#include <new>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/moe.hpp"
#include "base/parallel.hpp"
#include "kernels/kernel_table.hpp"
#include "model/moe.hpp"
#include "model/moe_backward.hpp"

namespace attn {
namespace {

constexpr int64_t kRows = 64;       // a work item: 64 weight rows of one expert
constexpr int64_t kTokens = 16;     // tokens per routing item
constexpr int64_t kChannels = 16;   // channels per combine item

struct Work {
  std::vector<float> y, dr, dyt, xg, gtok, du, dv, dxt, tmp;
  std::vector<int64_t> items;
};

}  // namespace

void moe_feed_forward_backward(const MoeSizes& z, std::span<const float> dy, double daux, std::span<const float> x,
                               std::span<const float> router, std::span<const float> w1, std::span<const float> w2,
                               std::span<const float> w3, const MoeGradients<float>& g, int threads) try {
  model::check_moe_backward(z, dy, x, router, w1, w2, w3, g, threads);
  const int64_t n = z.tokens, E = z.experts, d = z.dim, H = z.hidden, k = z.top_k;
  std::fill(g.dx.begin(), g.dx.end(), 0.0f);
  std::fill(g.drouter.begin(), g.drouter.end(), 0.0f);
  std::fill(g.dw1.begin(), g.dw1.end(), 0.0f);
  std::fill(g.dw2.begin(), g.dw2.end(), 0.0f);
  std::fill(g.dw3.begin(), g.dw3.end(), 0.0f);
  if (n == 0) return;
  const Isa isa = active_isa();
  const kernels::TileKernels& kern = kernels::kernels_for(isa);

  // 0. The forward: routing, Xt, Yt (model::moe_forward's scratch).
  auto bytes = [](const float* p) { return reinterpret_cast<const uint8_t*>(p); };
  model::MoeExperts mw;
  mw.router = model::matrix_over(bytes(router.data()), DType::f32, E, d);
  for (int64_t e = 0; e < E; ++e) {
    mw.w1.push_back(model::matrix_over(bytes(w1.data() + e * H * d), DType::f32, H, d));
    mw.w3.push_back(model::matrix_over(bytes(w3.data() + e * H * d), DType::f32, H, d));
    mw.w2.push_back(model::matrix_over(bytes(w2.data() + e * d * H), DType::f32, d, H));
  }
  model::MoeScratch s;
  Work w;
  w.y.resize(static_cast<size_t>(n * d));
  model::moe_forward(x.data(), n, mw, k, w.y.data(), threads, isa, s);
  const float* probs = s.logits.data();  // the softmax, in place of the logits
  const int32_t* ids = s.ids.data();
  const float* rw = s.route_w.data();
  const int64_t* slot = s.slot.data();
  const int64_t* off = s.offset.data();
  const int64_t S = off[E];
  const float* xt = s.xt.data();
  const float* yt = s.yt.data();
  int64_t widest = 1;
  for (int64_t e = 0; e < E; ++e) widest = std::max(widest, off[e + 1] - off[e]);
  std::vector<double> f(static_cast<size_t>(E), 0.0);
  for (int64_t i = 0; i < n * k; ++i) f[static_cast<size_t>(ids[i])] += 1.0;
  std::vector<float> aux_dp(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    aux_dp[static_cast<size_t>(e)] =
        float(daux * kMoeAuxCoefficient * double(E) * f[static_cast<size_t>(e)] / (double(n) * double(n)));

  w.dr.resize(static_cast<size_t>(n * E));
  w.dyt.assign(static_cast<size_t>(d * S), 0.0f);
  w.xg.assign(static_cast<size_t>(S * d), 0.0f);
  w.gtok.assign(static_cast<size_t>(S * H), 0.0f);
  w.du.assign(static_cast<size_t>(H * S), 0.0f);
  w.dv.assign(static_cast<size_t>(H * S), 0.0f);
  w.dxt.assign(static_cast<size_t>(d * S), 0.0f);
  float* dr = w.dr.data();
  float* dyt = w.dyt.data();
  float* xg = w.xg.data();
  float* gtok = w.gtok.data();
  float* dU = w.du.data();
  float* dV = w.dv.data();
  float* dxt = w.dxt.data();

  // 1. Routing backward per token; DYt and the token-major gather X (S, d).
  const int64_t token_items = (n + kTokens - 1) / kTokens;
  parallel_for(token_items, resolve_threads(threads, token_items), [&](int64_t b, int) {
    for (int64_t t = b * kTokens; t < std::min(n, (b + 1) * kTokens); ++t) {
      const float* dyr = dy.data() + t * d;
      const float* p = probs + t * E;
      float* drt = dr + t * E;
      for (int64_t e = 0; e < E; ++e) drt[e] = aux_dp[static_cast<size_t>(e)];  // dp, then dr in place
      float top = 0, mean = 0;
      for (int64_t i = 0; i < k; ++i) top += p[ids[t * k + i]];
      float dwv[64];  // k <= E; chunks of 64 choices below keep this on the stack
      for (int64_t i0 = 0; i0 < k; i0 += 64) {
        for (int64_t i = i0; i < std::min(k, i0 + 64); ++i) {
          const int64_t col = slot[t * k + i];
          float acc = 0;
          for (int64_t c = 0; c < d; ++c) acc += dyr[c] * yt[c * S + col];
          dwv[i - i0] = acc;
          mean += acc * rw[t * k + i];
        }
        for (int64_t i = i0; i < std::min(k, i0 + 64); ++i) drt[ids[t * k + i]] += dwv[i - i0] / top;
      }
      for (int64_t i = 0; i < k; ++i) drt[ids[t * k + i]] -= mean / top;
      float pdp = 0;
      for (int64_t e = 0; e < E; ++e) pdp += p[e] * drt[e];
      for (int64_t e = 0; e < E; ++e) drt[e] = p[e] * (drt[e] - pdp);
      for (int64_t i = 0; i < k; ++i) {
        const int64_t col = slot[t * k + i];
        const float wi = rw[t * k + i];
        for (int64_t c = 0; c < d; ++c) dyt[c * S + col] = wi * dyr[c];
        std::copy(x.data() + t * d, x.data() + (t + 1) * d, xg + col * d);
      }
    }
  });

  // 2 and 3: items (expert, block of rows), wider experts first; nt threads at most (tmp's slices).
  const int nt = resolve_threads(threads, E * ((std::max(H, d) + kRows - 1) / kRows));
  auto run_items = [&](int64_t rows, auto&& body) {
    const int64_t blocks = (rows + kRows - 1) / kRows;
    w.items.clear();
    for (int64_t e = 0; e < E; ++e)
      if (off[e + 1] > off[e])
        for (int64_t b = 0; b < blocks; ++b) w.items.push_back(e * blocks + b);
    std::stable_sort(w.items.begin(), w.items.end(), [&](int64_t a, int64_t b) {
      return off[a / blocks + 1] - off[a / blocks] > off[b / blocks + 1] - off[b / blocks];
    });
    const int64_t* items = w.items.data();
    const int64_t count = static_cast<int64_t>(w.items.size());
    parallel_for(count, std::min(nt, resolve_threads(threads, count)), [&](int64_t i, int thread) {
      const int64_t e = items[i] / blocks, j0 = items[i] % blocks * kRows;
      body(e, j0, std::min(kRows, rows - j0), thread);
    });
  };
  const int64_t per_thread = 3 * kRows * widest;
  w.tmp.resize(static_cast<size_t>(per_thread * std::max(nt, 1)));
  run_items(H, [&](int64_t e, int64_t j0, int64_t nj, int thread) {
    const int64_t c0 = off[e], m = off[e + 1] - c0;
    float* u = w.tmp.data() + thread * per_thread;  // (nj, m) each
    float* v = u + kRows * widest;
    float* dg = v + kRows * widest;
    const float* a1 = w1.data() + e * H * d + j0 * d;
    const float* a3 = w3.data() + e * H * d + j0 * d;
    const float* a2 = w2.data() + e * d * H + j0;  // column j0 of W2 (d, H)
    kern.gemm(nj, m, d, a1, d, 1, xt + c0, S, u, m, false);
    kern.gemm(nj, m, d, a3, d, 1, xt + c0, S, v, m, false);
    kern.gemm(nj, m, d, a2, 1, H, dyt + c0, S, dg, m, false);  // W2^T rows j0.. times DYt
    for (int64_t j = 0; j < nj; ++j)
      for (int64_t c = 0; c < m; ++c) {
        const float uu = u[j * m + c], vv = v[j * m + c], gg = dg[j * m + c];
        const float sg = 1.0f / (1.0f + std::exp(-uu));
        gtok[(c0 + c) * H + j0 + j] = uu * sg * vv;
        dU[(j0 + j) * S + c0 + c] = gg * vv * sg * (1.0f + uu * (1.0f - sg));
        dV[(j0 + j) * S + c0 + c] = gg * uu * sg;
      }
    kern.gemm(nj, d, m, dU + j0 * S + c0, S, 1, xg + c0 * d, d, g.dw1.data() + e * H * d + j0 * d, d, false);
    kern.gemm(nj, d, m, dV + j0 * S + c0, S, 1, xg + c0 * d, d, g.dw3.data() + e * H * d + j0 * d, d, false);
  });
  run_items(d, [&](int64_t e, int64_t r0, int64_t nr, int) {
    const int64_t c0 = off[e], m = off[e + 1] - c0;
    kern.gemm(nr, H, m, dyt + r0 * S + c0, S, 1, gtok + c0 * H, H, g.dw2.data() + e * d * H + r0 * H, H, false);
    kern.gemm(nr, m, H, w1.data() + e * H * d + r0, 1, d, dU + c0, S, dxt + r0 * S + c0, S, false);
    kern.gemm(nr, m, H, w3.data() + e * H * d + r0, 1, d, dV + c0, S, dxt + r0 * S + c0, S, true);
  });

  // 4. dx and dW_r per block of channels.
  const int64_t channel_items = (d + kChannels - 1) / kChannels;
  parallel_for(channel_items, resolve_threads(threads, channel_items), [&](int64_t b, int) {
    const int64_t c0 = b * kChannels, c1 = std::min(d, c0 + kChannels);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = c0; c < c1; ++c) {
        float acc = 0;
        for (int64_t i = 0; i < k; ++i) acc += dxt[c * S + slot[t * k + i]];
        for (int64_t e = 0; e < E; ++e) acc += router[static_cast<size_t>(e * d + c)] * dr[t * E + e];
        g.dx[static_cast<size_t>(t * d + c)] = acc;
      }
    kern.gemm(E, c1 - c0, n, dr, 1, E, x.data() + c0, d, g.drouter.data() + c0, d, false);
  });
} catch (const std::bad_alloc&) {
  fail("moe_feed_forward_backward", "out of memory while running " + std::to_string(z.tokens) + " tokens back through " +
                                        std::to_string(z.experts) + " experts");
}

}  // namespace attn
