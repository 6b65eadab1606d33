// Titans memory backward for one sequence (titans_backward.cpp runs it in float32 over the
// sequences in parallel, titans_backward_reference.cpp in float64 one after another).
//
// Forward per token t (mini-batches of b tokens take their gradients at the state before the
// mini-batch, the snapshot M' = M_{t0-1}):
//   g_t = grad_W l(M'; k_t, v_t),  S_t = eta_t S_{t-1} - theta_t g_t,  M_t = (1 - alpha_t) M_{t-1} + S_t,
//   y_t = M_t(q_t).
// Reverse loop, with dM, dS the adjoints of M_t, S_t (starting from dL/dM_N, dL/dS_N) and dM' the
// snapshot's, summed over its mini-batch:
//   read:     dM += d/dM <dy_t, M(q_t)>,  dq_t = d/dq <dy_t, M_t(q_t)>
//   M_t:      dS += dM,  dalpha_t = -<dM, M_{t-1}>,  dM <- (1 - alpha_t) dM
//   S_t:      deta_t = <dS, S_{t-1}>,  dtheta_t = -<dS, g_t>,  Gb = -theta_t dS,  dS <- eta_t dS
//   g_t:      L = <Gb, grad_W l(M'; k, v)>; dM' += dL/dM' (the Hessian of l times Gb: the second-order
//             term), dk_t = dL/dk, dv_t = dL/dv
//   at the mini-batch's first token: dM += dM' (M' was M_{t0-1}).
// With c = 2 (sum) or 2/d (mean) and e = M(k) - v:
//   linear (grad = c e k^T):  eb = c Gb k;  dM' += eb k^T;  dk = W^T eb + c Gb^T e;  dv = -eb
//   mlp (z = W1 k, a = gelu(z), gp = gelu'(z), gpp = gelu''(z) = phi(z)(2 - z^2), beta = W2^T e;
//        grad_W2 = c e a^T, grad_W1 = c (beta . gp) k^T), with r = Gb1 k, p = Gb2 a:
//     eb = c (p + W2 (gp . r)),  ab = c Gb2^T e + W2^T eb,  zb = ab . gp + c beta . r . gpp
//     dW2' += eb a^T + c e (gp . r)^T,  dW1' += zb k^T,  dk = W1^T zb + Gb1^T (c beta . gp),  dv = -eb
// The states M_{t-1}, S_{t-1} and g_t are replayed per mini-batch from checkpoints (M and S at
// each mini-batch's start, stored by a forward pass first): memory (2 N/b + 3 b + 4) weight counts.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "titans/titans_common.hpp"

