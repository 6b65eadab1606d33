#include "gau/gau.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include "attn/error.hpp"
#include "base/aligned_buffer.hpp"
#include "base/parallel.hpp"
#include "core/row_stats.hpp"
#include "core/direct_rows.hpp"
#include "core/nonfinite_rows.hpp"
#include "core/rows.hpp"

namespace attn::gau {
namespace {

const char* kWhere = "attend";
constexpr int64_t kBlock = kernels::kQueryTile;  // queries and keys per step

// The last key (exclusive) query i of batch b sees.
int64_t key_end(const GauProblem& p, int64_t b, int64_t i) {
  const int64_t len = p.kv_len[static_cast<size_t>(b)];
  return p.mech.causal ? std::clamp<int64_t>(i + p.M - p.N + 1, 0, len) : len;
}

template <class T>
T weight(const GauProblem& p, T score, int64_t n) {
  // + (score - score): a score of +-inf (a non-finite q or k) is NaN, as in the tiled form
  const T x = std::max((score + (score - score)) * static_cast<T>(p.scale) + static_cast<T>(p.mech.bias), T(0));
  return x * x / static_cast<T>(n);
}

// One thread's tiles, sized before the parallel region (which must not allocate).
struct Scratch {
  std::vector<float> q, k, v, s, out;
  AlignedFloats kt, ones;
  std::optional<core::DirectRows> rows;  // return_stats
  Scratch(const kernels::TileKernels& kern, const GauProblem& p, const core::Outputs& o)
      : q(static_cast<size_t>(kBlock * p.D)), k(static_cast<size_t>(kBlock * p.D)), v(static_cast<size_t>(kBlock * p.Dv)),
        s(static_cast<size_t>(kBlock * kBlock)), out(static_cast<size_t>(kBlock * p.Dv)),
        kt(static_cast<size_t>(p.D * kBlock)), ones(kBlock) {
    std::fill(ones.data(), ones.data() + kBlock, 1.0f);
    if (o.stats) rows.emplace(kern, o.stats->topk());
  }
};

// With return_stats, each row's weights are streamed into its summary tile by tile as they are
// made (the keys the row may see, zeros included), so the statistics cost no second product.
void run_tiled(const GauProblem& p, const core::Outputs& o, const core::Context& ctx) {
  const kernels::TileKernels& kern = *ctx.kern;
  const int64_t blocks = (p.N + kBlock - 1) / kBlock, items = p.B * p.H * blocks;
  const int threads = resolve_threads(ctx.threads, items);
  std::vector<Scratch> scratch = per_thread<Scratch>(threads, kern, p, o);
  const core::NonFiniteRows nonfinite(p, ctx.threads);
  parallel_for(items, threads, [&](int64_t item, int thread) {
    const int64_t b = item / (p.H * blocks), h = item / blocks % p.H, i0 = item % blocks * kBlock;
    const int64_t nq = std::min(kBlock, p.N - i0), hk = p.kv_head(h), n = p.kv_len[static_cast<size_t>(b)];
    Scratch& sc = scratch[static_cast<size_t>(thread)];
    // out accumulates and the rows' statistics start empty, as fresh ones did; the other tiles
    // are written before they are read.
    std::vector<float> &q = sc.q, &k = sc.k, &v = sc.v, &s = sc.s, &out = sc.out;
    std::fill(out.begin(), out.end(), 0.0f);
    AlignedFloats &kt = sc.kt, &ones = sc.ones;
    std::optional<core::DirectRows>& rows = sc.rows;
    if (rows) rows->start();
    core::load_rows(kern, p.q, b, h, i0, nq, p.N, q.data(), p.D);
    const int64_t end = key_end(p, b, i0 + nq - 1);  // the block's last row sees the most keys
    for (int64_t j0 = 0; j0 < end; j0 += kBlock) {
      const int64_t nk = std::min(kBlock, end - j0);
      core::load_rows(kern, p.k, b, hk, j0, nk, end, k.data(), p.D);
      core::load_rows(kern, p.v, b, hk, j0, nk, end, v.data(), p.Dv);
      kern.pack_qt(k.data(), p.D, static_cast<int>(nk), p.D, ones.data(), kt.data());
      kern.gemm(nq, nk, p.D, q.data(), p.D, 1, kt.data(), kBlock, s.data(), kBlock, false);
      const float sc = static_cast<float>(p.scale), bias = static_cast<float>(p.mech.bias);
      const float inv_n = n > 0 ? 1.0f / static_cast<float>(n) : 0.0f;
      for (int64_t r = 0; r < nq; ++r) {
        const int64_t seen = std::clamp<int64_t>(key_end(p, b, i0 + r) - j0, 0, nk);  // keys past it are hidden
        float* row = s.data() + r * kBlock;
        kern.relu2_rows(row, seen, sc, bias, inv_n);
        if (rows) rows->add(r, row, seen);
        std::fill(row + seen, row + nk, 0.0f);
      }
      // a non-finite value: 0 in the product (a hidden key's weight 0 times NaN would reach rows
      // that cannot see it), then NaN in its channel of the rows that see the key
      const bool poisoned = nonfinite.any(b, hk, j0, nk);
      if (poisoned)
        for (float& x : v) x = std::isfinite(x) ? x : 0.0f;
      kern.gemm(nq, p.Dv, nk, s.data(), kBlock, 1, v.data(), p.Dv, out.data(), p.Dv, true);
      if (poisoned)
        for (int64_t j = 0; j < nk; ++j)
          for (int64_t c = 0; nonfinite.row(b, hk, j0 + j) && c < p.Dv; ++c) {
            const float x = p.v.at(b, hk, j0 + j, c);
            if (std::isfinite(x)) continue;
            for (int64_t r = 0; r < nq; ++r)
              if (key_end(p, b, i0 + r) > j0 + j) out[static_cast<size_t>(r * p.Dv + c)] = x * 0.0f;  // NaN
          }
    }
    for (int64_t r = 0; r < nq; ++r)
      kern.from_float(out.data() + r * p.Dv, o.out->dtype, o.out->strides[3], p.Dv, o.out->ptr(b, h, i0 + r));
    if (rows)
      for (int64_t r = 0; r < nq; ++r) o.stats->put(b, h, i0 + r, rows->summary(r));
  });
}

template <class T>
core::ReferenceResult reference_impl(const GauProblem& p, bool plain) {
  const DType dt = p.q.dtype;
  const core::Rounding<T> rnd{dt, plain};
  core::ReferenceResult r = core::zero_result(p.B, p.H, p.N, p.M, p.Dv, p.stats_topk);
  r.probs.assign(static_cast<size_t>(p.B * p.H * p.N * p.M), 0.0);
  std::vector<T> acc(static_cast<size_t>(p.Dv));
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t i = 0; i < p.N; ++i) {
        const size_t at = static_cast<size_t>((b * p.H + h) * p.N + i);
        std::fill(acc.begin(), acc.end(), T(0));
        for (int64_t j = 0; j < key_end(p, b, i); ++j) {
          T dot = 0;
          for (int64_t c = 0; c < p.D; ++c)
            dot += static_cast<T>(p.q.at(b, h, i, c)) * static_cast<T>(p.k.at(b, p.kv_head(h), j, c));
          const T a = rnd(weight(p, rnd(dot), p.kv_len[static_cast<size_t>(b)]));
          r.probs[at * p.M + j] = static_cast<double>(a);
          for (int64_t c = 0; c < p.Dv; ++c) acc[static_cast<size_t>(c)] += a * static_cast<T>(p.v.at(b, p.kv_head(h), j, c));
        }
        for (int64_t c = 0; c < p.Dv; ++c) r.out[at * p.Dv + c] = static_cast<double>(rnd(acc[static_cast<size_t>(c)]));
        if (double* st = r.stats_of(b, h, i))  // the row is the keys it may see, zeros included
          core::reference_row_stats(&r.probs[at * p.M], nullptr, key_end(p, b, i), p.stats_topk, st);
      }
  return r;
}

}  // namespace

