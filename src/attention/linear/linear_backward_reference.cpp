// The linear backward's oracle (formulas: linear_backward.hpp): the quadratic weights written out
// per query, as linear_reference.cpp does for the forward, and every gradient summed from them.
// No state recurrence, no chunks: what the fast backward forms must reproduce.
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "attn/error.hpp"
#include "linear/feature_backward.hpp"
#include "linear/feature_map.hpp"
#include "linear/linear_backward.hpp"
#include "linear/output_norm.hpp"

namespace attn::linear {
namespace {

template <class T>
void reference_impl(const LinearProblem& p, const BackwardViews& g, bool plain) {
  const core::Rounding<T> rnd{p.q.dtype, plain};
  const int64_t F = p.F, D = p.D, Dv = p.Dv, cols = p.state_cols();
  const bool normalize = p.mech.normalize;
  auto at = [](int64_t r, int64_t w, int64_t c) { return static_cast<size_t>(r * w + c); };
  // (plain: every result rounded to the storage dtype too, as a same-dtype implementation returns it)
  // sk, sq: what the features' backward keeps of a row (feature_backward.hpp), D values each
  std::vector<T> fk(static_cast<size_t>(p.M * F)), sk(static_cast<size_t>(p.M * D)), u(static_cast<size_t>(p.M * cols)),
      dfk(static_cast<size_t>(p.M * F)), du(static_cast<size_t>(p.M * cols)), fq(static_cast<size_t>(F)),
      sq(static_cast<size_t>(D)), dfq(static_cast<size_t>(F)), y(static_cast<size_t>(cols)), gi(static_cast<size_t>(cols)),
      w(static_cast<size_t>(p.M)), s0(static_cast<size_t>(F * cols)), ds0(static_cast<size_t>(F * cols)),
      dsf(static_cast<size_t>(F * cols)), raw(static_cast<size_t>(D)), dx(static_cast<size_t>(std::max(D, p.M * D))),
      wf(static_cast<size_t>(std::max(F, p.M * F)));
  // PolaFormer's learned params (this stream's coefficients), added to g.dparams at the end
  const bool learned = p.polar() && !g.dparams.empty();
  std::vector<T> dpower(learned ? static_cast<size_t>(D) : 0), dcoef(learned ? static_cast<size_t>(Dv) : 0);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t hk = 0; hk < p.Hkv; ++hk) {
      const int64_t len = p.kv_len[static_cast<size_t>(b)];
      for (int64_t j = 0; j < len; ++j) {  // phi(k_j), phi'(k_j), u_j
        for (int64_t c = 0; c < D; ++c) raw[static_cast<size_t>(c)] = static_cast<T>(p.k.at(b, hk, j, c));
        reference_features(p, false, raw.data(), &fk[at(j, F, 0)]);
        for (int64_t c = 0; c < F; ++c) fk[at(j, F, c)] = rnd(fk[at(j, F, c)]);
        feature_aux(p, raw.data(), &sk[at(j, D, 0)]);
        for (int64_t c = 0; c < Dv; ++c) u[at(j, cols, c)] = static_cast<T>(p.v.at(b, hk, j, c));
        if (normalize) u[at(j, cols, Dv)] = 1;
      }
      std::fill(dfk.begin(), dfk.end(), T(0));
      std::fill(du.begin(), du.end(), T(0));
      for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
        const T lambda = static_cast<T>(p.decay[static_cast<size_t>(h)]), scale = static_cast<T>(p.scale);
        for (int64_t f = 0; f < F; ++f)
          for (int64_t c = 0; c < cols; ++c) {
            s0[at(f, cols, c)] = static_cast<T>(p.initial_at(b, h, f, c));
            dsf[at(f, cols, c)] = g.dfinal_state.empty() ? T(0) : static_cast<T>(g.dfinal_state.at(b, h, f, c));
          }
        std::fill(ds0.begin(), ds0.end(), T(0));
        for (int64_t i = 0; i < p.N; ++i) {
          const int64_t pos = i + p.M - p.N;  // causal calls have N = M
          for (int64_t c = 0; c < D; ++c) raw[static_cast<size_t>(c)] = static_cast<T>(p.q.at(b, h, i, c));
          reference_features(p, true, raw.data(), fq.data());
          for (int64_t c = 0; c < F; ++c) fq[static_cast<size_t>(c)] = rnd(fq[static_cast<size_t>(c)]);
          feature_aux(p, raw.data(), sq.data());
          // the forward again: the weights w_ij and y_i = sum_j w_ij u_j + t phi(q_i)^T S0
          std::fill(y.begin(), y.end(), T(0));
          const int64_t seen = p.mech.causal ? std::min(len, pos + 1) : len;
          for (int64_t j = 0; j < seen; ++j) {
            T dot = 0;
            for (int64_t c = 0; c < F; ++c) dot += fq[static_cast<size_t>(c)] * fk[at(j, F, c)];
            T x = rnd(rnd(dot * scale) * std::pow(lambda, static_cast<T>(pos - j)));
            x += x - x;  // +-inf (a non-finite q or k) is NaN, as in the forward
            w[static_cast<size_t>(j)] = x;
            for (int64_t c = 0; c < cols; ++c) y[static_cast<size_t>(c)] += x * u[at(j, cols, c)];
          }
          const T t = scale * (p.mech.causal ? std::pow(lambda, static_cast<T>(pos + 1)) : T(1));
          if (p.initial)
            for (int64_t f = 0; f < F; ++f)
              for (int64_t c = 0; c < cols; ++c) y[static_cast<size_t>(c)] += t * fq[static_cast<size_t>(f)] * s0[at(f, cols, c)];
          for (T& e : y) e = rnd(e);
          // g_i = dL/dy_i
          for (int64_t c = 0; c < Dv; ++c) gi[static_cast<size_t>(c)] = static_cast<T>(g.dout.at(b, h, i, c));
          if (p.norm != OutputNorm::none) {  // normattn: through the output norm (no denominator)
            std::vector<T> dout(gi.begin(), gi.begin() + Dv);
            normalise_row_backward(p.norm, y.data(), dout.data(), gi.data(), Dv);
            for (int64_t c = 0; c < Dv; ++c) gi[static_cast<size_t>(c)] = rnd(gi[static_cast<size_t>(c)]);
          }
          if (normalize) {
            const T den = rnd(y[static_cast<size_t>(Dv)] + static_cast<T>(p.eps));
            if (!p.coef.empty())  // o = coef y / den: dcoef gains dout y / den, and dout becomes coef dout
              for (int64_t c = 0; c < Dv; ++c) {
                const size_t e = static_cast<size_t>(c);
                if (learned) dcoef[e] += gi[e] * (den != 0 ? y[e] / den : T(0));
                gi[e] = rnd(gi[e] * static_cast<T>(p.coef[e]));
              }
            T dot = 0;  // dO_i . o_i den_i
            for (int64_t c = 0; c < Dv; ++c) dot += gi[static_cast<size_t>(c)] * y[static_cast<size_t>(c)];
            for (int64_t c = 0; c < Dv; ++c) gi[static_cast<size_t>(c)] = den != 0 ? rnd(gi[static_cast<size_t>(c)] / den) : T(0);
            gi[static_cast<size_t>(Dv)] = den != 0 ? rnd(-rnd(dot) / (den * den)) : T(0);
          }
          // d phi(q_i), d phi(k_j), d u_j through the weights; dS0 through the initial state
          std::fill(dfq.begin(), dfq.end(), T(0));
          for (int64_t j = 0; j < seen; ++j) {
            T dw = 0;
            for (int64_t c = 0; c < cols; ++c) dw += gi[static_cast<size_t>(c)] * u[at(j, cols, c)];
            const T e = rnd(rnd(dw) * scale * std::pow(lambda, static_cast<T>(pos - j)));
            for (int64_t c = 0; c < F; ++c) {
              dfq[static_cast<size_t>(c)] += e * fk[at(j, F, c)];
              dfk[at(j, F, c)] += e * fq[static_cast<size_t>(c)];
            }
            for (int64_t c = 0; c < cols; ++c) du[at(j, cols, c)] += w[static_cast<size_t>(j)] * gi[static_cast<size_t>(c)];
          }
          for (int64_t f = 0; f < F; ++f)
            for (int64_t c = 0; c < cols; ++c) {
              if (p.initial) dfq[static_cast<size_t>(f)] += t * s0[at(f, cols, c)] * gi[static_cast<size_t>(c)];
              ds0[at(f, cols, c)] += t * fq[static_cast<size_t>(f)] * gi[static_cast<size_t>(c)];
            }
          feature_backward(p, true, 1, sq.data(), fq.data(), dfq.data(), T(1), dx.data(), wf.data(), nullptr, nullptr,
                           learned ? dpower.data() : nullptr);
          for (int64_t c = 0; c < D; ++c)
            store_from_float(g.dq.data, g.dq.dtype, g.dq.offset(b, h, i, c),
                             static_cast<float>(rnd(dx[static_cast<size_t>(c)])));
        }
        // the final state: S = L^len S0 + sum_j L^(len-1-j) phi(k_j) u_j^T
        if (!g.dfinal_state.empty()) {
          for (int64_t j = 0; j < len; ++j) {
            const T a = p.mech.causal ? std::pow(lambda, static_cast<T>(len - 1 - j)) : T(1);
            for (int64_t f = 0; f < F; ++f)
              for (int64_t c = 0; c < cols; ++c) {
                dfk[at(j, F, f)] += a * dsf[at(f, cols, c)] * u[at(j, cols, c)];
                du[at(j, cols, c)] += a * dsf[at(f, cols, c)] * fk[at(j, F, f)];
              }
          }
          const T start = p.mech.causal ? std::pow(lambda, static_cast<T>(len)) : T(1);
          for (size_t e = 0; e < ds0.size(); ++e) ds0[e] += start * dsf[e];
        }
        if (!g.d_initial_state.empty())
          for (int64_t f = 0; f < F; ++f)
            for (int64_t c = 0; c < cols; ++c)
              store_from_float(g.d_initial_state.data, g.d_initial_state.dtype, g.d_initial_state.offset(b, h, f, c),
                               static_cast<float>(rnd(ds0[at(f, cols, c)])));
      }
      feature_backward(p, false, len, sk.data(), fk.data(), dfk.data(), T(1), dx.data(), wf.data(), nullptr, nullptr,
                       learned ? dpower.data() : nullptr);
      for (int64_t j = 0; j < p.M; ++j) {  // keys past the padding length: no gradient
        for (int64_t c = 0; c < D; ++c)
          store_from_float(g.dk.data, g.dk.dtype, g.dk.offset(b, hk, j, c),
                           j < len ? static_cast<float>(rnd(dx[at(j, D, c)])) : 0.0f);
        for (int64_t c = 0; c < Dv; ++c)
          store_from_float(g.dv.data, g.dv.dtype, g.dv.offset(b, hk, j, c), j < len ? static_cast<float>(rnd(du[at(j, cols, c)])) : 0.0f);
      }
    }
  if (learned)  // added to what the other stream left there (the caller zeroes them first)
    for (const bool power : {true, false}) {
      const auto it = g.dparams.find(power ? "power" : "coefficients");
      if (it == g.dparams.end()) continue;
      const std::vector<T>& sum = power ? dpower : dcoef;
      const TensorView& d = it->second;
      for (size_t c = 0; c < sum.size(); ++c) {
        const int64_t e = d.offset(0, 0, 0, static_cast<int64_t>(c));
        store_from_float(d.data, d.dtype, e, load_as_float(d.data, d.dtype, e) + static_cast<float>(rnd(sum[c])));
      }
    }
}

}  // namespace

