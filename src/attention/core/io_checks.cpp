// Every check on q, k, v and the outputs, once, at the entry point. Messages name the argument,
// the expected and the actual value.
#include "core/io_checks.hpp"
#include "core/row_stats.hpp"

#include <cmath>
#include <cstdio>
#include <limits>

#include "attn/error.hpp"
#include "base/checked_math.hpp"
#include "base/parallel.hpp"

namespace attn::core {
namespace {

const char* kWhere = "attend";

void check_shape(const TensorView& v, const std::string& name, std::array<int64_t, 4> want, LazyText meaning) {
  if (v.shape != want)
    fail(kWhere, name + " must have shape " + meaning.str() + " = (" + std::to_string(want[0]) + ", " +
                     std::to_string(want[1]) + ", " + std::to_string(want[2]) + ", " + std::to_string(want[3]) +
                     "), got " + dims_text(v));
}

// A paged call's M (tokens, or every row of every block of a table row).
int64_t check_pages(const PagedKv& pg, const Dims& d, const TensorView& pool) {
  const int64_t page = pool.shape[2];
  if (page < 1) fail(kWhere, "a paged k must have a block size (dim 2) of at least 1, got shape " + dims_text(pool));
  if (pg.blocks_per_seq < 0)
    fail(kWhere, "paged.blocks_per_seq must be >= 0, got " + std::to_string(pg.blocks_per_seq));
  int64_t entries, capacity;
  if (__builtin_mul_overflow(d.B, pg.blocks_per_seq, &entries) || static_cast<int64_t>(pg.block_table.size()) != entries)
    fail(kWhere, "paged.block_table must have batch x blocks_per_seq = " + std::to_string(d.B) + " x " +
                     std::to_string(pg.blocks_per_seq) + " entries, got " + std::to_string(pg.block_table.size()));
  if (__builtin_mul_overflow(pg.blocks_per_seq, page, &capacity))
    fail(kWhere, "paged.blocks_per_seq x block size overflows 64-bit sizes");
  if (pg.tokens < -1 || pg.tokens > capacity)
    fail(kWhere, "paged.tokens must be in [0, blocks_per_seq x block size = " + std::to_string(capacity) +
                     "] (or -1 for all of them), got " + std::to_string(pg.tokens));
  return pg.tokens < 0 ? capacity : pg.tokens;
}

// Every block a batch entry's valid keys live in must be a block of the pool.
std::shared_ptr<const PageTable> checked_block_table(const PagedKv& pg, const Dims& d, const TensorView& pool) {
  auto t = std::make_shared<PageTable>();
  t->table = pg.block_table, t->per_seq = pg.blocks_per_seq, t->page = pool.shape[2];
  for (int64_t b = 0; b < d.B; ++b) {
    const int64_t used = (d.kv_len[static_cast<size_t>(b)] + t->page - 1) / t->page;
    for (int64_t i = 0; i < used; ++i) {
      const int32_t blk = t->table[static_cast<size_t>(b * t->per_seq + i)];
      if (blk < 0 || blk >= pool.shape[0])
        fail(kWhere, "paged.block_table[" + std::to_string(b) + "][" + std::to_string(i) + "] must name a block in [0, " +
                         std::to_string(pool.shape[0]) + ") (the pool's blocks), got " + std::to_string(blk));
    }
  }
  return t;
}

}  // namespace

void check_causal_tokens(const Dims& p, LazyText text) {
  if (p.N != p.M)
    fail(kWhere, text.str() +
                     " is causal: each token brings its q, k and v, so N (queries) must equal M (keys), got N = " +
                     std::to_string(p.N) + ", M = " + std::to_string(p.M) + " (pass earlier tokens as initial_state)");
}

void refuse_score_options(const AttendOptions& opt, LazyText kind, LazyText why) {
  auto refuse = [&](bool given, const char* what) {
    if (given) fail(kWhere, kind.str() + " does not take " + what + " (" + why.str() + ")");
  };
  refuse(opt.mask.has_value(), "a boolean mask");
  refuse(opt.block_mask.has_value() || static_cast<bool>(opt.mask_mod), "a block mask or mask_mod");
  refuse(opt.bias.has_value(), "an additive bias");
  refuse(!opt.alibi_slopes.empty(), "ALiBi slopes");
}

std::string dims_text(const TensorView& v) {
  return "(" + std::to_string(v.shape[0]) + ", " + std::to_string(v.shape[1]) + ", " + std::to_string(v.shape[2]) +
         ", " + std::to_string(v.shape[3]) + ")";
}

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// Shape non-negative, data present when non-empty, largest offset representable.
void check_view(const TensorView& v, const std::string& name) {
  // Messages are built only on failure: this runs for every view of every call.
  auto overflow = [&](const char* what, int64_t a, int64_t b) {
    fail(kWhere, name + " " + what + ": " + std::to_string(a) + " * " + std::to_string(b) +
                     " overflows 64-bit sizes (shape " + dims_text(v) + ")");
  };
  int64_t n = 1;
  for (int i = 0; i < 4; ++i) {
    if (v.shape[i] < 0) fail(kWhere, name + " has negative dimension " + std::to_string(i) + " in shape " + dims_text(v));
    if (__builtin_mul_overflow(n, v.shape[i], &n)) overflow("element count", n, v.shape[i]);
  }
  int64_t bytes;
  if (__builtin_mul_overflow(n, static_cast<int64_t>(dtype_size(v.dtype)), &bytes))
    overflow("bytes", n, static_cast<int64_t>(dtype_size(v.dtype)));
  int64_t span = 0;
  for (int i = 0; i < 4; ++i) {
    if (v.shape[i] == 0) continue;
    const int64_t s = v.strides[i] < 0 ? -v.strides[i] : v.strides[i];
    int64_t extent;
    if (__builtin_mul_overflow(v.shape[i] - 1, s, &extent) || __builtin_add_overflow(span, extent, &span))
      overflow("extent", v.shape[i] - 1, s);
  }
  if (n > 0 && v.data == nullptr) fail(kWhere, name + " has " + std::to_string(n) + " elements but no data");
}

void check_finite(double x, const std::string& name) {
  if (!std::isfinite(x)) fail(kWhere, name + " must be finite, got " + std::to_string(x));
}

void check_positive_float32(double x, const std::string& name) {
  check_finite(x, name);
  if (x <= 0) fail(kWhere, name + " must be > 0, got " + std::to_string(x));
  const float f = static_cast<float>(x);
  if (!(std::isfinite(f) && f >= std::numeric_limits<float>::min())) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", x);
    fail(kWhere, name + " must be a positive finite float32 (between 1.2e-38 and 3.4e38), got " + buf);
  }
}

