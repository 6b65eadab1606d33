// attend_with_kvcache: check everything, then append the new rows (rotated when asked), then run
// one attend() per sequence against its own prefix of the cache. Per-sequence calls give each
// sequence its own bottom-right alignment (causal, windows) without a per-entry offset in the
// engine; each call still spreads its keys over every thread (split-K), so a batch of one
// decoding sequence, the common case, loses nothing.
#include "attn/kv_cache.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "attn/error.hpp"
#include "attn/info.hpp"
#include "cache/cache_memory.hpp"
#include "cache/sequence_views.hpp"
#include "core/io_checks.hpp"
#include "core/kv_rows.hpp"
#include "core/out_of_memory.hpp"
#include "rope/rope_tables.hpp"

namespace attn {
namespace {

const char* kWhere = "attend_with_kvcache";

struct Plan {
  int64_t B = 0, H = 0, Hkv = 0, N = 0, D = 0, Dv = 0, Nnew = 0, capacity = 0;
  std::vector<int64_t> before;               // tokens cached per sequence before the call
  std::shared_ptr<const core::PageTable> pages;  // paged caches
  int64_t after(int64_t b) const { return before[static_cast<size_t>(b)] + Nnew; }
};

void check_new_rows(const TensorView& t, const TensorView& cache, const char* name, const Plan& p, int64_t dim) {
  core::check_view(t, name);
  if (t.dtype != cache.dtype)
    fail(kWhere, std::string(name) + " must have the cache's dtype " + dtype_name(cache.dtype) + ", got " +
                     dtype_name(t.dtype));
  if (t.batch() != p.B || t.heads() != p.Hkv || t.dim() != dim)
    fail(kWhere, std::string(name) + " must be (batch of q, heads of the cache, new tokens, " + std::to_string(dim) +
                     ") = (" + std::to_string(p.B) + ", " + std::to_string(p.Hkv) + ", Nnew, " + std::to_string(dim) +
                     "), got " + core::dims_text(t));
}

// Positions "a..b" that entry i of a sequence's block table holds.
std::string block_positions(const core::PageTable& t, int64_t i) {
  return std::to_string(i * t.page) + ".." + std::to_string((i + 1) * t.page - 1);
}

// A block written by this call must hold one run of positions of one sequence: listed twice in
// the writing sequence's table, the new rows of one entry would overwrite the keys of the other;
// named by another sequence of the call, they would change what that sequence reads.
void check_written_blocks(const Plan& p) {
  const core::PageTable& t = *p.pages;
  if (p.Nnew == 0) return;
  auto entry = [&](int64_t b, int64_t i) { return t.table[static_cast<size_t>(b * t.per_seq + i)]; };
  auto used = [&](int64_t b) { return (p.after(b) + t.page - 1) / t.page; };  // entries sequence b reads
  std::map<int32_t, int64_t> writer;
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t first_written = p.before[static_cast<size_t>(b)] / t.page;
    std::map<int32_t, int64_t> seen;  // block -> its first entry in this sequence's table
    for (int64_t i = 0; i < used(b); ++i) {
      const auto [s, fresh] = seen.emplace(entry(b, i), i);
      if (!fresh && i >= first_written)
        fail(kWhere, "block_table[" + std::to_string(b) + "] lists block " + std::to_string(entry(b, i)) +
                         " at entries " + std::to_string(s->second) + " and " + std::to_string(i) + " (positions " +
                         block_positions(t, s->second) + " and " + block_positions(t, i) + " of sequence " +
                         std::to_string(b) + "), and this call writes it: its new keys would overwrite its own; "
                         "give each entry a block of its own");
    }
    for (int64_t i = first_written; i < used(b); ++i) {
      const int32_t blk = entry(b, i);
      const auto [w, fresh] = writer.emplace(blk, b);
      if (!fresh && w->second != b)
        fail(kWhere, "block " + std::to_string(blk) + " is written by sequences " + std::to_string(w->second) + " and " +
                         std::to_string(b) + " (positions " + block_positions(t, i) + " of sequence " +
                         std::to_string(b) + "); give each sequence its own block for new tokens");
    }
  }
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t i = 0; i < used(b); ++i) {
      const int32_t blk = entry(b, i);
      const auto w = writer.find(blk);
      if (w != writer.end() && w->second != b)
        fail(kWhere, "block " + std::to_string(blk) + " is written by sequence " + std::to_string(w->second) +
                         " and read by sequence " + std::to_string(b) + " (its positions " + block_positions(t, i) +
                         "); give each sequence its own block for new tokens");
    }
}

