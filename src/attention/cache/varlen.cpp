// attend_varlen: packed sequences, one attend() per sequence on views of the packed tensors
// (no copies). Every sequence is validated before the first is computed, so a bad one fails the
// call before any output is written.
#include <array>
#include <string>

#include "attn/error.hpp"
#include "attn/kv_cache.hpp"
#include "cache/sequence_views.hpp"
#include "cache/varlen_sequences.hpp"
#include "core/params.hpp"
#include "core/io_checks.hpp"
#include "core/out_of_memory.hpp"

namespace attn {
namespace varlen {
namespace {

void check_cu(const char* where, const std::vector<int64_t>& cu, const char* name, int64_t total, int64_t max_len,
              const char* max_name) {
  if (cu.empty() || cu.front() != 0)
    fail(where, std::string(name) + " must start at 0 (batch + 1 offsets), got " +
                    (cu.empty() ? std::string("none") : std::to_string(cu.front())));
  int64_t longest = 0;
  for (size_t b = 1; b < cu.size(); ++b) {
    if (cu[b] < cu[b - 1])
      fail(where, std::string(name) + " must not decrease, got " + std::to_string(cu[b - 1]) + " then " +
                      std::to_string(cu[b]) + " at index " + std::to_string(b));
    longest = std::max(longest, cu[b] - cu[b - 1]);
  }
  if (cu.back() != total)
    fail(where, std::string(name) + " must end at the packed tokens " + std::to_string(total) + ", got " +
                    std::to_string(cu.back()));
  if (max_len < longest)
    fail(where, std::string(max_name) + " must be at least the longest sequence " + std::to_string(longest) + ", got " +
                    std::to_string(max_len));
}

}  // namespace

void check_packed(const char* where, const TensorView& q, const TensorView& k, const TensorView& v,
                  const std::vector<int64_t>& cu_q, const std::vector<int64_t>& cu_k, int64_t max_q, int64_t max_k,
                  const AttendOptions& opt) {
  if (opt.return_stats) fail(where, "return_stats: row statistics are not returned by varlen calls (use attend)");
  if (opt.kv_scales) fail(where, "kv_scales: varlen calls take float k and v (int8 rows: attend with kv_scales)");
  for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    core::check_view(*t, name);
    if (t->batch() != 1)
      fail(where, std::string(name) + " must be packed: (1, heads, total tokens, dim), got " + core::dims_text(*t));
  }
  if (k.tokens() != v.tokens())
    fail(where, "k and v must have the same packed tokens, got " + std::to_string(k.tokens()) + " and " +
                    std::to_string(v.tokens()));
  check_cu(where, cu_q, "cu_seqlens_q", q.tokens(), max_q, "max_seqlen_q");
  check_cu(where, cu_k, "cu_seqlens_k", k.tokens(), max_k, "max_seqlen_k");
  if (cu_q.size() != cu_k.size())
    fail(where, "cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got " +
                    std::to_string(cu_q.size()) + " and " + std::to_string(cu_k.size()));
  if (!opt.key_padding_lengths.empty() || opt.mask || opt.block_mask || opt.bias || opt.paged)
    fail(where, "options must not carry key padding, masks, a bias or a paged cache (cu_seqlens say where each "
                "sequence is)");
  if (!opt.alibi_slopes.empty() && static_cast<int64_t>(opt.alibi_slopes.size()) != q.heads())
    fail(where, "alibi_slopes must have one slope per head (" + std::to_string(q.heads()) + "), got " +
                    std::to_string(opt.alibi_slopes.size()));
}

const ArrayView* initial_state(const AttendOptions& opt) {
  const auto it = opt.params.find("initial_state");
  return it == opt.params.end() ? nullptr : &it->second;
}

AttendOptions sequence_options(const char* where, const AttendOptions& opt, int64_t s, int64_t S) {
  const ArrayView* given = initial_state(opt);
  if (!given) return opt;
  if (given->shape.size() != 4 || given->shape[0] != S)
    fail(where, "params['initial_state'] must hold one state per sequence, (" + std::to_string(S) +
                    ", H, F, state columns), got " + std::to_string(given->shape.size()) + " dimensions" +
                    (given->shape.empty() ? std::string() : " of which the first is " + std::to_string(given->shape[0])));
  AttendOptions o = opt;
  ArrayView& row = o.params.at("initial_state");
  row.data = static_cast<const char*>(given->data) + s * given->strides[0] * static_cast<int64_t>(dtype_size(given->dtype));
  row.shape[0] = 1;
  return o;
}

TensorView state_row(TensorView t, int64_t s) {
  t.data = t.ptr(s, 0, 0, 0);
  t.shape[0] = 1;
  return t;
}

}  // namespace varlen

