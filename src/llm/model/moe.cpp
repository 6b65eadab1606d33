// Mixture-of-experts feed-forward (MiniMax-01): the gathered float32 form (model/moe.hpp), the
// public entry points and the float64 per-token reference.
#include "model/moe.hpp"
#include "model/moe_top_k.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <string>

#include "attn/error.hpp"
#include "attn/moe.hpp"
#include "base/parallel.hpp"
#include "kernels/kernel_table.hpp"
#include "model/ops.hpp"

namespace attn {
namespace {

constexpr const char* kWhere = "moe_feed_forward";
constexpr int64_t kRowsOfW = 64;   // a work item: 64 weight rows of one expert
constexpr int64_t kPad = 16;       // an expert's columns are padded to a multiple of this
constexpr int64_t kRouteRows = 16; // tokens per router work item
constexpr int64_t kChannels = 16;  // channels per gather / combine work item

// 0.001 · E · sum_e f_e P_e from the routing (f_e: share of tokens with e in their top-k; P_e:
// mean p_e), in double, in a fixed order.
template <class T>
double aux_loss(const T* probs, const int32_t* ids, int64_t n, int64_t E, int64_t k) {
  if (n == 0) return 0.0;
  double total = 0;
  std::vector<double> f(static_cast<size_t>(E), 0.0), P(static_cast<size_t>(E), 0.0);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t e = 0; e < E; ++e) P[static_cast<size_t>(e)] += static_cast<double>(probs[t * E + e]);
    for (int64_t i = 0; i < k; ++i) f[static_cast<size_t>(ids[t * k + i])] += 1.0;
  }
  for (int64_t e = 0; e < E; ++e) total += (f[static_cast<size_t>(e)] / n) * (P[static_cast<size_t>(e)] / n);
  return kMoeAuxCoefficient * static_cast<double>(E) * total;
}

}  // namespace

