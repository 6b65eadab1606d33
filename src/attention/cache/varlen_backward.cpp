// attend_varlen_backward: the gradients of packed sequences, one attend_backward per sequence on
// views of the packed tensors (as the forward, varlen.cpp), each sequence's gradients copied into
// its rows of the packed results. The linear family's state starts afresh at each sequence, so a
// packed batch's gradients are each sequence's alone (fla's cu_seqlens); its initial states'
// gradients go to their rows of d_initial_state, and dfinal_state's rows to their sequences.
// Learned params are shared by the sequences: their gradients are summed in sequence order.
#include <string>

#include "attn/error.hpp"
#include "attn/kv_cache.hpp"
#include "cache/sequence_views.hpp"
#include "cache/varlen_sequences.hpp"
#include "core/io_checks.hpp"
#include "core/out_of_memory.hpp"
#include "core/params.hpp"

namespace attn {
namespace {

const char* kWhere = "attend_varlen_backward";

void check_rows(const TensorView* t, const char* name, int64_t batch, int64_t tokens, const char* shape) {
  if (!t) return;
  core::check_view(*t, name);
  if (t->batch() != batch || t->tokens() != tokens)
    fail(kWhere, std::string(name) + " must be " + shape + ", got " + core::dims_text(*t));
}

}  // namespace

AttendGradients attend_varlen_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                                       const TensorView& v, const TensorView& out, const TensorView& lse,
                                       const std::vector<int64_t>& cu_q, const std::vector<int64_t>& cu_k,
                                       int64_t max_seqlen_q, int64_t max_seqlen_k, const Mechanism& mech,
                                       const AttendOptions& opt, const TensorView* dlse,
                                       const TensorView* dfinal_state) try {
  varlen::check_packed(kWhere, q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, opt);
  const int64_t T = q.tokens(), S = static_cast<int64_t>(cu_q.size()) - 1;
  const std::string rows = "(1, heads, total q tokens " + std::to_string(T) + ", dim)";
  check_rows(&dout, "dout", 1, T, rows.c_str());
  check_rows(&out, "out", 1, T, rows.c_str());
  if (!lse.empty()) check_rows(&lse, "lse", 1, T, "(1, heads, total q tokens, 1)");
  check_rows(dlse, "dlse", 1, T, "(1, heads, total q tokens, 1)");
  if (dfinal_state) {
    core::check_view(*dfinal_state, "dfinal_state");
    if (dfinal_state->batch() != S)
      fail(kWhere, "dfinal_state must hold one state gradient per sequence (" + std::to_string(S) +
                       ", H, F, state columns), got " + core::dims_text(*dfinal_state));
  }
  struct Views {
    TensorView dout, q, k, v, out, lse, dlse, dfinal;
  };
  auto views = [&](int64_t b) {
    const int64_t nq = cu_q[b + 1] - cu_q[b], nk = cu_k[b + 1] - cu_k[b];
    Views w{cache_view::tokens(dout, cu_q[b], nq), cache_view::tokens(q, cu_q[b], nq), cache_view::tokens(k, cu_k[b], nk),
            cache_view::tokens(v, cu_k[b], nk), cache_view::tokens(out, cu_q[b], nq), {}, {}, {}};
    if (!lse.empty()) w.lse = cache_view::tokens(lse, cu_q[b], nq);
    if (dlse) w.dlse = cache_view::tokens(*dlse, cu_q[b], nq);
    if (dfinal_state) w.dfinal = varlen::state_row(*dfinal_state, b);
    return w;
  };
  auto runs = [&](const Views& w) { return w.q.tokens() > 0 || w.k.tokens() > 0; };
  for (int64_t b = 0; b < S; ++b) {  // every sequence checked before the first runs
    const Views w = views(b);
    if (runs(w)) (void)explain_backward(w.q, w.k, w.v, mech, varlen::sequence_options(kWhere, opt, b, S));
  }
  AttendGradients g;
  g.dq = Tensor(q.dtype, {1, q.heads(), T, q.dim()});
  g.dk = Tensor(k.dtype, {1, k.heads(), k.tokens(), k.dim()});
  g.dv = Tensor(v.dtype, {1, v.heads(), v.tokens(), v.dim()});
  const ArrayView* s0 = varlen::initial_state(opt);
  if (s0) {
    (void)varlen::sequence_options(kWhere, opt, 0, S);  // one state per sequence
    g.d_initial_state = Tensor(DType::f32, {s0->shape[0], s0->shape[1], s0->shape[2], s0->shape[3]});
  }
  for (int64_t b = 0; b < S; ++b) {
    const Views w = views(b);
    if (!runs(w)) {  // no token: the final state is the initial one, and so is its gradient
      if (s0 && dfinal_state) cache_view::copy(w.dfinal, varlen::state_row(g.d_initial_state.view(), b));
      continue;
    }
    const AttendOptions o = varlen::sequence_options(kWhere, opt, b, S);
    AttendGradients one = attend_backward(w.dout, w.q, w.k, w.v, w.out, w.lse, mech, o, dlse ? &w.dlse : nullptr,
                                          dfinal_state ? &w.dfinal : nullptr);
    cache_view::copy(one.dq.view(), cache_view::tokens(g.dq.view(), cu_q[b], w.q.tokens()));
    cache_view::copy(one.dk.view(), cache_view::tokens(g.dk.view(), cu_k[b], w.k.tokens()));
    cache_view::copy(one.dv.view(), cache_view::tokens(g.dv.view(), cu_k[b], w.k.tokens()));
    if (s0) cache_view::copy(one.d_initial_state.view(), varlen::state_row(g.d_initial_state.view(), b));
    for (auto& [name, t] : one.dparams) {  // summed over the sequences, in order
      auto [it, first] = g.dparams.try_emplace(name);
      if (first) {
        it->second = std::move(t);
        continue;
      }
      float* sum = static_cast<float*>(it->second.view().data);
      const float* add = static_cast<const float*>(t.view().data);
      for (int64_t e = 0; e < t.view().numel(); ++e) sum[e] += add[e];
    }
  }
  return g;
} catch (const std::bad_alloc&) {
  core::fail_out_of_memory(kWhere, "running the backward of", mech, q);
}

}  // namespace attn