Plan check_cache(const TensorView& q, const TensorView& kc, const TensorView& vc, const KvCacheUpdate& u,
                 const AttendOptions& opt) {
  core::check_view(q, "q");
  core::check_view(kc, "k_cache");
  core::check_view(vc, "v_cache");
  Plan p;
  p.B = q.batch(), p.H = q.heads(), p.N = q.tokens(), p.D = q.dim(), p.Hkv = kc.heads(), p.Dv = vc.dim();
  if (!opt.key_padding_lengths.empty() || opt.mask || opt.block_mask || opt.mask_mod || opt.bias || opt.paged)
    fail(kWhere, "options must not carry key padding, masks, a bias or paged (the cache lengths say which keys exist; "
                 "a paged cache goes in update.paged)");
  if (u.k.has_value() != u.v.has_value()) fail(kWhere, "give both new k and new v, or neither");
  if (u.paged) {
    if (vc.shape[0] != kc.shape[0] || vc.shape[2] != kc.shape[2] || vc.heads() != kc.heads())
      fail(kWhere, "v_cache must be a pool of the k_cache's (blocks, heads, block size) = " + core::dims_text(kc) +
                       ", got " + core::dims_text(vc));
    const int64_t page = kc.tokens();
    if (page < 1) fail(kWhere, "a paged k_cache must have a block size of at least 1, got shape " + core::dims_text(kc));
    if (u.paged->blocks_per_seq < 1 || static_cast<int64_t>(u.paged->block_table.size()) != p.B * u.paged->blocks_per_seq)
      fail(kWhere, "block_table must be (batch, blocks per sequence >= 1) = " + std::to_string(p.B) + " x " +
                       std::to_string(u.paged->blocks_per_seq) + " entries, got " +
                       std::to_string(u.paged->block_table.size()));
    p.capacity = u.paged->blocks_per_seq * page;
    auto t = std::make_shared<core::PageTable>();
    t->table = u.paged->block_table, t->per_seq = u.paged->blocks_per_seq, t->page = page;
    p.pages = t;
  } else {
    if (kc.batch() != p.B || vc.batch() != p.B)
      fail(kWhere, "k_cache and v_cache must have q's batch " + std::to_string(p.B) + ", got " + core::dims_text(kc) +
                       " and " + core::dims_text(vc));
    if (vc.tokens() != kc.tokens())
      fail(kWhere, "v_cache must have k_cache's capacity " + std::to_string(kc.tokens()) + ", got " +
                       std::to_string(vc.tokens()));
    p.capacity = kc.tokens();
  }
  if (u.k) {
    check_new_rows(*u.k, kc, "k", p, kc.dim());
    check_new_rows(*u.v, vc, "v", p, p.Dv);
    if (u.v->tokens() != u.k->tokens())
      fail(kWhere, "new k and v must have the same tokens, got " + std::to_string(u.k->tokens()) + " and " +
                       std::to_string(u.v->tokens()));
    p.Nnew = u.k->tokens();
  }
  if (u.cache_seqlens.empty()) {
    p.before.assign(static_cast<size_t>(p.B), p.capacity);
  } else {
    if (static_cast<int64_t>(u.cache_seqlens.size()) != p.B)
      fail(kWhere, "cache_seqlens must have one length per sequence (" + std::to_string(p.B) + "), got " +
                       std::to_string(u.cache_seqlens.size()));
    p.before = u.cache_seqlens;
  }
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t len = p.before[static_cast<size_t>(b)];
    if (len < 0 || len > p.capacity)
      fail(kWhere, "cache_seqlens[" + std::to_string(b) + "] must be in [0, " + std::to_string(p.capacity) +
                       "] (the cache's capacity), got " + std::to_string(len));
    if (p.Nnew > p.capacity - len)
      fail(kWhere, "the cache of sequence " + std::to_string(b) + " overflows: it holds " + std::to_string(len) +
                       " tokens, " + std::to_string(p.Nnew) + " new ones do not fit its capacity " +
                       std::to_string(p.capacity));
  }
  if (p.pages) {
    const core::PageTable& t = *p.pages;
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t i = 0; i < (p.after(b) + t.page - 1) / t.page; ++i) {
        const int32_t blk = t.table[static_cast<size_t>(b * t.per_seq + i)];
        if (blk < 0 || blk >= kc.batch())
          fail(kWhere, "block_table[" + std::to_string(b) + "][" + std::to_string(i) + "] must name a block in [0, " +
                           std::to_string(kc.batch()) + ") (the pool's blocks), got " + std::to_string(blk));
      }
    check_written_blocks(p);
  }
  return p;
}

