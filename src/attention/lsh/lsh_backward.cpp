// LSH attention's backward. The buckets (and so the sorted orders and chunks) are constants of the
// inputs: no gradient flows through the hashing (an argmax, piecewise constant). Round r of query i
// counts the keys A_r(i): those in its sorted chunk or the one before, that the pattern allows
// (causal; not itself under shared_qk) and that no earlier round counted; under shared_qk a query
// no round reaches attends to itself alone. Per round a softmax (lse_r, P_r, O_r), merged through
// the rounds' log-sum-exp: lse = log sum_r e^lse_r, O = sum_r w_r O_r with w_r = e^(lse_r - lse).
// Differentiated:
//   dO_r = w_r dO,   dlse_r = w_r (dO . (O_r - O) + dlse)
//   dS_rj = P_rj (dO_r . v_j - dO_r . O_r + dlse_r) = P_j (dO . v_j - dO . O + dlse)   (P_j = w_r P_rj)
//   dq_i = scale sum dS k_j,   dk_j += scale dS q_i,   dv_j += P_j dO_i
// The rounds' sets are disjoint, so the merged weights are one softmax over their union and the
// second form of dS needs only the merged lse and D_i = dO_i . O_i - dlse_i.
// Forms: "chunked" (float32: per (batch entry, kv head) task, every query head of its group in
// order, per round the sorted queries in tiles of 64 against the key chunks they reach, 64 keys at
// a time through the tile kernels (the forward's masking, P from the forward's lse; dV, dK, dQ as
// small GEMMs); dq, dk, dv accumulated in a fixed order, so bitwise the same for any thread count) and "reference" (float64: each
// round's softmax and the merge written out, differentiated as in the first lines above).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/aligned_buffer.hpp"
#include "base/parallel.hpp"
#include "kernels/kernel_table.hpp"
#include "lsh/lsh.hpp"

