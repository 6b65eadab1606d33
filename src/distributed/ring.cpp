// Ring attention (see attn/distributed.hpp): K/V shards travel around the ring while each rank
// attends its queries to the shard it holds; partials merge by core::merge_partials.
#include <chrono>
#include <cmath>
#include <limits>
#include <type_traits>
#include <variant>

#include "attn/distributed.hpp"
#include "attn/error.hpp"
#include "core/partial_merge.hpp"
#include "distributed/comm.hpp"
#include "mask/pattern.hpp"
#include "mask/patterns.hpp"

namespace attn::distributed {

using detail::Comm;

std::vector<Piece> shard_pieces(int64_t n, int ranks, int rank, bool zigzag) {
  if (ranks < 1 || rank < 0 || rank >= ranks)
    fail("shard_pieces", "rank must be in [0, " + std::to_string(ranks) + "), got " + std::to_string(rank));
  if (n < 0) fail("shard_pieces", "n must be >= 0, got " + std::to_string(n));
  const int64_t P = zigzag ? 2 * int64_t{ranks} : ranks;
  auto start = [&](int64_t c) { return c * (n / P) + std::min(c, n % P); };
  std::vector<Piece> out;
  int64_t local = 0;
  for (int64_t c : zigzag ? std::vector<int64_t>{rank, P - 1 - rank} : std::vector<int64_t>{rank}) {
    const Piece p{start(c), start(c + 1) - start(c), local};
    local += p.length;
    out.push_back(p);
  }
  return out;
}

int64_t shard_length(int64_t n, int ranks, int rank, bool zigzag) {
  int64_t total = 0;
  for (const Piece& p : shard_pieces(n, ranks, rank, zigzag)) total += p.length;
  return total;
}

namespace {

constexpr const char* kWhere = "distributed::ring_attention";
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The mechanism's scores without its pattern (positions are handled here), and its pattern over
// the whole sequence in global positions.
struct Split {
  Softmax scores;
  mask::Pattern pattern;
  bool causal = false;
  std::optional<Softmax> native;  // the mechanism itself, runnable as-is on a diagonal pair
};

Split split(const Mechanism& m, int64_t n) {
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
          s.pattern = mask::pattern_of(x, n, n);
          s.causal = x.causal;
          s.native = x;
        } else if constexpr (std::is_same_v<T, Longformer> || std::is_same_v<T, BigBird>) {
          s.scores.scale = x.scale;
          s.pattern = mask::pattern_of(x, n, n);
          s.causal = x.causal;
        } else {
          fail(kWhere, "mechanism must be softmax, longformer or bigbird, got " + to_string(Mechanism{m}));
        }
      },
      m);
  return s;
}

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

}  // namespace

