// Efficient attention's backward. Per (batch entry, head) and feature f, query i reads the softmax
// over the keys of its row (all valid keys; causal: j <= i) and the initial state's pseudo key
// (log-weight log z0_f + m0_f, value C0_f; none where z0_f = 0): weights w_xf, context
// C_f = sum_x w_xf val_x; then o_i = sum_f a_if C_f with a_i = scale softmax(q_i). Differentiated:
//   g_if = dO_i . C_f,   dq_i = scale p_i o (g_i - p_i . g_i)        (p_i = softmax(q_i))
//   dC_f = a_if dO_i,   dval_x += w_xf dC_f,   dlogw_xf = w_xf (dC_f . val_x - dC_f . C_f)
//   keys: dv_j += dval_j, dk_jf += dlogw_jf;  the initial state: dC0_f += dval_0,
//   dz0_f += dlogw_0f / z0_f, dm0_f += dlogw_0f
// (z0_f = 0: the pseudo key is absent; dz0_f is the one-sided derivative e^(m0 - top) / Z (dC_f .
// C0_f - dC_f . C_f)). The final state (C_F, z_F, m_F) of all valid keys takes dfinal_state: C_F as
// one more query with dC_f = dC_F_f; z_F = sum_x e^(logw_x - m_F) adds z_F dz_f w_xf to dlogw_xf, and
// m_F, the first largest of m0 (when z0 > 0) and the keys, adds dm_f - z_F dz_f to that one's
// dlogw (dm0 or dk).
// Forms: "online" (float32, per (batch entry, kv head) task: the per-feature states again forward
// in token order, then one walk backward over the keys carrying G_f = sum_i a_if dO_i e^(m_ref -
// m_i) / z_i and H_f = the same with g_if, rescaled to each earlier state's maximum (factors <= 1,
// nothing overflows); dk, dv summed over the group's heads in order: bitwise the same for any
// thread count) and "reference" (float64, every query's softmaxes written out).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/parallel.hpp"
#include "core/params.hpp"
#include "core/rows.hpp"
#include "efficient/efficient.hpp"