void polar_streams_backward(const LinearProblem& p, const BackwardViews& g,
                            const std::function<void(const LinearProblem&, const BackwardViews&)>& run) {
  Tensor dq[2] = {Tensor(DType::f32, {p.B, p.H, p.N, p.D}), Tensor(DType::f32, {p.B, p.H, p.N, p.D})};
  Tensor dk[2] = {Tensor(DType::f32, {p.B, p.Hkv, p.M, p.D}), Tensor(DType::f32, {p.B, p.Hkv, p.M, p.D})};
  for (const auto& [name, d] : g.dparams) std::fill_n(static_cast<float*>(d.data), d.numel(), 0.0f);
  auto part = [](TensorView v, int axis, int64_t from, int64_t count) {  // rows or channels [from, from + count)
    if (v.empty()) return v;
    v.data = axis == 2 ? v.ptr(0, 0, from, 0) : v.ptr(0, 0, 0, from);
    v.shape[axis] = count;
    return v;
  };
  for (int s = 0; s < 2; ++s) {
    const LinearProblem sub = stream_problem(p, s);
    BackwardViews sg = g;
    sg.dout = part(g.dout, 3, s * sub.Dv, sub.Dv), sg.out = part(g.out, 3, s * sub.Dv, sub.Dv);
    sg.dv = part(g.dv, 3, s * sub.Dv, sub.Dv);
    sg.dq = dq[s].view(), sg.dk = dk[s].view();
    sg.dfinal_state = part(g.dfinal_state, 2, s * sub.F, sub.F);
    sg.d_initial_state = part(g.d_initial_state, 2, s * sub.F, sub.F);
    if (const auto it = g.dparams.find("coefficients"); it != g.dparams.end())
      sg.dparams["coefficients"] = part(it->second, 3, s * sub.Dv, sub.Dv);
    run(sub, sg);
  }
  for (int which = 0; which < 2; ++which) {  // dq, dk: the same-sign stream's plus the other's, in float32
    const TensorView& dst = which == 0 ? g.dq : g.dk;
    const Tensor* src = which == 0 ? dq : dk;
    for (int64_t b = 0; b < dst.shape[0]; ++b)
      for (int64_t h = 0; h < dst.shape[1]; ++h)
        for (int64_t n = 0; n < dst.shape[2]; ++n)
          for (int64_t c = 0; c < dst.shape[3]; ++c)
            store_from_float(dst.data, dst.dtype, dst.offset(b, h, n, c),
                             src[0].at(b, h, n, c) + src[1].at(b, h, n, c));
  }
}

std::string linear_backward_refusal(const LinearProblem& p) {
  // the queries' stabilising shift is taken as a constant: exact only where it cancels
  if (!p.omega_t.empty() && (!p.mech.normalize || p.eps != 0 || p.norm != OutputNorm::none))
    return "performer's backward needs its normalised output without eps (the queries' shift must cancel)";
  return "";
}

void linear_backward_reference(const LinearProblem& p, const BackwardViews& g, core::RefPrecision precision) {
  if (p.polar() && p.stream < 0)
    return polar_streams_backward(p, g, [&](const LinearProblem& sub, const BackwardViews& sg) {
      linear_backward_reference(sub, sg, precision);
    });
  if (precision == core::RefPrecision::f64)
    reference_impl<double>(p, g, false);
  else
    reference_impl<float>(p, g, true);
}

}  // namespace attn::linear