AttendResult ring_attention(const TensorView& q, const TensorView& k, const TensorView& v, MPI_Comm comm,
                            const Mechanism& mechanism, const RingOptions& options) {
  const Comm c(comm);
  const auto t_start = Clock::now();
  // 1. Sizes: every rank's (B, H, Hkv, n_q, n_k, n_v, D, Dv, local check), then the same checks everywhere.
  const std::string local = detail::error_of([&] {
    for (const auto* x : {&q, &k, &v})
      if (x->data == nullptr && x->numel() != 0) fail(kWhere, "a view has no data");
    if (q.dim() != k.dim()) fail(kWhere, "k must have q's head dim " + std::to_string(q.dim()) + ", got " + detail::dims(k));
    if (q.batch() != k.batch() || q.batch() != v.batch() || k.heads() != v.heads())
      fail(kWhere, "q " + detail::dims(q) + ", k " + detail::dims(k) + ", v " + detail::dims(v) +
                       " disagree on batch or k/v heads");
    if (k.heads() == 0 || q.heads() % k.heads() != 0)
      fail(kWhere, "k has " + std::to_string(k.heads()) + " heads, which does not divide q's " + std::to_string(q.heads()));
    if (q.tokens() != k.tokens() || k.tokens() != v.tokens())
      fail(kWhere, "q, k and v shards must hold the same tokens, got " + std::to_string(q.tokens()) + ", " +
                       std::to_string(k.tokens()) + " and " + std::to_string(v.tokens()));
    if (q.tokens() > 0) (void)explain(q, k, v, Softmax{}, {});  // dtype, strides, finite sizes
  });
  detail::agree(c, kWhere, local);
  const std::vector<int64_t> all =
      detail::allgather(c, {q.batch(), q.heads(), k.heads(), q.tokens(), q.dim(), v.dim(), static_cast<int64_t>(q.dtype)});
  constexpr size_t kFields = 7;
  auto at = [&](int r, size_t f) { return all[static_cast<size_t>(r) * kFields + f]; };
  int64_t n = 0;
  for (int r = 0; r < c.size; ++r) n += at(r, 3);
  Split s;
  const std::string shape_error = detail::error_of([&] {
    const char* names[] = {"batch", "q heads", "k/v heads", "", "head dim", "v head dim", "dtype"};
    auto value = [&](int r, size_t f) {
      return f == 6 ? dtype_name(static_cast<DType>(at(r, f))) : std::to_string(at(r, f));
    };
    for (int r = 1; r < c.size; ++r)
      for (size_t f : {0, 1, 2, 4, 5, 6})
        if (at(r, f) != at(0, f))
          fail(kWhere, std::string(names[f]) + " must agree on every rank: rank 0 has " + value(0, f) + ", rank " +
                           std::to_string(r) + " has " + value(r, f));
    s = split(mechanism, n);
    const bool zig = options.zigzag_auto && s.causal;
    for (int r = 0; r < c.size; ++r)
      if (at(r, 3) != shard_length(n, c.size, r, zig))
        fail(kWhere, "rank " + std::to_string(r) + " holds " + std::to_string(at(r, 3)) + " tokens; a " +
                         (zig ? "zig-zag" : "contiguous") + " shard of " + std::to_string(n) + " tokens over " +
                         std::to_string(c.size) + " ranks has " + std::to_string(shard_length(n, c.size, r, zig)));
    int64_t longest = 0;
    for (int r = 0; r < c.size; ++r) longest = std::max(longest, at(r, 3));
    (void)detail::mpi_count(at(0, 0) * at(0, 2) * (at(0, 4) + at(0, 5)) * longest * static_cast<int64_t>(dtype_size(q.dtype)),
                            kWhere);
  });
  detail::agree(c, kWhere, shape_error);  // the same verdict everywhere (same data), without hanging

  const bool zig = options.zigzag_auto && s.causal;
  const int64_t B = q.batch(), H = q.heads(), Hkv = k.heads(), D = q.dim(), Dv = v.dim(), nl = q.tokens();
  // K/V travel in the inputs' dtype (attend() takes q, k, v of one dtype): bytes of a shard
  const int64_t es = static_cast<int64_t>(dtype_size(q.dtype));
  auto bytes_of = [&](int64_t tokens) { return B * Hkv * tokens * (D + Dv) * es; };
  int64_t most = 0;
  for (int r = 0; r < c.size; ++r) most = std::max(most, at(r, 3));
  std::vector<char> buf[2] = {std::vector<char>(static_cast<size_t>(bytes_of(most))),
                              std::vector<char>(static_cast<size_t>(bytes_of(most)))};
  detail::pack(v, detail::pack(k, buf[0].data()));

  // Accumulators: out (B, H, nl, Dv) and lse (B, H, nl), float32.
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::vector<float> acc_out(static_cast<size_t>(B * H * nl * Dv), 0.0f), acc_lse(static_cast<size_t>(B * H * nl), kNegInf);
  std::vector<float> part_out, part_lse, tmp;
  const std::vector<Piece> mine = shard_pieces(n, c.size, c.rank, zig);
  RingStats st;
  st.steps = c.size;

  int cur = 0;
  for (int step = 0; step < c.size; ++step) {
    const int src = (c.rank - step + c.size) % c.size;
    MPI_Request req[2];
    int nreq = 0;
    if (step + 1 < c.size) {  // pass the current shard on while working on it
      const int from = (c.rank - 1 + c.size) % c.size, to = (c.rank + 1) % c.size;
      const int next_src = (c.rank - step - 1 + c.size) % c.size;
      MPI_Irecv(buf[1 - cur].data(), detail::mpi_count(bytes_of(at(next_src, 3)), kWhere), MPI_BYTE, from, step,
                c.comm, &req[nreq++]);
      MPI_Isend(buf[cur].data(), detail::mpi_count(bytes_of(at(src, 3)), kWhere), MPI_BYTE, to, step, c.comm,
                &req[nreq++]);
      st.bytes_sent += bytes_of(at(src, 3));
    }
    const auto t_compute = Clock::now();
    const int64_t ns = at(src, 3);
    const TensorView ks = make_view(buf[cur].data(), q.dtype, B, Hkv, ns, D);
    const TensorView vs = make_view(buf[cur].data() + B * Hkv * ns * D * es, q.dtype, B, Hkv, ns, Dv);
    for (const Piece& qp : mine) {
      if (qp.length == 0) continue;
      for (const Piece& kp : shard_pieces(n, c.size, src, zig)) {
        if (kp.length == 0) continue;
        const mask::Coverage cov =
            s.pattern.classify(qp.start, qp.start + qp.length - 1, kp.start, kp.start + kp.length - 1);
        if (cov == mask::Coverage::hidden) {
          ++st.blocks_skipped;
          continue;
        }
        ++st.blocks_computed;
        AttendOptions o;
        o.threads = options.threads;
        Mechanism run = s.scores;
        if (cov == mask::Coverage::partial) {
          const bool aligned = qp.start == kp.start && qp.length == kp.length && s.native &&
                               (s.native->sinks == 0 || kp.start == 0) &&
                               (s.native->chunk == 0 || kp.start % s.native->chunk == 0);
          if (aligned) {
            run = *s.native;  // positions relative to the pair equal the global ones' differences
          } else {
            const mask::Pattern* pat = &s.pattern;
            const int64_t q0 = qp.start, k0 = kp.start;
            o.mask_mod = [pat, q0, k0](int64_t, int64_t, int64_t i, int64_t j) { return pat->visible(q0 + i, k0 + j); };
          }
        }
        part_out.resize(static_cast<size_t>(B * H * qp.length * Dv));
        part_lse.resize(static_cast<size_t>(B * H * qp.length));
        const TensorView po = detail::f32_view(part_out.data(), B, H, qp.length, Dv);
        const TensorView pl = detail::f32_view(part_lse.data(), B, H, qp.length, 1);
        attend_into(detail::rows(q, qp.local, qp.length), detail::rows(ks, kp.local, kp.length),
                    detail::rows(vs, kp.local, kp.length), run, o, po, &pl, nullptr);
        for (int64_t bh = 0; bh < B * H; ++bh)
          merge_rows(qp.length, Dv, acc_out.data() + (bh * nl + qp.local) * Dv, acc_lse.data() + bh * nl + qp.local,
                     part_out.data() + bh * qp.length * Dv, part_lse.data() + bh * qp.length, tmp);
      }
    }
    st.compute_seconds += seconds_since(t_compute);
    if (nreq) {
      const auto t_wait = Clock::now();
      MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE);
      st.wait_seconds += seconds_since(t_wait);
      cur = 1 - cur;
    }
  }

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

}  // namespace attn::distributed
