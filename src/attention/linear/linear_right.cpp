// The non-causal right product: S = S0 + phi(K)^T V and z = z0 + sum_j phi(k_j) once per head
// (O(M F Dv)), then every query row against them (O(N F Dv)); no N x M anything.
#include "base/parallel.hpp"
#include "linear/head_state.hpp"

namespace attn::linear {
namespace {

constexpr int64_t kRows = 64;  // key / query rows per step

// One thread's state and rows, sized before the parallel region (which must not allocate).
struct Scratch {
  HeadState st;
  std::vector<float> x, y, raw;
  explicit Scratch(const LinearProblem& p)
      : st(p), x(static_cast<size_t>(kRows * p.F)), y(static_cast<size_t>(kRows * p.Dv)),
        raw(static_cast<size_t>(kRows * p.D)) {}
};

}  // namespace

void refuse_right(const LinearProblem& p, const core::Outputs& o, core::Reasons& why) {
  if (p.mech.causal) why.push_back("causal (each query sees only the keys before it: recurrent or chunked)");
  core::refuse_probs(p, o, why);  // row statistics: linear_row_stats after the form
}

void run_right(const LinearProblem& p, const core::Outputs& o, const core::Context& ctx) {
  const kernels::TileKernels& kern = *ctx.kern;
  const int64_t items = p.B * p.H, rows = kRows;
  const int threads = resolve_threads(ctx.threads, items);
  std::vector<Scratch> scratch(static_cast<size_t>(threads), Scratch(p));
  parallel_for(items, threads, [&](int64_t item, int thread) {
    const int64_t b = item / p.H, h = item % p.H, hk = p.kv_head(h), len = p.kv_len[static_cast<size_t>(b)];
    Scratch& s = scratch[static_cast<size_t>(thread)];  // every buffer is written before it is read
    HeadState& st = s.st;
    st.load(p, b, h);
    std::vector<float> &x = s.x, &y = s.y, &raw = s.raw;
    for (int64_t j0 = 0; j0 < len; j0 += rows) {  // S += phi(K)^T V, z += the rows of phi(K)
      const int64_t n = std::min(rows, len - j0);
      load_features(kern, p, false, b, hk, j0, n, len, 1.0f, raw.data(), x.data());
      load_rows(kern, p.v, b, hk, j0, n, len, y.data(), p.Dv);
      kern.gemm(p.F, p.Dv, n, x.data(), 1, p.F, y.data(), p.Dv, st.S.data(), p.Dv, true);
      if (p.mech.normalize)
        for (int64_t j = 0; j < n; ++j)
          for (int64_t f = 0; f < p.F; ++f) st.z[static_cast<size_t>(f)] += x[static_cast<size_t>(j * p.F + f)];
    }
    for (int64_t i0 = 0; i0 < p.N; i0 += rows) {  // o_i = phi(q_i) S / phi(q_i) . z
      const int64_t n = std::min(rows, p.N - i0);
      load_features(kern, p, true, b, h, i0, n, p.N, static_cast<float>(p.scale), raw.data(), x.data());
      kern.gemm(n, p.Dv, p.F, x.data(), p.F, 1, st.S.data(), p.Dv, y.data(), p.Dv, false);
      for (int64_t i = 0; i < n; ++i) {
        const float d = p.mech.normalize ? dot(x.data() + i * p.F, st.z.data(), p.F) : 0.0f;
        write_row(kern, p, o, b, h, i0 + i, y.data() + i * p.Dv, d);
      }
    }
    st.store(p, o, b, h);
  });
}

}  // namespace attn::linear
