// Titans memory, fast form (float32). Within a mini-batch of nb tokens every gradient
// is taken at the same state M_0 (the state before the mini-batch), so each is a rank-1 matrix
// per layer, G_i = u_i x_i^T (u: the output-side gradient, x: the layer's input). Unrolling the
// two scans over the mini-batch (j, i counted within it, 1-based):
//   S_j = P_j S_0 - sum_{i<=j} pi_{j,i} theta_i G_i,          pi_{j,i} = eta_{i+1} ... eta_j
//   M_j = A_j M_0 + c_j S_0 - sum_{i<=j} gamma_{j,i} theta_i G_i
// with P_j = eta_1 ... eta_j, A_j = (1 - alpha_1) ... (1 - alpha_j) and the scalar scans
//   c_j = (1 - alpha_j) c_{j-1} + P_j,   gamma_{j,i} = (1 - alpha_j) gamma_{j-1,i} + pi_{j,i}
// (c_0 = 0, gamma_{i-1,i} = 0). A layer read with input r_j then gives
//   M_j r_j = A_j M_0 r_j + c_j S_0 r_j - sum_{i<=j} gamma_{j,i} theta_i (x_i . r_j) u_i,
// and the state at the mini-batch's end is M_0, S_0 scaled plus X^T [u scaled]: every product is
// a gemm of the kernel table. The gate products run within one mini-batch as running products
// in double (never a division, never a product from the sequence's start).
// A layer's state is held transposed beside its momentum: MS (in, 2 out) = [W^T | S^T].
#include <algorithm>
#include <vector>

#include "attn/isa.hpp"
#include "base/parallel.hpp"
#include "kernels/kernel_table.hpp"
#include "titans/titans_common.hpp"

