// Ring attention (see attn/distributed.hpp): K/V shards travel around the ring while each rank
// attends its queries to the shard it holds; partials merge by core::merge_partials.
#include <chrono>
#include <functional>
#include <memory>
#include <cmath>
#include <limits>
#include <type_traits>
#include <variant>

#include "attn/backward.hpp"
#include "attn/distributed.hpp"
#include "attn/error.hpp"
#include "core/partial_merge.hpp"
#include "distributed/comm.hpp"
#include "mask/pattern.hpp"
#include "mask/patterns.hpp"

namespace attn::distributed {

using detail::Comm;

namespace {

constexpr const char* kWhere = "distributed::ring_attention";
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The mechanism's scores without its pattern (positions are handled here), and its pattern for
// a sequence of a given length (mask::pattern_of: the definition attend() uses).
struct Split {
  Softmax scores;
  bool causal = false;
  std::optional<Softmax> native;  // the mechanism itself, runnable as-is on a diagonal pair
  std::function<mask::Pattern(int64_t)> pattern_for;
};

Split split(const Mechanism& m) {
  Split s;
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Softmax>) {
          if (x.dropout != 0) fail(kWhere, "dropout is not supported across ranks, got dropout=" + std::to_string(x.dropout));
          if (x.entropy_train_len != 0)
            fail(kWhere, "entropy_scale needs each query's whole key count; not supported across ranks");
          if (x.score == ScoreKind::additive) fail(kWhere, "score=additive (its params) is not supported across ranks");
          s.scores.score = x.score, s.scores.scale = x.scale, s.scores.softcap = x.softcap;
          s.causal = x.causal;
          s.native = x;
        } else if constexpr (std::is_same_v<T, Longformer> || std::is_same_v<T, BigBird>) {
          s.scores.scale = x.scale;
          s.causal = x.causal;
        } else {
          fail(kWhere, "mechanism must be softmax, longformer or bigbird, got " + to_string(Mechanism{m}));
        }
        if constexpr (std::is_same_v<T, Softmax> || std::is_same_v<T, Longformer> || std::is_same_v<T, BigBird>)
          s.pattern_for = [x](int64_t len) { return mask::pattern_of(x, len, len); };
      },
      m);
  return s;
}

// The packed token stream: sequence t is global tokens [start[t], start[t + 1]) (one sequence
// without cu_seqlens), each with its pattern; seq_of[p] the sequence of token p.
struct Sequences {
  std::vector<int64_t> start;
  std::vector<mask::Pattern> pattern;
  std::vector<int32_t> seq_of;

  Sequences(const Split& s, const std::vector<int64_t>& cu, int64_t n) {
    start = cu.empty() ? std::vector<int64_t>{0, n} : cu;
    const size_t count = start.size() - 1;
    seq_of.resize(static_cast<size_t>(n));
    for (size_t t = 0; t < count; ++t) {
      pattern.push_back(s.pattern_for(start[t + 1] - start[t]));
      for (int64_t p = start[t]; p < start[t + 1]; ++p) seq_of[static_cast<size_t>(p)] = static_cast<int32_t>(t);
    }
  }
  bool visible(int64_t p, int64_t g) const {
    const int32_t t = seq_of[static_cast<size_t>(p)];
    return t == seq_of[static_cast<size_t>(g)] && pattern[static_cast<size_t>(t)].visible(p - start[t], g - start[t]);
  }
  // How much of queries [q0, q0 + nq) x keys [k0, k0 + nk) is visible; `only` is set to the one
  // sequence holding both ranges entirely, else -1.
  mask::Coverage classify(int64_t q0, int64_t nq, int64_t k0, int64_t nk, int64_t& only) const {
    only = -1;
    const int32_t first = seq_of[static_cast<size_t>(std::max(q0, k0))];
    bool any = false, all_full = true;
    for (size_t t = static_cast<size_t>(first); t + 1 < start.size(); ++t) {
      const int64_t s0 = start[t], s1 = start[t + 1];
      if (s0 >= q0 + nq || s0 >= k0 + nk) break;  // later sequences miss one of the ranges
      const int64_t qa = std::max(q0, s0), qb = std::min(q0 + nq, s1), ka = std::max(k0, s0), kb = std::min(k0 + nk, s1);
      if (qa >= qb || ka >= kb) continue;
      const mask::Coverage c = pattern[t].classify(qa - s0, qb - 1 - s0, ka - s0, kb - 1 - s0);
      if (c != mask::Coverage::hidden) any = true;
      if (c != mask::Coverage::full) all_full = false;
      if (qa == q0 && qb == q0 + nq && ka == k0 && kb == k0 + nk) only = static_cast<int64_t>(t);
    }
    if (!any) return mask::Coverage::hidden;
    return only >= 0 && all_full ? mask::Coverage::full : mask::Coverage::partial;
  }
};

