// The causal backward in blocks of C rows (formulas: linear_backward.hpp). For a block starting
// at s0, rows r and keys s counted from 0 inside it, A = scale phi(Q_b), K = phi(K_b), U = [V_b 1],
// H the state entering the block, M[r][s] = L^(r-s) for s <= r (else 0), G = dL/dY_b:
//   P  = (A K^T) o M                    Y  = diag(L^(r+1)) A H + P U      (the forward again)
//   E  = (G U^T) o M                    dA = diag(L^(r+1)) G H^T + E K
//   dK += E^T A + diag(L^(C-1-s)) U dH^T     dU += P^T G + diag(L^(C-1-s)) K dH
//   dH <- L^C dH + A^T diag(L^(r+1)) G    (dH: the gradient of the state leaving the block)
// and in the block holding the last valid key (ce of its keys valid) the final state's gradient
// dS enters as L^(ce-1-s) for its keys and L^ce for the state entering it. The states entering
// every block are recomputed first, forward, and kept (ceil(N / C) states of F x cols floats).
// Every product runs on kernels.gemm (the triangular ones in bands of 16 rows that stop at the
// diagonal, as the forward's); a task owns (batch entry, kv head) and walks its
// group's query heads in order, so the sums do not depend on the thread count.
#include <algorithm>
#include <cmath>

#include "base/parallel.hpp"
#include "linear/backward_keys.hpp"

