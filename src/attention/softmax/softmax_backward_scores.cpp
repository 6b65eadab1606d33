// The softmax family's backward for cosine and additive scores (the "scores" form; formulas:
// include/attn/backward.hpp): float32, flash-style from the forward's LSE and output. With
// s_ij = scale_i r_ij and dS_ij the gradient of the loss with respect to s_ij (softcap, bias and
// dropout as for dot scores):
//
//   cosine    r_ij = q^_i . k^_j,  x^ = x / |x|  (|x| = sqrt(max(x . x, 1e-30)), as the forward's):
//             dot-product attention on q^ and k^, so the dot-product tiled backward runs on float32
//             copies of q^ and k^ (its five tile products), and the gradients it gives for q^ and k^
//             go back through the normalisation: dq_i = (g_i - (g_i . q^_i) q^_i) / |q_i| (no
//             projection where the norm is clamped: the score is linear there), dk_j likewise.
//   additive  r_ij = sum_a w_a tanh(u_ija),  u_ij = Wq q_i + Wk k_j: no product of matrices, so one
//             (query, key) pair at a time (the projections once per row and per key); with
//             e_ija = dS_ij scale_i w_a (1 - tanh^2 u_ija):
//             dq_i = Wq^T sum_j e_ij,  dk_j = Wk^T sum_i e_ij,  dWq = sum_i (sum_j e_ij) q_i^T,
//             dWk = sum_j (sum_i e_ij) k_j^T,  dw_a = sum_ij dS_ij scale_i tanh(u_ija)
//             on core::KvGradientTasks (batch entry, kv head, segment of query blocks), so dQ, dK
//             and dV are bitwise the same for any thread count; the parameter gradients are summed
//             per task (each task's own partial sums, in its fixed walk order) and the partials
//             added in task order afterwards.
// Everything is allocated before the parallel regions.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/parallel.hpp"
#include "core/kv_gradient_tasks.hpp"
#include "softmax/softmax_backward.hpp"
#include "softmax/softmax_family.hpp"

namespace attn::exact {
namespace {

constexpr int64_t kRowsPerBlock = 64;  // the task split's unit (query rows per block)
constexpr double kTiny = 1e-30;        // the forward's clamp of a squared norm

float dotf(const float* a, const float* b, int64_t n) {
  float acc = 0;
  for (int64_t c = 0; c < n; ++c) acc += a[c] * b[c];
  return acc;
}

double sum_sq(const float* x, int64_t n) {
  double s = 0;
  for (int64_t c = 0; c < n; ++c) s += static_cast<double>(x[c]) * x[c];
  return s;
}

// y (A) = W (A x D) x (D), in the forward's order.
void project(const float* w, const float* x, int64_t A, int64_t D, float* y) {
  for (int64_t a = 0; a < A; ++a) y[a] = dotf(w + a * D, x, D);
}

// y (D) = W^T (D x A) e (A).
void project_back(const float* w, const float* e, int64_t A, int64_t D, float* y) {
  std::fill(y, y + D, 0.0f);
  for (int64_t a = 0; a < A; ++a) {
    const float ea = e[a];
    const float* wa = w + a * D;
    for (int64_t c = 0; c < D; ++c) y[c] += ea * wa[c];
  }
}

// x -= (x . u) u, u a unit vector (the gradient of x / |x| without its 1 / |x|).
void remove_component(float* x, const float* u, int64_t n) {
  const float along = dotf(x, u, n);
  for (int64_t c = 0; c < n; ++c) x[c] -= along * u[c];
}

// One thread's scratch for the additive pairs, sized by the problem.
struct Scratch {
  std::vector<float> k, v, kx, dkx, q, qx, dout, acc, th, row;
  void reserve(const Problem& p) {
    k.resize(static_cast<size_t>(p.M * p.D));
    v.resize(static_cast<size_t>(p.M * p.Dv));
    kx.resize(static_cast<size_t>(p.M * p.A));  // Wk k_j
    dkx.resize(kx.size());                      // sum_i e_ij
    q.resize(static_cast<size_t>(p.D));
    qx.resize(static_cast<size_t>(p.A));        // Wq q_i
    dout.resize(static_cast<size_t>(p.Dv));
    acc.resize(static_cast<size_t>(p.A));       // sum_j e_ij
    th.resize(static_cast<size_t>(p.A));        // tanh(u_ija) of the pair
    row.resize(static_cast<size_t>(std::max(p.D, p.Dv)));
  }
};

// A task's additive-score parameter gradients (A x D, A x D, A), float32 partial sums.
struct ParamSums {
  float *wq = nullptr, *wk = nullptr, *w = nullptr;
};

// The additive pairs of one task: query blocks [qb0, qb1) of kv head hk of batch entry b.
class AdditiveTask {
 public:
  AdditiveTask(const Problem& p, const BackwardViews& g, Scratch& s, int64_t b, int64_t hk, float* dk, float* dv,
               ParamSums sums)
      : p_(p), g_(g), s_(s), b_(b), hk_(hk), len_(p.kv_len[static_cast<size_t>(b)]), dk_(dk), dv_(dv),
        sums_(sums), E_(p.A) {}

