#include "attn/error.hpp"
#include "core/reference_result.hpp"

#include <limits>

#include "core/form.hpp"
#include "core/row_stats.hpp"

namespace attn::core {

ReferenceResult zero_result(int64_t B, int64_t H, int64_t N, int64_t M, int64_t Dv, int64_t stats_topk) {
  ReferenceResult r;
  r.B = B, r.H = H, r.N = N, r.M = M, r.Dv = Dv;
  r.out.assign(static_cast<size_t>(B * H * N * Dv), 0.0);
  r.stats_topk = stats_topk;
  if (stats_topk > 0) r.stats.assign(static_cast<size_t>(B * H * N * 4), std::numeric_limits<double>::quiet_NaN());
  return r;
}

void write_reference(const ReferenceResult& r, const Outputs& o) {
  // A family whose reference keeps no weight matrix must refuse return_probs when it validates;
  // this is the net under that rule, before anything is written.
  if (o.probs && r.probs.size() != static_cast<size_t>(r.B * r.H * r.N * r.M))
    fail("attend", "return_probs: this mechanism's reference has no weight matrix to return");
  if (o.stats && r.stats.size() != static_cast<size_t>(r.B * r.H * r.N * 4))
    fail("attend", "return_stats: this mechanism's reference computes no row statistics");
  for (int64_t b = 0; b < r.B; ++b)
    for (int64_t h = 0; h < r.H; ++h)
      for (int64_t i = 0; i < r.N; ++i) {
        for (int64_t c = 0; c < r.Dv; ++c)
          store_from_float(o.out->data, o.out->dtype, o.out->offset(b, h, i, c), static_cast<float>(r.o(b, h, i, c)));
        if (o.lse) static_cast<float*>(o.lse->data)[o.lse->offset(b, h, i, 0)] = static_cast<float>(r.l(b, h, i));
        if (o.stats) o.stats->put_values(b, h, i, &r.stats[static_cast<size_t>(((b * r.H + h) * r.N + i) * 4)]);
        if (o.probs)
          for (int64_t j = 0; j < r.M; ++j)
            static_cast<float*>(o.probs->data)[o.probs->offset(b, h, i, j)] = static_cast<float>(r.p(b, h, i, j));
      }
  if (o.final_state)
    for (int64_t b = 0; b < r.B; ++b)
      for (int64_t h = 0; h < r.H; ++h)
        for (int64_t f = 0; f < r.F; ++f)
          for (int64_t c = 0; c < r.state_cols; ++c)
            static_cast<float*>(o.final_state->data)[o.final_state->offset(b, h, f, c)] =
                static_cast<float>(r.state[static_cast<size_t>(((b * r.H + h) * r.F + f) * r.state_cols + c)]);
}

}  // namespace attn::core
