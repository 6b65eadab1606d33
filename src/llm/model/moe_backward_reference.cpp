// MoE feed-forward backward, the plain form (float64: the reference; float32: the baseline the
// fast form's error is measured against in tests). Per token, with p = softmax(h W_r^T), the
// chosen ids e_i, top = sum_i p_{e_i}, w_i = p_{e_i} / top and o_i = E_{e_i}(h):
//   y = sum_i w_i o_i
//   dw_i = dy . o_i
//   expert e_i with dy_i = w_i dy:  u = W1 h, v = W3 h, s = sigmoid(u), g = u s v, o = W2 g
//     dW2 += dy_i g^T,  dg = W2^T dy_i,  du = dg v s (1 + u (1 - s)),  dv = dg u s
//     dW1 += du h^T,  dW3 += dv h^T,  dh += W1^T du + W3^T dv
//   renormalisation: dp_{e_j} = (dw_j - sum_i dw_i w_i) / top (0 for experts not chosen)
//   aux = 0.001 E sum_e (f_e / n)(sum_t p_te / n):  dp_te += daux 0.001 E f_e / n^2
//   softmax: dr_e = p_e (dp_e - sum_f p_f dp_f);  dW_r += dr h^T,  dh += W_r^T dr
#include <algorithm>
#include <cmath>
#include <new>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/moe.hpp"
#include "base/parallel.hpp"
#include "model/moe.hpp"
#include "model/moe_backward.hpp"
#include "model/moe_top_k.hpp"

