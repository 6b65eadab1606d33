#include "efficient/efficient.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "attn/error.hpp"
#include "base/parallel.hpp"
#include "core/params.hpp"
#include "core/row_stats.hpp"
#include "core/rows.hpp"

namespace attn::efficient {
namespace {

const char* kWhere = "attend";

// The per-feature online softmax of one head: rows f of C (D x Dv), z and m (D).
struct FeatureSoftmax {
  std::vector<float> C, z, m;
  int64_t D, Dv;

  explicit FeatureSoftmax(const EfficientProblem& p)
      : C(static_cast<size_t>(p.D * p.Dv)), z(static_cast<size_t>(p.D)), m(static_cast<size_t>(p.D)), D(p.D), Dv(p.Dv) {}

  // The initial state of (b, h), or zeros.
  void load(const EfficientProblem& p, int64_t b, int64_t h) {
    std::fill(C.begin(), C.end(), 0.0f);
    std::fill(z.begin(), z.end(), 0.0f);
    std::fill(m.begin(), m.end(), 0.0f);
    if (!p.initial) return;
    auto at = [&](int64_t f, int64_t c) { return core::element_at(*p.initial, b, h, f, c); };
    for (int64_t f = 0; f < D; ++f) {
      for (int64_t c = 0; c < Dv; ++c) C[static_cast<size_t>(f * Dv + c)] = at(f, c);
      z[static_cast<size_t>(f)] = at(f, Dv), m[static_cast<size_t>(f)] = at(f, Dv + 1);
    }
  }

  // One key k (D) with its value v (Dv).
  void absorb(const float* k, const float* v) {
    for (int64_t f = 0; f < D; ++f) {
      float* row = C.data() + f * Dv;
      float& zf = z[static_cast<size_t>(f)];
      float& mf = m[static_cast<size_t>(f)];
      if (zf == 0.0f) {  // the first key this feature sees
        std::copy(v, v + Dv, row);
        zf = 1.0f, mf = k[f];
        continue;
      }
      const float top = std::max(mf, k[f]);
      const float old = zf * std::exp(mf - top), fresh = std::exp(k[f] - top), total = old + fresh;
      const float keep = old / total, add = fresh / total;
      for (int64_t c = 0; c < Dv; ++c) row[c] = row[c] * keep + v[c] * add;
      zf = total, mf = top;
    }
  }