namespace attn {
namespace {

using kernels::TileKernels;

// The mini-batch's coefficients (float), nb tokens at most b.
struct Coeffs {
  float* a;   // A_j (nb)
  float* c;   // c_j (nb)
  float* cg;  // gamma_{j,i} theta_i (nb, nb), 0 above the diagonal
  float* gb;  // gamma_{nb,i} theta_i (nb)
  float* pb;  // pi_{nb,i} theta_i (nb)
  float a_end = 0, c_end = 0, p_end = 0;
};

void coefficients(int64_t nb, const float* theta, const float* eta, const float* alpha, Coeffs& k) {
  double P = 1, A = 1, c = 0;
  for (int64_t j = 0; j < nb; ++j) {
    const double keep = 1.0 - double(alpha[j]);
    P *= double(eta[j]);
    A *= keep;
    c = keep * c + P;
    k.a[j] = float(A);
    k.c[j] = float(c);
  }
  k.a_end = float(A);
  k.c_end = float(c);
  k.p_end = float(P);
  for (int64_t i = 0; i < nb; ++i) {
    const double th = double(theta[i]);
    double pi = 1, g = 0;
    for (int64_t j = 0; j < i; ++j) k.cg[j * nb + i] = 0.0f;
    for (int64_t j = i; j < nb; ++j) {
      if (j > i) pi *= double(eta[j]);
      g = (1.0 - double(alpha[j])) * g + pi;
      k.cg[j * nb + i] = float(g * th);
    }
    k.gb[i] = float(g * th);
    k.pb[i] = float(pi * th);
  }
}

// dst (cols, rows) = src (rows, cols) transposed; src rows at stride lds.
void transpose(const float* src, int64_t rows, int64_t cols, int64_t lds, float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * lds + c];
}

struct Layer {
  int64_t in, out;
  float* ms;  // (in, 2 out)
};

// out (nb, L.out) = the layer at each token's state applied to R (nb, in): see the file comment.
// xt (in, nb): the gradients' inputs transposed; u (nb, out). t2 (nb, 2 out), d (nb, nb) scratch.
void read_layer(const TileKernels& kern, int64_t nb, const Layer& L, const float* r, const float* xt, const float* u,
                const Coeffs& k, float* t2, float* d, float* out) {
  const int64_t o2 = 2 * L.out;
  kern.gemm(nb, o2, L.in, r, L.in, 1, L.ms, o2, t2, o2, false);
  for (int64_t j = 0; j < nb; ++j) {
    const float a = k.a[j], c = k.c[j];
    const float* tj = t2 + j * o2;
    float* oj = out + j * L.out;
    for (int64_t o = 0; o < L.out; ++o) oj[o] = a * tj[o] + c * tj[L.out + o];
  }
  kern.gemm(nb, nb, L.in, r, L.in, 1, xt, nb, d, nb, false);
  for (int64_t j = 0; j < nb; ++j)
    for (int64_t i = 0; i <= j; ++i) d[j * nb + i] *= -k.cg[j * nb + i];
  // row j sums over i <= j only: a later token's inf or NaN never reaches an earlier read
  for (int64_t j = 0; j < nb; ++j) kern.gemm(1, L.out, j + 1, d + j * nb, nb, 1, u, L.out, out + j * L.out, L.out, true);
}

// The state after the mini-batch: W^T <- A W^T + c S^T, S^T <- P S^T, then both += X^T [u scaled].
// x (nb, in), u (nb, out); uu (nb, 2 out) scratch.
void update_layer(const TileKernels& kern, int64_t nb, const Layer& L, const float* x, const float* u,
                  const Coeffs& k, float* uu) {
  const int64_t o2 = 2 * L.out;
  for (int64_t p = 0; p < L.in; ++p) {
    float* row = L.ms + p * o2;
    for (int64_t o = 0; o < L.out; ++o) {
      const float w = row[o], s = row[L.out + o];
      row[o] = k.a_end * w + k.c_end * s;
      row[L.out + o] = k.p_end * s;
    }
  }
  for (int64_t i = 0; i < nb; ++i) {
    const float g = -k.gb[i], p = -k.pb[i];
    for (int64_t o = 0; o < L.out; ++o) {
      uu[i * o2 + o] = g * u[i * L.out + o];
      uu[i * o2 + L.out + o] = p * u[i * L.out + o];
    }
  }
  kern.gemm(L.in, o2, nb, x, 1, L.in, uu, o2, L.ms, o2, true);
}

// Scratch of one sequence, in floats.
int64_t scratch_size(TitansMemory memory, int64_t d, int64_t b) {
  const int64_t coeff = 4 * b + b * b;
  if (memory == TitansMemory::linear) return coeff + 2 * d * d + b * d + d * b + b * 2 * d + b * b + b * 2 * d;
  const int64_t h = 4 * d;
  return coeff + d * 2 * h + h * 2 * d        // MS1, MS2
         + 3 * b * h + b * d + d * h + b * h  // Z, Act, Gp, U2, W2n, U1
         + d * b + b * 2 * h + 2 * b * h      // Kt, T2 (widest), Hq, Rq
         + h * b + b * b + b * 2 * h;         // ActT, D, UU (widest)
}

// One sequence: q, k, v (N, d), gates (N), w0 (count) or null; y (N, d), w_out, s_out (count).
void run_sequence(const TileKernels& kern, const TitansConfig& cfg, int64_t N, int64_t d, const float* q,
                  const float* kk, const float* v, const float* theta, const float* eta, const float* alpha,
                  const float* w0, const float* s0, float* y, float* w_out, float* s_out, float* scratch) {
  const int64_t b = cfg.batch_size, h = 4 * d;
  const float scale = float(titans::grad_scale(cfg.loss, d));
  float* p = scratch;
  auto take = [&p](int64_t n) {
    float* r = p;
    p += n;
    return r;
  };
  Coeffs k{take(b), take(b), take(b * b), take(b), take(b)};
  const bool mlp = cfg.memory == TitansMemory::mlp;
  Layer l1{d, mlp ? h : d, take(d * 2 * (mlp ? h : d))};
  Layer l2{h, d, mlp ? take(h * 2 * d) : nullptr};
  // M_0 and S_0 transposed
  for (int64_t pi = 0; pi < l1.in; ++pi)
    for (int64_t o = 0; o < l1.out; ++o) {
      l1.ms[pi * 2 * l1.out + o] = w0 ? w0[o * l1.in + pi] : 0.0f;
      l1.ms[pi * 2 * l1.out + l1.out + o] = s0 ? s0[o * l1.in + pi] : 0.0f;
    }
  if (mlp)
    for (int64_t r = 0; r < h; ++r)
      for (int64_t o = 0; o < d; ++o) {
        l2.ms[r * 2 * d + o] = w0 ? w0[h * d + o * h + r] : 0.0f;
        l2.ms[r * 2 * d + d + o] = s0 ? s0[h * d + o * h + r] : 0.0f;
      }
  if (!mlp) {
    float* u = take(b * d);
    float* kt = take(d * b);
    float* t2 = take(b * 2 * d);
    float* dd = take(b * b);
    float* uu = take(b * 2 * d);
    for (int64_t t0 = 0; t0 < N; t0 += b) {
      const int64_t nb = std::min(b, N - t0);
      const float* kc = kk + t0 * d;
      const float* vc = v + t0 * d;
      coefficients(nb, theta + t0, eta + t0, alpha + t0, k);
      kern.gemm(nb, d, d, kc, d, 1, l1.ms, 2 * d, u, d, false);  // M_0 k_i
      for (int64_t i = 0; i < nb * d; ++i) u[i] = scale * (u[i] - vc[i]);
      transpose(kc, nb, d, d, kt);
      read_layer(kern, nb, l1, q + t0 * d, kt, u, k, t2, dd, y + t0 * d);
      update_layer(kern, nb, l1, kc, u, k, uu);
    }
  } else {
    float* z = take(b * h);
    float* act = take(b * h);
    float* gp = take(b * h);
    float* u2 = take(b * d);
    float* w2n = take(d * h);
    float* u1 = take(b * h);
    float* kt = take(d * b);
    float* t2 = take(b * 2 * h);
    float* hq = take(b * h);
    float* rq = take(b * h);
    float* actt = take(h * b);
    float* dd = take(b * b);
    float* uu = take(b * 2 * h);
    for (int64_t t0 = 0; t0 < N; t0 += b) {
      const int64_t nb = std::min(b, N - t0);
      const float* kc = kk + t0 * d;
      const float* vc = v + t0 * d;
      coefficients(nb, theta + t0, eta + t0, alpha + t0, k);
      kern.gemm(nb, h, d, kc, d, 1, l1.ms, 2 * h, z, h, false);  // z = W_1 k
      titans::gelu_rows(z, act, gp, nb * h);
      kern.gemm(nb, d, h, act, h, 1, l2.ms, 2 * d, u2, d, false);  // W_2 a
      for (int64_t i = 0; i < nb * d; ++i) u2[i] = scale * (u2[i] - vc[i]);
      // W_2 = (W_2^T)^T in blocks of 16 rows: writes run along rows of w2n (a plain transpose
      // writing with a stride of 4d floats was a tenth of the time)
      for (int64_t r0 = 0; r0 < h; r0 += 16)
        for (int64_t o = 0; o < d; ++o)
          for (int64_t r = r0; r < std::min(h, r0 + 16); ++r) w2n[o * h + r] = l2.ms[r * 2 * d + o];
      kern.gemm(nb, h, d, u2, d, 1, w2n, h, u1, h, false);  // W_2^T u2
      for (int64_t i = 0; i < nb * h; ++i) u1[i] *= gp[i];
      transpose(kc, nb, d, d, kt);
      read_layer(kern, nb, l1, q + t0 * d, kt, u1, k, t2, dd, hq);
      titans::gelu_rows(hq, rq, gp, nb * h);  // gp is free again: its derivative is not used
      transpose(act, nb, h, h, actt);
      read_layer(kern, nb, l2, rq, actt, u2, k, t2, dd, y + t0 * d);
      update_layer(kern, nb, l1, kc, u1, k, uu);
      update_layer(kern, nb, l2, act, u2, k, uu);
    }
  }
  // back to the weights' layout (M(k) = W k)
  auto store = [](const Layer& L, float* w, float* s) {
    for (int64_t o = 0; o < L.out; ++o)
      for (int64_t pi = 0; pi < L.in; ++pi) {
        w[o * L.in + pi] = L.ms[pi * 2 * L.out + o];
        if (s) s[o * L.in + pi] = L.ms[pi * 2 * L.out + L.out + o];
      }
  };
  store(l1, w_out, s_out);
  if (mlp) store(l2, w_out + h * d, s_out ? s_out + h * d : nullptr);
}

}  // namespace

