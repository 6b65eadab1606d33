// The softmax family's backward for cosine and additive scores (the "scores" form; formulas:
// include/attn/backward.hpp): float32, flash-style from the forward's LSE and output, one (query,
// key) pair at a time, as the rows form does for dot scores. With s_ij = scale_i r_ij and dS_ij the
// gradient of the loss with respect to s_ij (softcap, bias and dropout as for dot scores):
//
//   cosine    r_ij = q^_i . k^_j,  x^ = x / |x|  (|x| = sqrt(max(x . x, 1e-30)), as the forward's)
//             dq_i = scale_i / |q_i| (a_i - (a_i . q^_i) q^_i),  a_i = sum_j dS_ij k^_j
//             dk_j = 1 / |k_j| (c_j - (c_j . k^_j) k^_j),        c_j = sum_i dS_ij scale_i q^_i
//             (the projections left out where a norm is clamped: the score is linear there)
//   additive  r_ij = sum_a w_a tanh(u_ija),  u_ij = Wq q_i + Wk k_j  (the projections once per row
//             and per key); with e_ija = dS_ij scale_i w_a (1 - tanh^2 u_ija):
//             dq_i = Wq^T sum_j e_ij,  dk_j = Wk^T sum_i e_ij,  dWq = sum_i (sum_j e_ij) q_i^T,
//             dWk = sum_j (sum_i e_ij) k_j^T,  dw_a = sum_ij dS_ij scale_i tanh(u_ija)
//
// Tasks: core::KvGradientTasks (batch entry, kv head, segment of query blocks), so dQ, dK and dV are
// bitwise the same for any thread count. The parameter gradients are summed per task (each task's
// own partial sums, in its fixed walk order) and the partials added in task order afterwards.
// Everything is allocated before the parallel region.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/aligned_buffer.hpp"
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

// One thread's scratch, sized by the problem (E = D for cosine, A for additive).
struct Scratch {
  std::vector<float> k, v, kx, dkx, inv_nk, q, qx, dout, acc, th, row;
  std::vector<uint8_t> unit_k;  // cosine: |k_j| not clamped (the projection applies)
  void reserve(const Problem& p) {
    const int64_t E = p.mech.score == ScoreKind::additive ? p.A : p.D;
    k.resize(static_cast<size_t>(p.M * p.D));
    v.resize(static_cast<size_t>(p.M * p.Dv));
    kx.resize(static_cast<size_t>(p.M * E));   // k^_j (cosine) or Wk k_j (additive)
    dkx.resize(kx.size());                     // c_j (cosine) or sum_i e_ij (additive)
    inv_nk.resize(static_cast<size_t>(p.M));
    unit_k.resize(static_cast<size_t>(p.M));
    q.resize(static_cast<size_t>(p.D));
    qx.resize(static_cast<size_t>(std::max(p.D, E)));   // scaled q^ (cosine) or Wq q (additive)
    dout.resize(static_cast<size_t>(p.Dv));
    acc.resize(static_cast<size_t>(E));        // a_i (cosine) or sum_j e_ij (additive)
    th.resize(static_cast<size_t>(std::max<int64_t>(p.A, 1)));
    row.resize(static_cast<size_t>(std::max(p.D, p.Dv)));
  }
};

// A task's additive-score parameter gradients (A x D, A x D, A), float32 partial sums.
struct ParamSums {
  float *wq = nullptr, *wk = nullptr, *w = nullptr;
};

class Task {
 public:
  Task(const Problem& p, const BackwardViews& g, Scratch& s, int64_t b, int64_t hk, float* dk, float* dv,
       ParamSums sums)
      : p_(p), g_(g), s_(s), b_(b), hk_(hk), len_(p.kv_len[static_cast<size_t>(b)]), dk_(dk), dv_(dv),
        sums_(sums), additive_(p.mech.score == ScoreKind::additive), E_(additive_ ? p.A : p.D) {}

  void run(int64_t qb0, int64_t qb1) {
    load_keys();
    std::fill(s_.dkx.begin(), s_.dkx.begin() + len_ * E_, 0.0f);
    for (int64_t h = hk_ * p_.group; h < (hk_ + 1) * p_.group; ++h)
      for (int64_t i = qb0 * kRowsPerBlock; i < std::min(p_.N, qb1 * kRowsPerBlock); ++i) row(h, i);
    finish_keys();
  }

 private:
  // K and V of the kv head as float32; cosine: k^_j and 1 / |k_j|; additive: Wk k_j.
  void load_keys() {
    const core::KvRows keys = p_.keys(b_, hk_), values = p_.values(b_, hk_);
    for (int64_t j = 0; j < len_; ++j) {
      float* kj = &s_.k[j * p_.D];
      for (int64_t c = 0; c < p_.D; ++c) kj[c] = keys.at(j, c);
      for (int64_t c = 0; c < p_.Dv; ++c) s_.v[j * p_.Dv + c] = values.at(j, c);
      float* x = &s_.kx[j * E_];
      if (additive_) {
        project(p_.wk.data(), kj, p_.A, p_.D, x);
        continue;
      }
      const double n2 = sum_sq(kj, p_.D);
      const float inv = static_cast<float>(1.0 / std::sqrt(std::max(n2, kTiny)));  // the forward's factor
      s_.inv_nk[j] = inv;
      s_.unit_k[j] = n2 > kTiny;
      for (int64_t c = 0; c < p_.D; ++c) x[c] = kj[c] * inv;
    }
  }

