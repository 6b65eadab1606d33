// Linear attention across ranks, LASP-2 style (see attn/distributed.hpp).
#include <cmath>

#include "attn/distributed.hpp"
#include "attn/error.hpp"
#include "distributed/comm.hpp"

namespace attn::distributed {

using detail::Comm;

AttendResult linear_attention(const TensorView& q, const TensorView& k, const TensorView& v, MPI_Comm comm,
                              const Linear& mechanism, bool return_final_state, int threads) {
  constexpr const char* kWhere = "distributed::linear_attention";
  const Comm c(comm);
  std::array<int64_t, 4> shape{};
  const std::string local = detail::error_of([&] {
    if (q.tokens() != k.tokens() || k.tokens() != v.tokens())
      fail(kWhere, "q, k and v shards must hold the same tokens, got " + std::to_string(q.tokens()) + ", " +
                       std::to_string(k.tokens()) + " and " + std::to_string(v.tokens()));
    if (q.tokens() > 0) {
      shape = state_shape(q, k, v, mechanism, {});
    } else {
      if (q.batch() != k.batch() || q.batch() != v.batch() || k.heads() != v.heads() || k.heads() == 0 ||
          q.heads() % k.heads() != 0 || q.dim() != k.dim())
        fail(kWhere, "q " + detail::dims(q) + ", k " + detail::dims(k) + ", v " + detail::dims(v) +
                         " disagree on batch, heads or head dim");
      shape = {q.batch(), q.heads(), q.dim(), v.dim() + (mechanism.normalize ? 1 : 0)};  // a Linear state
    }
  });
  detail::agree(c, kWhere, local);
  const std::vector<int64_t> all = detail::allgather(c, {shape[0], shape[1], shape[2], shape[3], q.dim(), v.dim(),
                                                          static_cast<int64_t>(q.dtype),
                                                          detail::fingerprint(to_string(Mechanism{mechanism})), q.tokens()});
  constexpr size_t kFields = 9;
  const std::string shape_error = detail::error_of([&] {
    const char* names[] = {"batch", "heads", "state rows", "state columns", "head dim", "v head dim", "q dtype (code)",
                           "the mechanism (fingerprint)"};
    for (int r = 1; r < c.size; ++r)
      for (size_t f = 0; f + 1 < kFields; ++f)
        if (all[r * kFields + f] != all[f])
          fail(kWhere, std::string(names[f]) + " must agree on every rank: rank 0 has " + std::to_string(all[f]) +
                           ", rank " + std::to_string(r) + " has " + std::to_string(all[r * kFields + f]));
  });
  detail::agree(c, kWhere, shape_error, /*global=*/true);

  const int64_t S = shape[0] * shape[1] * shape[2] * shape[3];
  const int count = detail::mpi_count(S, kWhere);
  AttendOptions o;
  o.threads = threads;
  // 1. This shard's own state contribution (from a zero state).
  Tensor own(DType::f32, shape);
  if (q.tokens() > 0) {
    o.return_final_state = true;
    Tensor scratch(q.dtype, {q.batch(), q.heads(), q.tokens(), v.dim()});
    attend_into(q, k, v, mechanism, o, scratch.view(), nullptr, nullptr, &own.view());
  }
  // 2. Everyone's, in rank order.
  std::vector<float> states(static_cast<size_t>(S) * static_cast<size_t>(c.size));
  MPI_Allgather(own.view().data, count, MPI_FLOAT, states.data(), count, MPI_FLOAT, c.comm);
  // 3. The prefix before this rank (causal: P_(r+1) = decay^(n_r) P_r + S_r) and the whole
  //    sequence's state; non-causal: the other ranks' sum and the total.
  const double decay = mechanism.decay.value_or(1.0);
  std::vector<float> prefix(static_cast<size_t>(S), 0.0f), total(static_cast<size_t>(S), 0.0f);
  for (int r = 0; r < c.size; ++r) {
    const float* sr = states.data() + static_cast<int64_t>(r) * S;
    const float f = mechanism.causal ? static_cast<float>(std::pow(decay, static_cast<double>(all[r * kFields + 8]))) : 1.0f;
    if (r == c.rank) prefix = total;
    for (int64_t i = 0; i < S; ++i) total[i] = f * total[i] + sr[i];
  }
  if (!mechanism.causal) {  // the other ranks' states, in rank order
    std::fill(prefix.begin(), prefix.end(), 0.0f);
    for (int r = 0; r < c.size; ++r)
      if (r != c.rank)
        for (int64_t i = 0; i < S; ++i) prefix[i] += states[static_cast<size_t>(r * S + i)];
  }
  // 4. The shard again, from its prefix.
  AttendResult res;
  res.out = Tensor(q.dtype, {q.batch(), q.heads(), q.tokens(), v.dim()}, detail::layout_of(q));
  if (q.tokens() > 0) {
    AttendOptions o2;
    o2.threads = threads;
    o2.params["initial_state"] = make_array_view(prefix.data(), DType::f32, {shape[0], shape[1], shape[2], shape[3]});
    attend_into(q, k, v, mechanism, o2, res.out.view(), nullptr, nullptr);
  }
  if (return_final_state) {
    res.final_state = Tensor(DType::f32, shape);
    std::copy(total.begin(), total.end(), static_cast<float*>(res.final_state.view().data));
  }
  return res;
}

}  // namespace attn::distributed