namespace attn {
namespace model {

namespace {
constexpr const char* kWhere = "moe_feed_forward_backward";

void check_len(size_t got, int64_t want, const char* name, const char* shape) {
  check_moe_len(got, want, name, shape, kWhere);
}
}  // namespace

template <class T>
void check_moe_backward(const MoeSizes& z, std::span<const T> dy, std::span<const T> x, std::span<const T> router,
                        std::span<const T> w1, std::span<const T> w2, std::span<const T> w3,
                        const MoeGradients<T>& g, int threads) {
  check_moe_sizes(z, threads, kWhere);
  const int64_t n = z.tokens, E = z.experts, d = z.dim, H = z.hidden;
  check_len(dy.size(), n * d, "dy", "tokens x dim");
  check_len(x.size(), n * d, "x", "tokens x dim");
  check_len(router.size(), E * d, "router", "experts x dim");
  check_len(w1.size(), E * H * d, "w1", "experts x hidden x dim");
  check_len(w2.size(), E * d * H, "w2", "experts x dim x hidden");
  check_len(w3.size(), E * H * d, "w3", "experts x hidden x dim");
  check_len(g.dx.size(), n * d, "dx", "tokens x dim");
  check_len(g.drouter.size(), E * d, "drouter", "experts x dim");
  check_len(g.dw1.size(), E * H * d, "dw1", "experts x hidden x dim");
  check_len(g.dw2.size(), E * d * H, "dw2", "experts x dim x hidden");
  check_len(g.dw3.size(), E * H * d, "dw3", "experts x hidden x dim");
  const std::pair<std::span<const T>, const char*> ins[] = {{dy, "dy"}, {x, "x"}, {router, "router"},
                                                            {w1, "w1"}, {w2, "w2"}, {w3, "w3"}};
  const std::pair<std::span<T>, const char*> outs[] = {
      {g.dx, "dx"}, {g.drouter, "drouter"}, {g.dw1, "dw1"}, {g.dw2, "dw2"}, {g.dw3, "dw3"}};
  for (const auto& [o, on] : outs) {
    if (o.empty()) continue;
    for (const auto& [i, in] : ins)
      if (!i.empty() && o.data() < i.data() + i.size() && i.data() < o.data() + o.size())
        fail(kWhere, std::string(on) + " must not overlap " + in);
    for (const auto& [o2, on2] : outs)
      if (o2.data() != o.data() && !o2.empty() && o.data() < o2.data() + o2.size() && o2.data() < o.data() + o.size())
        fail(kWhere, std::string(on) + " must not overlap " + on2);
  }
}

template <class T>
void moe_backward_plain(const MoeSizes& z, const T* dy, double daux, const T* x, const T* router, const T* w1,
                        const T* w2, const T* w3, T* dx, T* drouter, T* dw1, T* dw2, T* dw3) {
  const int64_t n = z.tokens, E = z.experts, d = z.dim, H = z.hidden, k = z.top_k;
  std::fill(dx, dx + n * d, T(0));
  std::fill(drouter, drouter + E * d, T(0));
  std::fill(dw1, dw1 + E * H * d, T(0));
  std::fill(dw2, dw2 + E * d * H, T(0));
  std::fill(dw3, dw3 + E * H * d, T(0));
  if (n == 0) return;
  // Pass 1: every token's routing (the aux gradient needs the counts f_e over all tokens).
  std::vector<T> probs(static_cast<size_t>(n * E));
  std::vector<int32_t> ids(static_cast<size_t>(n * k));
  std::vector<double> f(static_cast<size_t>(E), 0.0);
  for (int64_t t = 0; t < n; ++t) {
    T* p = probs.data() + t * E;
    for (int64_t e = 0; e < E; ++e) {
      T r = 0;
      for (int64_t c = 0; c < d; ++c) r += router[e * d + c] * x[t * d + c];
      p[e] = r;
    }
    T mx = p[0];
    for (int64_t e = 1; e < E; ++e) mx = std::isnan(p[e]) || p[e] > mx ? p[e] : mx;
    T sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(p[e] - mx);
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
    moe_top_k(p, E, k, ids.data() + t * k);
    for (int64_t i = 0; i < k; ++i) f[static_cast<size_t>(ids[static_cast<size_t>(t * k + i)])] += 1.0;
  }
  // Pass 2: token by token.
  std::vector<T> u(static_cast<size_t>(H)), v(u.size()), s(u.size()), g(u.size()), dg(u.size()), o(static_cast<size_t>(d)),
      dyi(o.size()), dw(static_cast<size_t>(k)), dp(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t) {
    const T* h = x + t * d;
    const T* dyt = dy + t * d;
    T* dh = dx + t * d;
    const T* p = probs.data() + t * E;
    const int32_t* id = ids.data() + t * k;
    T top = 0;
    for (int64_t i = 0; i < k; ++i) top += p[id[i]];
    for (int64_t i = 0; i < k; ++i) {
      const int64_t e = id[i];
      const T wi = p[e] / top;
      const T* a = w1 + e * H * d;
      const T* b = w3 + e * H * d;
      const T* m2 = w2 + e * d * H;
      for (int64_t j = 0; j < H; ++j) {
        T uj = 0, vj = 0;
        for (int64_t c = 0; c < d; ++c) uj += a[j * d + c] * h[c], vj += b[j * d + c] * h[c];
        u[j] = uj, v[j] = vj;
        s[j] = T(1) / (T(1) + std::exp(-uj));
        g[j] = uj * s[j] * vj;
      }
      T dwi = 0;
      for (int64_t c = 0; c < d; ++c) {
        T oc = 0;
        for (int64_t j = 0; j < H; ++j) oc += m2[c * H + j] * g[j];
        dwi += dyt[c] * oc;
        dyi[c] = wi * dyt[c];
      }
      dw[i] = dwi;
      for (int64_t c = 0; c < d; ++c)
        for (int64_t j = 0; j < H; ++j) dw2[e * d * H + c * H + j] += dyi[c] * g[j];
      for (int64_t j = 0; j < H; ++j) {
        T acc = 0;
        for (int64_t c = 0; c < d; ++c) acc += m2[c * H + j] * dyi[c];
        dg[j] = acc;
      }
      for (int64_t j = 0; j < H; ++j) {
        const T du = dg[j] * v[j] * s[j] * (T(1) + u[j] * (T(1) - s[j]));
        const T dv = dg[j] * u[j] * s[j];
        for (int64_t c = 0; c < d; ++c) {
          dw1[e * H * d + j * d + c] += du * h[c];
          dw3[e * H * d + j * d + c] += dv * h[c];
          dh[c] += a[j * d + c] * du + b[j * d + c] * dv;
        }
      }
    }
    T mean = 0;  // sum_i dw_i w_i
    for (int64_t i = 0; i < k; ++i) mean += dw[i] * (p[id[i]] / top);
    std::fill(dp.begin(), dp.end(), T(0));
    for (int64_t i = 0; i < k; ++i) dp[static_cast<size_t>(id[i])] = (dw[i] - mean) / top;
    const double aux_scale = daux * kMoeAuxCoefficient * double(E) / (double(n) * double(n));
    for (int64_t e = 0; e < E; ++e) dp[static_cast<size_t>(e)] += T(aux_scale * f[static_cast<size_t>(e)]);
    T pdp = 0;
    for (int64_t e = 0; e < E; ++e) pdp += p[e] * dp[static_cast<size_t>(e)];
    for (int64_t e = 0; e < E; ++e) {
      const T dr = p[e] * (dp[static_cast<size_t>(e)] - pdp);
      for (int64_t c = 0; c < d; ++c) {
        drouter[e * d + c] += dr * h[c];
        dh[c] += router[e * d + c] * dr;
      }
    }
  }
}

template void check_moe_backward<float>(const MoeSizes&, std::span<const float>, std::span<const float>,
                                        std::span<const float>, std::span<const float>, std::span<const float>,
                                        std::span<const float>, const MoeGradients<float>&, int);
template void check_moe_backward<double>(const MoeSizes&, std::span<const double>, std::span<const double>,
                                         std::span<const double>, std::span<const double>, std::span<const double>,
                                         std::span<const double>, const MoeGradients<double>&, int);
template void moe_backward_plain<float>(const MoeSizes&, const float*, double, const float*, const float*,
                                        const float*, const float*, const float*, float*, float*, float*, float*,
                                        float*);
template void moe_backward_plain<double>(const MoeSizes&, const double*, double, const double*, const double*,
                                         const double*, const double*, const double*, double*, double*, double*,
                                         double*, double*);

}  // namespace model

void moe_feed_forward_backward(const MoeSizes& z, std::span<const double> dy, double daux, std::span<const double> x,
                               std::span<const double> router, std::span<const double> w1,
                               std::span<const double> w2, std::span<const double> w3,
                               const MoeGradients<double>& g, int threads) try {
  model::check_moe_backward(z, dy, x, router, w1, w2, w3, g, threads);
  model::moe_backward_plain(z, dy.data(), daux, x.data(), router.data(), w1.data(), w2.data(), w3.data(), g.dx.data(),
                            g.drouter.data(), g.dw1.data(), g.dw2.data(), g.dw3.data());
} catch (const std::bad_alloc&) {
  fail(model::kWhere, "out of memory while running the float64 reference backward on " + std::to_string(z.tokens) +
                          " tokens");
}

}  // namespace attn
