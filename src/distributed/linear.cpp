// Linear attention across ranks, LASP-2 style (see attn/distributed.hpp).
#include <cmath>
#include <functional>

#include "attn/backward.hpp"
#include "attn/distributed.hpp"
#include "attn/error.hpp"
#include "distributed/comm.hpp"

namespace attn::distributed {

using detail::Comm;

namespace {

// What the forward and the backward share: the agreed sizes, every rank's state contribution
// (all-gathered), this rank's prefix state and the whole sequence's final state.
struct Prefix {
  Comm c;
  std::array<int64_t, 4> shape{};
  std::vector<int64_t> all;
  static constexpr size_t kFields = 9;
  int64_t S = 0;                     // floats of one state
  std::vector<float> states;         // every rank's contribution, rank order
  std::vector<float> prefix, total;  // this rank's initial state; the whole sequence's final state

  int64_t tokens_of(int r) const { return all[static_cast<size_t>(r) * kFields + 8]; }
  float decay_over(const Linear& m, int r) const {
    return m.causal ? static_cast<float>(std::pow(m.decay.value_or(1.0), static_cast<double>(tokens_of(r)))) : 1.0f;
  }

  Prefix(const TensorView& q, const TensorView& k, const TensorView& v, MPI_Comm comm, const Linear& mechanism,
         int threads, const char* where, const std::function<void()>& extra = {})
      : c(comm) {
    const std::string local = detail::error_of([&] {
      if (q.tokens() != k.tokens() || k.tokens() != v.tokens())
        fail(where, "q, k and v shards must hold the same tokens, got " + std::to_string(q.tokens()) + ", " +
                        std::to_string(k.tokens()) + " and " + std::to_string(v.tokens()));
      if (q.tokens() > 0) {
        shape = state_shape(q, k, v, mechanism, {});
      } else {
        if (q.batch() != k.batch() || q.batch() != v.batch() || k.heads() != v.heads() || k.heads() == 0 ||
            q.heads() % k.heads() != 0 || q.dim() != k.dim())
          fail(where, "q " + detail::dims(q) + ", k " + detail::dims(k) + ", v " + detail::dims(v) +
                          " disagree on batch, heads or head dim");
        shape = {q.batch(), q.heads(), q.dim(), v.dim() + (mechanism.normalize ? 1 : 0)};  // a Linear state
      }
      if (extra) extra();
    });
    detail::agree(c, where, local);
    all = detail::allgather(c, {shape[0], shape[1], shape[2], shape[3], q.dim(), v.dim(), static_cast<int64_t>(q.dtype),
                                detail::fingerprint(to_string(Mechanism{mechanism})), q.tokens()});
    const std::string shape_error = detail::error_of([&] {
      const char* names[] = {"batch", "heads", "state rows", "state columns", "head dim", "v head dim", "q dtype (code)",
                             "the mechanism (fingerprint)"};
      for (int r = 1; r < c.size; ++r)
        for (size_t f = 0; f + 1 < kFields; ++f)
          if (all[r * kFields + f] != all[f])
            fail(where, std::string(names[f]) + " must agree on every rank: rank 0 has " + std::to_string(all[f]) +
                            ", rank " + std::to_string(r) + " has " + std::to_string(all[r * kFields + f]));
    });
    detail::agree(c, where, shape_error, /*global=*/true);

    S = shape[0] * shape[1] * shape[2] * shape[3];
    // 1. This shard's own state contribution (from a zero state).
    Tensor own(DType::f32, shape);
    if (q.tokens() > 0) {
      AttendOptions o;
      o.threads = threads;
      o.return_final_state = true;
      Tensor scratch(q.dtype, {q.batch(), q.heads(), q.tokens(), v.dim()});
      attend_into(q, k, v, mechanism, o, scratch.view(), nullptr, nullptr, &own.view());
    }
    // 2. Everyone's, in rank order.
    states.resize(static_cast<size_t>(S) * static_cast<size_t>(c.size));
    MPI_Allgather(own.view().data, detail::mpi_count(S, where), MPI_FLOAT, states.data(), detail::mpi_count(S, where),
                  MPI_FLOAT, c.comm);
    // 3. The prefix before this rank (causal: P_(r+1) = decay^(n_r) P_r + S_r) and the whole
    //    sequence's state; non-causal: the other ranks' sum and the total.
    prefix.assign(static_cast<size_t>(S), 0.0f);
    total.assign(static_cast<size_t>(S), 0.0f);
    for (int r = 0; r < c.size; ++r) {
      const float* sr = states.data() + static_cast<int64_t>(r) * S;
      const float f = decay_over(mechanism, r);
      if (r == c.rank) prefix = total;
      for (int64_t i = 0; i < S; ++i) total[i] = f * total[i] + sr[i];
    }
    if (!mechanism.causal) {  // the other ranks' states, in rank order
      std::fill(prefix.begin(), prefix.end(), 0.0f);
      for (int r = 0; r < c.size; ++r)
        if (r != c.rank)
          for (int64_t i = 0; i < S; ++i) prefix[i] += states[static_cast<size_t>(r * S + i)];
    }
  }