namespace attn::efficient {
namespace {

// ---- reference: float64, or the plain same-dtype baseline --------------------------------------

template <class T>
void reference_impl(const EfficientProblem& p, const core::BackwardViews& g, bool plain) {
  const core::Rounding<T> rnd{p.q.dtype, plain};
  const int64_t D = p.D, Dv = p.Dv, W = Dv + 2;
  const T scale = static_cast<T>(p.scale);
  const bool has_final = !g.dfinal_state.empty(), has_initial = p.initial.has_value();
  std::vector<T> dk(static_cast<size_t>(p.M * D)), dv(static_cast<size_t>(p.M * Dv));
  std::vector<T> ds0(static_cast<size_t>(D * W));  // [dC0 | dz0 | dm0] of one head
  std::vector<T> ctx(static_cast<size_t>(Dv)), dC(static_cast<size_t>(Dv)), a(static_cast<size_t>(D)),
      gq(static_cast<size_t>(D)), wts;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t hk = 0; hk < p.Hkv; ++hk) {
      const int64_t len = p.kv_len[static_cast<size_t>(b)];
      std::fill(dk.begin(), dk.end(), T(0));
      std::fill(dv.begin(), dv.end(), T(0));
      for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
        std::fill(ds0.begin(), ds0.end(), T(0));
        auto init = [&](int64_t f, int64_t c) { return static_cast<T>(core::element_at(*p.initial, b, h, f, c)); };
        auto key = [&](int64_t j, int64_t f) { return static_cast<T>(p.k.at(b, hk, j, f)); };
        auto val = [&](int64_t j, int64_t c) { return static_cast<T>(p.v.at(b, hk, j, c)); };
        // Feature f over keys [0, end) and the initial state: the context (ctx), the weights (wts:
        // the pseudo key first), the reference point top and the sum Z (relative to top), as the
        // forward's state has them. dC: the context's gradient, dz, dm: of Z and top (the final
        // state's). Adds the gradients of the keys, values and initial state.
        auto feature = [&](int64_t f, int64_t end, bool final_state, T dz, T dm) {
          const T z0 = has_initial ? init(f, Dv) : T(0), m0 = has_initial ? init(f, Dv + 1) : T(0);
          std::fill(ctx.begin(), ctx.end(), T(0));
          if (z0 == 0 && end == 0) return;
          T top = z0 != 0 ? m0 : key(0, f);
          int64_t arg = z0 != 0 ? -1 : 0;  // the first largest: -1 the initial state
          for (int64_t j = 0; j < end; ++j)
            if (key(j, f) > top) top = key(j, f), arg = j;
          wts.assign(static_cast<size_t>(end + 1), T(0));
          T Z = wts[0] = z0 != 0 ? z0 * std::exp(m0 - top) : T(0);
          for (int64_t j = 0; j < end; ++j) Z += (wts[static_cast<size_t>(j + 1)] = std::exp(key(j, f) - top));
          for (T& w : wts) w /= Z;
          for (int64_t c = 0; c < Dv; ++c) {
            T acc = z0 != 0 ? wts[0] * init(f, c) : T(0);
            for (int64_t j = 0; j < end; ++j) acc += wts[static_cast<size_t>(j + 1)] * val(j, c);
            ctx[static_cast<size_t>(c)] = rnd(acc);
          }
          if (final_state) return;  // the context only (g of the queries)
          T dCC = 0;
          for (int64_t c = 0; c < Dv; ++c) dCC += dC[static_cast<size_t>(c)] * ctx[static_cast<size_t>(c)];
          for (int64_t j = 0; j < end; ++j) {
            const T w = wts[static_cast<size_t>(j + 1)];
            T dCv = 0;
            for (int64_t c = 0; c < Dv; ++c) {
              dCv += dC[static_cast<size_t>(c)] * val(j, c);
              dv[static_cast<size_t>(j * Dv + c)] += w * dC[static_cast<size_t>(c)];
            }
            dk[static_cast<size_t>(j * D + f)] += rnd(w * (dCv - dCC) + w * Z * dz) + (arg == j ? dm - Z * dz : T(0));
          }
          if (!has_initial) return;
          T dC0 = 0;
          for (int64_t c = 0; c < Dv; ++c) dC0 += dC[static_cast<size_t>(c)] * init(f, c);
          T* row = &ds0[static_cast<size_t>(f * W)];
          if (z0 != 0) {
            const T dlogw = wts[0] * (dC0 - dCC) + wts[0] * Z * dz;
            for (int64_t c = 0; c < Dv; ++c) row[c] += wts[0] * dC[static_cast<size_t>(c)];
            row[Dv] += dlogw / z0;
            row[Dv + 1] += dlogw + (arg == -1 ? dm - Z * dz : T(0));
          } else {  // one-sided: the weight e^(m0 - top) z0 / Z grows from 0
            row[Dv] += std::exp(m0 - top) / Z * (dC0 - dCC + Z * dz);
          }
        };
        for (int64_t i = 0; i < p.N; ++i) {
          const int64_t end = p.mech.causal ? std::min(i + 1, len) : len;
          T top = -std::numeric_limits<T>::infinity(), sum = 0;
          for (int64_t f = 0; f < D; ++f) top = std::max(top, static_cast<T>(p.q.at(b, h, i, f)));
          for (int64_t f = 0; f < D; ++f) sum += (a[static_cast<size_t>(f)] = std::exp(static_cast<T>(p.q.at(b, h, i, f)) - top));
          for (T& x : a) x /= sum;  // p_i, then a_i = scale p_i
          T pg = 0;
          for (int64_t f = 0; f < D; ++f) {
            const T af = rnd(scale * a[static_cast<size_t>(f)]);
            for (int64_t c = 0; c < Dv; ++c) dC[static_cast<size_t>(c)] = af * static_cast<T>(g.dout.at(b, h, i, c));
            feature(f, end, false, T(0), T(0));
            T gf = 0;
            for (int64_t c = 0; c < Dv; ++c) gf += static_cast<T>(g.dout.at(b, h, i, c)) * ctx[static_cast<size_t>(c)];
            gq[static_cast<size_t>(f)] = rnd(gf);
            pg += a[static_cast<size_t>(f)] * gq[static_cast<size_t>(f)];
          }
          for (int64_t f = 0; f < D; ++f) {
            const T dqf = scale * a[static_cast<size_t>(f)] * (gq[static_cast<size_t>(f)] - pg);
            store_from_float(g.dq.data, g.dq.dtype, g.dq.offset(b, h, i, f), static_cast<float>(rnd(dqf)));
          }
        }
        if (has_final)
          for (int64_t f = 0; f < D; ++f) {
            for (int64_t c = 0; c < Dv; ++c) dC[static_cast<size_t>(c)] = static_cast<T>(g.dfinal_state.at(b, h, f, c));
            const T dz = static_cast<T>(g.dfinal_state.at(b, h, f, Dv)), dm = static_cast<T>(g.dfinal_state.at(b, h, f, Dv + 1));
            feature(f, len, true, T(0), T(0));  // ctx = C_F
            feature(f, len, false, dz, dm);
          }
        if (!g.d_initial_state.empty())
          for (int64_t f = 0; f < D; ++f)
            for (int64_t c = 0; c < W; ++c)
              store_from_float(g.d_initial_state.data, g.d_initial_state.dtype, g.d_initial_state.offset(b, h, f, c),
                               static_cast<float>(rnd(ds0[static_cast<size_t>(f * W + c)])));
      }
      for (int64_t j = 0; j < p.M; ++j) {  // keys past the length: zero
        for (int64_t c = 0; c < D; ++c)
          store_from_float(g.dk.data, g.dk.dtype, g.dk.offset(b, hk, j, c),
                           j < len ? static_cast<float>(rnd(dk[static_cast<size_t>(j * D + c)])) : 0.0f);
        for (int64_t c = 0; c < Dv; ++c)
          store_from_float(g.dv.data, g.dv.dtype, g.dv.offset(b, hk, j, c),
                           j < len ? static_cast<float>(rnd(dv[static_cast<size_t>(j * Dv + c)])) : 0.0f);
      }
    }
}