namespace attn::linear {
namespace {

// One thread's buffers, sized before the parallel region (which must not allocate).
struct Scratch {
  KeySide keys;
  std::vector<float> states, pw, a, qs, dx, w, raw, kt, ut, P, E, y, G, Gs, dA, dout, tk, tu, dH, hT, dhT, dS, dST,
      clean;
  Scratch(const LinearProblem& p, int64_t C, int64_t blocks, const float* omega)
      : keys(p, C, omega), states(static_cast<size_t>(blocks * p.F * p.state_cols())), pw(static_cast<size_t>(C + 1)),
        a(static_cast<size_t>(C * p.F)), qs(static_cast<size_t>(C * p.D)), dx(static_cast<size_t>(C * p.D)),
        w(static_cast<size_t>(C * p.F)), raw(static_cast<size_t>(C * p.D)),
        kt(static_cast<size_t>(p.F * C)), ut(static_cast<size_t>(p.state_cols() * C)), P(static_cast<size_t>(C * C)),
        E(static_cast<size_t>(C * C)), y(static_cast<size_t>(C * p.state_cols())), G(static_cast<size_t>(C * p.state_cols())),
        Gs(static_cast<size_t>(C * p.state_cols())), dA(static_cast<size_t>(C * p.F)), dout(static_cast<size_t>(C * p.Dv)),
        tk(static_cast<size_t>(C * p.F)), tu(static_cast<size_t>(C * p.state_cols())),
        dH(static_cast<size_t>(p.F * p.state_cols())), hT(static_cast<size_t>(p.F * p.state_cols())),
        dhT(static_cast<size_t>(p.F * p.state_cols())), dS(static_cast<size_t>(p.F * p.state_cols())),
        dST(static_cast<size_t>(p.F * p.state_cols())),
        clean(static_cast<size_t>(C * std::max(p.F, p.state_cols()))) {}
};

constexpr int64_t kBand = 16;  // output rows per band of a triangular product

// x (c x C) = a b^T on and below the diagonal, in bands of kBand rows that each stop at their last
// row's diagonal (a: c x k rows, bt: b^T, k x c with leading dimension C); what lies above the
// diagonal is left to causal_decay_mask, which zeroes it.
void lower_product(const kernels::TileKernels& kern, const float* a, const float* bt, int64_t c, int64_t k, int64_t C,
                   float* x) {
  for (int64_t r0 = 0; r0 < c; r0 += kBand) {
    const int64_t rows = std::min(kBand, c - r0);
    kern.gemm(rows, r0 + rows, k, a + r0 * k, k, 1, bt, C, x + r0 * C, C, false);
  }
}

// x (c x C, leading dimension C): x[r][s] *= pw[r - s] on and below the diagonal, 0 above.
void causal_decay_mask(float* x, int64_t c, int64_t C, const float* pw) {
  for (int64_t r = 0; r < c; ++r) {
    float* row = x + r * C;
    for (int64_t s = 0; s <= r; ++s) row[s] *= pw[r - s];
    std::fill(row + r + 1, row + c, 0.0f);
  }
}

// out (c x w) += L X in bands of kBand rows (a band of L's rows ends at its last row's diagonal),
// or L^T X (a band of L^T's rows starts at its first row's diagonal).
void banded_product(const kernels::TileKernels& kern, const float* L, int64_t c, int64_t C, bool transpose,
                    const float* X, int64_t w, float* out) {
  for (int64_t r0 = 0; r0 < c; r0 += kBand) {
    const int64_t rows = std::min(kBand, c - r0);
    if (!transpose)
      kern.gemm(rows, w, r0 + rows, L + r0 * C, C, 1, X, w, out + r0 * w, w, true);
    else  // L^T(r0 + i, p) = L[r0 + p][r0 + i] for p < c - r0
      kern.gemm(rows, w, c - r0, L + r0 * C + r0, 1, C, X + r0 * w, w, out + r0 * w, w, true);
  }
}

// out (c x w) += L X, or L^T X with `transpose`: L lower triangular (c x c, leading dimension C),
// X (c x w). A non-finite value of X is kept out of the product (L's zeros above the diagonal
// times NaN would reach rows that never see it) and added to the rows that do; clean: c x w scratch.
void triangular_product(const kernels::TileKernels& kern, const float* L, int64_t c, int64_t C, bool transpose,
                        const float* X, int64_t w, float* out, float* clean) {
  bool finite = true;
  for (int64_t e = 0; e < c * w && finite; ++e) finite = std::isfinite(X[e]);
  if (finite) {
    banded_product(kern, L, c, C, transpose, X, w, out);
    return;
  }
  for (int64_t e = 0; e < c * w; ++e) clean[e] = std::isfinite(X[e]) ? X[e] : 0.0f;
  banded_product(kern, L, c, C, transpose, clean, w, out);
  for (int64_t s = 0; s < c; ++s)
    for (int64_t x = 0; x < w; ++x) {
      const float val = X[s * w + x];
      if (std::isfinite(val)) continue;
      if (!transpose)  // row s of X reaches rows r >= s
        for (int64_t r = s; r < c; ++r) out[r * w + x] += L[r * C + s] * val;
      else  // row s of X reaches rows i <= s (through L[s][i])
        for (int64_t i = 0; i <= s; ++i) out[i * w + x] += L[s * C + i] * val;
    }
}

// dst rows s < n = src rows s scaled by pw[last - s] (width w).
void decayed_rows(const float* src, int64_t n, int64_t w, const float* pw, int64_t last, float* dst) {
  for (int64_t s = 0; s < n; ++s)
    for (int64_t x = 0; x < w; ++x) dst[s * w + x] = src[s * w + x] * pw[last - s];
}

// One query head h of kv head hk (its keys loaded in s.keys): dq of its rows, its share of dK and
// dU, and its initial state's gradient.
void head_backward(const kernels::TileKernels& kern, const LinearProblem& p, const BackwardViews& g, int64_t b,
                   int64_t h, int64_t C, Scratch& s) {
  const int64_t F = p.F, Dv = p.Dv, cols = p.state_cols(), N = p.N, len = p.kv_len[static_cast<size_t>(b)];
  const int64_t blocks = (N + C - 1) / C, FS = F * cols;
  const double lambda = p.decay[static_cast<size_t>(h)];
  float* pw = s.pw.data();  // lambda^n, n <= C
  for (int64_t n = 0; n <= C; ++n) pw[n] = static_cast<float>(std::pow(lambda, n));
  KeySide& ks = s.keys;
  // Forward: the state entering each block.
  float* H = s.dH.data();  // (borrowed until the backward walk)
  load_initial_state(p, b, h, H);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t s0 = blk * C, c = std::min(C, N - s0);
    std::copy(H, H + FS, s.states.data() + blk * FS);
    if (blk + 1 == blocks) break;
    for (int64_t e = 0; e < FS; ++e) H[e] *= pw[c];
    decayed_rows(ks.kf.data() + s0 * F, c, F, pw, c - 1, s.tk.data());
    kern.gemm(F, cols, c, s.tk.data(), 1, F, ks.u.data() + s0 * cols, cols, H, cols, true);
  }
  // Backward, last block first, carrying dH.
  float* dH = s.dH.data();
  std::fill(dH, dH + FS, 0.0f);
  const bool has_dS = !g.dfinal_state.empty();
  if (has_dS) {
    load_dfinal_state(p, g, b, h, s.dS.data());
    transpose(s.dS.data(), F, cols, s.dST.data(), F);
  }
  for (int64_t blk = blocks - 1; blk >= 0; --blk) {
    const int64_t s0 = blk * C, c = std::min(C, N - s0), ce = std::clamp<int64_t>(len - s0, 0, c);
    const bool last_valid = s0 + c >= len && (blk == 0 || s0 < len);  // the final state is taken here
    const float* Hin = s.states.data() + blk * FS;
    const float* K = ks.kf.data() + s0 * F;
    const float* U = ks.u.data() + s0 * cols;
    float *A = s.a.data(), *P = s.P.data(), *E = s.E.data(), *Y = s.y.data(), *G = s.G.data(), *dA = s.dA.data();
    load_features_and_aux(kern, p, true, b, h, s0, c, N, static_cast<float>(p.scale), s.raw.data(), A, s.qs.data());
    transpose(K, c, F, s.kt.data(), C);
    transpose(U, c, cols, s.ut.data(), C);
    // the forward again: P, Y and from them G
    lower_product(kern, A, s.kt.data(), c, F, C, P);
    causal_decay_mask(P, c, C, pw);
    kern.gemm(c, cols, F, A, F, 1, Hin, cols, Y, cols, false);
    for (int64_t r = 0; r < c; ++r)
      for (int64_t x = 0; x < cols; ++x) Y[r * cols + x] *= pw[r + 1];
    triangular_product(kern, P, c, C, false, U, cols, Y, s.clean.data());
    load_rows(kern, g.dout, b, h, s0, c, N, s.dout.data(), Dv);
    for (int64_t r = 0; r < c; ++r) output_gradient(p, s.dout.data() + r * Dv, Y + r * cols, G + r * cols, ks.dcoef);
    // dA = diag(L^(r+1)) G H^T + E K, then dq
    lower_product(kern, G, s.ut.data(), c, cols, C, E);
    causal_decay_mask(E, c, C, pw);
    transpose(Hin, F, cols, s.hT.data(), F);
    kern.gemm(c, F, cols, G, cols, 1, s.hT.data(), F, dA, F, false);
    for (int64_t r = 0; r < c; ++r)
      for (int64_t f = 0; f < F; ++f) dA[r * F + f] *= pw[r + 1];
    triangular_product(kern, E, c, C, false, K, F, dA, s.clean.data());
    feature_backward(p, true, c, s.qs.data(), A, dA, static_cast<float>(p.scale), s.dx.data(), s.w.data(), &kern,
                     ks.omega, ks.dpower);
    for (int64_t r = 0; r < c; ++r)
      kern.from_float(s.dx.data() + r * p.D, g.dq.dtype, g.dq.strides[3], p.D, g.dq.ptr(b, h, s0 + r));
    // dK += E^T A + diag(L^(C-1-s)) U dH^T (+ the final state's share)
    float* dK = ks.dkf.data() + s0 * F;
    float* dU = ks.du.data() + s0 * cols;
    triangular_product(kern, E, c, C, true, A, F, dK, s.clean.data());
    transpose(dH, F, cols, s.dhT.data(), F);
    decayed_rows(U, c, cols, pw, c - 1, s.tu.data());
    kern.gemm(c, F, cols, s.tu.data(), cols, 1, s.dhT.data(), F, dK, F, true);
    // dU += P^T G + diag(L^(C-1-s)) K dH (+ the final state's share)
    triangular_product(kern, P, c, C, true, G, cols, dU, s.clean.data());
    decayed_rows(K, c, F, pw, c - 1, s.tk.data());
    kern.gemm(c, cols, F, s.tk.data(), F, 1, dH, cols, dU, cols, true);
    if (has_dS && last_valid && ce > 0) {
      decayed_rows(U, ce, cols, pw, ce - 1, s.tu.data());
      kern.gemm(ce, F, cols, s.tu.data(), cols, 1, s.dST.data(), F, dK, F, true);
      decayed_rows(K, ce, F, pw, ce - 1, s.tk.data());
      kern.gemm(ce, cols, F, s.tk.data(), F, 1, s.dS.data(), cols, dU, cols, true);
    }
    // dH: of the state entering the block
    for (int64_t e = 0; e < FS; ++e) dH[e] *= pw[c];
    for (int64_t r = 0; r < c; ++r)
      for (int64_t x = 0; x < cols; ++x) s.Gs[static_cast<size_t>(r * cols + x)] = G[r * cols + x] * pw[r + 1];
    kern.gemm(F, cols, c, A, 1, F, s.Gs.data(), cols, dH, cols, true);
    if (has_dS && last_valid)
      for (int64_t e = 0; e < FS; ++e) dH[e] += pw[ce] * s.dS[static_cast<size_t>(e)];
  }
  if (blocks == 0 && has_dS) std::copy(s.dS.begin(), s.dS.end(), dH);  // no tokens: the final state is S0
  store_d_initial_state(p, g, b, h, dH);
}

}  // namespace