GauProblem GauFamily::validate(const TensorView& q, const TensorView& k, const TensorView& v, const Gau& m,
                               const AttendOptions& opt, const core::Outputs& outs) {
  GauProblem p;
  static_cast<core::Dims&>(p) = core::check_io(q, k, v, outs, opt);
  p.mech = m;
  core::refuse_score_options(opt, "gau", "only causal and key padding");
  if (!opt.params.empty()) fail(kWhere, "gau takes no named params, got '" + opt.params.begin()->first + "'");
  core::check_option_ranges(ranges(m), "gau");
  p.scale = m.scale ? *m.scale : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(p.D, 1)));
  return p;
}

const std::vector<core::Form<GauProblem>>& GauFamily::forms() {
  static const std::vector<core::Form<GauProblem>> list = {
      {"tiled", "64 queries x 64 keys per step, relu^2 weights between two GEMM-shaped products",
       core::refuse_probs<GauProblem>, run_tiled},
      {"reference", "float64 weights row by row (slow, exact)", core::refuse_nothing<GauProblem>,
       [](const GauProblem& p, const core::Outputs& o, const core::Context&) {
         core::write_reference(reference_impl<double>(p, false), o);
       }},
  };
  return list;
}

double GauFamily::flops(const GauProblem& p) {
  double pairs = 0;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t i = 0; i < p.N; ++i) pairs += static_cast<double>(key_end(p, b, i));
  return 2.0 * static_cast<double>(p.H) * pairs * static_cast<double>(p.D + p.Dv);
}

core::ReferenceResult GauFamily::reference(const GauProblem& p, core::RefPrecision precision) {
  return precision == core::RefPrecision::f64 ? reference_impl<double>(p, false) : reference_impl<float>(p, true);
}

}  // namespace attn::gau