// ---- online: float32, one task per (batch entry, kv head) --------------------------------------

// One thread's buffers, sized before the parallel region (which allocates nothing).
struct Scratch {
  std::vector<float> C, z, m;          // the state: (D, Dv), D, D
  std::vector<float> zs, ms;           // (M + 1, D): z and m after e keys
  std::vector<float> a, gq, dout;      // (N, D), (N, D), (N, Dv): a_i, g_i, dO_i by query
  std::vector<float> G, H, k, v, q;    // (D, Dv), D, D, Dv, D
  std::vector<float> dk, dv;           // (M, D), (M, Dv)
  std::vector<int64_t> arg;            // D: the first largest of the final state (-1: the initial state)
  explicit Scratch(const EfficientProblem& p) {
    const size_t N = static_cast<size_t>(p.N), M = static_cast<size_t>(p.M), D = static_cast<size_t>(p.D),
                 Dv = static_cast<size_t>(p.Dv);
    C.resize(D * Dv), z.resize(D), m.resize(D), zs.resize((M + 1) * D), ms.resize((M + 1) * D);
    a.resize(N * D), gq.resize(N * D), dout.resize(N * Dv), G.resize(D * Dv), H.resize(D), k.resize(D), v.resize(Dv),
        q.resize(D), dk.resize(M * D), dv.resize(M * Dv), arg.resize(D);
  }
};

class TaskRun {
 public:
  TaskRun(const EfficientProblem& p, const core::BackwardViews& g, const kernels::TileKernels& kern, Scratch& s,
          int64_t b, int64_t hk)
      : p_(p), g_(g), kern_(kern), s_(s), b_(b), hk_(hk), len_(p.kv_len[static_cast<size_t>(b)]) {}

  void run() {
    std::fill(s_.dk.begin(), s_.dk.end(), 0.0f);
    std::fill(s_.dv.begin(), s_.dv.end(), 0.0f);
    for (int64_t h = hk_ * p_.group; h < (hk_ + 1) * p_.group; ++h) {
      forward(h);
      backward(h);
    }
    for (int64_t j = 0; j < p_.M; ++j) {  // keys past the length: zero
      float* dk = s_.dk.data() + j * p_.D;
      float* dv = s_.dv.data() + j * p_.Dv;
      kern_.from_float(dk, g_.dk.dtype, g_.dk.strides[3], p_.D, g_.dk.ptr(b_, hk_, j));
      kern_.from_float(dv, g_.dv.dtype, g_.dv.strides[3], p_.Dv, g_.dv.ptr(b_, hk_, j));
    }
  }