namespace attn::lsh {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- reference: float64 (or the plain same-dtype baseline), round by round ---------------------

template <class T>
void reference_impl(const LshProblem& p, const core::BackwardViews& g, bool plain) {
  const core::Rounding<T> rnd{p.q.dtype, plain};
  const int64_t D = p.D, Dv = p.Dv, R = p.mech.rounds, C = p.mech.chunk;
  const T scale = static_cast<T>(p.scale), inf = std::numeric_limits<T>::infinity();
  std::vector<T> dk(static_cast<size_t>(p.M * D)), dv(static_cast<size_t>(p.M * Dv)), dq(static_cast<size_t>(D));
  std::vector<T> q(static_cast<size_t>(D)), dout(static_cast<size_t>(Dv));
  // per round of one query: its keys, scores, weights, output and lse
  std::vector<std::vector<int64_t>> keys(static_cast<size_t>(R + 1));
  std::vector<std::vector<T>> P(static_cast<size_t>(R + 1)), O(static_cast<size_t>(R + 1), std::vector<T>(static_cast<size_t>(Dv)));
  std::vector<T> lse_r(static_cast<size_t>(R + 1));
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t hk = 0; hk < p.Hkv; ++hk) {
      const int64_t len = p.kv_len[static_cast<size_t>(b)];
      std::fill(dk.begin(), dk.end(), T(0));
      std::fill(dv.begin(), dv.end(), T(0));
      bool poisoned = false;
      for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
        const std::vector<LshRound> rounds = lsh_rounds(p, b, h);
        const bool bad = head_not_finite(p, b, h);
        poisoned = poisoned || bad;
        for (int64_t i = 0; i < p.N; ++i) {
          std::fill(dq.begin(), dq.end(), T(0));
          for (int64_t c = 0; c < D; ++c) q[static_cast<size_t>(c)] = static_cast<T>(p.q.at(b, h, i, c));
          for (int64_t c = 0; c < Dv; ++c) dout[static_cast<size_t>(c)] = static_cast<T>(g.dout.at(b, h, i, c));
          // the rounds' key sets: round r counts what it sees and no earlier round counted
          int64_t used = 0;
          for (int64_t r = 0; r < R; ++r) {
            std::vector<int64_t>& set = keys[static_cast<size_t>(r)];
            set.clear();
            for (int64_t j = 0; j < len; ++j) {
              if (!lsh_allowed(p, i, j) || !rounds[static_cast<size_t>(r)].sees(i, j, C)) continue;
              bool earlier = false;
              for (int64_t e = 0; e < r; ++e) earlier = earlier || rounds[static_cast<size_t>(e)].sees(i, j, C);
              if (!earlier) set.push_back(j);
            }
            used += static_cast<int64_t>(!set.empty());
          }
          keys[static_cast<size_t>(R)].clear();
          if (used == 0 && p.mech.shared_qk && i < len) keys[static_cast<size_t>(R)].push_back(i);  // itself alone
          // each round's softmax: lse_r, P_r, O_r
          T lse = -inf;
          for (int64_t r = 0; r <= R; ++r) {
            const std::vector<int64_t>& set = keys[static_cast<size_t>(r)];
            std::vector<T>& w = P[static_cast<size_t>(r)];
            std::vector<T>& o = O[static_cast<size_t>(r)];
            w.assign(set.size(), T(0));
            std::fill(o.begin(), o.end(), T(0));
            lse_r[static_cast<size_t>(r)] = -inf;
            if (set.empty()) continue;
            T mx = -inf;
            for (size_t t = 0; t < set.size(); ++t) {
              T dot = 0;
              for (int64_t c = 0; c < D; ++c) dot += q[static_cast<size_t>(c)] * static_cast<T>(p.k.at(b, hk, set[t], c));
              w[t] = rnd(dot * scale);
              mx = std::max(mx, w[t]);
            }
            T sum = 0;
            for (T s : w) sum += std::exp(s - mx);
            const T l = mx + std::log(sum);
            for (size_t t = 0; t < set.size(); ++t) {
              w[t] = rnd(std::exp(w[t] - l));
              for (int64_t c = 0; c < Dv; ++c) o[static_cast<size_t>(c)] += w[t] * static_cast<T>(p.v.at(b, hk, set[t], c));
            }
            for (T& x : o) x = rnd(x);
            lse_r[static_cast<size_t>(r)] = l;
            lse = lse == -inf ? l : std::max(lse, l) + std::log1p(std::exp(-std::abs(lse - l)));
          }
          // the merge: O = sum_r w_r O_r
          std::vector<T> merged(static_cast<size_t>(Dv), T(0));
          for (int64_t r = 0; r <= R; ++r) {
            if (keys[static_cast<size_t>(r)].empty()) continue;
            const T wr = std::exp(lse_r[static_cast<size_t>(r)] - lse);
            for (int64_t c = 0; c < Dv; ++c) merged[static_cast<size_t>(c)] += wr * O[static_cast<size_t>(r)][static_cast<size_t>(c)];
          }
          const T dlse = g.dlse.empty() ? T(0) : static_cast<T>(g.dlse.at(b, h, i, 0));
          // backward through the merge, then through each round's softmax
          for (int64_t r = 0; r <= R; ++r) {
            const std::vector<int64_t>& set = keys[static_cast<size_t>(r)];
            if (set.empty()) continue;
            const std::vector<T>& o = O[static_cast<size_t>(r)];
            const T wr = std::exp(lse_r[static_cast<size_t>(r)] - lse);
            T dout_or = 0, dout_delta = 0;  // dO . O_r, dO . (O_r - O)
            for (int64_t c = 0; c < Dv; ++c) {
              dout_or += dout[static_cast<size_t>(c)] * o[static_cast<size_t>(c)];
              dout_delta += dout[static_cast<size_t>(c)] * (o[static_cast<size_t>(c)] - merged[static_cast<size_t>(c)]);
            }
            const T dlse_r = rnd(wr * (dout_delta + dlse));
            for (size_t t = 0; t < set.size(); ++t) {
              const int64_t j = set[t];
              const T pr = P[static_cast<size_t>(r)][t];
              T dp = 0;  // dO_r . v_j
              for (int64_t c = 0; c < Dv; ++c) dp += wr * dout[static_cast<size_t>(c)] * static_cast<T>(p.v.at(b, hk, j, c));
              const T dS = rnd(pr * (rnd(dp) - wr * dout_or + dlse_r));
              for (int64_t c = 0; c < Dv; ++c) dv[static_cast<size_t>(j * Dv + c)] += pr * wr * dout[static_cast<size_t>(c)];
              for (int64_t c = 0; c < D; ++c) {
                dq[static_cast<size_t>(c)] += dS * scale * static_cast<T>(p.k.at(b, hk, j, c));
                dk[static_cast<size_t>(j * D + c)] += dS * scale * q[static_cast<size_t>(c)];
              }
            }
          }
          for (int64_t c = 0; c < D; ++c)
            store_from_float(g.dq.data, g.dq.dtype, g.dq.offset(b, h, i, c),
                             static_cast<float>(bad ? kNaN : static_cast<double>(rnd(dq[static_cast<size_t>(c)]))));
        }
      }
      for (int64_t j = 0; j < p.M; ++j) {  // keys past the length: zero; a poisoned group: NaN
        const double fill = j < len ? (poisoned ? kNaN : 1.0) : 0.0;
        for (int64_t c = 0; c < D; ++c)
          store_from_float(g.dk.data, g.dk.dtype, g.dk.offset(b, hk, j, c),
                           static_cast<float>(fill == 1.0 ? static_cast<double>(rnd(dk[static_cast<size_t>(j * D + c)])) : fill));
        for (int64_t c = 0; c < Dv; ++c)
          store_from_float(g.dv.data, g.dv.dtype, g.dv.offset(b, hk, j, c),
                           static_cast<float>(fill == 1.0 ? static_cast<double>(rnd(dv[static_cast<size_t>(j * Dv + c)])) : fill));
      }
    }
}