namespace model {

double moe_forward(const float* x, int64_t n, const MoeExperts& w, int64_t k, float* y, int threads, Isa isa,
                   MoeScratch& s, int32_t* ids_out, float* weights_out, float* probs_out) {
  const int64_t E = w.experts(), d = w.dim(), H = w.hidden();
  if (n == 0) return 0.0;
  const kernels::TileKernels& kern = kernels::kernels_for(isa);

  // 1. Router logits and softmax (float32), top-k, renormalised weights.
  s.logits.resize(static_cast<size_t>(n * E));
  s.ids.resize(static_cast<size_t>(n * k));
  s.route_w.resize(static_cast<size_t>(n * k));
  float* logits = s.logits.data();
  int32_t* ids = s.ids.data();
  float* rw = s.route_w.data();
  const int64_t route_items = (n + kRouteRows - 1) / kRouteRows;
  parallel_for(route_items, resolve_threads(threads, route_items), [&](int64_t b, int) {
    const int64_t t0 = b * kRouteRows, m = std::min(kRouteRows, n - t0);
    kern.qk_rows(x + t0 * d, m, d, w.router.row_ptrs.data(), w.router.dtype, E, logits + t0 * E, E, nullptr, 0);
    for (int64_t t = t0; t < t0 + m; ++t) {
      float* p = logits + t * E;
      float mx = p[0];
      for (int64_t e = 1; e < E; ++e) mx = std::isnan(p[e]) || p[e] > mx ? p[e] : mx;
      float sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(p[e] - mx);
      for (int64_t e = 0; e < E; ++e) p[e] /= sum;
      int32_t* id = ids + t * k;
      moe_top_k(p, E, k, id);
      float top = 0;
      for (int64_t i = 0; i < k; ++i) top += p[id[i]];
      for (int64_t i = 0; i < k; ++i) rw[t * k + i] = p[id[i]] / top;
    }
  });
  const double aux = aux_loss(logits, ids, n, E, k);
  if (ids_out) std::copy(ids, ids + n * k, ids_out);
  if (weights_out) std::copy(rw, rw + n * k, weights_out);
  if (probs_out) std::copy(logits, logits + n * E, probs_out);

  // 2. Columns per expert (padded), each (token, choice)'s column, in token order per expert.
  s.count.assign(static_cast<size_t>(E), 0);
  s.offset.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t i = 0; i < n * k; ++i) ++s.count[static_cast<size_t>(ids[i])];
  int64_t widest = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t padded = (s.count[static_cast<size_t>(e)] + kPad - 1) / kPad * kPad;
    s.offset[static_cast<size_t>(e + 1)] = s.offset[static_cast<size_t>(e)] + padded;
    widest = std::max(widest, padded);
  }
  const int64_t S = s.offset[static_cast<size_t>(E)];
  s.slot.resize(static_cast<size_t>(n * k));
  std::vector<int64_t>& fill = s.count;  // reused as the next free column of each expert
  for (int64_t e = 0; e < E; ++e) fill[static_cast<size_t>(e)] = s.offset[static_cast<size_t>(e)];
  for (int64_t i = 0; i < n * k; ++i) s.slot[static_cast<size_t>(i)] = fill[static_cast<size_t>(ids[i])]++;
  const int64_t* slot = s.slot.data();

  // 3. Gather: Xt[c][slot] = x[t][c] (padding columns zero).
  s.xt.assign(static_cast<size_t>(d * S), 0.0f);
  s.gt.resize(static_cast<size_t>(H * S));
  s.yt.resize(static_cast<size_t>(d * S));
  float* xt = s.xt.data();
  float* gt = s.gt.data();
  float* yt = s.yt.data();
  const int64_t channel_items = (d + kChannels - 1) / kChannels;
  parallel_for(channel_items, resolve_threads(threads, channel_items), [&](int64_t b, int) {
    const int64_t c0 = b * kChannels, c1 = std::min(d, c0 + kChannels);
    for (int64_t i = 0; i < n * k; ++i) {
      const float* xr = x + (i / k) * d;
      for (int64_t c = c0; c < c1; ++c) xt[c * S + slot[i]] = xr[c];
    }
  });

  // 4. Experts: items (expert, block of 64 weight rows), larger experts first.
  const int nt = resolve_threads(threads, E * ((std::max(H, d) + kRowsOfW - 1) / kRowsOfW));
  const int64_t panel = kRowsOfW * std::max(H, d);
  s.panels.resize(static_cast<size_t>(panel * nt));
  s.tmp.resize(static_cast<size_t>(kRowsOfW * std::max<int64_t>(widest, 1) * nt));
  // A block of rows as float32 row-major (cols apart): in place when stored so, else converted.
  auto rows_of = [&](const Matrix& m, int64_t j0, int64_t nj, int thread) -> const float* {
    const float* first = static_cast<const float*>(m.row(j0));
    bool in_place = m.dtype == DType::f32 && !m.quant;
    for (int64_t j = 1; in_place && j < nj; ++j) in_place = m.row(j0 + j) == first + j * m.cols;
    if (in_place) return first;
    float* p = s.panels.data() + thread * panel;
    for (int64_t j = 0; j < nj; ++j) kern.to_float(m.row(j0 + j), m.dtype, 1, m.cols, p + j * m.cols);
    return p;
  };
  auto run_items = [&](int64_t rows, auto&& body) {
    const int64_t blocks = (rows + kRowsOfW - 1) / kRowsOfW;
    s.items.clear();
    for (int64_t e = 0; e < E; ++e)
      if (s.offset[static_cast<size_t>(e + 1)] > s.offset[static_cast<size_t>(e)] && !s.few[static_cast<size_t>(e)])
        for (int64_t b = 0; b < blocks; ++b) s.items.push_back(e * blocks + b);
    std::stable_sort(s.items.begin(), s.items.end(), [&](int64_t a, int64_t b) {
      const auto width = [&](int64_t item) {
        const size_t e = static_cast<size_t>(item / blocks);
        return s.offset[e + 1] - s.offset[e];
      };
      return width(a) > width(b);
    });
    const int64_t* items = s.items.data();
    const int64_t count = static_cast<int64_t>(s.items.size());
    parallel_for(count, std::min(nt, resolve_threads(threads, count)), [&](int64_t i, int thread) {
      const int64_t e = items[i] / blocks, j0 = items[i] % blocks * kRowsOfW;
      body(e, j0, std::min(kRowsOfW, rows - j0), thread);
    });
  };
  // Experts with fewer than kPad tokens: token-major rows through model::matmul (each weight row
  // read once, as a decode step's dense products), then written into their columns of Yt.
  s.few_x.resize(static_cast<size_t>(kPad * d)), s.few_y.resize(static_cast<size_t>(kPad * d));
  s.few_g.resize(static_cast<size_t>(kPad * H)), s.few_u.resize(static_cast<size_t>(kPad * H));
  std::vector<char>& few = s.few;
  few.assign(static_cast<size_t>(E), 0);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t c0 = s.offset[static_cast<size_t>(e)], m = fill[static_cast<size_t>(e)] - c0;  // its tokens
    if (m == 0 || m >= kPad) continue;
    few[static_cast<size_t>(e)] = 1;
    for (int64_t i = 0, r = 0; i < n * k; ++i)
      if (ids[i] == e) std::copy(x + (i / k) * d, x + (i / k + 1) * d, s.few_x.data() + (r++) * d);
    matmul_many(s.few_x.data(), m, {{&w.w1[static_cast<size_t>(e)], s.few_g.data()}, {&w.w3[static_cast<size_t>(e)], s.few_u.data()}},
                threads, isa);
    for (int64_t i = 0; i < m * H; ++i) s.few_g[static_cast<size_t>(i)] = silu(s.few_g[static_cast<size_t>(i)]) * s.few_u[static_cast<size_t>(i)];
    matmul(s.few_g.data(), m, w.w2[static_cast<size_t>(e)], s.few_y.data(), threads, isa);
    for (int64_t r = 0; r < m; ++r)  // the rows were gathered in slot order: row r is column c0 + r
      for (int64_t c = 0; c < d; ++c) yt[c * S + c0 + r] = s.few_y[static_cast<size_t>(r * d + c)];
  }
  run_items(H, [&](int64_t e, int64_t j0, int64_t nj, int thread) {
    const int64_t c0 = s.offset[static_cast<size_t>(e)], m = s.offset[static_cast<size_t>(e + 1)] - c0;
    float* tmp = s.tmp.data() + thread * kRowsOfW * widest;
    float* g = gt + j0 * S + c0;
    kern.gemm(nj, m, d, rows_of(w.w1[static_cast<size_t>(e)], j0, nj, thread), d, 1, xt + c0, S, g, S, false);
    kern.gemm(nj, m, d, rows_of(w.w3[static_cast<size_t>(e)], j0, nj, thread), d, 1, xt + c0, S, tmp, m, false);
    for (int64_t j = 0; j < nj; ++j)
      for (int64_t c = 0; c < m; ++c) g[j * S + c] = silu(g[j * S + c]) * tmp[j * m + c];
  });
  run_items(d, [&](int64_t e, int64_t j0, int64_t nj, int thread) {
    const int64_t c0 = s.offset[static_cast<size_t>(e)], m = s.offset[static_cast<size_t>(e + 1)] - c0;
    kern.gemm(nj, m, H, rows_of(w.w2[static_cast<size_t>(e)], j0, nj, thread), H, 1, gt + c0, S, yt + j0 * S + c0, S,
              false);
  });

  // 5. Combine: y[t][c] = sum_i w[t][i] Yt[c][slot(t, i)], in top-k order.
  parallel_for(channel_items, resolve_threads(threads, channel_items), [&](int64_t b, int) {
    const int64_t c0 = b * kChannels, c1 = std::min(d, c0 + kChannels);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = c0; c < c1; ++c) {
        float acc = 0;
        for (int64_t i = 0; i < k; ++i) acc += rw[t * k + i] * yt[c * S + slot[t * k + i]];
        y[t * d + c] = acc;
      }
  });
  return aux;
}