// acc (out, lse) <- merge(acc, part) for rows [0, rows) of a (rows, dv) block; acc rows at
// acc_out + i * dv, acc_lse[i].
void merge_rows(int64_t rows, int64_t dv, float* acc_out, float* acc_lse, const float* part_out,
                const float* part_lse, std::vector<float>& tmp) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  auto weight = [](float lse) { return std::isnan(lse) ? lse : lse == kNegInf ? 0.0f : 1.0f; };
  tmp.resize(static_cast<size_t>(2 * dv));
  for (int64_t i = 0; i < rows; ++i) {
    const float m[2] = {acc_lse[i], part_lse[i]};
    const float l[2] = {weight(acc_lse[i]), weight(part_lse[i])};
    std::copy(acc_out + i * dv, acc_out + (i + 1) * dv, tmp.data());
    std::copy(part_out + i * dv, part_out + (i + 1) * dv, tmp.data() + dv);
    acc_lse[i] = core::merge_partials(2, m, l, 1, tmp.data(), dv, dv, acc_out + i * dv);
  }
}

// What every ring call agrees on first: sizes, mechanism, sharding, the sequences.
struct Plan {
  Comm c;
  std::vector<int64_t> all;  // kFields per rank
  static constexpr size_t kFields = 10;
  int64_t n = 0, B = 0, H = 0, Hkv = 0, D = 0, Dv = 0, nl = 0, es = 0, most = 0;
  Split s;
  bool zig = false;
  std::vector<Piece> mine;
  std::unique_ptr<Sequences> seqs;

  int64_t tokens_of(int r) const { return all[static_cast<size_t>(r) * kFields + 3]; }
  int64_t bytes_of(int64_t tokens) const { return B * Hkv * tokens * (D + Dv) * es; }