void refuse_chunked_backward(const LinearProblem& p, const core::Outputs&, core::Reasons& why) {
  if (!p.mech.causal) why.push_back("not causal (the right product sums all keys at once)");
}

void linear_backward_chunked(const LinearProblem& p, const BackwardViews& g, const core::Context& ctx) {
  if (p.polar() && p.stream < 0)
    return polar_streams_backward(
        p, g, [&](const LinearProblem& sub, const BackwardViews& sg) { linear_backward_chunked(sub, sg, ctx); });
  const kernels::TileKernels& kern = *ctx.kern;
  // a chunk longer than N is one block of N rows anyway
  const int64_t C = std::max<int64_t>(1, std::min(p.mech.chunk, p.N)), blocks = (p.N + C - 1) / C;
  const int64_t tasks = p.B * p.Hkv;
  const int threads = resolve_threads(ctx.threads, tasks);
  const std::vector<float> omega = feature_omega(p);
  std::vector<Scratch> scratch = per_thread<Scratch>(threads, p, C, blocks, omega.data());
  ParamPartials partials(p, g, tasks);
  parallel_for(tasks, threads, [&](int64_t task, int thread) {
    const int64_t b = task / p.Hkv, hk = task % p.Hkv;
    Scratch& s = scratch[static_cast<size_t>(thread)];
    partials.point(s.keys, task);
    s.keys.load(kern, p, b, hk);
    for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) head_backward(kern, p, g, b, h, C, s);
    s.keys.store(kern, p, g, b, hk);
  });
  partials.add_to(g);
}

}  // namespace attn::linear
