// The checks every mechanism shares: q, k, v and the output views (dtypes, shapes, head
// grouping, sizes that fit 64-bit offsets) and the run options (threads). Families add their
// own checks on top (src/exact/validate.cpp).
#pragma once
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attn/attend.hpp"
#include "base/lazy_text.hpp"
#include "core/form.hpp"
#include "core/kv_rows.hpp"

namespace attn::core {

// Sizes of a validated call: q (B, H, N, D), k (B, Hkv, M, D), v (B, Hkv, M, Dv) (or page
// pools with a block table: AttendOptions::paged).
struct Dims {
  TensorView q, k, v;
  int64_t B = 0, H = 0, Hkv = 0, N = 0, M = 0, D = 0, Dv = 0;
  int64_t group = 1;   // query heads per kv head: kv head of h is h / group
  std::vector<int64_t> kv_len;  // valid keys per batch (key_padding_lengths; M when none given)
  std::shared_ptr<const PageTable> pages;  // set when k and v are page pools
  std::optional<TensorView> k_scale, v_scale;  // set when k and v are int8 rows (AttendOptions::kv_scales)
  int64_t stats_topk = 0;  // k of the row statistics when they are asked for, else 0
  int64_t kv_head(int64_t h) const { return h / group; }
  // The rows of kv head hk of batch entry b: read K and V through these, never through k/v.
  KvRows keys(int64_t b, int64_t hk) const { return KvRows(k, b, hk, pages.get(), k_scale ? &*k_scale : nullptr); }
  KvRows values(int64_t b, int64_t hk) const { return KvRows(v, b, hk, pages.get(), v_scale ? &*v_scale : nullptr); }
};

// How a family reads K and V: only as float views, or through Dims::keys/values (KvRows), which
// also read the caches' storage forms: page pools (AttendOptions::paged) and int8 rows with
// their scales (AttendOptions::kv_scales).
enum class KvStorage { views, rows };

// Validates q, k, v, the outputs that are given (none when explaining), key padding, the block
// table of a paged cache and the scales of int8 rows (families that say KvStorage::rows; the
// others refuse both) and the run options.
Dims check_io(const TensorView& q, const TensorView& k, const TensorView& v, const Outputs& outs,
              const AttendOptions& options, KvStorage storage = KvStorage::views);

// The four row-statistics views: float32, (B, H, N, 1), valid strides.
void check_stats_views(const Dims& d, const RowStatsViews& s);

// For families whose weights are no score matrix to mask: a boolean mask, a block mask or
// mask_mod, an additive bias or ALiBi slopes is an Error "<kind> does not take <what> (<why>)".
void refuse_score_options(const AttendOptions& options, LazyText kind, LazyText why);

// Causal calls of a recurrent family take as many queries as keys (each token brings q, k, v);
// else an Error naming N and M.
void check_causal_tokens(const Dims& p, LazyText text);

// A mechanism's canonical text for messages, made only when one is raised (base/lazy_text.hpp):
//   core::check_params(opt.params, specs, core::mechanism_text(m), symbols);
template <class M>
auto mechanism_text(const M& m) {
  return [&m] { return to_string(Mechanism{m}); };
}

// Shared helpers for family checks.
std::string dims_text(const TensorView& v);
void check_view(const TensorView& v, const std::string& name);
void check_finite(double x, const std::string& name);
// x must be finite, > 0, and a normal float32 (kernels compute in float32: 1e39 would be inf).
void check_positive_float32(double x, const std::string& name);
bool is_float(DType t);

}  // namespace attn::core