 private:
  float init(int64_t h, int64_t f, int64_t c) const { return core::element_at(*p_.initial, b_, h, f, c); }

  // The states again in token order (as the forward's FeatureSoftmax: the first key of a feature
  // replaces an empty state), z and m after each; every query's a_i, g_i and dq_i.
  void forward(int64_t h) {
    const int64_t D = p_.D, Dv = p_.Dv;
    std::fill(s_.C.begin(), s_.C.end(), 0.0f);
    std::fill(s_.z.begin(), s_.z.end(), 0.0f);
    std::fill(s_.m.begin(), s_.m.end(), 0.0f);
    std::fill(s_.arg.begin(), s_.arg.end(), int64_t{-1});
    if (p_.initial)
      for (int64_t f = 0; f < D; ++f) {
        for (int64_t c = 0; c < Dv; ++c) s_.C[static_cast<size_t>(f * Dv + c)] = init(h, f, c);
        s_.z[static_cast<size_t>(f)] = init(h, f, Dv), s_.m[static_cast<size_t>(f)] = init(h, f, Dv + 1);
      }
    std::copy(s_.z.begin(), s_.z.end(), s_.zs.begin());
    std::copy(s_.m.begin(), s_.m.end(), s_.ms.begin());
    if (!p_.mech.causal) {
      for (int64_t j = 0; j < len_; ++j) absorb(j);
      for (int64_t i = 0; i < p_.N; ++i) query(h, i);
      return;
    }
    for (int64_t t = 0; t < p_.N; ++t) {
      if (t < len_) absorb(t);
      query(h, t);
    }
  }

  void absorb(int64_t j) {
    const int64_t D = p_.D, Dv = p_.Dv;
    float* k = s_.k.data();
    float* v = s_.v.data();
    core::load_rows(kern_, p_.k, b_, hk_, j, 1, len_, k, D);
    core::load_rows(kern_, p_.v, b_, hk_, j, 1, len_, v, Dv);
    for (int64_t f = 0; f < D; ++f) {
      float* row = s_.C.data() + f * Dv;
      float& zf = s_.z[static_cast<size_t>(f)];
      float& mf = s_.m[static_cast<size_t>(f)];
      if (zf == 0.0f) {
        std::copy(v, v + Dv, row);
        zf = 1.0f, mf = k[f], s_.arg[static_cast<size_t>(f)] = j;
        continue;
      }
      if (k[f] > mf) s_.arg[static_cast<size_t>(f)] = j;
      const float top = std::max(mf, k[f]);
      const float old = zf * std::exp(mf - top), fresh = std::exp(k[f] - top), total = old + fresh;
      const float keep = old / total, add = fresh / total;
      for (int64_t c = 0; c < Dv; ++c) row[c] = row[c] * keep + v[c] * add;
      zf = total, mf = top;
    }
    std::copy(s_.z.begin(), s_.z.end(), s_.zs.begin() + (j + 1) * D);
    std::copy(s_.m.begin(), s_.m.end(), s_.ms.begin() + (j + 1) * D);
  }

  void query(int64_t h, int64_t i) {
    const int64_t D = p_.D, Dv = p_.Dv;
    float* a = s_.a.data() + i * D;
    float* gq = s_.gq.data() + i * D;
    float* dout = s_.dout.data() + i * Dv;
    core::load_rows(kern_, p_.q, b_, h, i, 1, p_.N, a, D);
    kern_.to_float(g_.dout.ptr(b_, h, i), g_.dout.dtype, g_.dout.strides[3], Dv, dout);
    const float top = *std::max_element(a, a + D);
    float sum = 0;
    for (int64_t f = 0; f < D; ++f) sum += (a[f] = std::exp(a[f] - top));
    float pg = 0;
    for (int64_t f = 0; f < D; ++f) {
      a[f] /= sum;  // p_if for now
      const float* row = s_.C.data() + f * Dv;
      float acc = 0;
      for (int64_t c = 0; c < Dv; ++c) acc += dout[c] * row[c];
      gq[f] = acc;
      pg += a[f] * acc;
    }
    const float scale = static_cast<float>(p_.scale);
    float* dq = s_.q.data();
    for (int64_t f = 0; f < D; ++f) {
      dq[f] = scale * a[f] * (gq[f] - pg);
      a[f] *= scale;  // a_if
    }
    kern_.from_float(dq, g_.dq.dtype, g_.dq.strides[3], D, g_.dq.ptr(b_, h, i));
  }

