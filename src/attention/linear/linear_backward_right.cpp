// The non-causal backward through the whole state (formulas: linear_backward.hpp with L = 1): per
// kv head KU = phi(K)^T U once; per query head H = S0 + KU, then in row blocks Y = A H, G from
// dout, dA = G H^T and dH += A^T G; at the end dH += dS (the final state's gradient), and
// dK += U dH^T, dU += K dH, dS0 = dH. No N x M anything; every product one kernels.gemm call.
#include <algorithm>

#include "base/parallel.hpp"
#include "linear/backward_keys.hpp"

namespace attn::linear {
namespace {

constexpr int64_t kRows = 64;  // query rows per block

// One thread's buffers, sized before the parallel region (which must not allocate).
struct Scratch {
  KeySide keys;
  std::vector<float> KU, H, hT, dH, dhT, dS, a, da, w, qs, dx, raw, y, G, dout;
  Scratch(const LinearProblem& p, const float* omega)
      : keys(p, kRows, omega), KU(static_cast<size_t>(p.F * p.state_cols())), H(KU.size()), hT(KU.size()),
        dH(KU.size()), dhT(KU.size()), dS(KU.size()), a(static_cast<size_t>(kRows * p.F)), da(a.size()), w(a.size()),
        qs(static_cast<size_t>(kRows * p.D)), dx(qs.size()), raw(qs.size()),
        y(static_cast<size_t>(kRows * p.state_cols())), G(y.size()), dout(static_cast<size_t>(kRows * p.Dv)) {}
};

void head_backward(const kernels::TileKernels& kern, const LinearProblem& p, const BackwardViews& g, int64_t b,
                   int64_t h, Scratch& s) {
  const int64_t F = p.F, Dv = p.Dv, cols = p.state_cols(), FS = F * cols;
  load_initial_state(p, b, h, s.H.data());
  for (int64_t e = 0; e < FS; ++e) s.H[static_cast<size_t>(e)] += s.KU[static_cast<size_t>(e)];
  transpose(s.H.data(), F, cols, s.hT.data(), F);
  std::fill(s.dH.begin(), s.dH.end(), 0.0f);
  const float scale = static_cast<float>(p.scale);
  for (int64_t i0 = 0; i0 < p.N; i0 += kRows) {
    const int64_t n = std::min(kRows, p.N - i0);
    float *A = s.a.data(), *Y = s.y.data(), *G = s.G.data();
    load_features_and_aux(kern, p, true, b, h, i0, n, p.N, scale, s.raw.data(), A, s.qs.data());
    kern.gemm(n, cols, F, A, F, 1, s.H.data(), cols, Y, cols, false);
    load_rows(kern, g.dout, b, h, i0, n, p.N, s.dout.data(), Dv);
    for (int64_t r = 0; r < n; ++r)
      output_gradient(p, s.dout.data() + r * Dv, Y + r * cols, G + r * cols, s.keys.dcoef);
    kern.gemm(F, cols, n, A, 1, F, G, cols, s.dH.data(), cols, true);  // dH += A^T G
    kern.gemm(n, F, cols, G, cols, 1, s.hT.data(), F, s.da.data(), F, false);  // dA = G H^T
    feature_backward(p, true, n, s.qs.data(), A, s.da.data(), scale, s.dx.data(), s.w.data(), &kern, s.keys.omega,
                     s.keys.dpower);
    for (int64_t r = 0; r < n; ++r)
      kern.from_float(s.dx.data() + r * p.D, g.dq.dtype, g.dq.strides[3], p.D, g.dq.ptr(b, h, i0 + r));
  }
  if (!g.dfinal_state.empty()) {  // the final state S0 + KU
    load_dfinal_state(p, g, b, h, s.dS.data());
    for (int64_t e = 0; e < FS; ++e) s.dH[static_cast<size_t>(e)] += s.dS[static_cast<size_t>(e)];
  }
  KeySide& ks = s.keys;
  const int64_t len = p.kv_len[static_cast<size_t>(b)];
  if (len > 0) {
    transpose(s.dH.data(), F, cols, s.dhT.data(), F);
    kern.gemm(len, F, cols, ks.u.data(), cols, 1, s.dhT.data(), F, ks.dkf.data(), F, true);
    kern.gemm(len, cols, F, ks.kf.data(), F, 1, s.dH.data(), cols, ks.du.data(), cols, true);
  }
  store_d_initial_state(p, g, b, h, s.dH.data());
}

}  // namespace

void refuse_right_backward(const LinearProblem& p, const core::Outputs&, core::Reasons& why) {
  if (p.mech.causal) why.push_back("causal (each query sees only the keys before it: chunked)");
}

void linear_backward_right(const LinearProblem& p, const BackwardViews& g, const core::Context& ctx) {
  if (p.polar() && p.stream < 0)
    return polar_streams_backward(
        p, g, [&](const LinearProblem& sub, const BackwardViews& sg) { linear_backward_right(sub, sg, ctx); });
  const kernels::TileKernels& kern = *ctx.kern;
  const int64_t tasks = p.B * p.Hkv;
  const int threads = resolve_threads(ctx.threads, tasks);
  const std::vector<float> omega = feature_omega(p);
  std::vector<Scratch> scratch = per_thread<Scratch>(threads, p, omega.data());
  ParamPartials partials(p, g, tasks);
  parallel_for(tasks, threads, [&](int64_t task, int thread) {
    const int64_t b = task / p.Hkv, hk = task % p.Hkv, len = p.kv_len[static_cast<size_t>(b)];
    Scratch& s = scratch[static_cast<size_t>(thread)];
    KeySide& ks = s.keys;
    partials.point(ks, task);
    ks.load(kern, p, b, hk);
    std::fill(s.KU.begin(), s.KU.end(), 0.0f);
    if (len > 0) kern.gemm(p.F, p.state_cols(), len, ks.kf.data(), 1, p.F, ks.u.data(), p.state_cols(), s.KU.data(), p.state_cols(), false);
    for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) head_backward(kern, p, g, b, h, s);
    ks.store(kern, p, g, b, hk);
  });
  partials.add_to(g);
}

}  // namespace attn::linear