  // extra: checks of the caller's other local arguments (backward: dout, out, lse).
  Plan(const TensorView& q, const TensorView& k, const TensorView& v, MPI_Comm comm, const Mechanism& mechanism,
       const RingOptions& options, const char* where, const std::function<void()>& extra = {})
      : c(comm) {
    // 1. Local checks, agreed (a rank's own error reaches every rank).
    const std::string local = detail::error_of([&] {
      for (const auto* x : {&q, &k, &v})
        if (x->data == nullptr && x->numel() != 0) fail(where, "a view has no data");
      if (q.dim() != k.dim()) fail(where, "k must have q's head dim " + std::to_string(q.dim()) + ", got " + detail::dims(k));
      if (q.batch() != k.batch() || q.batch() != v.batch() || k.heads() != v.heads())
        fail(where, "q " + detail::dims(q) + ", k " + detail::dims(k) + ", v " + detail::dims(v) +
                        " disagree on batch or k/v heads");
      if (k.heads() == 0 || q.heads() % k.heads() != 0)
        fail(where, "k has " + std::to_string(k.heads()) + " heads, which does not divide q's " + std::to_string(q.heads()));
      if (q.tokens() != k.tokens() || k.tokens() != v.tokens())
        fail(where, "q, k and v shards must hold the same tokens, got " + std::to_string(q.tokens()) + ", " +
                        std::to_string(k.tokens()) + " and " + std::to_string(v.tokens()));
      if (q.tokens() > 0) (void)explain(q, k, v, Softmax{}, {});  // dtype, strides, finite sizes
      if (extra) extra();
    });
    detail::agree(c, where, local);
    // 2. Every rank's sizes, and fingerprints of the mechanism, sharding and cu_seqlens.
    all = detail::allgather(c, {q.batch(), q.heads(), k.heads(), q.tokens(), q.dim(), v.dim(),
                                static_cast<int64_t>(q.dtype), static_cast<int64_t>(options.cu_seqlens.size()),
                                detail::fingerprint(options.cu_seqlens),
                                detail::fingerprint(to_string(mechanism) + (options.zigzag_auto ? "" : " contiguous"))});
    auto at = [&](int r, size_t f) { return all[static_cast<size_t>(r) * kFields + f]; };
    for (int r = 0; r < c.size; ++r) n += at(r, 3), most = std::max(most, at(r, 3));
    const std::string shape_error = detail::error_of([&] {
      const char* names[] = {"batch", "q heads", "k/v heads", "", "head dim", "v head dim", "dtype"};
      auto value = [&](int r, size_t f) {
        return f == 6 ? dtype_name(static_cast<DType>(at(r, f))) : std::to_string(at(r, f));
      };
      for (int r = 1; r < c.size; ++r)
        for (size_t f : {0, 1, 2, 4, 5, 6})
          if (at(r, f) != at(0, f))
            fail(where, std::string(names[f]) + " must agree on every rank: rank 0 has " + value(0, f) + ", rank " +
                            std::to_string(r) + " has " + value(r, f));
      for (int r = 1; r < c.size; ++r)
        if (at(r, 9) != at(0, 9))
          fail(where, "the mechanism (and zigzag_auto) must be the same on every rank: rank " + std::to_string(r) +
                          "'s differs from rank 0's");
      for (int r = 1; r < c.size; ++r)
        if (at(r, 7) != at(0, 7) || at(r, 8) != at(0, 8))
          fail(where, "cu_seqlens must be the same on every rank: rank " + std::to_string(r) + "'s (" +
                          std::to_string(at(r, 7)) + " offsets) differs from rank 0's (" + std::to_string(at(0, 7)) + ")");
      s = split(mechanism);
      if (!options.cu_seqlens.empty()) {
        const auto& cu = options.cu_seqlens;
        if (at(0, 0) != 1) fail(where, "cu_seqlens (packed sequences) needs batch 1, got " + std::to_string(at(0, 0)));
        if (cu.size() < 2 || cu.front() != 0 || cu.back() != n)
          fail(where, "cu_seqlens must run from 0 to the total tokens " + std::to_string(n) + " over the ranks, got " +
                          std::to_string(cu.size()) + " offsets ending at " + std::to_string(cu.empty() ? 0 : cu.back()));
        for (size_t t = 1; t < cu.size(); ++t)
          if (cu[t] < cu[t - 1])
            fail(where, "cu_seqlens must be non-decreasing, got " + std::to_string(cu[t - 1]) + " then " +
                            std::to_string(cu[t]));
      }
      const bool z = options.zigzag_auto && s.causal;
      for (int r = 0; r < c.size; ++r)
        if (at(r, 3) != shard_length(n, c.size, r, z))
          fail(where, "rank " + std::to_string(r) + " holds " + std::to_string(at(r, 3)) + " tokens; a " +
                          (z ? "zig-zag" : "contiguous") + " shard of " + std::to_string(n) + " tokens over " +
                          std::to_string(c.size) + " ranks has " + std::to_string(shard_length(n, c.size, r, z)));
      // the backward's float32 dK/dV accumulators are the largest message
      (void)detail::mpi_count(at(0, 0) * at(0, 2) * (at(0, 4) + at(0, 5)) * most * 4, where);
    });
    detail::agree(c, where, shape_error, /*global=*/true);  // the same verdict everywhere (same data)
    zig = options.zigzag_auto && s.causal;
    B = q.batch(), H = q.heads(), Hkv = k.heads(), D = q.dim(), Dv = v.dim(), nl = q.tokens();
    es = static_cast<int64_t>(dtype_size(q.dtype));  // K/V travel in the inputs' dtype
    mine = shard_pieces(n, c.size, c.rank, zig);
    seqs = std::make_unique<Sequences>(s, options.cu_seqlens, n);
  }