  AttendOptions with_prefix(int threads) const {
    AttendOptions o;
    o.threads = threads;
    o.params["initial_state"] = make_array_view(prefix.data(), DType::f32, {shape[0], shape[1], shape[2], shape[3]});
    return o;
  }
};

}  // namespace

AttendResult linear_attention(const TensorView& q, const TensorView& k, const TensorView& v, MPI_Comm comm,
                              const Linear& mechanism, bool return_final_state, int threads) {
  const Prefix p(q, k, v, comm, mechanism, threads, "distributed::linear_attention");
  // 4. The shard again, from its prefix.
  AttendResult res;
  res.out = Tensor(q.dtype, {q.batch(), q.heads(), q.tokens(), v.dim()}, detail::layout_of(q));
  if (q.tokens() > 0) attend_into(q, k, v, mechanism, p.with_prefix(threads), res.out.view(), nullptr, nullptr);
  if (return_final_state) {
    res.final_state = Tensor(DType::f32, p.shape);
    std::copy(p.total.begin(), p.total.end(), static_cast<float*>(res.final_state.view().data));
  }
  return res;
}

AttendGradients linear_attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                                          const TensorView& v, MPI_Comm comm, const Linear& mechanism,
                                          const TensorView* dfinal_state, int threads) {
  constexpr const char* kWhere = "distributed::linear_attention_backward";
  const Prefix p(q, k, v, comm, mechanism, threads, kWhere, [&] {
    const std::array<int64_t, 4> want{q.batch(), q.heads(), q.tokens(), v.dim()};
    if (dout.shape != want) fail(kWhere, "dout must have shape " + detail::dims(want) + ", got " + detail::dims(dout));
    if (dout.dtype != q.dtype)
      fail(kWhere, "dout must have q's dtype " + dtype_name(q.dtype) + ", got " + dtype_name(dout.dtype));
  });
  const std::string bad_dfinal = detail::error_of([&] {
    if (dfinal_state && (dfinal_state->shape != p.shape || dfinal_state->dtype != DType::f32))
      fail(kWhere, "dfinal_state must be float32 of the state's shape " + detail::dims(p.shape) + ", got " +
                       dtype_name(dfinal_state->dtype) + " " + detail::dims(*dfinal_state));
  });
  detail::agree(p.c, kWhere, bad_dfinal);
  const int64_t S = p.S;
  const bool has = q.tokens() > 0;
  // The forward's output of this shard (the backward of a normalised output reads it).
  Tensor out(q.dtype, {q.batch(), q.heads(), q.tokens(), v.dim()});
  const AttendOptions o = p.with_prefix(threads);
  if (has) attend_into(q, k, v, mechanism, o, out.view(), nullptr, nullptr);
  const TensorView no_lse{};
  // 1. Each rank's own outputs' gradient with respect to its initial state, all-gathered.
  std::vector<float> mine(static_cast<size_t>(S), 0.0f);
  if (has) {
    const AttendGradients g = attend_backward(dout, q, k, v, out.view(), no_lse, mechanism, o);
    std::copy_n(static_cast<const float*>(g.d_initial_state.view().data), S, mine.data());
  }
  std::vector<float> every(static_cast<size_t>(S) * static_cast<size_t>(p.c.size));
  MPI_Allgather(mine.data(), detail::mpi_count(S, kWhere), MPI_FLOAT, every.data(), detail::mpi_count(S, kWhere),
                MPI_FLOAT, p.c.comm);
  // 2. The gradient with respect to this shard's final state, G_r. Causal: G_(R-1) = dfinal and
  //    G_(r-1) = d_initial_(r) = own_(r) + decay^(n_r) G_r (the state passes through shard r).
  //    Non-causal: every output sees the same total state: G = dfinal + sum_s own_s, and this
  //    shard's call already counts own_r, so G_r = G - own_r.
  std::vector<float> g(static_cast<size_t>(S), 0.0f);
  if (dfinal_state)
    for (int64_t i = 0; i < S; ++i) g[i] = dfinal_state->at(i / (p.shape[1] * p.shape[2] * p.shape[3]),
                                                            i / (p.shape[2] * p.shape[3]) % p.shape[1],
                                                            i / p.shape[3] % p.shape[2], i % p.shape[3]);
  if (mechanism.causal) {
    for (int r = p.c.size - 1; r > p.c.rank; --r) {
      const float f = p.decay_over(mechanism, r);
      const float* own = every.data() + static_cast<int64_t>(r) * S;
      for (int64_t i = 0; i < S; ++i) g[i] = own[i] + f * g[i];
    }
  } else {
    for (int r = 0; r < p.c.size; ++r)
      if (r != p.c.rank)
        for (int64_t i = 0; i < S; ++i) g[i] += every[static_cast<size_t>(r * S + i)];
  }
  // 3. The shard's gradients with G_r flowing into its final state.
  AttendGradients res;
  if (has) {
    const TensorView gv = make_view(g.data(), DType::f32, p.shape[0], p.shape[1], p.shape[2], p.shape[3]);
    res = attend_backward(dout, q, k, v, out.view(), no_lse, mechanism, o, nullptr, &gv);
    res.d_initial_state = Tensor();
  } else {
    res.dq = Tensor(q.dtype, {q.batch(), q.heads(), 0, q.dim()});
    res.dk = Tensor(k.dtype, {k.batch(), k.heads(), 0, k.dim()});
    res.dv = Tensor(v.dtype, {v.batch(), v.heads(), 0, v.dim()});
  }
  return res;
}

}  // namespace attn::distributed
