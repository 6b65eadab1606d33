#include "qsoftmax/qsoftmax.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include "attn/error.hpp"
#include "base/parallel.hpp"
#include "core/direct_rows.hpp"
#include "core/params.hpp"
#include "core/row_stats.hpp"
#include "core/rows.hpp"
#include "qsoftmax/feature_softmax.hpp"

namespace attn::qsoftmax {
namespace {

// One thread's rows and state, sized before the parallel region (which must not allocate).
struct Scratch {
  std::vector<float> S, q, k, v, o, w;
  std::optional<core::DirectRows> rows;  // return_stats
  Scratch(const kernels::TileKernels& kern, const QSoftmaxProblem& p, const core::Outputs& out)
      : S(static_cast<size_t>(p.D * p.Dv)), q(static_cast<size_t>(p.D)), k(static_cast<size_t>(p.D)),
        v(static_cast<size_t>(p.Dv)), o(static_cast<size_t>(p.Dv)), w(core::DirectRows::kSegment) {
    if (out.stats) rows.emplace(kern, out.stats->topk());
  }
};

// S += k_j v_j^T for key j of head (b, h).
void absorb(const kernels::TileKernels& kern, const QSoftmaxProblem& p, Scratch& s, int64_t b, int64_t hk, int64_t j) {
  core::load_rows(kern, p.k, b, hk, j, 1, j + 1, s.k.data(), p.D);
  core::load_rows(kern, p.v, b, hk, j, 1, j + 1, s.v.data(), p.Dv);
  for (int64_t f = 0; f < p.D; ++f)
    for (int64_t c = 0; c < p.Dv; ++c) s.S[static_cast<size_t>(f * p.Dv + c)] += s.k[static_cast<size_t>(f)] * s.v[static_cast<size_t>(c)];
}

// Row i: o_i = scale softmax(q_i)^T S into out, and its weights' statistics.
void emit(const kernels::TileKernels& kern, const QSoftmaxProblem& p, const core::Outputs& out, Scratch& s, int64_t b,
          int64_t h, int64_t i) {
  core::load_rows(kern, p.q, b, h, i, 1, p.N, s.q.data(), p.D);
  softmax_features(s.q.data(), p.D);
  std::fill(s.o.begin(), s.o.end(), 0.0f);
  for (int64_t f = 0; f < p.D; ++f)
    for (int64_t c = 0; c < p.Dv; ++c) s.o[static_cast<size_t>(c)] += s.q[static_cast<size_t>(f)] * s.S[static_cast<size_t>(f * p.Dv + c)];
  for (float& x : s.o) x = x * static_cast<float>(p.scale) + (x - x);  // +-inf (a non-finite k) is NaN
  kern.from_float(s.o.data(), out.out->dtype, out.out->strides[3], p.Dv, out.out->ptr(b, h, i));
  if (!s.rows) return;
  s.rows->start();  // the weights softmax(q_i) . k_j over the keys the row sees, 64 at a time
  const int64_t end = key_end(p, b, i), hk = p.kv_head(h);
  for (int64_t j0 = 0; j0 < end; j0 += core::DirectRows::kSegment) {
    const int64_t n = std::min(core::DirectRows::kSegment, end - j0);
    for (int64_t j = 0; j < n; ++j) {
      core::load_rows(kern, p.k, b, hk, j0 + j, 1, end, s.k.data(), p.D);
      s.w[static_cast<size_t>(j)] = core::dot(s.q.data(), s.k.data(), p.D);
    }
    s.rows->add(0, s.w.data(), n);
  }
  out.stats->put(b, h, i, s.rows->summary(0));
}

// Both forms: per (batch, query head), the state from S0, then the rows (non-causal: every key
// first; causal: key i just before row i).
void run_state(const QSoftmaxProblem& p, const core::Outputs& out, const core::Context& ctx) {
  const kernels::TileKernels& kern = *ctx.kern;
  const int threads = resolve_threads(ctx.threads, p.B * p.H);
  std::vector<Scratch> scratch = per_thread<Scratch>(threads, kern, p, out);
  parallel_for(p.B * p.H, threads, [&](int64_t item, int thread) {
    const int64_t b = item / p.H, h = item % p.H, hk = p.kv_head(h), len = p.kv_len[static_cast<size_t>(b)];
    Scratch& s = scratch[static_cast<size_t>(thread)];
    for (int64_t f = 0; f < p.D; ++f)
      for (int64_t c = 0; c < p.Dv; ++c)
        s.S[static_cast<size_t>(f * p.Dv + c)] = p.initial ? core::element_at(*p.initial, b, h, f, c) : 0.0f;
    if (!p.mech.causal)
      for (int64_t j = 0; j < len; ++j) absorb(kern, p, s, b, hk, j);
    for (int64_t i = 0; i < p.N; ++i) {
      if (p.mech.causal && i < len) absorb(kern, p, s, b, hk, i);
      emit(kern, p, out, s, b, h, i);
    }
    if (out.final_state)
      for (int64_t f = 0; f < p.D; ++f)
        for (int64_t c = 0; c < p.Dv; ++c)
          static_cast<float*>(out.final_state->data)[out.final_state->offset(b, h, f, c)] = s.S[static_cast<size_t>(f * p.Dv + c)];
  });
}

void refuse_right(const QSoftmaxProblem& p, const core::Outputs& o, core::Reasons& why) {
  if (p.mech.causal) why.push_back("causal (the recurrent form)");
  core::refuse_probs(p, o, why);
}

void refuse_recurrent(const QSoftmaxProblem& p, const core::Outputs& o, core::Reasons& why) {
  if (!p.mech.causal) why.push_back("not causal (the right form)");
  core::refuse_probs(p, o, why);
}

template <class T>
core::ReferenceResult reference_impl(const QSoftmaxProblem& p, bool plain) {
  const core::Rounding<T> rnd{p.q.dtype, plain};
  core::ReferenceResult r = core::zero_result(p.B, p.H, p.N, p.M, p.Dv, p.stats_topk);
  r.probs.assign(static_cast<size_t>(p.B * p.H * p.N * p.M), 0.0);
  r.F = p.D, r.state_cols = p.Dv;
  r.state.assign(static_cast<size_t>(p.B * p.H * p.D * p.Dv), 0.0);
  std::vector<T> sq(static_cast<size_t>(p.D)), acc(static_cast<size_t>(p.Dv));
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h) {
      const int64_t hk = p.kv_head(h);
      auto s0 = [&](int64_t f, int64_t c) { return p.initial ? static_cast<T>(core::element_at(*p.initial, b, h, f, c)) : T(0); };
      for (int64_t i = 0; i < p.N; ++i) {
        const size_t at = static_cast<size_t>((b * p.H + h) * p.N + i);
        for (int64_t f = 0; f < p.D; ++f) sq[static_cast<size_t>(f)] = static_cast<T>(p.q.at(b, h, i, f));
        softmax_features(sq.data(), p.D);
        for (T& x : sq) x = rnd(x);
        for (int64_t c = 0; c < p.Dv; ++c) {  // the state passed in
          T x = 0;
          for (int64_t f = 0; f < p.D; ++f) x += sq[static_cast<size_t>(f)] * s0(f, c);
          acc[static_cast<size_t>(c)] = x;
        }
        for (int64_t j = 0; j < key_end(p, b, i); ++j) {
          T w = 0;
          for (int64_t f = 0; f < p.D; ++f) w += sq[static_cast<size_t>(f)] * static_cast<T>(p.k.at(b, hk, j, f));
          w = rnd(w);
          w += w - w;  // a weight of +-inf (a non-finite k) is NaN, as the fast forms' rows
          r.probs[at * p.M + j] = static_cast<double>(w) * p.scale;
          for (int64_t c = 0; c < p.Dv; ++c) acc[static_cast<size_t>(c)] += w * static_cast<T>(p.v.at(b, hk, j, c));
        }
        for (int64_t c = 0; c < p.Dv; ++c)
          r.out[at * p.Dv + c] = static_cast<double>(rnd(acc[static_cast<size_t>(c)] * static_cast<T>(p.scale)));
        if (double* st = r.stats_of(b, h, i)) core::reference_row_stats(&r.probs[at * p.M], nullptr, key_end(p, b, i), p.stats_topk, st);
      }
      for (int64_t f = 0; f < p.D; ++f)  // S0 + every valid key's k v^T
        for (int64_t c = 0; c < p.Dv; ++c) {
          T x = s0(f, c);
          for (int64_t j = 0; j < p.kv_len[static_cast<size_t>(b)]; ++j)
            x += static_cast<T>(p.k.at(b, hk, j, f)) * static_cast<T>(p.v.at(b, hk, j, c));
          r.state[static_cast<size_t>(((b * p.H + h) * p.D + f) * p.Dv + c)] = static_cast<double>(x);
        }
    }
  return r;
}

}  // namespace

