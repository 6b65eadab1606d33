// The chunked causal form (Lightning Attention): the sequence in blocks of C rows. For a block
// starting at s0, rows r and keys s counted from 0 inside it, decay lambda:
//   A      = (Q_b K_b^T) o M,  M[r][s] = lambda^(r - s) for s <= r, else 0   (left product)
//   O_b    = diag(lambda^(r + 1)) Q_b S + A V_b                              (right product)
//   den_b  = diag(lambda^(r + 1)) Q_b z + A 1
//   S      = lambda^C S + sum_s lambda^(C - 1 - s) k_s v_s^T,  z likewise
// Every factor is a power <= 1 of lambda, so no lambda^(-n) appears at any length. Each product
// is one kernels.gemm call; the block's keys are transposed once (pack_qt) for Q_b K_b^T.
#include <algorithm>

#include "base/aligned_buffer.hpp"
#include "base/parallel.hpp"
#include "core/nonfinite_rows.hpp"
#include "linear/head_state.hpp"

namespace attn::linear {

namespace {

constexpr int64_t kBand = 16;  // rows per band of the block's triangular products

// Sum of x[0..n) in 8 interleaved partial sums (vectorisable; the order is fixed).
float row_sum(const float* x, int64_t n) {
  float part[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) part[l] += x[i + l];
  for (; i < n; ++i) part[i % 8] += x[i];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

// One thread's state and block buffers, sized before the parallel region (which must not
// allocate): C rows of q, k (F wide), v, out (Dv), raw (D), the block's C x C weights a, its keys
// transposed in 64-key groups kt, the powers pw of the decay.
struct Scratch {
  HeadState st;
  std::vector<float> pw, q, k, v, a, out, den, raw;
  AlignedFloats kt, ones;
  Scratch(const LinearProblem& p, int64_t C, int64_t groups)
      : st(p), pw(static_cast<size_t>(C + 1)), q(static_cast<size_t>(C * p.F)), k(static_cast<size_t>(C * p.F)),
        v(static_cast<size_t>(C * p.Dv)), a(static_cast<size_t>(C * C)), out(static_cast<size_t>(C * p.Dv)),
        den(static_cast<size_t>(C)), raw(static_cast<size_t>(C * p.D)),
        kt(static_cast<size_t>(groups * p.F * kernels::kQueryTile)), ones(kernels::kQueryTile) {
    std::fill(ones.data(), ones.data() + kernels::kQueryTile, 1.0f);
  }
};

}  // namespace

void refuse_chunked(const LinearProblem& p, const core::Outputs& o, core::Reasons& why) {
  if (!p.mech.causal) why.push_back("not causal (the right product sums all keys at once)");
  core::refuse_probs(p, o, why);  // row statistics: linear_row_stats after the form
}

void run_chunked(const LinearProblem& p, const core::Outputs& o, const core::Context& ctx) {
  const kernels::TileKernels& kern = *ctx.kern;
  constexpr int64_t kT = kernels::kQueryTile;  // pack_qt transposes up to 64 rows at a time
  // Scratch by the chunk the sequence fills: a chunk longer than N is one block of N rows anyway
  // (chunk=4096 on one token must not size 4096 x 4096 floats per thread).
  const int64_t C = std::min(p.mech.chunk, std::max<int64_t>(p.N, 1)), F = p.F, Dv = p.Dv,
                groups = (C + kT - 1) / kT;
  const int64_t items = p.B * p.H;
  const int threads = resolve_threads(ctx.threads, items);
  std::vector<Scratch> scratch = per_thread<Scratch>(threads, p, C, groups);
  const core::NonFiniteRows nonfinite(p, ctx.threads);
  parallel_for(items, threads, [&](int64_t item, int thread) {
    const int64_t b = item / p.H, h = item % p.H, hk = p.kv_head(h), len = p.kv_len[static_cast<size_t>(b)];
    const double lambda = p.decay[static_cast<size_t>(h)];
    Scratch& s = scratch[static_cast<size_t>(thread)];
    std::vector<float>& pw = s.pw;  // lambda^n, n <= C
    for (int64_t n = 0; n <= C; ++n) pw[static_cast<size_t>(n)] = static_cast<float>(std::pow(lambda, n));
    HeadState& st = s.st;
    st.load(p, b, h);
    // The other buffers are written before they are read; den is zeroed as a fresh one was.
    std::vector<float> &q = s.q, &k = s.k, &v = s.v, &a = s.a, &out = s.out, &den = s.den, &raw = s.raw;
    std::fill(den.begin(), den.end(), 0.0f);
    AlignedFloats &kt = s.kt, &ones = s.ones;
    bool stored = false;
    for (int64_t s0 = 0; s0 < p.N; s0 += C) {
      const int64_t c = std::min(C, p.N - s0), ce = std::clamp<int64_t>(len - s0, 0, c);  // ce keys are valid
      load_features(kern, p, true, b, h, s0, c, p.N, static_cast<float>(p.scale), raw.data(), q.data());
      load_features(kern, p, false, b, hk, s0, c, len, 1.0f, raw.data(), k.data());
      load_rows(kern, p.v, b, hk, s0, c, len, v.data(), Dv);
      // A = Q_b K_b^T on and below the diagonal (rows in bands of kBand: a band needs the keys up
      // to its last row only), through K_b^T in 64-key groups, then the causal decay mask.
      for (int64_t g = 0; g * kT < c; ++g)
        kern.pack_qt(k.data() + g * kT * F, F, static_cast<int>(std::min(kT, c - g * kT)), F, ones.data(),
                     kt.data() + g * F * kT);
      for (int64_t r0 = 0; r0 < c; r0 += kBand) {
        const int64_t rows = std::min(kBand, c - r0), keys = r0 + rows;
        for (int64_t g = 0; g * kT < keys; ++g)
          kern.gemm(rows, std::min(kT, keys - g * kT), F, q.data() + r0 * F, F, 1, kt.data() + g * F * kT, kT,
                    a.data() + r0 * C + g * kT, C, false);
      }
      for (int64_t r = 0; r < c; ++r) {
        float* ar = a.data() + r * C;
        if (lambda != 1.0)
          for (int64_t s = 0; s <= r; ++s) ar[s] *= pw[static_cast<size_t>(r - s)];
        std::fill(ar + r + 1, ar + c, 0.0f);
        if (p.mech.normalize) den[static_cast<size_t>(r)] = row_sum(ar, r + 1);
      }
      // O_b = diag(lambda^(r+1)) Q_b S + A V_b; the denominators likewise.
      kern.gemm(c, Dv, F, q.data(), F, 1, st.S.data(), Dv, out.data(), Dv, false);
      for (int64_t r = 0; r < c; ++r) {
        const float t = pw[static_cast<size_t>(r + 1)];  // r < C
        if (t != 1.0f)
          for (int64_t x = 0; x < Dv; ++x) out[static_cast<size_t>(r * Dv + x)] *= t;
        if (p.mech.normalize) den[static_cast<size_t>(r)] += t * dot(q.data() + r * F, st.z.data(), F);
      }
      // A non-finite value is 0 in A V_b (A's zeros above the diagonal times NaN would reach the
      // rows before its key), then NaN in its channel of the rows at or after it; the state
      // update below takes the value as it is.
      const bool poisoned = nonfinite.any(b, hk, s0, ce);
      if (poisoned)
        for (int64_t e = 0; e < ce * Dv; ++e) v[static_cast<size_t>(e)] = std::isfinite(v[static_cast<size_t>(e)]) ? v[static_cast<size_t>(e)] : 0.0f;
      for (int64_t r0 = 0; r0 < c; r0 += kBand) {  // A V_b: a band's keys end at its last row
        const int64_t rows = std::min(kBand, c - r0);
        kern.gemm(rows, Dv, r0 + rows, a.data() + r0 * C, C, 1, v.data(), Dv, out.data() + r0 * Dv, Dv, true);
      }
      if (poisoned)
        for (int64_t s = 0; s < ce; ++s)
          for (int64_t x = 0; nonfinite.row(b, hk, s0 + s) && x < Dv; ++x) {
            const float val = p.v.at(b, hk, s0 + s, x);
            if (std::isfinite(val)) continue;
            v[static_cast<size_t>(s * Dv + x)] = val;
            for (int64_t r = s; r < c; ++r) out[static_cast<size_t>(r * Dv + x)] = val * 0.0f;  // NaN
          }
      for (int64_t r = 0; r < c; ++r)
        write_row(kern, p, o, b, h, s0 + r, out.data() + r * Dv, den[static_cast<size_t>(r)]);
      // S = lambda^ce S + sum_(s < ce) lambda^(ce - 1 - s) k_s v_s^T: the state after the block's
      // last valid key (the final state when that is the last valid key of the sequence) ...
      st.decay(pw[static_cast<size_t>(ce)]);
      for (int64_t s = 0; s < ce; ++s) {
        const float t = pw[static_cast<size_t>(ce - 1 - s)];
        if (t != 1.0f)
          for (int64_t f = 0; f < F; ++f) k[static_cast<size_t>(s * F + f)] *= t;
      }
      if (ce > 0) kern.gemm(F, Dv, ce, k.data(), 1, F, v.data(), Dv, st.S.data(), Dv, true);
      if (p.mech.normalize)
        for (int64_t s = 0; s < ce; ++s)
          for (int64_t f = 0; f < F; ++f) st.z[static_cast<size_t>(f)] += k[static_cast<size_t>(s * F + f)];
      if (!stored && s0 + c >= len) st.store(p, o, b, h), stored = true;
      st.decay(pw[static_cast<size_t>(c - ce)]);  // ... then decayed over the padded positions after it
    }
    if (!stored) st.store(p, o, b, h);  // no tokens: the initial state
  });
}

}  // namespace attn::linear