  // G_f += c dO_i / z_f, H_f += c g_if / z_f for query i with c = a_if (at its own state: the
  // reference point is its maximum).
  void add_query(int64_t i, const float* z) {
    const int64_t D = p_.D, Dv = p_.Dv;
    const float* a = s_.a.data() + i * D;
    const float* gq = s_.gq.data() + i * D;
    const float* dout = s_.dout.data() + i * Dv;
    for (int64_t f = 0; f < D; ++f) {
      if (z[f] == 0.0f) continue;  // an empty state: C_f = 0, nothing flows back
      const float c = a[f] / z[f];
      float* G = s_.G.data() + f * Dv;
      for (int64_t x = 0; x < Dv; ++x) G[x] += c * dout[x];
      s_.H[static_cast<size_t>(f)] += c * gq[f];
    }
  }

  void backward(int64_t h) {
    const int64_t D = p_.D, Dv = p_.Dv, W = Dv + 2;
    std::fill(s_.G.begin(), s_.G.end(), 0.0f);
    std::fill(s_.H.begin(), s_.H.end(), 0.0f);
    const bool has_final = !g_.dfinal_state.empty();
    const bool ds0 = !g_.d_initial_state.empty();
    const float* zF = s_.zs.data() + len_ * D;
    if (ds0)
      for (int64_t f = 0; f < D; ++f)
        for (int64_t c = 0; c < W; ++c) store_from_float(g_.d_initial_state.data, g_.d_initial_state.dtype,
                                                         g_.d_initial_state.offset(b_, h, f, c), 0.0f);
    auto add_ds0 = [&](int64_t f, int64_t c, float x) {
      const int64_t at = g_.d_initial_state.offset(b_, h, f, c);
      store_from_float(g_.d_initial_state.data, g_.d_initial_state.dtype, at,
                       load_as_float(g_.d_initial_state.data, g_.d_initial_state.dtype, at) + x);
    };
    if (has_final)  // C_F as one more query (dC_f = dC_F_f), its sum's gradient into H; the maximum's below
      for (int64_t f = 0; f < D; ++f) {
        if (zF[f] == 0.0f) continue;
        float* G = s_.G.data() + f * Dv;
        const float* CF = s_.C.data() + f * Dv;  // the state after every key: the last forward's
        float dCC = 0;
        for (int64_t c = 0; c < Dv; ++c) {
          const float d = g_.dfinal_state.at(b_, h, f, c);
          G[c] += d / zF[f];
          dCC += d * CF[c];
        }
        s_.H[static_cast<size_t>(f)] += dCC / zF[f] - g_.dfinal_state.at(b_, h, f, Dv);
      }
    // queries by their state: non-causal all at len; causal i at min(i + 1, len)
    const auto first_at = [&](int64_t e) {  // queries i with e_i == e: [first_at(e), last)
      return !p_.mech.causal ? (e == len_ ? int64_t{0} : p_.N) : e == 0 ? int64_t{0} : e - 1;
    };
    for (int64_t e = len_; e >= 0; --e) {
      const int64_t i0 = first_at(e), i1 = e == len_ ? p_.N : (p_.mech.causal ? e : i0);
      const float* z = s_.zs.data() + e * D;
      for (int64_t i = i0; i < i1; ++i) add_query(i, z);
      const float* m = s_.ms.data() + e * D;
      if (e >= 1) {  // key e - 1
        const int64_t j = e - 1;
        float* k = s_.k.data();
        float* v = s_.v.data();
        core::load_rows(kern_, p_.k, b_, hk_, j, 1, len_, k, D);
        core::load_rows(kern_, p_.v, b_, hk_, j, 1, len_, v, Dv);
        float* dk = s_.dk.data() + j * D;
        float* dv = s_.dv.data() + j * Dv;
        const float* zp = s_.zs.data() + (e - 1) * D;
        const float* mp = s_.ms.data() + (e - 1) * D;
        for (int64_t f = 0; f < D; ++f) {
          float* G = s_.G.data() + f * Dv;
          const float w = std::exp(k[f] - m[f]);
          float Gv = 0;
          for (int64_t c = 0; c < Dv; ++c) {
            dv[c] += w * G[c];
            Gv += G[c] * v[c];
          }
          dk[f] += w * (Gv - s_.H[static_cast<size_t>(f)]);
          if (has_final && s_.arg[static_cast<size_t>(f)] == j)
            dk[f] += g_.dfinal_state.at(b_, h, f, Dv + 1) - zF[f] * g_.dfinal_state.at(b_, h, f, Dv);
          if (zp[f] == 0.0f) {  // no earlier state: an initial state with z0 = 0 gets its one-sided dz0
            if (ds0) add_ds0(f, Dv, std::exp(mp[f] - m[f]) * (dot_initial(h, f) - s_.H[static_cast<size_t>(f)]));
            continue;
          }
          const float r = std::exp(mp[f] - m[f]);  // <= 1: the earlier maximum is not larger
          for (int64_t c = 0; c < Dv; ++c) G[c] *= r;
          s_.H[static_cast<size_t>(f)] *= r;
        }
        continue;
      }
      // e == 0: the initial state (its pseudo key has weight z0 at its own maximum m0)
      if (!ds0) continue;
      for (int64_t f = 0; f < D; ++f) {
        const float z0 = z[f];
        if (z0 == 0.0f) {
          if (len_ == 0) add_ds0(f, Dv, dot_initial(h, f) - s_.H[static_cast<size_t>(f)]);  // (G = H = 0 here)
          continue;
        }
        const float* G = s_.G.data() + f * Dv;
        for (int64_t c = 0; c < Dv; ++c) add_ds0(f, c, z0 * G[c]);
        const float dlogw = z0 * (dot_initial(h, f) - s_.H[static_cast<size_t>(f)]);
        add_ds0(f, Dv, dlogw / z0);
        float dm = dlogw;
        if (has_final && s_.arg[static_cast<size_t>(f)] == -1)
          dm += g_.dfinal_state.at(b_, h, f, Dv + 1) - zF[f] * g_.dfinal_state.at(b_, h, f, Dv);
        add_ds0(f, Dv + 1, dm);
      }
    }
  }