  // The call for queries qp against keys kp: false when the pattern hides the pair entirely;
  // else sets run (the mechanism's scores, or the mechanism itself on an aligned diagonal pair)
  // and, for a partly visible pair, o.mask_mod in global positions.
  bool pair(const Piece& qp, const Piece& kp, Mechanism& run, AttendOptions& o) const {
    int64_t only = -1;
    const mask::Coverage cov = seqs->classify(qp.start, qp.length, kp.start, kp.length, only);
    if (cov == mask::Coverage::hidden) return false;
    run = s.scores;
    if (cov == mask::Coverage::partial) {
      // A diagonal pair inside one sequence: positions relative to the pair differ as the global
      // ones do, so the mechanism runs as it is (sinks and chunks need the pair to start where
      // they count from).
      const int64_t from = only >= 0 ? kp.start - seqs->start[static_cast<size_t>(only)] : -1;
      const bool aligned = only >= 0 && qp.start == kp.start && qp.length == kp.length && s.native &&
                           (s.native->sinks == 0 || from == 0) && (s.native->chunk == 0 || from % s.native->chunk == 0);
      if (aligned) {
        run = *s.native;
      } else {
        const Sequences* all_seqs = seqs.get();
        const int64_t q0 = qp.start, k0 = kp.start;
        o.mask_mod = [all_seqs, q0, k0](int64_t, int64_t, int64_t i, int64_t j) {
          return all_seqs->visible(q0 + i, k0 + j);
        };
      }
    }
    return true;
  }

  // The transfers of the current step, tested between pairs (progress()): Open MPI moves a
  // large message only inside MPI calls, so without them it would all happen in MPI_Waitall.
  mutable MPI_Request pending[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  void progress() const {
    int done = 0;
    MPI_Testall(2, pending, &done, MPI_STATUSES_IGNORE);
  }

  // Calls fn(qp, kp, run, o) for every pair of this rank's query pieces and rank src's key pieces
  // the pattern does not hide (o: the pair's options, `threads` set), counting the pairs in st.
  template <class Fn>
  void for_each_pair(int src, int threads, RingStats& st, Fn&& fn) const {
    for (const Piece& qp : mine) {
      if (qp.length == 0) continue;
      for (const Piece& kp : shard_pieces(n, c.size, src, zig)) {
        if (kp.length == 0) continue;
        AttendOptions o;
        o.threads = threads;
        Mechanism run;
        if (!pair(qp, kp, run, o)) {
          ++st.blocks_skipped;
          continue;
        }
        ++st.blocks_computed;
        fn(qp, kp, run, o);
      }
    }
  }

  // The ring: R steps; in step s this rank holds the K/V shard of rank (rank - s) mod R (packed
  // from k and v in step 0) and sends it on while `work(src, ks, vs)` runs on it.
  template <class Work>
  void run_ring(const TensorView& k, const TensorView& v, RingStats& st, Work&& work) const {
    std::vector<char> buf[2] = {std::vector<char>(static_cast<size_t>(bytes_of(most))),
                                std::vector<char>(static_cast<size_t>(bytes_of(most)))};
    detail::pack(v, detail::pack(k, buf[0].data()));
    const DType dt = k.dtype;
    st.steps = c.size;
    int cur = 0;
    for (int step = 0; step < c.size; ++step) {
      const int src = (c.rank - step + c.size) % c.size;
      MPI_Request* req = pending;
      int nreq = 0;
      if (step + 1 < c.size) {  // pass the current shard on while working on it
        const int from = (c.rank - 1 + c.size) % c.size, to = (c.rank + 1) % c.size;
        const int next_src = (c.rank - step - 1 + c.size) % c.size;
        MPI_Irecv(buf[1 - cur].data(), detail::mpi_count(bytes_of(tokens_of(next_src)), kWhere), MPI_BYTE, from, step,
                  c.comm, &req[nreq++]);
        MPI_Isend(buf[cur].data(), detail::mpi_count(bytes_of(tokens_of(src)), kWhere), MPI_BYTE, to, step, c.comm,
                  &req[nreq++]);
        st.bytes_sent += bytes_of(tokens_of(src));
      }
      const auto t_compute = Clock::now();
      const int64_t ns = tokens_of(src);
      const TensorView ks = make_view(buf[cur].data(), dt, B, Hkv, ns, D);
      const TensorView vs = make_view(buf[cur].data() + B * Hkv * ns * D * es, dt, B, Hkv, ns, Dv);
      work(step, src, ks, vs);
      st.compute_seconds += seconds_since(t_compute);
      if (nreq) {
        const auto t_wait = Clock::now();
        MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE);  // completed requests are MPI_REQUEST_NULL already
        st.wait_seconds += seconds_since(t_wait);
        cur = 1 - cur;
      }
    }
  }
};

}  // namespace

