// Decode against a KV cache sharded by tokens (see attn/distributed.hpp).
#include <cmath>
#include <limits>

#include "attn/distributed.hpp"
#include "attn/error.hpp"
#include "core/partial_merge.hpp"
#include "distributed/comm.hpp"

namespace attn::distributed {

using detail::Comm;

AttendResult decode(const TensorView& q, const TensorView& k_shard, const TensorView& v_shard, MPI_Comm comm,
                    const Softmax& mechanism, bool return_lse) {
  constexpr const char* kWhere = "distributed::decode";
  const Comm c(comm);
  Softmax scores;
  scores.score = mechanism.score, scores.scale = mechanism.scale, scores.softcap = mechanism.softcap;
  const std::string local = detail::error_of([&] {
    if (!(mechanism == scores))
      fail(kWhere, "mechanism may set only score, scale and softcap (every query sees every cached key), got " +
                       to_string(Mechanism{mechanism}));
    if (mechanism.score == ScoreKind::additive) fail(kWhere, "score=additive (its params) is not supported across ranks");
    if (k_shard.tokens() != v_shard.tokens())
      fail(kWhere, "k_shard has " + std::to_string(k_shard.tokens()) + " tokens, v_shard " +
                       std::to_string(v_shard.tokens()));
    if (k_shard.tokens() > 0) {
      (void)explain(q, k_shard, v_shard, scores, {});
    } else if (q.batch() != k_shard.batch() || q.batch() != v_shard.batch() || k_shard.heads() != v_shard.heads() ||
               k_shard.heads() == 0 || q.heads() % k_shard.heads() != 0 || q.dim() != k_shard.dim()) {
      fail(kWhere, "q " + detail::dims(q) + ", k_shard " + detail::dims(k_shard) + ", v_shard " +
                       detail::dims(v_shard) + " disagree on batch, heads or head dim");
    }
  });
  detail::agree(c, kWhere, local);
  const std::vector<int64_t> all = detail::allgather(
      c, {q.batch(), q.heads(), q.tokens(), q.dim(), k_shard.heads(), v_shard.dim(), static_cast<int64_t>(q.dtype),
          detail::fingerprint(to_string(Mechanism{mechanism}))});
  constexpr size_t kFields = 8;
  const std::string shape_error = detail::error_of([&] {
    const char* names[] = {"q batch", "q heads", "q tokens", "head dim", "k/v heads", "v head dim", "q dtype (code)",
                           "the mechanism (fingerprint)"};
    for (int r = 1; r < c.size; ++r)
      for (size_t f = 0; f < kFields; ++f)
        if (all[r * kFields + f] != all[f])
          fail(kWhere, std::string(names[f]) + " must agree on every rank: rank 0 has " + std::to_string(all[f]) +
                           ", rank " + std::to_string(r) + " has " + std::to_string(all[r * kFields + f]));
  });
  detail::agree(c, kWhere, shape_error, /*global=*/true);

  const int64_t B = q.batch(), H = q.heads(), N = q.tokens(), Dv = v_shard.dim(), rows = B * H * N;
  const int64_t record = rows * Dv + rows;  // out (B, H, N, Dv), then lse (B, H, N)
  const int count = detail::mpi_count(record, kWhere);
  std::vector<float> mine(static_cast<size_t>(record), 0.0f);
  std::fill(mine.begin() + rows * Dv, mine.end(), -std::numeric_limits<float>::infinity());
  if (k_shard.tokens() > 0 && rows > 0) {
    const TensorView po = detail::f32_view(mine.data(), B, H, N, Dv);
    const TensorView pl = detail::f32_view(mine.data() + rows * Dv, B, H, N, 1);
    attend_into(q, k_shard, v_shard, scores, {}, po, &pl, nullptr);
  }
  std::vector<float> every(static_cast<size_t>(record) * static_cast<size_t>(c.size));
  MPI_Allgather(mine.data(), count, MPI_FLOAT, every.data(), count, MPI_FLOAT, c.comm);

  // Partial p of row i: m = lse, l = 1 (0 for a shard with no key, NaN passes on), acc = out.
  std::vector<float> l(static_cast<size_t>(c.size)), m(static_cast<size_t>(c.size)), row(static_cast<size_t>(Dv));
  AttendResult res;
  res.out = Tensor(q.dtype, {B, H, N, Dv}, detail::layout_of(q));
  if (return_lse) res.lse = Tensor(DType::f32, {B, H, N, 1});
  const TensorView& ov = res.out.view();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < N; ++i) {
        const int64_t r = (b * H + h) * N + i;
        for (int p = 0; p < c.size; ++p) {
          const float x = every[static_cast<size_t>(p * record + rows * Dv + r)];
          m[p] = x;
          l[p] = std::isnan(x) ? x : x == -std::numeric_limits<float>::infinity() ? 0.0f : 1.0f;
        }
        const float lse = core::merge_partials(c.size, m.data(), l.data(), 1, every.data() + r * Dv, record, Dv, row.data());
        for (int64_t ch = 0; ch < Dv; ++ch) store_from_float(ov.data, ov.dtype, ov.offset(b, h, i, ch), row[ch]);
        if (return_lse) static_cast<float*>(res.lse.view().data)[r] = lse;
      }
  return res;
}

}  // namespace attn::distributed