  // G_f . C0_f (the initial state's context row).
  float dot_initial(int64_t h, int64_t f) const {
    const float* G = s_.G.data() + f * p_.Dv;
    float acc = 0;
    for (int64_t c = 0; c < p_.Dv; ++c) acc += G[c] * init(h, f, c);
    return acc;
  }

  const EfficientProblem& p_;
  const core::BackwardViews& g_;
  const kernels::TileKernels& kern_;
  Scratch& s_;
  int64_t b_, hk_, len_;
};

void run_online(const EfficientProblem& p, const core::BackwardViews& g, const core::Context& ctx) {
  const int64_t items = p.B * p.Hkv;
  const int threads = resolve_threads(ctx.threads, items);
  std::vector<Scratch> scratch = per_thread<Scratch>(threads, p);
  parallel_for(items, threads, [&](int64_t item, int t) {
    TaskRun(p, g, *ctx.kern, scratch[static_cast<size_t>(t)], item / p.Hkv, item % p.Hkv).run();
  });
}

}  // namespace

std::string EfficientFamily::backward_refusal(const EfficientProblem&) { return ""; }

void EfficientFamily::backward_reference(const EfficientProblem& p, const core::BackwardViews& g,
                                         core::RefPrecision precision) {
  if (precision == core::RefPrecision::f64)
    reference_impl<double>(p, g, false);
  else
    reference_impl<float>(p, g, true);
}

const std::vector<core::BackwardForm<EfficientProblem>>& EfficientFamily::backward_forms() {
  static const std::vector<core::BackwardForm<EfficientProblem>> list = {
      {"online", "float32: the per-feature states again in token order, then one walk back over the keys",
       core::refuse_nothing<EfficientProblem>, run_online},
      {"reference", "float64: every query's per-feature softmaxes written out, differentiated by hand (slow, exact)",
       core::refuse_nothing<EfficientProblem>,
       [](const EfficientProblem& p, const core::BackwardViews& g, const core::Context&) {
         reference_impl<double>(p, g, false);
       }},
  };
  return list;
}

}  // namespace attn::efficient