namespace {

const char* kWhere = "attend_varlen";

}  // namespace

void attend_varlen_into(const TensorView& q, const TensorView& k, const TensorView& v,
                        const std::vector<int64_t>& cu_q, const std::vector<int64_t>& cu_k, int64_t max_seqlen_q,
                        int64_t max_seqlen_k, const Mechanism& mech, const AttendOptions& opt, const TensorView& out,
                        const TensorView* lse, const TensorView* final_state) try {
  varlen::check_packed(kWhere, q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, opt);
  core::check_view(out, "out");
  if (out.batch() != 1)
    fail(kWhere, "out must be packed: (1, heads, total tokens, dim), got " + core::dims_text(out));
  if (lse) core::check_view(*lse, "lse");
  const auto B = static_cast<int64_t>(cu_q.size()) - 1;
  if (out.tokens() != q.tokens())
    fail(kWhere, "out must have q's packed tokens " + std::to_string(q.tokens()) + ", got " + core::dims_text(out));
  if (lse && (lse->batch() != 1 || lse->tokens() != q.tokens()))
    fail(kWhere, "lse must be (1, heads, total q tokens, 1), got " + core::dims_text(*lse));
  if (final_state) {
    core::check_view(*final_state, "final_state");
    if (final_state->batch() != B)
      fail(kWhere, "final_state must hold one state per sequence (" + std::to_string(B) + ", H, F, state columns), got " +
                       core::dims_text(*final_state));
  }
  auto views = [&](int64_t b, TensorView& qb, TensorView& kb, TensorView& vb, TensorView& ob, TensorView& lb) {
    const int64_t nq = cu_q[b + 1] - cu_q[b], nk = cu_k[b + 1] - cu_k[b];
    qb = cache_view::tokens(q, cu_q[b], nq), ob = cache_view::tokens(out, cu_q[b], nq);
    kb = cache_view::tokens(k, cu_k[b], nk), vb = cache_view::tokens(v, cu_k[b], nk);
    if (lse) lb = cache_view::tokens(*lse, cu_q[b], nq);
  };
  TensorView qb, kb, vb, ob, lb;
  for (int64_t b = 0; b < B; ++b) {
    views(b, qb, kb, vb, ob, lb);
    AttendOptions o = varlen::sequence_options(kWhere, opt, b, B);
    o.return_lse = lse != nullptr;
    o.return_final_state = final_state != nullptr;
    (void)explain(qb, kb, vb, mech, o);
  }
  for (int64_t b = 0; b < B; ++b) {
    views(b, qb, kb, vb, ob, lb);
    const AttendOptions o = varlen::sequence_options(kWhere, opt, b, B);
    const TensorView fs = final_state ? varlen::state_row(*final_state, b) : TensorView{};
    if (qb.tokens() > 0 || (final_state && kb.tokens() > 0)) {
      attend_into(qb, kb, vb, mech, o, ob, lse ? &lb : nullptr, nullptr, final_state ? &fs : nullptr);
    } else if (final_state) {  // no token: the state is the initial one (or zeros)
      const ArrayView* s0 = varlen::initial_state(o);
      for (int64_t h = 0; h < fs.shape[1]; ++h)
        for (int64_t f = 0; f < fs.shape[2]; ++f)
          for (int64_t c = 0; c < fs.shape[3]; ++c)
            static_cast<float*>(fs.data)[fs.offset(0, h, f, c)] = s0 ? core::element_at(*s0, 0, h, f, c) : 0.0f;
    }
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
  if (opt.return_final_state) {  // (S, H, F, C): the first sequence's state shape, one per sequence
    const auto S = static_cast<int64_t>(cu_q.size()) - 1;
    varlen::check_packed(kWhere, q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, opt);
    std::array<int64_t, 4> shape{S, q.heads(), 0, 0};
    if (S > 0) {
      AttendOptions o = varlen::sequence_options(kWhere, opt, 0, S);
      o.return_final_state = false;
      shape = state_shape(cache_view::tokens(q, 0, cu_q[1]), cache_view::tokens(k, 0, cu_k[1]),
                          cache_view::tokens(v, 0, cu_k[1]), mech, o);
      if (shape[0] == 0) fail(kWhere, std::string(kind_of(mech)) + " has no recurrent state; do not ask for final_state");
      shape[0] = S;
    }
    r.final_state = Tensor(DType::f32, shape);
  }
  attend_varlen_into(q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, mech, opt, r.out.view(),
                     opt.return_lse ? &r.lse.view() : nullptr, opt.return_final_state ? &r.final_state.view() : nullptr);
  return r;
} catch (const std::bad_alloc&) {
  core::fail_out_of_memory("attend_varlen", "running", mech, q);
}

}  // namespace attn