  void run(int64_t qb0, int64_t qb1) {
    load_keys();
    std::fill(s_.dkx.begin(), s_.dkx.begin() + len_ * E_, 0.0f);
    for (int64_t h = hk_ * p_.group; h < (hk_ + 1) * p_.group; ++h)
      for (int64_t i = qb0 * kRowsPerBlock; i < std::min(p_.N, qb1 * kRowsPerBlock); ++i) row(h, i);
    finish_keys();
  }

 private:
  // K and V of the kv head as float32, and Wk k_j.
  void load_keys() {
    const core::KvRows keys = p_.keys(b_, hk_), values = p_.values(b_, hk_);
    for (int64_t j = 0; j < len_; ++j) {
      float* kj = &s_.k[j * p_.D];
      for (int64_t c = 0; c < p_.D; ++c) kj[c] = keys.at(j, c);
      for (int64_t c = 0; c < p_.Dv; ++c) s_.v[j * p_.Dv + c] = values.at(j, c);
      project(p_.wk.data(), kj, p_.A, p_.D, &s_.kx[j * E_]);
    }
  }

  // The score s_ij before softcap, as the forward's tiled form computes it; th = tanh(u).
  float score(int64_t j, float scale) {
    const float* kx = &s_.kx[j * E_];
    float r = 0;
    for (int64_t a = 0; a < p_.A; ++a) {
      const float u = s_.qx[a] + kx[a];
      s_.th[a] = std::tanh(u) + (u - u);  // a non-finite u gives NaN, as the forward's
      r += p_.w[a] * s_.th[a];
    }
    return r * scale;
  }

  void row(int64_t h, int64_t i) {
    const float lse = g_.lse.at(b_, h, i, 0);
    float* dq = s_.row.data();
    if (lse == -std::numeric_limits<float>::infinity()) {  // no visible key: every gradient of the row is 0
      std::fill(dq, dq + p_.D, 0.0f);
      return store_dq(h, i);
    }
    float* q = s_.q.data();
    for (int64_t c = 0; c < p_.D; ++c) q[c] = p_.q.at(b_, h, i, c);
    const float scale = static_cast<float>(p_.row_scale(b_, h, i));
    project(p_.wq.data(), q, p_.A, p_.D, s_.qx.data());
    float D = 0;  // dO_i . O_i, less the gradient through lse_i
    for (int64_t c = 0; c < p_.Dv; ++c) {
      s_.dout[c] = g_.dout.at(b_, h, i, c);
      D += s_.dout[c] * g_.out.at(b_, h, i, c);
    }
    if (!g_.dlse.empty()) D -= g_.dlse.at(b_, h, i, 0);
    float* acc = s_.acc.data();
    std::fill(acc, acc + E_, 0.0f);
    const float cap = static_cast<float>(p_.mech.softcap);
    for (int64_t j = 0; j < len_; ++j) {
      if (!p_.visible(b_, h, i, j)) continue;
      const float sc = score(j, scale);
      float t = sc, slope = 1.0f;
      if (cap > 0) {
        const float th = std::tanh(sc / cap);
        t = cap * th;
        slope = 1.0f - th * th;
      }
      if (p_.has_bias()) t += p_.additive_bias(b_, h, i, j);
      const float P = std::exp(t - lse);
      float keep = 1.0f;
      if (p_.mech.dropout > 0)
        keep = dropout_keep(p_.mech.seed, p_.mech.dropout, b_, h, i, j) ? static_cast<float>(1 / (1 - p_.mech.dropout))
                                                                         : 0.0f;
      const float dP = keep * dotf(s_.dout.data(), &s_.v[j * p_.Dv], p_.Dv);
      const float dS = P * (dP - D) * slope;
      const float Pk = P * keep;
      float* dvj = dv_ + j * p_.Dv;
      for (int64_t c = 0; c < p_.Dv; ++c) dvj[c] += Pk * s_.dout[c];
      float* dkx = &s_.dkx[j * E_];
      const float ds = dS * scale;
      for (int64_t a = 0; a < p_.A; ++a) {
        const float e = ds * p_.w[a] * (1.0f - s_.th[a] * s_.th[a]);
        acc[a] += e;
        dkx[a] += e;
        sums_.w[a] += ds * s_.th[a];
      }
    }
    project_back(p_.wq.data(), acc, p_.A, p_.D, dq);
    for (int64_t a = 0; a < p_.A; ++a)
      for (int64_t c = 0; c < p_.D; ++c) sums_.wq[a * p_.D + c] += acc[a] * q[c];
    store_dq(h, i);
  }

