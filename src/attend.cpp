// The entry point: validate once, pick the kernel set for this CPU, run the mechanism.
#include "attn/attend.hpp"

#include <cmath>
#include <limits>

#include "attn/error.hpp"
#include "exact/problem.hpp"
#include "exact/reference.hpp"
#include "exact/softmax_rows.hpp"
#include "exact/softmax_tiled.hpp"
#include "kernels/kernel_table.hpp"

namespace attn {
namespace {

Layout layout_of(const TensorView& q) {
  return q.heads() > 1 && q.tokens() > 1 && q.strides[2] > q.strides[1] ? Layout::bnhd : Layout::bhnd;
}

void copy_reference(const exact::ReferenceResult& r, const TensorView& out, const TensorView* lse,
                    const TensorView* probs) {
  for (int64_t b = 0; b < r.B; ++b)
    for (int64_t h = 0; h < r.H; ++h)
      for (int64_t i = 0; i < r.N; ++i) {
        for (int64_t c = 0; c < r.Dv; ++c)
          store_from_float(out.data, out.dtype, out.offset(b, h, i, c), static_cast<float>(r.o(b, h, i, c)));
        if (lse) static_cast<float*>(lse->data)[lse->offset(b, h, i, 0)] = static_cast<float>(r.l(b, h, i));
        if (probs)
          for (int64_t j = 0; j < r.M; ++j)
            static_cast<float*>(probs->data)[probs->offset(b, h, i, j)] = static_cast<float>(r.p(b, h, i, j));
      }
}

}  // namespace

void attend_into(const TensorView& q, const TensorView& k, const TensorView& v,
                 const Mechanism& mechanism, const AttendOptions& options, const TensorView& out,
                 const TensorView* lse, const TensorView* probs) {
  std::visit(
      [&](const auto& mech) {
        using M = std::decay_t<decltype(mech)>;
        if constexpr (std::is_same_v<M, Softmax>) {
          const exact::Problem p = exact::validate_softmax(q, k, v, mech, options, out, lse, probs);
          if (options.use_reference) {
            copy_reference(exact::reference_softmax(p), out, lse, probs);
            return;
          }
          const Isa isa = options.isa ? *options.isa : active_isa();
          if (exact::softmax_rows_fits(p, probs))
            exact::softmax_rows(p, kernels::kernels_for(isa), out, lse, options.threads);
          else
            exact::softmax_tiled(p, kernels::kernels_for(isa), out, lse, probs, options.threads);
        }
      },
      mechanism);
}

AttendResult attend(const TensorView& q, const TensorView& k, const TensorView& v,
                    const Mechanism& mechanism, const AttendOptions& options) {
  AttendResult r;
  const std::array<int64_t, 4> oshape{q.shape[0], q.shape[1], q.shape[2], v.shape[3]};
  for (int64_t s : oshape)
    if (s < 0) fail("attend", "q and v shapes must be non-negative, got q " + describe(q));
  r.out = Tensor(q.dtype, oshape, layout_of(q));  // a bad dtype is reported by validation
  if (options.return_lse) r.lse = Tensor(DType::f32, {q.shape[0], q.shape[1], q.shape[2], 1});
  if (options.return_probs) r.probs = Tensor(DType::f32, {q.shape[0], q.shape[1], q.shape[2], k.shape[2]});
  attend_into(q, k, v, mechanism, options, r.out.view(), options.return_lse ? &r.lse.view() : nullptr,
              options.return_probs ? &r.probs.view() : nullptr);
  return r;
}

double attention_flops(const TensorView& q, const TensorView& k, const TensorView& v,
                       const Mechanism& mechanism) {
  const double N = static_cast<double>(q.tokens()), M = static_cast<double>(k.tokens());
  double pairs = N * M;
  if (const auto* s = std::get_if<Softmax>(&mechanism)) {
    const int64_t right = s->causal ? 0 : s->window_right;
    pairs = 0;
    for (int64_t i = 0; i < q.tokens(); ++i) {
      const int64_t d = i + k.tokens() - q.tokens();
      int64_t lo = s->window_left < 0 ? 0 : std::max<int64_t>(0, d - s->window_left);
      int64_t hi = right < 0 ? k.tokens() : std::min<int64_t>(k.tokens(), d + right + 1);
      if (hi > lo) pairs += static_cast<double>(hi - lo);
    }
  }
  return 2.0 * pairs * static_cast<double>(q.batch() * q.heads()) * static_cast<double>(q.dim() + v.dim());
}

}  // namespace attn