  // The score s_ij before softcap, as the forward's tiled form computes it; additive: th = tanh(u).
  float score(int64_t j, float scale) {
    const float* kx = &s_.kx[j * E_];
    if (!additive_) return dotf(s_.qx.data(), &s_.k[j * p_.D], p_.D) * s_.inv_nk[j];  // qx: q scale / |q|
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
    double nq2 = 0;
    float q_factor = 0;  // cosine: scale / |q|, the forward's factor of q
    if (additive_) {
      project(p_.wq.data(), q, p_.A, p_.D, s_.qx.data());
    } else {
      nq2 = sum_sq(q, p_.D);
      q_factor = static_cast<float>(p_.row_scale(b_, h, i) / std::sqrt(std::max(nq2, kTiny)));
      for (int64_t c = 0; c < p_.D; ++c) s_.qx[c] = q[c] * q_factor;
    }
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
      const float* kx = &s_.kx[j * E_];
      if (additive_) {
        const float ds = dS * scale;
        for (int64_t a = 0; a < p_.A; ++a) {
          const float e = ds * p_.w[a] * (1.0f - s_.th[a] * s_.th[a]);
          acc[a] += e;
          dkx[a] += e;
          sums_.w[a] += ds * s_.th[a];
        }
      } else {
        for (int64_t c = 0; c < p_.D; ++c) {
          acc[c] += dS * kx[c];
          dkx[c] += dS * s_.qx[c];  // dS scale_i q^_i (qx = scale_i q / |q|)
        }
      }
    }
    if (additive_) {
      project_back(p_.wq.data(), acc, p_.A, p_.D, dq);
      for (int64_t a = 0; a < p_.A; ++a)
        for (int64_t c = 0; c < p_.D; ++c) sums_.wq[a * p_.D + c] += acc[a] * q[c];
    } else {
      if (nq2 > kTiny) {  // q^ = qx / scale_i; project against it
        const float inv_nq = static_cast<float>(1.0 / std::sqrt(nq2));
        for (int64_t c = 0; c < p_.D; ++c) dq[c] = q[c] * inv_nq;  // q^ (dq's storage as scratch)
        remove_component(acc, dq, p_.D);
      }
      for (int64_t c = 0; c < p_.D; ++c) dq[c] = acc[c] * q_factor;
    }
    store_dq(h, i);
  }

  void store_dq(int64_t h, int64_t i) {
    const float* dq = s_.row.data();
    for (int64_t c = 0; c < p_.D; ++c) store_from_float(g_.dq.data, g_.dq.dtype, g_.dq.offset(b_, h, i, c), dq[c]);
  }

  // dK of the task's keys from their sums (cosine: projected; additive: through Wk, and dWk).
  void finish_keys() {
    for (int64_t j = 0; j < len_; ++j) {
      float* dkx = &s_.dkx[j * E_];
      float* dkj = dk_ + j * p_.D;
      if (additive_) {
        project_back(p_.wk.data(), dkx, p_.A, p_.D, dkj);
        const float* kj = &s_.k[j * p_.D];
        for (int64_t a = 0; a < p_.A; ++a)
          for (int64_t c = 0; c < p_.D; ++c) sums_.wk[a * p_.D + c] += dkx[a] * kj[c];
        continue;
      }
      if (s_.unit_k[j]) remove_component(dkx, &s_.kx[j * p_.D], p_.D);
      for (int64_t c = 0; c < p_.D; ++c) dkj[c] = dkx[c] * s_.inv_nk[j];
    }
  }

  const Problem& p_;
  const BackwardViews& g_;
  Scratch& s_;
  int64_t b_, hk_, len_;
  float *dk_, *dv_;
  ParamSums sums_;
  bool additive_;
  int64_t E_;
};

}  // namespace

void softmax_backward_scores(const Problem& p, const BackwardViews& g, const core::Context& ctx) {
  const bool params = p.mech.score == ScoreKind::additive && g.dparams.contains("wq");
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
  // one partial sum of the parameter gradients per task (also without params: the task writes them)
  std::vector<float> partial(static_cast<size_t>(tasks.count() * per_task), 0.0f);
  tasks.run(g, *ctx.kern, [&](int64_t b, int64_t hk, int64_t qb0, int64_t qb1, float* dk, float* dv, int tid) {
    float* mine = partial.data() + tasks.index(b, hk, qb0) * per_task;
    Task(p, g, scratch[static_cast<size_t>(tid)], b, hk, dk, dv, {mine, mine + AD, mine + 2 * AD}).run(qb0, qb1);
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