// Position of query i of sequence b (rotary).
int64_t query_position(const Plan& p, bool per_token, int64_t b, int64_t i) {
  return p.after(b) - p.N + (per_token ? i : 0);
}

void check_rotary(const Plan& p, const RotaryTables& r, bool per_token) {
  rope::check_rope_tables(p.D, r.cos, r.sin);
  const int64_t P = r.cos.tokens();
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t first = std::min(p.before[static_cast<size_t>(b)], query_position(p, per_token, b, 0));
    const int64_t last = std::max(p.after(b) - 1, query_position(p, per_token, b, p.N - 1));
    if (first < 0)
      fail(kWhere, "sequence " + std::to_string(b) + " has " + std::to_string(p.N) + " queries but only " +
                       std::to_string(p.after(b)) + " keys: its first query would sit at rotary position " +
                       std::to_string(first));
    if (last >= P)
      fail(kWhere, "sequence " + std::to_string(b) + " needs rotary positions up to " + std::to_string(last) +
                       ", the tables have " + std::to_string(P));
  }
}

// The cache as sequence b sees it after the append: its first after(b) keys.
TensorView sequence_cache(const Plan& p, const TensorView& cache, int64_t b) {
  return p.pages ? cache : cache_view::tokens(cache_view::entry(cache, b), 0, p.after(b));
}

AttendOptions sequence_options(const Plan& p, const AttendOptions& opt, int64_t b) {
  AttendOptions o = opt;
  if (p.pages) {
    const auto first = p.pages->table.begin() + b * p.pages->per_seq;
    o.paged = PagedKv{std::vector<int32_t>(first, first + p.pages->per_seq), p.pages->per_seq, p.after(b)};
  }
  if (static_cast<int64_t>(opt.alibi_slopes.size()) == p.B * p.H)
    o.alibi_slopes.assign(opt.alibi_slopes.begin() + b * p.H, opt.alibi_slopes.begin() + (b + 1) * p.H);
  return o;
}

// new rows -> cache rows, element by element in the storage type (same dtype, any strides).
void write_rows(const Plan& p, const TensorView& src, const TensorView& cache) {
  const auto size = static_cast<int64_t>(dtype_size(cache.dtype));
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.Hkv; ++h) {
      const core::KvRows dst(cache, b, h, p.pages.get());
      for (int64_t i = 0; i < p.Nnew; ++i) {
        char* d = const_cast<char*>(dst.row(p.before[static_cast<size_t>(b)] + i));
        const char* s = src.ptr(b, h, i);
        for (int64_t c = 0; c < src.dim(); ++c)
          std::memcpy(d + c * dst.elem_stride() * size, s + c * src.strides[3] * size, static_cast<size_t>(size));
      }
    }
}