void check_moe_sizes(const MoeSizes& z, int threads, const char* where) {
  auto at_least = [&](int64_t v, int64_t lo, const char* name) {
    if (v < lo) fail(where, std::string(name) + " must be >= " + std::to_string(lo) + ", got " + std::to_string(v));
  };
  at_least(z.tokens, 0, "tokens");
  at_least(z.dim, 1, "dim");
  at_least(z.experts, 1, "experts");
  at_least(z.hidden, 1, "hidden");
  if (z.experts > INT32_MAX) fail(where, "experts must fit int32 ids, got " + std::to_string(z.experts));
  if (z.top_k < 1 || z.top_k > z.experts)
    fail(where, "top_k must be in [1, experts = " + std::to_string(z.experts) + "], got " + std::to_string(z.top_k));
  if (threads < 0 || threads > kMaxThreads)
    fail(where, "threads must be in [0, " + std::to_string(kMaxThreads) + "], got " + std::to_string(threads));
}

void check_moe_len(size_t got, int64_t want, const char* name, const std::string& shape, const char* where) {
  if (static_cast<int64_t>(got) != want)
    fail(where, std::string(name) + " must hold " + shape + " = " + std::to_string(want) + " values, got " +
                    std::to_string(got));
}

}  // namespace model

namespace {

void check_sizes(const MoeSizes& z, int threads) { model::check_moe_sizes(z, threads, kWhere); }

void check_len(size_t got, int64_t want, const char* name, const std::string& shape) {
  model::check_moe_len(got, want, name, shape, kWhere);
}

template <class T>
void check_spans(const MoeSizes& z, std::span<const T> x, std::span<const T> router, std::span<const T> w1,
                 std::span<const T> w2, std::span<const T> w3, std::span<T> y) {
  const int64_t E = z.experts, d = z.dim, H = z.hidden;
  check_len(x.size(), z.tokens * d, "x", "tokens x dim");
  check_len(router.size(), E * d, "router", "experts x dim");
  check_len(w1.size(), E * H * d, "w1", "experts x hidden x dim");
  check_len(w3.size(), E * H * d, "w3", "experts x hidden x dim");
  check_len(w2.size(), E * d * H, "w2", "experts x dim x hidden");
  check_len(y.size(), z.tokens * d, "y", "tokens x dim");
  if (!y.empty() && y.data() < x.data() + x.size() && x.data() < y.data() + y.size())
    fail(kWhere, "y must not overlap x");
}

template <class T>
void size_routing(MoeRouting<T>* r, const MoeSizes& z) {
  if (!r) return;
  r->ids.resize(static_cast<size_t>(z.tokens * z.top_k));
  r->weights.resize(static_cast<size_t>(z.tokens * z.top_k));
  r->probs.resize(static_cast<size_t>(z.tokens * z.experts));
}

}  // namespace