// ---- chunked: float32, one task per (batch entry, kv head) -------------------------------------

// Chunk indices no key has: "0 or 1 chunks behind" never holds for them.
constexpr int32_t kNoKey = std::numeric_limits<int32_t>::max() / 2;

constexpr int64_t L = kernels::kQueryTile;
// Chunk indices no lane has (padding lanes): far from every key's.
constexpr int32_t kNoChunk = std::numeric_limits<int32_t>::min() / 2;

// One thread's buffers, sized before the parallel region (which allocates nothing).
struct Scratch {
  LshWork hashing;
  std::vector<float> q, dout, dq, delta, lse;   // (N, D), (N, Dv), (N, D), N, N: by query position
  std::vector<float> k, v;                      // (M, D), (M, Dv): this round's valid keys, sorted
  std::vector<float> dk, dv;                    // (M, D), (M, Dv): by key position
  std::vector<float> dks, dvs;                  // (M, D), (M, Dv): this round's, in sorted order
  std::vector<uint8_t> reached;                 // N: a round counted a key for the query
  std::vector<std::vector<int32_t>> query_chunk, key_chunk;  // [round][position]
  // one tile of L sorted queries: rows (L, D), (L, Dv), (L, D); lane-major Qt (scaled), dOt;
  // score and dS tiles (L keys x L lanes); per lane its lse (+inf: no pair), D_i, scale, 1
  std::vector<float> qrows, drows, dqrows;
  AlignedFloats qt, dot, st, ds, sub{L}, delta_l{L}, scale{L}, one{L};
  std::vector<std::vector<int32_t>> lane_chunk;  // [round][lane]
  int32_t lane_pos[L];
  uint8_t keep[L], lane_reached[L];