QSoftmaxProblem QSoftmaxFamily::validate(const TensorView& q, const TensorView& k, const TensorView& v, const QSoftmax& m,
                                         const AttendOptions& opt, const core::Outputs& outs) {
  QSoftmaxProblem p;
  static_cast<core::Dims&>(p) = core::check_io(q, k, v, outs, opt);
  p.mech = m;
  const auto text = core::mechanism_text(m);
  core::refuse_score_options(opt, "qsoftmax", "its weights are softmax(q) . k, not a score matrix");
  if (m.causal) core::check_causal_tokens(p, text);
  core::check_option_ranges(ranges(m), "qsoftmax");
  p.scale = m.scale.value_or(1.0);
  if (!opt.params.empty()) {  // all optional: nothing given, nothing to check
    core::Symbols symbols{{"B", p.B}, {"H", p.H}, {"D", p.D}, {"Dv", p.Dv}};
    core::check_params(opt.params, params(m), text, symbols);
  } else {
    assert(core::none_required(params(m)));
  }
  if (const auto it = opt.params.find("initial_state"); it != opt.params.end()) p.initial = it->second;
  return p;
}

const std::vector<core::Form<QSoftmaxProblem>>& QSoftmaxFamily::forms() {
  static const std::vector<core::Form<QSoftmaxProblem>> list = {
      {"right", "non-causal: S = S0 + K^T V once per head, then softmax(q_i)^T S per row", refuse_right, run_state},
      {"recurrent", "causal: S += k_i v_i^T, then softmax(q_i)^T S, token by token (O(D Dv) each)", refuse_recurrent,
       run_state},
      {"reference", "float64 weights row by row (quadratic, exact)", core::refuse_nothing<QSoftmaxProblem>,
       [](const QSoftmaxProblem& p, const core::Outputs& o, const core::Context&) {
         core::write_reference(reference_impl<double>(p, false), o);
       }},
  };
  return list;
}

double QSoftmaxFamily::flops(const QSoftmaxProblem& p) {
  return 2.0 * static_cast<double>(p.B * p.H) * static_cast<double>(p.N + p.M) * static_cast<double>(p.D * p.Dv);
}

core::ReferenceResult QSoftmaxFamily::reference(const QSoftmaxProblem& p, core::RefPrecision precision) {
  return precision == core::RefPrecision::f64 ? reference_impl<double>(p, false) : reference_impl<float>(p, true);
}

std::array<int64_t, 4> QSoftmaxFamily::state_shape(const QSoftmaxProblem& p) { return {p.B, p.H, p.D, p.Dv}; }

}  // namespace attn::qsoftmax