  void store(const core::Outputs& o, int64_t b, int64_t h) const {
    if (!o.final_state) return;
    const TensorView& t = *o.final_state;
    float* base = static_cast<float*>(t.data);
    for (int64_t f = 0; f < D; ++f) {
      for (int64_t c = 0; c < Dv; ++c) base[t.offset(b, h, f, c)] = C[static_cast<size_t>(f * Dv + c)];
      base[t.offset(b, h, f, Dv)] = z[static_cast<size_t>(f)];
      base[t.offset(b, h, f, Dv + 1)] = m[static_cast<size_t>(f)];
    }
  }
};

// out[b, h, i] = scale * softmax(q_i) . C.
void write_output(const kernels::TileKernels& kern, const EfficientProblem& p, const core::Outputs& o,
                  const FeatureSoftmax& st, int64_t b, int64_t h, int64_t i, float* q, float* out) {
  core::load_rows(kern, p.q, b, h, i, 1, p.N, q, p.D);
  const float top = *std::max_element(q, q + p.D);
  const float sum = kern.exp_shift_sum(q, p.D, top);
  for (int64_t f = 0; f < p.D; ++f) q[f] *= static_cast<float>(p.scale) / sum;
  kern.gemm(1, p.Dv, p.D, q, p.D, 1, st.C.data(), p.Dv, out, p.Dv, false);
  kern.from_float(out, o.out->dtype, o.out->strides[3], p.Dv, o.out->ptr(b, h, i));
}

// One thread's state and rows, sized before the parallel region (which must not allocate).
struct Scratch {
  FeatureSoftmax st;
  std::vector<float> k, v, q, out;
  explicit Scratch(const EfficientProblem& p)
      : st(p), k(static_cast<size_t>(p.D)), v(static_cast<size_t>(p.Dv)), q(static_cast<size_t>(p.D)),
        out(static_cast<size_t>(p.Dv)) {}
};

template <bool Causal>
void run_online(const EfficientProblem& p, const core::Outputs& o, const core::Context& ctx) {
  const kernels::TileKernels& kern = *ctx.kern;
  const int64_t items = p.B * p.H;
  const int threads = resolve_threads(ctx.threads, items);
  std::vector<Scratch> scratch(static_cast<size_t>(threads), Scratch(p));
  parallel_for(items, threads, [&](int64_t item, int thread) {
    const int64_t b = item / p.H, h = item % p.H, hk = p.kv_head(h), len = p.kv_len[static_cast<size_t>(b)];
    Scratch& s = scratch[static_cast<size_t>(thread)];  // the rows are written before they are read
    FeatureSoftmax& st = s.st;
    st.load(p, b, h);
    std::vector<float> &k = s.k, &v = s.v, &q = s.q, &out = s.out;
    if (!Causal) {  // every key, then every query
      for (int64_t j = 0; j < len; ++j) {
        core::load_rows(kern, p.k, b, hk, j, 1, len, k.data(), p.D);
        core::load_rows(kern, p.v, b, hk, j, 1, len, v.data(), p.Dv);
        st.absorb(k.data(), v.data());
      }
      for (int64_t i = 0; i < p.N; ++i) write_output(kern, p, o, st, b, h, i, q.data(), out.data());
      st.store(o, b, h);
      return;
    }
    if (len == 0) st.store(o, b, h);
    for (int64_t t = 0; t < p.N; ++t) {
      if (t < len) {
        core::load_rows(kern, p.k, b, hk, t, 1, len, k.data(), p.D);
        core::load_rows(kern, p.v, b, hk, t, 1, len, v.data(), p.Dv);
        st.absorb(k.data(), v.data());
        if (t == len - 1) st.store(o, b, h);
      }
      write_output(kern, p, o, st, b, h, t, q.data(), out.data());
    }
  });
  if (o.stats) efficient_row_stats(p, o, ctx);  // the weights themselves: a pass of their own
}

void refuse_right(const EfficientProblem& p, const core::Outputs& o, core::Reasons& why) {
  if (p.mech.causal) why.push_back("causal (the key softmax runs over each prefix: recurrent)");
  core::refuse_probs(p, o, why);
}

void refuse_recurrent(const EfficientProblem& p, const core::Outputs& o, core::Reasons& why) {
  if (!p.mech.causal) why.push_back("not causal (the right form takes all keys at once)");
  core::refuse_probs(p, o, why);
}

template <class T>
core::ReferenceResult reference_impl(const EfficientProblem& p, bool plain) {
  const core::Rounding<T> rnd{p.q.dtype, plain};
  core::ReferenceResult r = core::zero_result(p.B, p.H, p.N, p.M, p.Dv, p.stats_topk);
  r.F = p.D, r.state_cols = p.Dv + 2;
  r.state.assign(static_cast<size_t>(p.B * p.H * p.D * r.state_cols), 0.0);
  const int64_t D = p.D, Dv = p.Dv;
  // For feature f over keys [0, end) and the initial state: the context, the sum and the maximum.
  struct Softmax1 {
    std::vector<T> ctx;
    T z = 0, m = 0;
  };
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h) {
      const int64_t hk = p.kv_head(h), len = p.kv_len[static_cast<size_t>(b)];
      auto init = [&](int64_t f, int64_t c) { return static_cast<T>(core::element_at(*p.initial, b, h, f, c)); };
      auto over = [&](int64_t f, int64_t end) {  // written out: max, then the weights, then the sums
        Softmax1 s;
        s.ctx.assign(static_cast<size_t>(Dv), T(0));
        const T z0 = p.initial ? init(f, Dv) : T(0), m0 = p.initial ? init(f, Dv + 1) : T(0);
        if (z0 == 0 && end == 0) return s;
        T top = z0 != 0 ? m0 : static_cast<T>(p.k.at(b, hk, 0, f));
        for (int64_t j = 0; j < end; ++j) top = std::max(top, static_cast<T>(p.k.at(b, hk, j, f)));
        const T w0 = z0 != 0 ? z0 * std::exp(m0 - top) : T(0);
        T total = w0;
        for (int64_t c = 0; c < Dv; ++c) s.ctx[static_cast<size_t>(c)] = w0 != 0 ? w0 * init(f, c) : T(0);
        for (int64_t j = 0; j < end; ++j) {
          const T w = std::exp(static_cast<T>(p.k.at(b, hk, j, f)) - top);
          total += w;
          for (int64_t c = 0; c < Dv; ++c) s.ctx[static_cast<size_t>(c)] += w * static_cast<T>(p.v.at(b, hk, j, c));
        }
        for (T& x : s.ctx) x = rnd(x / total);
        s.z = total, s.m = top;
        return s;
      };
      std::vector<T> qs(static_cast<size_t>(D));
      std::vector<Softmax1> all;  // non-causal: one softmax per feature for every query
      if (!p.mech.causal)
        for (int64_t f = 0; f < D; ++f) all.push_back(over(f, len));
      std::vector<T> w(static_cast<size_t>(p.M));  // one row's weights (row statistics)
      for (int64_t i = 0; i < p.N; ++i) {
        const int64_t end = p.mech.causal ? std::min(i + 1, len) : len;  // the keys of its row
        std::fill(w.begin(), w.end(), T(0));
        T top = -INFINITY, sum = 0;
        for (int64_t f = 0; f < D; ++f) top = std::max(top, static_cast<T>(p.q.at(b, h, i, f)));
        for (int64_t f = 0; f < D; ++f) sum += (qs[static_cast<size_t>(f)] = std::exp(static_cast<T>(p.q.at(b, h, i, f)) - top));
        const size_t at = static_cast<size_t>((b * p.H + h) * p.N + i);
        double* st = r.stats_of(b, h, i);
        for (int64_t f = 0; f < D; ++f) {
          const Softmax1 s = p.mech.causal ? over(f, end) : all[static_cast<size_t>(f)];
          const T a = rnd(static_cast<T>(p.scale) * qs[static_cast<size_t>(f)] / sum);
          for (int64_t c = 0; c < Dv; ++c) r.out[at * Dv + c] += static_cast<double>(a * s.ctx[static_cast<size_t>(c)]);
          if (st)  // a_ij = sum_f a_f e^(k_jf - m_f) / z_f over the row's keys
            for (int64_t j = 0; j < end; ++j)
              w[static_cast<size_t>(j)] += a * std::exp(static_cast<T>(p.k.at(b, hk, j, f)) - s.m) / s.z;
        }
        if (st) {
          const std::vector<double> row(w.begin(), w.begin() + end);
          core::reference_row_stats(row.data(), nullptr, end, p.stats_topk, st);
        }
      }
      for (int64_t f = 0; f < D; ++f) {  // the final state: every valid key
        const Softmax1 s = p.mech.causal || all.empty() ? over(f, len) : all[static_cast<size_t>(f)];
        double* row = &r.state[static_cast<size_t>(((b * p.H + h) * D + f) * r.state_cols)];
        for (int64_t c = 0; c < Dv; ++c) row[c] = static_cast<double>(s.ctx[static_cast<size_t>(c)]);
        row[Dv] = static_cast<double>(s.z), row[Dv + 1] = static_cast<double>(s.m);
      }
    }
  return r;
}

}  // namespace