  void store_dq(int64_t h, int64_t i) {
    const float* dq = s_.row.data();
    for (int64_t c = 0; c < p_.D; ++c) store_from_float(g_.dq.data, g_.dq.dtype, g_.dq.offset(b_, h, i, c), dq[c]);
  }

  // dK of the task's keys through Wk, and their share of dWk.
  void finish_keys() {
    for (int64_t j = 0; j < len_; ++j) {
      const float* dkx = &s_.dkx[j * E_];
      project_back(p_.wk.data(), dkx, p_.A, p_.D, dk_ + j * p_.D);
      const float* kj = &s_.k[j * p_.D];
      for (int64_t a = 0; a < p_.A; ++a)
        for (int64_t c = 0; c < p_.D; ++c) sums_.wk[a * p_.D + c] += dkx[a] * kj[c];
    }
  }

  const Problem& p_;
  const BackwardViews& g_;
  Scratch& s_;
  int64_t b_, hk_, len_;
  float *dk_, *dv_;
  ParamSums sums_;
  int64_t E_;  // A
};

// Row (b, h, i) of a float32 tensor.
float* f32_row(const TensorView& t, int64_t b, int64_t h, int64_t i) {
  return static_cast<float*>(t.data) + t.offset(b, h, i, 0);
}

// q^ (or k^) of rows [0, n) of head (b, h), element (i, c) read by at(i, c), into `to` (float32, the
// same shape), 1 / |x| into inv and whether the norm is not clamped into unit; rows from `valid` on
// are zeros (keys past the batch entry's valid length: never read as inputs).
template <class At>
void normalize_rows(const At& at, int64_t n, int64_t valid, int64_t D, const TensorView& to, int64_t b, int64_t h,
                    float* inv, uint8_t* unit) {
  for (int64_t i = 0; i < n; ++i) {
    float* row = f32_row(to, b, h, i);
    if (i >= valid) {
      std::fill(row, row + D, 0.0f);
      inv[i] = 0.0f, unit[i] = 0;
      continue;
    }
    for (int64_t c = 0; c < D; ++c) row[c] = at(i, c);
    const double n2 = sum_sq(row, D);
    inv[i] = static_cast<float>(1.0 / std::sqrt(std::max(n2, kTiny)));  // the forward's factor
    unit[i] = n2 > kTiny;
    for (int64_t c = 0; c < D; ++c) row[c] *= inv[i];
  }
}

// dx = (g - (g . x^) x^) / |x| (g alone / |x| where the norm is clamped), stored into `to`.
void denormalize_row(const float* g, const float* unit_x, float inv, bool unit, int64_t D, float* scratch,
                     const TensorView& to, int64_t b, int64_t h, int64_t i) {
  std::copy(g, g + D, scratch);
  if (unit) remove_component(scratch, unit_x, D);
  for (int64_t c = 0; c < D; ++c) scratch[c] *= inv;
  for (int64_t c = 0; c < D; ++c) store_from_float(to.data, to.dtype, to.offset(b, h, i, c), scratch[c]);
}

// Cosine scores: the dot-product tiled backward on q^ and k^ (float32 copies), then the gradients
// through the normalisation. dV goes straight to g.dv.
void cosine_on_tiles(const Problem& p, const BackwardViews& g, const core::Context& ctx) {
  Tensor qn(DType::f32, {p.B, p.H, p.N, p.D}), kn(DType::f32, {p.B, p.Hkv, p.M, p.D});
  Tensor gq(DType::f32, {p.B, p.H, p.N, p.D}), gk(DType::f32, {p.B, p.Hkv, p.M, p.D});
  std::vector<float> inv_q(static_cast<size_t>(p.B * p.H * p.N)), inv_k(static_cast<size_t>(p.B * p.Hkv * p.M));
  std::vector<uint8_t> unit_q(inv_q.size()), unit_k(inv_k.size());
  const int t = resolve_threads(ctx.threads, p.B * (p.H + p.Hkv));
  std::vector<std::vector<float>> rows(static_cast<size_t>(t), std::vector<float>(static_cast<size_t>(p.D)));
  parallel_for(p.B * (p.H + p.Hkv), t, [&](int64_t item, int) {  // q heads, then kv heads, per batch entry
    const int64_t b = item / (p.H + p.Hkv), h = item % (p.H + p.Hkv);
    if (h < p.H) {
      const size_t at = static_cast<size_t>((b * p.H + h) * p.N);
      normalize_rows([&](int64_t i, int64_t c) { return p.q.at(b, h, i, c); }, p.N, p.N, p.D, qn.view(), b, h,
                     &inv_q[at], &unit_q[at]);
    } else {
      const int64_t hk = h - p.H;
      const core::KvRows keys = p.keys(b, hk);
      const size_t at = static_cast<size_t>((b * p.Hkv + hk) * p.M);
      normalize_rows([&](int64_t j, int64_t c) { return keys.at(j, c); }, p.M, p.kv_len[static_cast<size_t>(b)], p.D,
                     kn.view(), b, hk, &inv_k[at], &unit_k[at]);
    }
  });
  Problem dot = p;  // the same attention on q^ and k^ with dot scores
  dot.q = qn.view(), dot.k = kn.view();
  dot.mech.score = ScoreKind::dot;
  BackwardViews gn = g;
  gn.dq = gq.view(), gn.dk = gk.view();
  softmax_backward_tiled(dot, gn, ctx);
  parallel_for(p.B * (p.H + p.Hkv), t, [&](int64_t item, int tid) {
    const int64_t b = item / (p.H + p.Hkv), h = item % (p.H + p.Hkv);
    float* scratch = rows[static_cast<size_t>(tid)].data();
    if (h < p.H) {
      for (int64_t i = 0; i < p.N; ++i) {
        const size_t at = static_cast<size_t>((b * p.H + h) * p.N + i);
        denormalize_row(f32_row(gq.view(), b, h, i), f32_row(qn.view(), b, h, i), inv_q[at], unit_q[at], p.D, scratch,
                        g.dq, b, h, i);
      }
    } else {
      const int64_t hk = h - p.H;
      for (int64_t j = 0; j < p.M; ++j) {
        const size_t at = static_cast<size_t>((b * p.Hkv + hk) * p.M + j);
        denormalize_row(f32_row(gk.view(), b, hk, j), f32_row(kn.view(), b, hk, j), inv_k[at], unit_k[at], p.D,
                        scratch, g.dk, b, hk, j);
      }
    }
  });
}

}  // namespace

void softmax_backward_scores(const Problem& p, const BackwardViews& g, const core::Context& ctx) {
  if (p.mech.score == ScoreKind::cosine) return cosine_on_tiles(p, g, ctx);
  const bool params = g.dparams.contains("wq");
  const int64_t AD = p.A * p.D, per_task = 2 * AD + p.A;
  if (p.B == 0 || p.Hkv == 0 || p.N == 0) {  // dk and dv are 0 (fresh tensors are zeroed), and so are dparams
    if (params)
      for (const char* name : {"wq", "wk", "w"}) {
        const TensorView& t = g.dparams.at(name);
        for (int64_t e = 0; e < t.numel(); ++e) store_from_float(t.data, t.dtype, e, 0.0f);
      }
    return;
  }
  const int64_t q_blocks = (p.N + kRowsPerBlock - 1) / kRowsPerBlock;
  const core::KvGradientTasks tasks(p, q_blocks, ctx.threads);
  std::vector<Scratch> scratch(static_cast<size_t>(tasks.threads()));
  for (Scratch& s : scratch) s.reserve(p);
  // one partial sum of the parameter gradients per task (also without dparams: the task writes them)
  std::vector<float> partial(static_cast<size_t>(tasks.count() * per_task), 0.0f);
  tasks.run(g, *ctx.kern, [&](int64_t b, int64_t hk, int64_t qb0, int64_t qb1, float* dk, float* dv, int tid) {
    float* mine = partial.data() + tasks.index(b, hk, qb0) * per_task;
    AdditiveTask(p, g, scratch[static_cast<size_t>(tid)], b, hk, dk, dv, {mine, mine + AD, mine + 2 * AD})
        .run(qb0, qb1);
  });
  if (!params) return;
  // the tasks' partial sums added in task order
  std::vector<float> total(static_cast<size_t>(per_task), 0.0f);
  for (int64_t t = 0; t < tasks.count(); ++t)
    for (int64_t e = 0; e < per_task; ++e) total[e] += partial[t * per_task + e];
  const TensorView &gq = g.dparams.at("wq"), &gk = g.dparams.at("wk"), &gw = g.dparams.at("w");
  for (int64_t a = 0; a < p.A; ++a) {
    for (int64_t c = 0; c < p.D; ++c) {
      store_from_float(gq.data, gq.dtype, gq.offset(0, 0, a, c), total[a * p.D + c]);
      store_from_float(gk.data, gk.dtype, gk.offset(0, 0, a, c), total[AD + a * p.D + c]);
    }
    store_from_float(gw.data, gw.dtype, gw.offset(0, 0, 0, a), total[2 * AD + a]);
  }
}

}  // namespace attn::exact