namespace attn::titans {

// Scratch of one sequence's backward, in T: sizes from backward_scratch_size.
inline int64_t backward_scratch_size(TitansMemory memory, int64_t d, int64_t N, int64_t b) {
  const int64_t count = titans_weight_count(memory, d), batches = (N + b - 1) / b;
  return count * (2 * std::max<int64_t>(batches, 1) + 2 * (b + 1) + b + 4) + 32 * d;
}

template <class T>
struct SequenceIn {
  const T *q, *k, *v, *theta, *eta, *alpha;  // (N, d) and (N)
  const T *w0, *s0;                          // (count) or null: zeros
  const T *dy, *dw_out, *ds_out;             // (N, d), (count), (count) or null: zeros
};
template <class T>
struct SequenceOut {
  T *dq, *dk, *dv, *dtheta, *deta, *dalpha;  // (N, d) and (N)
  T *dw0, *ds0;                              // (count) each, always written
};

// Sequence bh's inputs (rows bh * N ..) of a call's arguments `in` (TitansArgs or its float64 twin)
// and of its output gradients dy, dw_out, ds_out (each null when absent).
template <class T, class Args>
SequenceIn<T> sequence_in(const Args& in, int64_t bh, int64_t N, int64_t d, int64_t heads, int64_t count,
                          const T* dy, const T* dw_out, const T* ds_out) {
  const int64_t row = bh * N;
  return {in.q + row * d,
          in.k + row * d,
          in.v + row * d,
          in.theta + row,
          in.eta + row,
          in.alpha + row,
          w0_of(in.w0, in.w0_groups, bh, heads, count),
          w0_of(in.s0, in.w0_groups, bh, heads, count),
          dy ? dy + row * d : nullptr,
          dw_out ? dw_out + bh * count : nullptr,
          ds_out ? ds_out + bh * count : nullptr};
}

namespace detail {

template <class T>
T gelu_second(T z) {
  return T(0.39894228040143267794) * std::exp(T(-0.5) * z * z) * (T(2) - z * z);
}

// grad_W l(W; k, v) into g (count); tmp >= 9d values.
template <class T>
void inner_gradient(TitansMemory memory, T c, int64_t d, const T* W, const T* k, const T* v, T* g, T* tmp) {
  if (memory == TitansMemory::linear) {
    for (int64_t o = 0; o < d; ++o) {
      T e = 0;
      for (int64_t p = 0; p < d; ++p) e += W[o * d + p] * k[p];
      e = c * (e - v[o]);
      for (int64_t p = 0; p < d; ++p) g[o * d + p] = e * k[p];
    }
    return;
  }
  const int64_t h = 4 * d;
  const T* W1 = W;
  const T* W2 = W + h * d;
  T* a = tmp;          // h
  T* gp = tmp + h;     // h
  T* e = tmp + 2 * h;  // d
  for (int64_t r = 0; r < h; ++r) {
    T z = 0;
    for (int64_t p = 0; p < d; ++p) z += W1[r * d + p] * k[p];
    gelu_and_grad(z, a[r], gp[r]);
  }
  for (int64_t o = 0; o < d; ++o) {
    T m = 0;
    for (int64_t r = 0; r < h; ++r) m += W2[o * h + r] * a[r];
    e[o] = c * (m - v[o]);
  }
  for (int64_t o = 0; o < d; ++o)
    for (int64_t r = 0; r < h; ++r) g[h * d + o * h + r] = e[o] * a[r];
  for (int64_t r = 0; r < h; ++r) {
    T beta = 0;
    for (int64_t o = 0; o < d; ++o) beta += W2[o * h + r] * e[o];
    const T br = beta * gp[r];
    for (int64_t p = 0; p < d; ++p) g[r * d + p] = br * k[p];
  }
}

// dW += d/dW <dy, M(W; q)>, dq = d/dq <dy, M(W; q)>; tmp >= 9d values.
template <class T>
void read_backward(TitansMemory memory, int64_t d, const T* W, const T* q, const T* dy, T* dW, T* dq, T* tmp) {
  std::fill(dq, dq + d, T(0));
  if (memory == TitansMemory::linear) {
    for (int64_t o = 0; o < d; ++o)
      for (int64_t p = 0; p < d; ++p) {
        dW[o * d + p] += dy[o] * q[p];
        dq[p] += W[o * d + p] * dy[o];
      }
    return;
  }
  const int64_t h = 4 * d;
  const T* W1 = W;
  const T* W2 = W + h * d;
  T* a = tmp;
  T* gp = tmp + h;
  for (int64_t r = 0; r < h; ++r) {
    T z = 0;
    for (int64_t p = 0; p < d; ++p) z += W1[r * d + p] * q[p];
    gelu_and_grad(z, a[r], gp[r]);
  }
  for (int64_t o = 0; o < d; ++o)
    for (int64_t r = 0; r < h; ++r) dW[h * d + o * h + r] += dy[o] * a[r];
  for (int64_t r = 0; r < h; ++r) {
    T ab = 0;
    for (int64_t o = 0; o < d; ++o) ab += W2[o * h + r] * dy[o];
    const T zb = ab * gp[r];
    for (int64_t p = 0; p < d; ++p) {
      dW[r * d + p] += zb * q[p];
      dq[p] += W1[r * d + p] * zb;
    }
  }
}

// L = <Gb, grad_W l(W; k, v)>: dW += dL/dW, dk = dL/dk, dv = dL/dv (the file comment's formulas);
// tmp >= 26d values.
template <class T>
void gradient_backward(TitansMemory memory, T c, int64_t d, const T* W, const T* k, const T* v, const T* Gb, T* dW,
                       T* dk, T* dv, T* tmp) {
  if (memory == TitansMemory::linear) {
    T* e = tmp;       // d
    T* eb = tmp + d;  // d
    for (int64_t o = 0; o < d; ++o) {
      T m = 0, gk = 0;
      for (int64_t p = 0; p < d; ++p) m += W[o * d + p] * k[p], gk += Gb[o * d + p] * k[p];
      e[o] = m - v[o];
      eb[o] = c * gk;
    }
    std::fill(dk, dk + d, T(0));
    for (int64_t o = 0; o < d; ++o) {
      const T ce = c * e[o];
      for (int64_t p = 0; p < d; ++p) {
        dW[o * d + p] += eb[o] * k[p];
        dk[p] += W[o * d + p] * eb[o] + Gb[o * d + p] * ce;
      }
      dv[o] = -eb[o];
    }
    return;
  }
  const int64_t h = 4 * d;
  const T* W1 = W;
  const T* W2 = W + h * d;
  const T* G1 = Gb;
  const T* G2 = Gb + h * d;
  T* a = tmp;              // h
  T* gp = a + h;           // h
  T* gpp = gp + h;         // h
  T* r = gpp + h;          // h: G1 k
  T* e = r + h;            // d
  T* eb = e + d;           // d
  T* beta = eb + d;        // h
  T* ab = beta + h;        // h
  for (int64_t j = 0; j < h; ++j) {
    T z = 0, rj = 0;
    for (int64_t p = 0; p < d; ++p) z += W1[j * d + p] * k[p], rj += G1[j * d + p] * k[p];
    gelu_and_grad(z, a[j], gp[j]);
    gpp[j] = gelu_second(z);
    r[j] = rj;
  }
  for (int64_t o = 0; o < d; ++o) {
    T m = 0, pa = 0, wr = 0;
    for (int64_t j = 0; j < h; ++j) {
      m += W2[o * h + j] * a[j];
      pa += G2[o * h + j] * a[j];
      wr += W2[o * h + j] * (gp[j] * r[j]);
    }
    e[o] = m - v[o];
    eb[o] = c * (pa + wr);
  }
  for (int64_t j = 0; j < h; ++j) {
    T bj = 0, qj = 0, wb = 0;
    for (int64_t o = 0; o < d; ++o) {
      bj += W2[o * h + j] * e[o];
      qj += G2[o * h + j] * e[o];
      wb += W2[o * h + j] * eb[o];
    }
    beta[j] = bj;
    ab[j] = c * qj + wb;
  }
  for (int64_t o = 0; o < d; ++o) {
    const T ce = c * e[o];
    for (int64_t j = 0; j < h; ++j) dW[h * d + o * h + j] += eb[o] * a[j] + ce * (gp[j] * r[j]);
    dv[o] = -eb[o];
  }
  std::fill(dk, dk + d, T(0));
  for (int64_t j = 0; j < h; ++j) {
    const T zb = ab[j] * gp[j] + c * beta[j] * r[j] * gpp[j];
    const T cb = c * beta[j] * gp[j];
    for (int64_t p = 0; p < d; ++p) {
      dW[j * d + p] += zb * k[p];
      dk[p] += W1[j * d + p] * zb + G1[j * d + p] * cb;
    }
  }
}

template <class T>
T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace detail

// One sequence's backward (the file comment); `scratch` holds backward_scratch_size values.
template <class T>
void sequence_backward(TitansMemory memory, TitansLoss loss, int64_t N, int64_t d, int64_t b, const SequenceIn<T>& in,
                       const SequenceOut<T>& out, T* scratch) {
  const int64_t count = titans_weight_count(memory, d), batches = (N + b - 1) / b;
  const T c = T(grad_scale(loss, d));
  T* ckw = scratch;                                  // (batches, count)
  T* cks = ckw + std::max<int64_t>(batches, 1) * count;  // (batches, count)
  T* ws = cks + std::max<int64_t>(batches, 1) * count;   // (b + 1, count): M_{t0-1} ... M_{t1-1}
  T* ss = ws + (b + 1) * count;                      // (b + 1, count)
  T* gs = ss + (b + 1) * count;                      // (b, count)
  T* dW = gs + b * count;
  T* dS = dW + count;
  T* dsnap = dS + count;
  T* gb = dsnap + count;
  T* tmp = gb + count;  // 32 d
  // Forward: checkpoints at each mini-batch's start.
  T* W = ws;  // the running state (ws / ss rows 0 as working space)
  T* S = ss;
  for (int64_t i = 0; i < count; ++i) W[i] = in.w0 ? in.w0[i] : T(0), S[i] = in.s0 ? in.s0[i] : T(0);
  for (int64_t m = 0; m < batches; ++m) {
    std::copy(W, W + count, ckw + m * count);
    std::copy(S, S + count, cks + m * count);
    const T* snap = ckw + m * count;
    for (int64_t t = m * b; t < std::min(N, (m + 1) * b); ++t) {
      detail::inner_gradient(memory, c, d, snap, in.k + t * d, in.v + t * d, gb, tmp);
      const T th = in.theta[t], et = in.eta[t], keep = T(1) - in.alpha[t];
      for (int64_t i = 0; i < count; ++i) {
        S[i] = et * S[i] - th * gb[i];
        W[i] = keep * W[i] + S[i];
      }
    }
  }
  // Reverse.
  for (int64_t i = 0; i < count; ++i)
    dW[i] = in.dw_out ? in.dw_out[i] : T(0), dS[i] = in.ds_out ? in.ds_out[i] : T(0);
  for (int64_t m = batches - 1; m >= 0; --m) {
    const int64_t t0 = m * b, L = std::min(N, t0 + b) - t0;
    const T* snap = ckw + m * count;
    std::copy(snap, snap + count, ws);
    std::copy(cks + m * count, cks + (m + 1) * count, ss);
    for (int64_t j = 0; j < L; ++j) {  // replay: ws[j + 1] = M_t, ss[j + 1] = S_t, gs[j] = g_t
      const int64_t t = t0 + j;
      T* g = gs + j * count;
      detail::inner_gradient(memory, c, d, snap, in.k + t * d, in.v + t * d, g, tmp);
      const T th = in.theta[t], et = in.eta[t], keep = T(1) - in.alpha[t];
      const T* s0 = ss + j * count;
      const T* w0 = ws + j * count;
      T* s1 = ss + (j + 1) * count;
      T* w1 = ws + (j + 1) * count;
      for (int64_t i = 0; i < count; ++i) {
        s1[i] = et * s0[i] - th * g[i];
        w1[i] = keep * w0[i] + s1[i];
      }
    }
    std::fill(dsnap, dsnap + count, T(0));
    for (int64_t j = L - 1; j >= 0; --j) {
      const int64_t t = t0 + j;
      T* dq = out.dq + t * d;
      if (in.dy)
        detail::read_backward(memory, d, ws + (j + 1) * count, in.q + t * d, in.dy + t * d, dW, dq, tmp);
      else
        std::fill(dq, dq + d, T(0));
      const T keep = T(1) - in.alpha[t], et = in.eta[t], th = in.theta[t];
      for (int64_t i = 0; i < count; ++i) dS[i] += dW[i];
      out.dalpha[t] = -detail::dot(dW, ws + j * count, count);
      for (int64_t i = 0; i < count; ++i) dW[i] *= keep;
      out.deta[t] = detail::dot(dS, ss + j * count, count);
      out.dtheta[t] = -detail::dot(dS, gs + j * count, count);
      for (int64_t i = 0; i < count; ++i) {
        gb[i] = -th * dS[i];
        dS[i] *= et;
      }
      detail::gradient_backward(memory, c, d, snap, in.k + t * d, in.v + t * d, gb, dsnap, out.dk + t * d,
                                out.dv + t * d, tmp);
    }
    for (int64_t i = 0; i < count; ++i) dW[i] += dsnap[i];
  }
  std::copy(dW, dW + count, out.dw0);
  std::copy(dS, dS + count, out.ds0);
}

}  // namespace attn::titans