EfficientProblem EfficientFamily::validate(const TensorView& q, const TensorView& k, const TensorView& v,
                                           const Efficient& m, const AttendOptions& opt, const core::Outputs& outs) {
  EfficientProblem p;
  static_cast<core::Dims&>(p) = core::check_io(q, k, v, outs, opt);
  p.mech = m;
  const auto text = core::mechanism_text(m);
  core::refuse_score_options(opt, "efficient", "its weights are softmax(q) . softmax_seq(k), not a score matrix");
  if (m.causal) core::check_causal_tokens(p, text);
  if (outs.wants_probs() || opt.return_probs)  // attend() validates before its outputs exist
    fail(kWhere, "return_probs: efficient attention's weights are not returned (its forms and reference keep "
                 "per-feature sums, not a weight row)");
  core::check_option_ranges(ranges(m), "efficient");
  p.scale = m.scale ? *m.scale : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(p.D, 1)));
  if (!opt.params.empty()) {  // all optional: nothing given, nothing to check
    core::Symbols symbols{{"B", p.B}, {"H", p.H}, {"D", p.D}, {"state_cols", p.Dv + 2}};
    core::check_params(opt.params, params(m), text, symbols);
  } else {
    assert(core::none_required(params(m)));
  }
  if (const auto it = opt.params.find("initial_state"); it != opt.params.end()) {
    p.initial = it->second;
    for (int64_t b = 0; b < p.B; ++b)  // z is a sum of exponentials: >= 0
      for (int64_t h = 0; h < p.H; ++h)
        for (int64_t f = 0; f < p.D; ++f) {
          const float z = core::element_at(it->second, b, h, f, p.Dv);
          if (z < 0) fail(kWhere, "params['initial_state'] column Dv (the sums z) must be >= 0, got " + std::to_string(z));
        }
  }
  return p;
}

const std::vector<core::Form<EfficientProblem>>& EfficientFamily::forms() {
  static const std::vector<core::Form<EfficientProblem>> list = {
      {"right", "non-causal: every key into the per-feature softmax state, then every query", refuse_right,
       run_online<false>},
      {"recurrent", "causal: one token at a time through the per-feature softmax state (O(D Dv) each)",
       refuse_recurrent, run_online<true>},
      {"reference", "per-feature softmax over each query's keys in float64 (slow, exact)",
       core::refuse_nothing<EfficientProblem>,
       [](const EfficientProblem& p, const core::Outputs& o, const core::Context&) {
         core::write_reference(reference_impl<double>(p, false), o);
       }},
  };
  return list;
}

double EfficientFamily::flops(const EfficientProblem& p) {
  return 2.0 * static_cast<double>(p.B * p.H) * static_cast<double>(p.D * p.Dv) * static_cast<double>(p.M + p.N);
}

core::ReferenceResult EfficientFamily::reference(const EfficientProblem& p, core::RefPrecision precision) {
  return precision == core::RefPrecision::f64 ? reference_impl<double>(p, false) : reference_impl<float>(p, true);
}

std::array<int64_t, 4> EfficientFamily::state_shape(const EfficientProblem& p) { return {p.B, p.H, p.D, p.Dv + 2}; }

}  // namespace attn::efficient