double moe_feed_forward(const MoeSizes& z, std::span<const float> x, std::span<const float> router,
                        std::span<const float> w1, std::span<const float> w2, std::span<const float> w3,
                        std::span<float> y, int threads, MoeRouting<float>* routing) try {
  check_sizes(z, threads);
  check_spans(z, x, router, w1, w2, w3, y);
  size_routing(routing, z);
  const int64_t E = z.experts, d = z.dim, H = z.hidden;
  auto bytes = [](const float* p) { return reinterpret_cast<const uint8_t*>(p); };
  model::MoeExperts w;
  w.router = model::matrix_over(bytes(router.data()), DType::f32, E, d);
  for (int64_t e = 0; e < E; ++e) {
    w.w1.push_back(model::matrix_over(bytes(w1.data() + e * H * d), DType::f32, H, d));
    w.w3.push_back(model::matrix_over(bytes(w3.data() + e * H * d), DType::f32, H, d));
    w.w2.push_back(model::matrix_over(bytes(w2.data() + e * d * H), DType::f32, d, H));
  }
  model::MoeScratch scratch;
  return model::moe_forward(x.data(), z.tokens, w, z.top_k, y.data(), threads, active_isa(), scratch,
                            routing ? routing->ids.data() : nullptr, routing ? routing->weights.data() : nullptr,
                            routing ? routing->probs.data() : nullptr);
} catch (const std::bad_alloc&) {
  fail(kWhere, "out of memory while running " + std::to_string(z.tokens) + " tokens through " +
                   std::to_string(z.experts) + " experts");
}

double moe_feed_forward(const MoeSizes& z, std::span<const double> x, std::span<const double> router,
                        std::span<const double> w1, std::span<const double> w2, std::span<const double> w3,
                        std::span<double> y, int threads, MoeRouting<double>* routing) try {
  check_sizes(z, threads);
  check_spans(z, x, router, w1, w2, w3, y);
  size_routing(routing, z);
  const int64_t n = z.tokens, E = z.experts, d = z.dim, H = z.hidden, k = z.top_k;
  std::vector<double> probs(static_cast<size_t>(n * E)), g(static_cast<size_t>(H));
  std::vector<int32_t> ids(static_cast<size_t>(n * k));
  for (int64_t t = 0; t < n; ++t) {  // one token at a time
    const double* xt = x.data() + t * d;
    double* p = probs.data() + t * E;
    for (int64_t e = 0; e < E; ++e) {
      double r = 0;
      for (int64_t c = 0; c < d; ++c) r += router[static_cast<size_t>(e * d + c)] * xt[c];
      p[e] = r;
    }
    double mx = p[0];
    for (int64_t e = 1; e < E; ++e) mx = std::isnan(p[e]) || p[e] > mx ? p[e] : mx;
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(p[e] - mx);
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
    int32_t* id = ids.data() + t * k;
    model::moe_top_k(p, E, k, id);
    double top = 0;
    for (int64_t i = 0; i < k; ++i) top += p[id[i]];
    double* yt = y.data() + t * d;
    std::fill(yt, yt + d, 0.0);
    for (int64_t i = 0; i < k; ++i) {
      const int64_t e = id[i];
      const double wi = p[e] / top;
      const double* a = w1.data() + e * H * d;
      const double* b = w3.data() + e * H * d;
      const double* o = w2.data() + e * d * H;
      for (int64_t j = 0; j < H; ++j) {
        double u = 0, v = 0;
        for (int64_t c = 0; c < d; ++c) u += a[j * d + c] * xt[c], v += b[j * d + c] * xt[c];
        g[static_cast<size_t>(j)] = u / (1.0 + std::exp(-u)) * v;
      }
      for (int64_t c = 0; c < d; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < H; ++j) acc += o[c * H + j] * g[static_cast<size_t>(j)];
        yt[c] += wi * acc;
      }
      if (routing) routing->weights[static_cast<size_t>(t * k + i)] = wi;
    }
  }
  if (routing) {
    std::copy(ids.begin(), ids.end(), routing->ids.begin());
    std::copy(probs.begin(), probs.end(), routing->probs.begin());
  }
  return aux_loss(probs.data(), ids.data(), n, E, k);
} catch (const std::bad_alloc&) {
  fail(kWhere, "out of memory while running the float64 reference on " + std::to_string(z.tokens) + " tokens");
}

}  // namespace attn
