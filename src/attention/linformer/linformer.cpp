#include "linformer/linformer.hpp"

#include <cmath>
#include <limits>

#include "attn/error.hpp"
#include "base/counter_random.hpp"
#include "base/parallel.hpp"
#include "core/float32_copy.hpp"
#include "core/params.hpp"
#include "core/reference_softmax_row.hpp"
#include "softmax/softmax_family.hpp"

namespace attn::lowrank {
namespace {

const char* kWhere = "attend";

}  // namespace

LinformerProblem LinformerFamily::validate(const TensorView& q, const TensorView& k, const TensorView& v,
                                           const Linformer& m, const AttendOptions& opt, const core::Outputs& outs) {
  core::check_option_ranges(ranges(m), "linformer");
  if (outs.probs || opt.return_probs)
    fail(kWhere, "linformer returns no probabilities over the keys (its weights are over k projected rows)");
  LinformerProblem p;
  static_cast<core::Dims&>(p) = core::check_io(q, k, v, outs, opt);
  p.mech = m;
  core::refuse_score_options(opt, "linformer", "it attends to k projected rows, not to the keys");
  if (m.k < 1 || m.k > (int64_t{1} << 20))
    fail(kWhere, "linformer k must be in [1, 2^20], got " + std::to_string(m.k));
  // More projected rows than keys add nothing (E K has rank at most M) and would size E, F
  // (k x M) and K', V' (k rows per head) by the option, not the input: refused before allocating.
  if (p.M > 0 && m.k > p.M)
    fail(kWhere, "linformer k must be in [1, M] (E K and F V have rank at most the key count M = " +
                     std::to_string(p.M) + "), got k = " + std::to_string(m.k));
  p.K = p.M > 0 ? m.k : 1;  // no keys: every projected row is zero, one stands for them all
  p.scale = m.scale ? *m.scale : 1.0 / std::sqrt(static_cast<double>(p.D));
  // E and F: both given (named params, shape (k, M)) or both drawn from the seed.
  const auto text = core::mechanism_text(m);
  if (!opt.params.empty()) {
    core::Symbols symbols{{"k", m.k}, {"M", p.M}};
    std::vector<core::ParamSpec> both = params(m);  // one given: both needed
    for (core::ParamSpec& spec : both) spec.optional = false;
    core::check_params(opt.params, both, text, symbols);
    p.E = core::to_floats(opt.params.at("E"));
    p.F = core::to_floats(opt.params.at("F"));
    p.learned = true;
  } else {
    const double sd = 1.0 / std::sqrt(static_cast<double>(p.K));
    p.E.resize(static_cast<size_t>(p.K * p.M));
    p.F.resize(p.E.size());
    for (int64_t r = 0; r < p.K; ++r)
      for (int64_t j = 0; j < p.M; ++j) {
        p.E[static_cast<size_t>(r * p.M + j)] = static_cast<float>(sd * counter_normal(m.seed, 0, r, j));
        p.F[static_cast<size_t>(r * p.M + j)] = static_cast<float>(sd * counter_normal(m.seed, 1, r, j));
      }
  }
  return p;
}

namespace {

// ---- the projected form: float32 projections, then the softmax family on K', V' --------------

}  // namespace

void linformer_project(const float* P, int64_t K, int64_t M, int64_t len, const TensorView& x, int64_t b, int64_t h,
                       float* y, float* row) {
  const int64_t d = x.dim();
  std::fill(y, y + K * d, 0.0f);
  for (int64_t j = 0; j < len; ++j) {
    for (int64_t c = 0; c < d; ++c) row[c] = x.at(b, h, j, c);
    for (int64_t r = 0; r < K; ++r) {
      const float e = P[r * M + j];
      float* yr = y + r * d;
      for (int64_t c = 0; c < d; ++c) yr[c] += e * row[c];
    }
  }
}

namespace {

void run_projected(const LinformerProblem& p, const core::Outputs& o, const core::Context& ctx) {
  AttendOptions inner;  // the softmax run on the projected rows: this call's threads and kernels
  inner.threads = ctx.threads;
  inner.isa = ctx.kern->isa;
  inner.row_cache_bytes = ctx.row_cache_bytes;
  Tensor kp(DType::f32, {p.B, p.Hkv, p.K, p.D}), vp(DType::f32, {p.B, p.Hkv, p.K, p.Dv});
  const int64_t items = p.B * p.Hkv, width = std::max(p.D, p.Dv);
  const int threads = resolve_threads(ctx.threads, items);
  std::vector<float> rows(static_cast<size_t>(threads * width));  // one row per thread, sized before the region
  parallel_for(items, threads, [&](int64_t item, int thread) {
    const int64_t b = item / p.Hkv, h = item % p.Hkv;
    float* row = rows.data() + thread * width;
    linformer_project(p.E.data(), p.K, p.M, p.kv_len[b], p.k, b, h, reinterpret_cast<float*>(kp.view().ptr(b, h, 0)),
                      row);
    linformer_project(p.F.data(), p.K, p.M, p.kv_len[b], p.v, b, h, reinterpret_cast<float*>(vp.view().ptr(b, h, 0)),
                      row);
  });
  Softmax exact;
  exact.scale = p.scale;
  if (o.stats) inner.stats_topk = o.stats->topk();
  // q keeps its dtype; the projected rows are float32: convert q's dtype to match.
  Tensor q32;
  if (p.q.dtype != DType::f32) q32 = core::float32_copy(*ctx.kern, p.q);
  const TensorView q = p.q.dtype == DType::f32 ? p.q : q32.view();
  // the softmax family's forms directly (not attend_into), so the row statistics' sink goes along
  const core::Outputs po{o.out, o.lse, nullptr, nullptr, o.stats};
  const exact::Problem sp = exact::SoftmaxFamily::validate(q, kp.view(), vp.view(), exact, inner, po);
  core::choose(exact::SoftmaxFamily::forms(), sp, po, "", "linformer").run(sp, po, ctx);
}

// ---- the reference: float64 (or the plain same-dtype baseline) --------------------------------

template <class T>
core::ReferenceResult reference_impl(const LinformerProblem& p, bool plain) {
  const DType dt = p.q.dtype;
  const core::Rounding<T> rnd{dt, plain};
  core::ReferenceResult r = core::zero_result(p.B, p.H, p.N, p.M, p.Dv, p.stats_topk);
  r.lse.assign(static_cast<size_t>(p.B * p.H * p.N), 0.0);
  std::vector<T> kp(static_cast<size_t>(p.K * p.D)), vp(static_cast<size_t>(p.K * p.Dv)), s(static_cast<size_t>(p.K));
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t hk = 0; hk < p.Hkv; ++hk) {
      for (int64_t row = 0; row < p.K; ++row) {
        for (int64_t c = 0; c < p.D; ++c) {
          T acc = 0;
          for (int64_t j = 0; j < p.kv_len[b]; ++j) acc += static_cast<T>(p.E[row * p.M + j]) * p.k.at(b, hk, j, c);
          kp[static_cast<size_t>(row * p.D + c)] = rnd(acc);
        }
        for (int64_t c = 0; c < p.Dv; ++c) {
          T acc = 0;
          for (int64_t j = 0; j < p.kv_len[b]; ++j) acc += static_cast<T>(p.F[row * p.M + j]) * p.v.at(b, hk, j, c);
          vp[static_cast<size_t>(row * p.Dv + c)] = rnd(acc);
        }
      }
      for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h)
        for (int64_t i = 0; i < p.N; ++i) {
          for (int64_t row = 0; row < p.K; ++row) {
            T dot = 0;
            for (int64_t c = 0; c < p.D; ++c) dot += static_cast<T>(p.q.at(b, h, i, c)) * kp[static_cast<size_t>(row * p.D + c)];
            s[static_cast<size_t>(row)] = rnd(dot * static_cast<T>(p.scale));
          }
          const size_t at = static_cast<size_t>((b * p.H + h) * p.N + i);
          core::reference_softmax_row(
              s, nullptr, p.Dv, rnd, [&](int64_t row, int64_t c) { return vp[static_cast<size_t>(row * p.Dv + c)]; },
              r.lse[at], nullptr, &r.out[at * p.Dv], r.stats_of(b, h, i), p.stats_topk);
        }
    }
  return r;
}

void run_reference(const LinformerProblem& p, const core::Outputs& o, const core::Context&) {
  core::write_reference(reference_impl<double>(p, false), o);
}

}  // namespace

const std::vector<core::Form<LinformerProblem>>& LinformerFamily::forms() {
  static const std::vector<core::Form<LinformerProblem>> list = {
      {"projected", "K' = E K, V' = F V in float32, then the softmax forms on the k rows", core::refuse_nothing<LinformerProblem>,
       run_projected},
      {"reference", "float64 projections and softmax (slow, exact)", core::refuse_nothing<LinformerProblem>,
       run_reference},
  };
  return list;
}

double LinformerFamily::flops(const LinformerProblem& p) {
  const double dims = static_cast<double>(p.D + p.Dv);
  return 2.0 * static_cast<double>(p.B * p.Hkv) * static_cast<double>(p.K * p.M) * dims +
         2.0 * static_cast<double>(p.B * p.H) * static_cast<double>(p.N * p.K) * dims;
}

core::ReferenceResult LinformerFamily::reference(const LinformerProblem& p, core::RefPrecision precision) {
  return precision == core::RefPrecision::f64 ? reference_impl<double>(p, false) : reference_impl<float>(p, true);
}

}  // namespace attn::lowrank