Dims check_io(const TensorView& q, const TensorView& k, const TensorView& v, const Outputs& outs,
              const AttendOptions& opt, KvStorage storage) {
  check_view(q, "q");
  check_view(k, "k");
  check_view(v, "v");
  if (!is_float(q.dtype)) fail(kWhere, "q must be float32, bfloat16 or float16, got " + dtype_name(q.dtype));
  if (opt.kv_scales) {
    if (storage == KvStorage::views)
      fail(kWhere, "int8 k and v rows (options.kv_scales) are read by the softmax family only (softmax, longformer, "
                   "bigbird); pass float k and v");
    for (auto [t, name] : {std::pair{&k, "k"}, {&v, "v"}})
      if (t->dtype != DType::i8)
        fail(kWhere, std::string(name) + " must be int8 with options.kv_scales, got " + dtype_name(t->dtype));
  } else {
    for (auto [t, name] : {std::pair{&k, "k"}, {&v, "v"}})
      if (!is_float(t->dtype))
        fail(kWhere, std::string(name) + " must be float32, bfloat16 or float16, got " + dtype_name(t->dtype) +
                         (t->dtype == DType::i8 ? " (int8 rows need their scales: options.kv_scales)" : ""));
    if (k.dtype != q.dtype || v.dtype != q.dtype)
      fail(kWhere, "q, k and v must share a dtype, got q " + dtype_name(q.dtype) + ", k " + dtype_name(k.dtype) +
                       ", v " + dtype_name(v.dtype));
  }

  Dims d;
  d.q = q, d.k = k, d.v = v;
  d.B = q.shape[0], d.H = q.shape[1], d.N = q.shape[2], d.D = q.shape[3];
  d.Hkv = k.shape[1], d.M = k.shape[2], d.Dv = v.shape[3];
  if (d.H < 1) fail(kWhere, "q must have at least one head, got shape " + dims_text(q));
  if (d.Hkv < 1) fail(kWhere, "k must have at least one head, got shape " + dims_text(k));
  if (d.D < 1) fail(kWhere, "head_dim of q must be at least 1, got shape " + dims_text(q));
  if (d.Dv < 1) fail(kWhere, "head_dim of v must be at least 1, got shape " + dims_text(v));
  if (k.shape[3] != d.D) fail(kWhere, "k has head_dim " + std::to_string(k.shape[3]) + ", q has " + std::to_string(d.D));
  if (opt.paged) {
    if (storage == KvStorage::views)
      fail(kWhere, "a paged KV cache (options.paged) is read by the softmax family only (softmax, longformer, "
                   "bigbird); pass k and v as plain views");
    check_shape(v, "v", {k.shape[0], d.Hkv, k.shape[2], d.Dv}, "(blocks of k, heads of k, block size of k, Dv)");
    d.M = check_pages(*opt.paged, d, k);  // the table itself once the valid lengths are known (below)
  } else {
    if (k.shape[0] != d.B) fail(kWhere, "k has batch " + std::to_string(k.shape[0]) + ", q has " + std::to_string(d.B));
    check_shape(v, "v", {d.B, d.Hkv, d.M, d.Dv}, "(batch of q, heads of k, tokens of k, Dv)");
  }
  if (d.H % d.Hkv != 0)
    fail(kWhere, "k has " + std::to_string(d.Hkv) + " heads, which does not divide q's " + std::to_string(d.H));
  d.group = d.H / d.Hkv;

  if (outs.out) {
    const TensorView& out = *outs.out;
    check_view(out, "out");
    if (!is_float(out.dtype)) fail(kWhere, "out must be a float dtype, got " + dtype_name(out.dtype));
    check_shape(out, "out", {d.B, d.H, d.N, d.Dv}, "(B, H, N, Dv)");
  }
  if (outs.lse) {
    check_view(*outs.lse, "lse");
    if (outs.lse->dtype != DType::f32) fail(kWhere, "lse must be float32, got " + dtype_name(outs.lse->dtype));
    check_shape(*outs.lse, "lse", {d.B, d.H, d.N, 1}, "(B, H, N, 1)");
  }
  if (outs.probs) {
    check_view(*outs.probs, "probs");
    if (outs.probs->dtype != DType::f32) fail(kWhere, "probs must be float32, got " + dtype_name(outs.probs->dtype));
    check_shape(*outs.probs, "probs", {d.B, d.H, d.N, d.M}, "(B, H, N, M)");
  }
  d.kv_len.assign(static_cast<size_t>(d.B), d.M);
  if (!opt.key_padding_lengths.empty()) {
    if (static_cast<int64_t>(opt.key_padding_lengths.size()) != d.B)
      fail(kWhere, "key_padding_lengths must have one length per batch (" + std::to_string(d.B) + "), got " +
                       std::to_string(opt.key_padding_lengths.size()));
    for (size_t b = 0; b < d.kv_len.size(); ++b) {
      const int64_t len = opt.key_padding_lengths[b];
      if (len < 0 || len > d.M)
        fail(kWhere, "key_padding_lengths[" + std::to_string(b) + "] must be in [0, " + std::to_string(d.M) +
                         "], got " + std::to_string(len));
      d.kv_len[b] = len;
    }
  }
  if (opt.paged) d.pages = checked_block_table(*opt.paged, d, k);
  if (opt.kv_scales) {  // one float32 scale per row of k and of v (of the pools when paged)
    auto scales = [&](const TensorView& s, const TensorView& rows, const std::string& name) {
      check_view(s, name);
      if (s.dtype != DType::f32) fail(kWhere, name + " must be float32, got " + dtype_name(s.dtype));
      check_shape(s, name, {rows.shape[0], rows.shape[1], rows.shape[2], 1},
                  opt.paged ? "(blocks, heads, block size, 1) of its pool" : "(B, Hkv, M, 1)");
      return s;
    };
    d.k_scale = scales(opt.kv_scales->k, k, "kv_scales.k");
    d.v_scale = scales(opt.kv_scales->v, v, "kv_scales.v");
  }
  if (opt.threads < 0 || opt.threads > kMaxThreads)
    fail(kWhere, "threads must be in [0, " + std::to_string(kMaxThreads) + "] (0 = all CPUs), got " +
                     std::to_string(opt.threads));
  if (opt.row_cache_bytes < 0)
    fail(kWhere, "row_cache_bytes must be >= 0, got " + std::to_string(opt.row_cache_bytes));
  if (opt.return_stats || outs.wants_stats()) {
    if (opt.stats_topk < 1 || opt.stats_topk > kMaxStatsTopk)
      fail(kWhere, "stats_topk must be in [1, " + std::to_string(kMaxStatsTopk) + "], got " +
                       std::to_string(opt.stats_topk));
    d.stats_topk = opt.stats_topk;
  }
  return d;
}

void check_stats_views(const Dims& d, const RowStatsViews& s) {
  const std::pair<const TensorView*, const char*> views[] = {
      {&s.sparsity, "sparsity"}, {&s.entropy, "entropy"}, {&s.max_weight, "max_weight"}, {&s.topk_mass, "topk_mass"}};
  for (const auto& [v, name] : views) {
    check_view(*v, name);
    if (v->dtype != DType::f32) fail(kWhere, std::string(name) + " must be float32, got " + dtype_name(v->dtype));
    check_shape(*v, name, {d.B, d.H, d.N, 1}, "(B, H, N, 1)");
  }
}

std::string describe_verdicts(const std::vector<FormVerdict>& v) {
  std::string o;
  for (const auto& f : v) {
    o += (o.empty() ? "" : "; ") + f.form + ": ";
    if (f.reasons.empty()) {
      o += "supported";
      continue;
    }
    for (size_t i = 0; i < f.reasons.size(); ++i) o += (i ? ", " : "") + f.reasons[i];
  }
  return o;
}

}  // namespace attn::core