  explicit Scratch(const LshProblem& p) {
    const size_t N = static_cast<size_t>(p.N), M = static_cast<size_t>(p.M), D = static_cast<size_t>(p.D),
                 Dv = static_cast<size_t>(p.Dv);
    hashing.reserve(p);
    q.resize(N * D), dout.resize(N * Dv), dq.resize(N * D), delta.resize(N), lse.resize(N);
    k.resize(M * D), v.resize(M * Dv), dk.resize(M * D), dv.resize(M * Dv), reached.resize(N);
    dks.resize(M * D), dvs.resize(M * Dv);
    query_chunk.assign(static_cast<size_t>(p.mech.rounds), std::vector<int32_t>(N));
    key_chunk.assign(static_cast<size_t>(p.mech.rounds), std::vector<int32_t>(M));
    qrows.resize(L * D), drows.resize(L * Dv), dqrows.resize(L * D);
    qt.resize(D * L), dot.resize(Dv * L), st.resize(L * L), ds.resize(L * L);
    lane_chunk.assign(static_cast<size_t>(p.mech.rounds), std::vector<int32_t>(L));
    std::fill(scale.data(), scale.data() + L, static_cast<float>(p.scale));
    std::fill(one.data(), one.data() + L, 1.0f);
  }
};

float dotf(const float* a, const float* b, int64_t n) {
  float acc = 0;
  for (int64_t c = 0; c < n; ++c) acc += a[c] * b[c];
  return acc;
}

class TaskRun {
 public:
  TaskRun(const LshProblem& p, const core::BackwardViews& g, const kernels::TileKernels& kern, Scratch& s, int64_t b,
          int64_t hk)
      : p_(p), g_(g), kern_(kern), s_(s), b_(b), hk_(hk), len_(p.kv_len[static_cast<size_t>(b)]) {}

  void run() {
    std::fill(s_.dk.begin(), s_.dk.end(), 0.0f);
    std::fill(s_.dv.begin(), s_.dv.end(), 0.0f);
    bool poisoned = false;
    for (int64_t h = hk_ * p_.group; h < (hk_ + 1) * p_.group; ++h) {
      const bool bad = head_not_finite(p_, b_, h);
      poisoned = poisoned || bad;
      if (!bad) head(h);
      for (int64_t i = 0; i < p_.N; ++i) {
        float* row = s_.dq.data() + i * p_.D;
        if (bad) std::fill(row, row + p_.D, std::numeric_limits<float>::quiet_NaN());
        kern_.from_float(row, g_.dq.dtype, g_.dq.strides[3], p_.D, g_.dq.ptr(b_, h, i));
      }
    }
    for (int64_t j = 0; j < p_.M; ++j) {  // keys past the length: zero; a poisoned group: NaN
      float* dk = s_.dk.data() + j * p_.D;
      float* dv = s_.dv.data() + j * p_.Dv;
      const float fill = poisoned ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
      if (j >= len_ || poisoned) {
        std::fill(dk, dk + p_.D, j < len_ ? fill : 0.0f);
        std::fill(dv, dv + p_.Dv, j < len_ ? fill : 0.0f);
      }
      kern_.from_float(dk, g_.dk.dtype, g_.dk.strides[3], p_.D, g_.dk.ptr(b_, hk_, j));
      kern_.from_float(dv, g_.dv.dtype, g_.dv.strides[3], p_.Dv, g_.dv.ptr(b_, hk_, j));
    }
  }

