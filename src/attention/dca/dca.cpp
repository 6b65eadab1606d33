#include "dca/dca.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attn/error.hpp"
#include "attn/rope.hpp"
#include "base/parallel.hpp"
#include "core/float32_copy.hpp"
#include "core/partial_merge.hpp"
#include "core/reference_softmax_row.hpp"
#include "core/row_stats.hpp"
#include "dca/rope64.hpp"
#include "softmax/softmax_family.hpp"
#include "mask/pattern.hpp"

namespace attn::dca {
namespace {

const char* kWhere = "attend";

}  // namespace

DcaPart dca_part(const Dca& m, int64_t p, int64_t j) {
  const int64_t lag = mask::floor_div(p, m.chunk) - mask::floor_div(j, m.chunk);
  return lag == 0 ? DcaPart::intra : lag == 1 ? DcaPart::successive : DcaPart::inter;
}

int64_t dca_query_position(const Dca& m, DcaPart part, int64_t p) {
  const int64_t s = m.chunk, w = m.local, in_chunk = mask::floor_mod(p, s);
  switch (part) {
    case DcaPart::intra: return in_chunk;
    case DcaPart::successive: return std::min(s + in_chunk, s + w - 1);
    case DcaPart::inter: return s + w - 1;
  }
  return 0;
}

DcaProblem DcaFamily::validate(const TensorView& q, const TensorView& k, const TensorView& v, const Dca& m,
                               const AttendOptions& opt, const core::Outputs& outs) {
  if (!opt.params.empty()) fail(kWhere, "dca takes no named params, got " + std::to_string(opt.params.size()));
  if (!opt.alibi_slopes.empty())
    fail(kWhere, "dca does not take ALiBi slopes (its positions are RoPE's, remapped per chunk)");
  if (opt.kv_scales)  // its forms rotate float copies of q and k
    fail(kWhere, "int8 k and v rows (options.kv_scales) are read by the softmax family only (softmax, longformer, "
                 "bigbird); dca takes float k and v");
  core::check_option_ranges(ranges(m), "dca");
  DcaProblem p;
  p.dca = m;
  Softmax scores;
  scores.causal = true;
  scores.scale = m.scale;
  static_cast<exact::Problem&>(p) = exact::validate_softmax(q, k, v, scores, opt, outs);
  if (m.chunk < 1) fail(kWhere, "dca chunk must be >= 1, got " + std::to_string(m.chunk));
  if (m.local < 1 || m.local > m.chunk)
    fail(kWhere, "dca local must be in [1, chunk = " + std::to_string(m.chunk) + "], got " + std::to_string(m.local));
  if (m.chunk > (int64_t{1} << 39))
    fail(kWhere, "dca chunk must be at most 2^39 (RoPE positions reach chunk + local), got " + std::to_string(m.chunk));
  if (p.D % 2 != 0)
    fail(kWhere, "dca needs an even head dim (RoPE rotates pairs of channels), got D = " + std::to_string(p.D));
  return p;
}

Rope dca_rope(const Dca& m) {
  Rope r;
  r.theta = m.theta;
  r.style = m.interleaved ? RopeStyle::interleaved : RopeStyle::half;
  return r;
}

Tensor dca_rotated(const kernels::TileKernels& kern, const TensorView& x, const Rope& rope,
                   const std::vector<int64_t>& positions) {
  Tensor t = core::float32_copy(kern, x);
  apply_rope_at(t.view(), rope, positions);
  return t;
}

Tensor dca_rotated_keys(const kernels::TileKernels& kern, const DcaProblem& p) {
  std::vector<int64_t> kpos(static_cast<size_t>(p.M));
  for (int64_t j = 0; j < p.M; ++j) kpos[static_cast<size_t>(j)] = mask::floor_mod(j, p.dca.chunk);
  return dca_rotated(kern, p.k, dca_rope(p.dca), kpos);
}

Tensor dca_rotated_queries(const kernels::TileKernels& kern, const DcaProblem& p, int t) {
  std::vector<int64_t> qpos(static_cast<size_t>(p.N));
  for (int64_t i = 0; i < p.N; ++i)
    qpos[static_cast<size_t>(i)] = dca_query_position(p.dca, kDcaPartSpecs[t].part, i + p.offset);
  return dca_rotated(kern, p.q, dca_rope(p.dca), qpos);
}

exact::Problem dca_part_problem(const DcaProblem& p, int t, const TensorView& q, const TensorView& k) {
  exact::Problem part = p;
  part.q = q, part.k = k;
  part.pattern.band->chunk = p.dca.chunk;
  part.pattern.band->lag_min = kDcaPartSpecs[t].lag_min, part.pattern.band->lag_max = kDcaPartSpecs[t].lag_max;
  return part;
}

namespace {

void run_parts(const DcaProblem& p, const core::Outputs& o, const core::Context& ctx) {
  const exact::Problem& e = p;
  const Tensor k = dca_rotated_keys(*ctx.kern, p);
  constexpr int kParts = kDcaParts;
  const int64_t rows = e.B * e.H * e.N;
  // The parts' normalised outputs and LSEs, float32, part after part: (3 B, H, N, .) each.
  const Tensor outs(DType::f32, {kParts * e.B, e.H, e.N, e.Dv}), lses(DType::f32, {kParts * e.B, e.H, e.N, 1});
  auto* out = static_cast<float*>(outs.view().data);
  auto* lse = static_cast<float*>(lses.view().data);
  // Row statistics: each part's summaries, merged per row in part order like the outputs (the
  // parts see disjoint keys of the row: lag 0, lag 1, lag >= 2).
  std::vector<core::StatsSink> part_stats;
  part_stats.reserve(kParts);
  if (o.stats)
    for (int t = 0; t < kParts; ++t) part_stats.emplace_back(e.B, e.H, e.N, o.stats->topk());
  for (int t = 0; t < kParts; ++t) {
    const Tensor q = dca_rotated_queries(*ctx.kern, p, t);
    const exact::Problem part = dca_part_problem(p, t, q.view(), k.view());
    TensorView pout = outs.view(), plse = lses.view();
    pout.shape[0] = plse.shape[0] = e.B;
    pout.data = out + t * rows * e.Dv, plse.data = lse + t * rows;
    const core::Outputs po{&pout, &plse, nullptr, nullptr, o.stats ? &part_stats[static_cast<size_t>(t)] : nullptr};
    core::choose(exact::SoftmaxFamily::forms(), part, po, "", "dca").run(part, po, ctx);
  }
  // One softmax: the parts' partials (m = lse, l = 1, or 0 for a part with no key, acc = the
  // normalised output) merged per row in part order.
  std::vector<float> l(static_cast<size_t>(kParts * rows));
  for (size_t r = 0; r < l.size(); ++r)
    l[r] = std::isnan(lse[r]) ? lse[r] : lse[r] == -std::numeric_limits<float>::infinity() ? 0.0f : 1.0f;
  // Per thread, sized before the region (which must not allocate): a merged row and a top-k heap.
  const int threads = resolve_threads(ctx.threads, e.B * e.H);
  const int64_t topk = o.stats ? o.stats->topk() : 0;
  std::vector<float> rows_of(static_cast<size_t>(threads * e.Dv)), tops_of(static_cast<size_t>(threads * topk));
  parallel_for(e.B * e.H, threads, [&](int64_t item, int thread) {
    const int64_t b = item / e.H, h = item % e.H;
    float* const row = rows_of.data() + thread * e.Dv;  // written by merge_partials before it is read
    float* const top = tops_of.data() + thread * topk;  // an empty heap for each row
    for (int64_t i = 0; i < e.N; ++i) {
      const int64_t r = item * e.N + i;
      if (o.stats) {
        core::RowSummary whole = core::RowSummary::empty(core::RowKind::softmax, static_cast<int32_t>(topk), top);
        for (const core::StatsSink& part : part_stats) core::merge_into(whole, part.summary(b, h, i));
        o.stats->put(b, h, i, whole);
      }
      const float x = core::merge_partials(kParts, lse + r, l.data() + r, rows, out + r * e.Dv, rows * e.Dv, e.Dv,
                                           row);
      ctx.kern->from_float(row, o.out->dtype, o.out->strides[3], e.Dv, o.out->ptr(b, h, i));
      if (o.lse) static_cast<float*>(o.lse->data)[o.lse->offset(b, h, i, 0)] = x;
    }
  });
}

// ---- the reference: each pair's remapped relative position, one float64 softmax ---------------

template <class T>
core::ReferenceResult reference_impl(const DcaProblem& dp, bool plain) {
  const exact::Problem& p = dp;
  const Rope rope = dca_rope(dp.dca);
  const core::Rounding<T> rnd{p.q.dtype, plain};
  core::ReferenceResult r = core::zero_result(p.B, p.H, p.N, p.M, p.Dv, p.stats_topk);
  r.lse.assign(static_cast<size_t>(p.B * p.H * p.N), -std::numeric_limits<double>::infinity());
  r.probs.assign(static_cast<size_t>(p.B * p.H * p.N * p.M), 0.0);
  std::vector<double> kr(static_cast<size_t>(p.M * p.D)), qr(static_cast<size_t>(3 * p.D));
  std::vector<T> s(static_cast<size_t>(p.M));
  std::vector<uint8_t> vis(static_cast<size_t>(p.M));
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h) {
      const int64_t hk = p.kv_head(h);
      for (int64_t j = 0; j < p.M; ++j) rope64(rope, p.k, b, hk, j, mask::floor_mod(j, dp.dca.chunk), &kr[j * p.D]);
      for (int64_t i = 0; i < p.N; ++i) {
        const int64_t pos = i + p.offset;
        for (int t = 0; t < 3; ++t)
          rope64(rope, p.q, b, h, i, dca_query_position(dp.dca, static_cast<DcaPart>(t), pos), &qr[t * p.D]);
        for (int64_t j = 0; j < p.M; ++j) {
          vis[static_cast<size_t>(j)] = p.visible(b, h, i, j);
          if (!vis[static_cast<size_t>(j)]) continue;
          const double* qv = &qr[static_cast<size_t>(dca_part(dp.dca, pos, j)) * p.D];
          T dot = 0;
          for (int64_t c = 0; c < p.D; ++c) dot += static_cast<T>(qv[c]) * static_cast<T>(kr[j * p.D + c]);
          s[static_cast<size_t>(j)] = rnd(dot * static_cast<T>(p.base_scale) + static_cast<T>(p.additive_bias(b, h, i, j)));
        }
        const size_t at = static_cast<size_t>((b * p.H + h) * p.N + i);
        core::reference_softmax_row(
            s, vis.data(), p.Dv, rnd, [&](int64_t j, int64_t c) { return static_cast<T>(p.v.at(b, hk, j, c)); },
            r.lse[at], &r.probs[at * p.M], &r.out[at * p.Dv], r.stats_of(b, h, i), p.stats_topk);
      }
    }
  return r;
}

void run_reference(const DcaProblem& p, const core::Outputs& o, const core::Context&) {
  core::write_reference(reference_impl<double>(p, false), o);
}

}  // namespace

const std::vector<core::Form<DcaProblem>>& DcaFamily::forms() {
  static const std::vector<core::Form<DcaProblem>> list = {
      {"parts", "intra-, successive- and inter-chunk attention on the softmax forms, merged by LSE",
       core::refuse_probs<DcaProblem>, run_parts},
      {"reference", "float64, each pair's remapped position, one softmax (slow, exact)",
       core::refuse_nothing<DcaProblem>, run_reference},
  };
  return list;
}

double DcaFamily::flops(const DcaProblem& p) { return exact::SoftmaxFamily::flops(p); }

core::ReferenceResult DcaFamily::reference(const DcaProblem& p, core::RefPrecision precision) {
  return precision == core::RefPrecision::f64 ? reference_impl<double>(p, false) : reference_impl<float>(p, true);
}

}  // namespace attn::dca