// Memory the call writes must be its own: written cache rows no other row of either cache
// (cache_memory.hpp), out and lse nothing the call reads (they are written while the caches,
// q and the new rows are still read).
void check_memory(const Plan& p, const TensorView& q, const TensorView& kc, const TensorView& vc,
                  const KvCacheUpdate& u, const TensorView& out, const TensorView* lse) {
  cache_memory::check_written_rows_are_private(kc, vc, p.pages.get(), p.before, p.Nnew, kWhere);
  std::vector<std::pair<const TensorView*, const char*>> read = {{&q, "q"}, {&kc, "k_cache"}, {&vc, "v_cache"}};
  if (u.k) read.insert(read.end(), {{&*u.k, "k"}, {&*u.v, "v"}});
  std::vector<std::pair<const TensorView*, const char*>> outputs = {{&out, "out"}};
  if (lse) outputs.emplace_back(lse, "lse");
  for (const auto& [o, oname] : outputs) {
    const cache_memory::Span written = cache_memory::span_of(*o);
    for (const auto& [r, rname] : read)
      if (written.overlaps(cache_memory::span_of(*r)))
        fail(kWhere, std::string(oname) + " shares memory with " + rname + ", which the call reads while writing " +
                         oname + "; give " + oname + " memory of its own");
    if (!cache_memory::elements_distinct(*o))
      fail(kWhere, std::string(oname) + " is " + describe(*o) + ": two of its elements share memory; give " + oname +
                       " one place per element");
  }
  if (lse && cache_memory::span_of(out).overlaps(cache_memory::span_of(*lse)))
    fail(kWhere, "out and lse share memory; give each memory of its own");
}

// A copy of t when it shares bytes with a cache this call writes (else an empty Tensor).
Tensor own_copy_if_in_caches(const TensorView& t, const Plan& p, const TensorView& kc, const TensorView& vc) {
  if (p.Nnew == 0) return {};
  const cache_memory::Span s = cache_memory::span_of(t);
  if (!s.overlaps(cache_memory::span_of(kc)) && !s.overlaps(cache_memory::span_of(vc))) return {};
  Tensor copy(t.dtype, t.shape);
  cache_view::copy(t, copy.view());
  return copy;
}

}  // namespace