void titans_memory(const TitansShape& shape, const TitansConfig& config, const TitansArgs& in, float* y,
                   float* w_out, float* s_out, int threads) {
  titans::check_args(shape, config, in.q, in.k, in.v, in.theta, in.eta, in.alpha, in.w0_groups, y, w_out);
  if (threads < 0 || threads > kMaxThreads)
    fail(titans::kWhere, "threads must be in [0, " + std::to_string(kMaxThreads) + "], got " + std::to_string(threads));
  const int64_t seqs = shape.batch * shape.heads;
  if (seqs == 0) return;
  const int64_t d = shape.dim, N = shape.tokens, count = titans_weight_count(config.memory, d);
  const int64_t b = std::min(config.batch_size, std::max<int64_t>(N, 1));
  TitansConfig cfg = config;
  cfg.batch_size = b;
  const kernels::TileKernels& kern = kernels::kernels_for(active_isa());
  const int nt = resolve_threads(threads, seqs);
  const int64_t per = scratch_size(config.memory, d, b);
  std::vector<float> scratch(static_cast<size_t>(per * nt));
  parallel_for(seqs, nt, [&](int64_t bh, int t) {
    const int64_t row = bh * N;
    run_sequence(kern, cfg, N, d, in.q + row * d, in.k + row * d, in.v + row * d, in.theta + row, in.eta + row,
                 in.alpha + row, titans::w0_of(in.w0, in.w0_groups, bh, shape.heads, count),
                 titans::w0_of(in.s0, in.w0_groups, bh, shape.heads, count),
                 N > 0 ? y + row * d : nullptr, w_out + bh * count, s_out ? s_out + bh * count : nullptr,
                 scratch.data() + t * per);
  });
}

}  // namespace attn