AttendResult ring_attention(const TensorView& q, const TensorView& k, const TensorView& v, MPI_Comm comm,
                            const Mechanism& mechanism, const RingOptions& options) {
  const auto t_start = Clock::now();
  const Plan plan(q, k, v, comm, mechanism, options, kWhere);
  const int64_t B = plan.B, H = plan.H, Dv = plan.Dv, nl = plan.nl;
  // Accumulators: out (B, H, nl, Dv) and lse (B, H, nl), float32.
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::vector<float> acc_out(static_cast<size_t>(B * H * nl * Dv), 0.0f), acc_lse(static_cast<size_t>(B * H * nl), kNegInf);
  std::vector<float> part_out, part_lse, tmp;
  RingStats st;
  plan.run_ring(k, v, st, [&](int, int src, const TensorView& ks, const TensorView& vs) {
    plan.for_each_pair(src, options.threads, st, [&](const Piece& qp, const Piece& kp, const Mechanism& run,
                                                    const AttendOptions& o) {
      part_out.resize(static_cast<size_t>(B * H * qp.length * Dv));
      part_lse.resize(static_cast<size_t>(B * H * qp.length));
      const TensorView po = detail::f32_view(part_out.data(), B, H, qp.length, Dv);
      const TensorView pl = detail::f32_view(part_lse.data(), B, H, qp.length, 1);
      attend_into(detail::rows(q, qp.local, qp.length), detail::rows(ks, kp.local, kp.length),
                  detail::rows(vs, kp.local, kp.length), run, o, po, &pl, nullptr);
      for (int64_t bh = 0; bh < B * H; ++bh)
        merge_rows(qp.length, Dv, acc_out.data() + (bh * nl + qp.local) * Dv, acc_lse.data() + bh * nl + qp.local,
                   part_out.data() + bh * qp.length * Dv, part_lse.data() + bh * qp.length, tmp);
      plan.progress();
    });
  });

  AttendResult res;
  res.out = Tensor(q.dtype, {B, H, nl, Dv}, detail::layout_of(q));
  const TensorView& ov = res.out.view();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < nl; ++i)
        for (int64_t ch = 0; ch < Dv; ++ch)
          store_from_float(ov.data, ov.dtype, ov.offset(b, h, i, ch), acc_out[static_cast<size_t>(((b * H + h) * nl + i) * Dv + ch)]);
  if (options.return_lse) {
    res.lse = Tensor(DType::f32, {B, H, nl, 1});
    std::copy(acc_lse.begin(), acc_lse.end(), static_cast<float*>(res.lse.view().data));
  }
  st.total_seconds = seconds_since(t_start);
  if (options.stats) *options.stats = st;
  return res;
}

