// attend_varlen: packed sequences, one attend() per sequence on views of the packed tensors
// (no copies). Every sequence is validated before the first is computed, so a bad one fails the
// call before any output is written.
#include <string>

#include "attn/error.hpp"
#include "attn/kv_cache.hpp"
#include "cache/sequence_views.hpp"
#include "core/io_checks.hpp"
#include "core/out_of_memory.hpp"

namespace attn {
namespace {

const char* kWhere = "attend_varlen";

void check_cu(const std::vector<int64_t>& cu, const char* name, int64_t total, int64_t max_len, const char* max_name) {
  if (cu.empty() || cu.front() != 0)
    fail(kWhere, std::string(name) + " must start at 0 (batch + 1 offsets), got " +
                     (cu.empty() ? std::string("none") : std::to_string(cu.front())));
  int64_t longest = 0;
  for (size_t b = 1; b < cu.size(); ++b) {
    if (cu[b] < cu[b - 1])
      fail(kWhere, std::string(name) + " must not decrease, got " + std::to_string(cu[b - 1]) + " then " +
                       std::to_string(cu[b]) + " at index " + std::to_string(b));
    longest = std::max(longest, cu[b] - cu[b - 1]);
  }
  if (cu.back() != total)
    fail(kWhere, std::string(name) + " must end at the packed tokens " + std::to_string(total) + ", got " +
                     std::to_string(cu.back()));
  if (max_len < longest)
    fail(kWhere, std::string(max_name) + " must be at least the longest sequence " + std::to_string(longest) + ", got " +
                     std::to_string(max_len));
}

}  // namespace

void attend_varlen_into(const TensorView& q, const TensorView& k, const TensorView& v,
                        const std::vector<int64_t>& cu_q, const std::vector<int64_t>& cu_k, int64_t max_seqlen_q,
                        int64_t max_seqlen_k, const Mechanism& mech, const AttendOptions& opt, const TensorView& out,
                        const TensorView* lse) try {
  if (opt.return_stats) fail(kWhere, "return_stats: row statistics are not returned by varlen calls (use attend)");
  if (opt.kv_scales) fail(kWhere, "kv_scales: varlen calls take float k and v (int8 rows: attend with kv_scales)");
  for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}}) {
    core::check_view(*t, name);
    if (t->batch() != 1)
      fail(kWhere, std::string(name) + " must be packed: (1, heads, total tokens, dim), got " + core::dims_text(*t));
  }
  if (lse) core::check_view(*lse, "lse");
  if (k.tokens() != v.tokens())
    fail(kWhere, "k and v must have the same packed tokens, got " + std::to_string(k.tokens()) + " and " +
                     std::to_string(v.tokens()));
  check_cu(cu_q, "cu_seqlens_q", q.tokens(), max_seqlen_q, "max_seqlen_q");
  check_cu(cu_k, "cu_seqlens_k", k.tokens(), max_seqlen_k, "max_seqlen_k");
  if (cu_q.size() != cu_k.size())
    fail(kWhere, "cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got " +
                     std::to_string(cu_q.size()) + " and " + std::to_string(cu_k.size()));
  if (!opt.key_padding_lengths.empty() || opt.mask || opt.block_mask || opt.bias || opt.paged)
    fail(kWhere, "options must not carry key padding, masks, a bias or a paged cache (cu_seqlens say where each "
                 "sequence is)");
  const auto B = static_cast<int64_t>(cu_q.size()) - 1;
  if (!opt.alibi_slopes.empty() && static_cast<int64_t>(opt.alibi_slopes.size()) != q.heads())
    fail(kWhere, "alibi_slopes must have one slope per head (" + std::to_string(q.heads()) + "), got " +
                 std::to_string(opt.alibi_slopes.size()));
  if (out.tokens() != q.tokens())
    fail(kWhere, "out must have q's packed tokens " + std::to_string(q.tokens()) + ", got " + core::dims_text(out));
  if (lse && (lse->batch() != 1 || lse->tokens() != q.tokens()))
    fail(kWhere, "lse must be (1, heads, total q tokens, 1), got " + core::dims_text(*lse));
  auto views = [&](int64_t b, TensorView& qb, TensorView& kb, TensorView& vb, TensorView& ob, TensorView& lb) {
    const int64_t nq = cu_q[b + 1] - cu_q[b], nk = cu_k[b + 1] - cu_k[b];
    qb = cache_view::tokens(q, cu_q[b], nq), ob = cache_view::tokens(out, cu_q[b], nq);
    kb = cache_view::tokens(k, cu_k[b], nk), vb = cache_view::tokens(v, cu_k[b], nk);
    if (lse) lb = cache_view::tokens(*lse, cu_q[b], nq);
  };
  AttendOptions o = opt;
  o.return_lse = lse != nullptr;
  TensorView qb, kb, vb, ob, lb;
  for (int64_t b = 0; b < B; ++b) {
    views(b, qb, kb, vb, ob, lb);
    (void)explain(qb, kb, vb, mech, o);
  }
  for (int64_t b = 0; b < B; ++b) {
    views(b, qb, kb, vb, ob, lb);
    if (qb.tokens() > 0) attend_into(qb, kb, vb, mech, opt, ob, lse ? &lb : nullptr, nullptr);
  }
} catch (const std::bad_alloc&) {
  core::fail_out_of_memory("attend_varlen", "running", mech, q);
}

AttendResult attend_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                           const std::vector<int64_t>& cu_q, const std::vector<int64_t>& cu_k, int64_t max_seqlen_q,
                           int64_t max_seqlen_k, const Mechanism& mech, const AttendOptions& opt) try {
  core::check_view(q, "q");
  core::check_view(v, "v");
  AttendResult r;
  r.out = Tensor(q.dtype, {q.batch(), q.heads(), q.tokens(), v.dim()}, opt.out_layout.value_or(Layout::bhnd));
  if (opt.return_lse) r.lse = Tensor(DType::f32, {q.batch(), q.heads(), q.tokens(), 1});
  attend_varlen_into(q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, mech, opt, r.out.view(),
                     opt.return_lse ? &r.lse.view() : nullptr);
  return r;
} catch (const std::bad_alloc&) {
  core::fail_out_of_memory("attend_varlen", "running", mech, q);
}

}  // namespace attn