 private:
  // Query head h: its rounds, then every counted pair of every round (and the lone self pairs).
  void head(int64_t h) {
    lsh_rounds_into(p_, b_, h, s_.hashing);
    const std::vector<LshRound>& rounds = s_.hashing.rounds;
    const int64_t R = p_.mech.rounds, C = p_.mech.chunk, D = p_.D, Dv = p_.Dv;
    for (int64_t e = 0; e < R; ++e) {  // each round's chunk of every query and key
      const LshRound& round = rounds[static_cast<size_t>(e)];
      for (int64_t i = 0; i < p_.N; ++i)
        s_.query_chunk[static_cast<size_t>(e)][static_cast<size_t>(i)] = static_cast<int32_t>(round.q_rank[static_cast<size_t>(i)] / C);
      for (int64_t j = 0; j < p_.M; ++j) {
        const int32_t rank = round.k_rank[static_cast<size_t>(j)];
        s_.key_chunk[static_cast<size_t>(e)][static_cast<size_t>(j)] = rank < 0 ? kNoKey : static_cast<int32_t>(rank / C);
      }
    }
    for (int64_t i = 0; i < p_.N; ++i) {  // rows as float32; D_i = dO_i . O_i - dlse_i
      kern_.to_float(p_.q.ptr(b_, h, i), p_.q.dtype, p_.q.strides[3], D, s_.q.data() + i * D);
      float* dout = s_.dout.data() + i * Dv;
      kern_.to_float(g_.dout.ptr(b_, h, i), g_.dout.dtype, g_.dout.strides[3], Dv, dout);
      float delta = 0;
      for (int64_t c = 0; c < Dv; ++c) delta += dout[c] * g_.out.at(b_, h, i, c);
      if (!g_.dlse.empty()) delta -= g_.dlse.at(b_, h, i, 0);
      s_.delta[static_cast<size_t>(i)] = delta;
      s_.lse[static_cast<size_t>(i)] = g_.lse.at(b_, h, i, 0);
    }
    std::fill(s_.dq.begin(), s_.dq.end(), 0.0f);
    std::fill(s_.reached.begin(), s_.reached.end(), uint8_t{0});
    for (int64_t r = 0; r < R; ++r) {
      const LshRound& round = rounds[static_cast<size_t>(r)];
      for (int64_t t = 0; t < len_; ++t) {  // this round's valid keys in sorted order
        const int64_t j = round.k_order[static_cast<size_t>(t)];
        kern_.to_float(p_.k.ptr(b_, hk_, j), p_.k.dtype, p_.k.strides[3], D, s_.k.data() + t * D);
        kern_.to_float(p_.v.ptr(b_, hk_, j), p_.v.dtype, p_.v.strides[3], Dv, s_.v.data() + t * Dv);
      }
      std::fill(s_.dks.begin(), s_.dks.begin() + len_ * D, 0.0f);
      std::fill(s_.dvs.begin(), s_.dvs.begin() + len_ * Dv, 0.0f);
      for (int64_t t0 = 0; t0 < p_.N; t0 += L) tile(r, round, t0, std::min(L, p_.N - t0));
      for (int64_t t = 0; t < len_; ++t) {  // this round's sums, to the keys' positions
        const int64_t j = round.k_order[static_cast<size_t>(t)];
        for (int64_t c = 0; c < D; ++c) s_.dk[static_cast<size_t>(j * D + c)] += s_.dks[static_cast<size_t>(t * D + c)];
        for (int64_t c = 0; c < Dv; ++c) s_.dv[static_cast<size_t>(j * Dv + c)] += s_.dvs[static_cast<size_t>(t * Dv + c)];
      }
    }
    if (p_.mech.shared_qk)  // a query no round reached attends to itself alone
      for (int64_t i = 0; i < std::min(p_.N, len_); ++i) {
        if (s_.reached[static_cast<size_t>(i)]) continue;
        float* k = s_.k.data();  // scratch rows: the pair's key and value
        float* v = s_.v.data();
        kern_.to_float(p_.k.ptr(b_, hk_, i), p_.k.dtype, p_.k.strides[3], D, k);
        kern_.to_float(p_.v.ptr(b_, hk_, i), p_.v.dtype, p_.v.strides[3], Dv, v);
        pair(i, i, k, v);
      }
  }