AttendGradients ring_attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                                        const TensorView& v, const TensorView& out, const TensorView& lse, MPI_Comm comm,
                                        const Mechanism& mechanism, const RingOptions& options) {
  constexpr const char* kBack = "distributed::ring_attention_backward";
  const auto t_start = Clock::now();
  const Plan plan(q, k, v, comm, mechanism, options, kBack, [&] {
    const std::array<int64_t, 4> want_out{q.batch(), q.heads(), q.tokens(), v.dim()};
    if (dout.shape != want_out) fail(kBack, "dout must have shape " + detail::dims(want_out) + ", got " + detail::dims(dout));
    if (out.shape != want_out) fail(kBack, "out must have shape " + detail::dims(want_out) + ", got " + detail::dims(out));
    const std::array<int64_t, 4> want_lse{q.batch(), q.heads(), q.tokens(), 1};
    if (lse.shape != want_lse || lse.dtype != DType::f32)
      fail(kBack, "lse must be float32 of shape " + detail::dims(want_lse) + ", got " + dtype_name(lse.dtype) + " " +
                      detail::dims(lse));
    if (dout.dtype != q.dtype || out.dtype != q.dtype)
      fail(kBack, "dout and out must have q's dtype " + dtype_name(q.dtype) + ", got " + dtype_name(dout.dtype) + " and " +
                      dtype_name(out.dtype));
    if (const auto* sm = std::get_if<Softmax>(&mechanism); sm && sm->score != ScoreKind::dot)
      fail(kBack, "the backward needs score=dot, got " + to_string(sm->score));
  });
  const int64_t B = plan.B, H = plan.H, Hkv = plan.Hkv, D = plan.D, Dv = plan.Dv, nl = plan.nl;
  // dQ of this rank's queries; dK/dV of the shard being visited, float32, travelling with it.
  std::vector<float> dq(static_cast<size_t>(B * H * nl * D), 0.0f);
  const size_t dkv_floats = static_cast<size_t>(B * Hkv * plan.most * (D + Dv));
  std::vector<float> dkv(dkv_floats, 0.0f), dkv_next(dkv_floats, 0.0f);
  RingStats st;
  plan.run_ring(k, v, st, [&](int step, int src, const TensorView& ks, const TensorView& vs) {
    const int64_t ns = plan.tokens_of(src);
    float* const dks = dkv.data();
    float* const dvs = dkv.data() + B * Hkv * ns * D;
    plan.for_each_pair(src, options.threads, st, [&](const Piece& qp, const Piece& kp, const Mechanism& run,
                                                    const AttendOptions& o) {
      // The pair's share of the gradients, from the whole row's out and lse (P_ij = exp(t_ij -
      // lse_i), D_i = dO_i . O_i): exact per pair, so the shares add up.
      const AttendGradients g =
          attend_backward(detail::rows(dout, qp.local, qp.length), detail::rows(q, qp.local, qp.length),
                          detail::rows(ks, kp.local, kp.length), detail::rows(vs, kp.local, kp.length),
                          detail::rows(out, qp.local, qp.length), detail::rows(lse, qp.local, qp.length), run, o);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < qp.length; ++i)
            for (int64_t ch = 0; ch < D; ++ch)
              dq[static_cast<size_t>(((b * H + h) * nl + qp.local + i) * D + ch)] += g.dq.at(b, h, i, ch);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hkv; ++h)
          for (int64_t j = 0; j < kp.length; ++j) {
            for (int64_t ch = 0; ch < D; ++ch)
              dks[((b * Hkv + h) * ns + kp.local + j) * D + ch] += g.dk.at(b, h, j, ch);
            for (int64_t ch = 0; ch < Dv; ++ch)
              dvs[((b * Hkv + h) * ns + kp.local + j) * Dv + ch] += g.dv.at(b, h, j, ch);
          }
      plan.progress();
    });
    // The shard's dK/dV go on with it (after R such moves they are back with their owner).
    if (plan.c.size > 1) {
      const int to = (plan.c.rank + 1) % plan.c.size, from = (plan.c.rank - 1 + plan.c.size) % plan.c.size;
      const int next_src = (src - 1 + plan.c.size) % plan.c.size;
      const int64_t send = B * Hkv * ns * (D + Dv), recv = B * Hkv * plan.tokens_of(next_src) * (D + Dv);
      MPI_Sendrecv(dkv.data(), detail::mpi_count(send, kBack), MPI_FLOAT, to, 1000 + step, dkv_next.data(),
                   detail::mpi_count(recv, kBack), MPI_FLOAT, from, 1000 + step, plan.c.comm, MPI_STATUS_IGNORE);
      st.bytes_sent += send * static_cast<int64_t>(sizeof(float));
      dkv.swap(dkv_next);
    }
  });
  // dkv now holds this rank's own shard's dK/dV (the last receive came from rank - 1 with shard rank).
  AttendGradients res;
  res.dq = Tensor(q.dtype, {B, H, nl, D});
  res.dk = Tensor(k.dtype, {B, Hkv, nl, D});
  res.dv = Tensor(v.dtype, {B, Hkv, nl, Dv});
  for (size_t i = 0; i < dq.size(); ++i) store_from_float(res.dq.view().data, q.dtype, static_cast<int64_t>(i), dq[i]);
  const int64_t nk = B * Hkv * nl * D;
  for (int64_t i = 0; i < nk; ++i) store_from_float(res.dk.view().data, k.dtype, i, dkv[static_cast<size_t>(i)]);
  for (int64_t i = 0; i < B * Hkv * nl * Dv; ++i)
    store_from_float(res.dv.view().data, v.dtype, i, dkv[static_cast<size_t>(nk + i)]);
  st.total_seconds = seconds_since(t_start);
  if (options.stats) *options.stats = st;
  return res;
}

}  // namespace attn::distributed