void attend_with_kvcache_into(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                              const KvCacheUpdate& u, const Mechanism& mech, const AttendOptions& opt,
                              const TensorView& out, const TensorView* lse) try {
  if (opt.return_stats) fail(kWhere, "return_stats: row statistics are not returned by cache calls (use attend)");
  if (opt.kv_scales)
    fail(kWhere, "kv_scales: cache calls append float rows; for an int8 cache round the rows with quantize_rows and "
                 "call attend with kv_scales");
  const Plan p = check_cache(q, k_cache, v_cache, u, opt);
  // flash-attn rotates q token by token when the mask depends on positions, else all at one.
  const MechanismInfo facts = info(mech);
  const bool per_token = facts.position_mask;
  if (u.rotary && facts.applies_positions)
    fail(kWhere, "rotary_cos/rotary_sin: " + facts.family + " applies RoPE itself (give q and k unrotated, and no tables)");
  if (u.rotary) check_rotary(p, *u.rotary, per_token);
  // Every sequence's attention is validated against the cache as it will be, before any write.
  for (int64_t b = 0; b < p.B; ++b) {
    AttendOptions o = sequence_options(p, opt, b);
    o.return_lse = lse != nullptr;
    (void)explain(cache_view::entry(q, b), sequence_cache(p, k_cache, b), sequence_cache(p, v_cache, b), mech, o);
  }
  core::check_view(out, "out");
  if (out.shape != std::array<int64_t, 4>{p.B, p.H, p.N, p.Dv} || !core::is_float(out.dtype))
    fail(kWhere, "out must be float (B, H, N, Dv) = (" + std::to_string(p.B) + ", " + std::to_string(p.H) + ", " +
                     std::to_string(p.N) + ", " + std::to_string(p.Dv) + "), got " + dtype_name(out.dtype) + " " +
                     core::dims_text(out));
  if (lse && (lse->shape != std::array<int64_t, 4>{p.B, p.H, p.N, 1} || lse->dtype != DType::f32))
    fail(kWhere, "lse must be float32 (B, H, N, 1), got " + dtype_name(lse->dtype) + " " + core::dims_text(*lse));

  check_memory(p, q, k_cache, v_cache, u, out, lse);

  // Rotated copies (q is the caller's and stays as it is; new k is rotated once, then stored).
  Tensor q_rot, k_rot;
  if (u.rotary) {
    q_rot = Tensor(q.dtype, q.shape);
    cache_view::copy(q, q_rot.view());
    std::vector<int64_t> pos;
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t i = 0; i < p.N; ++i) pos.push_back(query_position(p, per_token, b, i));
    apply_rope_table(q_rot.view(), u.rotary->cos, u.rotary->sin, u.rotary->style, pos);
    if (u.k) {
      k_rot = Tensor(u.k->dtype, u.k->shape);
      cache_view::copy(*u.k, k_rot.view());
      pos.clear();
      for (int64_t b = 0; b < p.B; ++b)
        for (int64_t i = 0; i < p.Nnew; ++i) pos.push_back(p.before[static_cast<size_t>(b)] + i);
      apply_rope_table(k_rot.view(), u.rotary->cos, u.rotary->sin, u.rotary->style, pos);
    }
  }
  // Inputs that are views of the caches (flash-attn lets new k be a slice of k_cache, say) are
  // copied aside first, so that every row written and every query read is the caller's value
  // from before the call.
  const Tensor k_own = k_rot.defined() || !u.k ? Tensor() : own_copy_if_in_caches(*u.k, p, k_cache, v_cache);
  const Tensor v_own = u.v ? own_copy_if_in_caches(*u.v, p, k_cache, v_cache) : Tensor();
  if (!q_rot.defined()) q_rot = own_copy_if_in_caches(q, p, k_cache, v_cache);
  if (u.k) {
    write_rows(p, k_rot.defined() ? k_rot.view() : k_own.defined() ? k_own.view() : *u.k, k_cache);
    write_rows(p, v_own.defined() ? v_own.view() : *u.v, v_cache);
  }
  const TensorView& qq = q_rot.defined() ? q_rot.view() : q;
  for (int64_t b = 0; b < p.B; ++b) {
    const TensorView lb = lse ? cache_view::entry(*lse, b) : TensorView{};
    attend_into(cache_view::entry(qq, b), sequence_cache(p, k_cache, b), sequence_cache(p, v_cache, b), mech,
                sequence_options(p, opt, b), cache_view::entry(out, b), lse ? &lb : nullptr, nullptr);
  }
} catch (const std::bad_alloc&) {
  core::fail_out_of_memory("attend_with_kvcache", "running", mech, q);
}

AttendResult attend_with_kvcache(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                                 const KvCacheUpdate& update, const Mechanism& mechanism, const AttendOptions& options) try {
  core::check_view(q, "q");  // before allocating from their shapes
  core::check_view(v_cache, "v_cache");
  AttendResult r;
  r.out = Tensor(q.dtype, {q.batch(), q.heads(), q.tokens(), v_cache.dim()}, options.out_layout.value_or(Layout::bhnd));
  if (options.return_lse) r.lse = Tensor(DType::f32, {q.batch(), q.heads(), q.tokens(), 1});
  attend_with_kvcache_into(q, k_cache, v_cache, update, mechanism, options, r.out.view(),
                           options.return_lse ? &r.lse.view() : nullptr);
  return r;
} catch (const std::bad_alloc&) {
  core::fail_out_of_memory("attend_with_kvcache", "running", mechanism, q);
}

}  // namespace attn