  // Sorted queries [t0, t0 + n) of round r against the key chunks their chunks see, 64 keys at a
  // time: S = scale Q K^T, P = exp(S - lse) on the counted pairs, dP = dO V^T, dS = scale P (dP - D);
  // dV += P^T dO, dK += dS^T Q (this round's sorted rows), dQ += dS K (the tile's rows).
  void tile(int64_t r, const LshRound& round, int64_t t0, int64_t n) {
    const int64_t D = p_.D, Dv = p_.Dv, C = p_.mech.chunk;
    const float inf = std::numeric_limits<float>::infinity();
    float *qrows = s_.qrows.data(), *drows = s_.drows.data(), *dqrows = s_.dqrows.data();
    for (int64_t i = 0; i < L; ++i) {
      const bool live = i < n;
      const int64_t pos = live ? round.q_order[static_cast<size_t>(t0 + i)] : 0;
      s_.lane_pos[i] = static_cast<int32_t>(pos);
      s_.lane_reached[i] = 0;
      const float lse = live ? s_.lse[static_cast<size_t>(pos)] : -inf;
      s_.sub.data()[i] = lse == -inf ? inf : lse;  // no pair: every weight 0
      s_.delta_l.data()[i] = live ? s_.delta[static_cast<size_t>(pos)] : 0.0f;
      s_.lane_chunk[0][static_cast<size_t>(i)] = live ? static_cast<int32_t>((t0 + i) / C) : kNoChunk;
      for (int64_t e = 0; e < r; ++e)
        s_.lane_chunk[static_cast<size_t>(e + 1)][static_cast<size_t>(i)] =
            live ? s_.query_chunk[static_cast<size_t>(e)][static_cast<size_t>(pos)] : kNoChunk;
      if (live) {
        std::copy(s_.q.data() + pos * D, s_.q.data() + (pos + 1) * D, qrows + i * D);
        std::copy(s_.dout.data() + pos * Dv, s_.dout.data() + (pos + 1) * Dv, drows + i * Dv);
      } else {
        std::fill(qrows + i * D, qrows + (i + 1) * D, 0.0f);
        std::fill(drows + i * Dv, drows + (i + 1) * Dv, 0.0f);
      }
    }
    std::fill(dqrows, dqrows + n * D, 0.0f);
    kern_.pack_qt(qrows, D, static_cast<int>(n), D, s_.scale.data(), s_.qt.data());
    kern_.pack_qt(drows, Dv, static_cast<int>(n), Dv, s_.one.data(), s_.dot.data());
    const int64_t c0 = t0 / C, c1 = (t0 + n - 1) / C;
    const int64_t k0 = std::max<int64_t>(0, (c0 - 1) * C), k1 = std::min(len_, (c1 + 1) * C);
    float *st = s_.st.data(), *ds = s_.ds.data();
    const float scale = static_cast<float>(p_.scale);
    for (int64_t j0 = k0; j0 < k1; j0 += L) {
      const int64_t bc = std::min(L, k1 - j0);
      kern_.qk(s_.qt.data(), D, s_.k.data() + j0 * D, D, bc, st, 0, static_cast<int>(L));
      for (int64_t jj = 0; jj < bc; ++jj) hide_uncounted(r, round, j0 + jj, st + jj * L);
      kern_.exp_rows(st, bc * L, s_.sub.data());  // P
      kern_.qk(s_.dot.data(), Dv, s_.v.data() + j0 * Dv, Dv, bc, ds, 0, static_cast<int>(L));  // dP
      for (int64_t jj = 0; jj < bc; ++jj) {
        const float* P = st + jj * L;
        float* dS = ds + jj * L;
        for (int64_t i = 0; i < L; ++i) dS[i] = P[i] * (dS[i] - s_.delta_l.data()[i]) * scale;
      }
      kern_.gemm(bc, Dv, L, st, L, 1, drows, Dv, s_.dvs.data() + j0 * Dv, Dv, true);
      kern_.gemm(bc, D, L, ds, L, 1, qrows, D, s_.dks.data() + j0 * D, D, true);
      kern_.gemm(n, D, bc, ds, 1, L, s_.k.data() + j0 * D, D, dqrows, D, true);
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = s_.lane_pos[i];
      float* dq = s_.dq.data() + pos * D;
      for (int64_t c = 0; c < D; ++c) dq[c] += dqrows[i * D + c];
      s_.reached[static_cast<size_t>(pos)] |= s_.lane_reached[i];
    }
  }

  // Hides, in the score row of sorted key ks, the lanes that do not count the pair in round r (the
  // forward's rule): the key's chunk is not the lane's or the one before, the pattern forbids it
  // (causal, self under shared_qk), or an earlier round had it.
  void hide_uncounted(int64_t r, const LshRound& round, int64_t ks, float* srow) {
    const int32_t j = round.k_order[static_cast<size_t>(ks)];
    const auto near = [](int32_t lane_chunk, int32_t key_chunk) {
      return static_cast<uint32_t>(lane_chunk - key_chunk) <= 1u;  // 0 or 1 chunks behind
    };
    const int32_t kc = static_cast<int32_t>(ks / p_.mech.chunk);
    const auto last = static_cast<int32_t>(j - (p_.M - p_.N));  // causal: lanes at positions >= this
    uint8_t* keep = s_.keep;
    for (int64_t i = 0; i < L; ++i)
      keep[i] = near(s_.lane_chunk[0][static_cast<size_t>(i)], kc) && (!p_.mech.causal || s_.lane_pos[i] >= last) &&
                (!p_.mech.shared_qk || s_.lane_pos[i] != j);
    for (int64_t e = 0; e < r; ++e) {
      const int32_t ke = s_.key_chunk[static_cast<size_t>(e)][static_cast<size_t>(j)];
      for (int64_t i = 0; i < L; ++i) keep[i] &= !near(s_.lane_chunk[static_cast<size_t>(e + 1)][static_cast<size_t>(i)], ke);
    }
    for (int64_t i = 0; i < L; ++i) {
      srow[i] = keep[i] ? srow[i] : -std::numeric_limits<float>::infinity();
      s_.lane_reached[i] |= keep[i];
    }
  }

  // One counted pair (query position i, key position j with rows k, v).
  void pair(int64_t i, int64_t j, const float* k, const float* v) {
    const int64_t D = p_.D, Dv = p_.Dv;
    const float scale = static_cast<float>(p_.scale);
    const float* q = s_.q.data() + i * D;
    const float* dout = s_.dout.data() + i * Dv;
    const float P = std::exp(dotf(q, k, D) * scale - s_.lse[static_cast<size_t>(i)]);
    const float dS = P * (dotf(dout, v, Dv) - s_.delta[static_cast<size_t>(i)]) * scale;
    float* dq = s_.dq.data() + i * D;
    float* dk = s_.dk.data() + j * D;
    float* dv = s_.dv.data() + j * Dv;
    for (int64_t c = 0; c < D; ++c) {
      dq[c] += dS * k[c];
      dk[c] += dS * q[c];
    }
    for (int64_t c = 0; c < Dv; ++c) dv[c] += P * dout[c];
    s_.reached[static_cast<size_t>(i)] = 1;
  }

  const LshProblem& p_;
  const core::BackwardViews& g_;
  const kernels::TileKernels& kern_;
  Scratch& s_;
  int64_t b_, hk_, len_;
};

void run_chunked(const LshProblem& p, const core::BackwardViews& g, const core::Context& ctx) {
  const int64_t items = p.B * p.Hkv;
  const int threads = resolve_threads(ctx.threads, items);
  std::vector<Scratch> scratch = per_thread<Scratch>(threads, p);
  parallel_for(items, threads, [&](int64_t item, int t) {
    TaskRun(p, g, *ctx.kern, scratch[static_cast<size_t>(t)], item / p.Hkv, item % p.Hkv).run();
  });
}

}  // namespace

std::string LshFamily::backward_refusal(const LshProblem&) { return ""; }

void LshFamily::backward_reference(const LshProblem& p, const core::BackwardViews& g, core::RefPrecision precision) {
  if (precision == core::RefPrecision::f64)
    reference_impl<double>(p, g, false);
  else
    reference_impl<float>(p, g, true);
}

const std::vector<core::BackwardForm<LshProblem>>& LshFamily::backward_forms() {
  static const std::vector<core::BackwardForm<LshProblem>> list = {
      {"chunked", "float32: per round the sorted chunks again, P from the forward's lse (buckets are constants)",
       core::refuse_nothing<LshProblem>, run_chunked},
      {"reference", "float64: each round's softmax and the rounds' merge, differentiated by hand (slow, exact)",
       core::refuse_nothing<LshProblem>,
       [](const LshProblem& p, const core::BackwardViews& g, const core::Context&) {
         reference_impl<double>(p, g, false);
       }},
  };
  return list;
}

}  // namespace attn::lsh
