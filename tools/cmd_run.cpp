// attn run: attention on .npy inputs, writing .npy outputs.
#include <fmt/core.h>


#include <algorithm>
#include <climits>
#include <cstring>
#include <map>

#include "attn/attn.hpp"
#ifdef ATTN_CLI_MPI
#include <mpi.h>

#include "attn/distributed.hpp"
#endif
#include "commands.hpp"
#include "usage.hpp"
#include "output_files.hpp"

namespace attn::cli {
namespace {

struct RunArgs {
  std::string mechanism = "softmax", q, k, v, out, lse, probs, final_state, stats, layout = "bhnd", mask, bias, wq, wk, w, isa, form,
      block_mask, precision = "auto";
  std::vector<int64_t> block_size = {128, 128};
  std::vector<std::string> params;  // NAME=file.npy
  std::vector<int64_t> kv_lengths;
  std::vector<float> alibi;
  // KV cache (attend_with_kvcache): --k/--v are then the new rows, appended at cache_seqlens.
  std::string k_cache, v_cache, k_cache_out, v_cache_out, rotary_cos, rotary_sin;
  std::vector<int64_t> cache_seqlens, block_table;
  int64_t blocks_per_seq = 0;
  bool rotary_interleaved = false;
  // Packed ragged batches (attend_varlen).
  std::vector<int64_t> cu_seqlens_q, cu_seqlens_k;
  int threads = 0;
  int64_t stats_topk = 8;
  bool reference = false, explain = false, distributed = false;
};

// q/k/v arrays: 4-D in the chosen layout, or 3-D (one batch).
TensorView view_of(NpyArray& a, const std::string& name, Layout layout) {
  if (a.dtype == DType::boolean) fail(name, "must be float32 or float16, got bool");
  std::vector<int64_t> s = a.shape;
  if (s.size() == 3) s.insert(s.begin(), 1);
  if (s.size() != 4)
    fail(name, "must have 4 dimensions (" + std::string(layout == Layout::bhnd ? "B, H, N, D" : "B, N, H, D") +
                   ") or 3 (one batch), got " + std::to_string(a.shape.size()));
  if (layout == Layout::bhnd) return make_view(a.bytes.data(), a.dtype, s[0], s[1], s[2], s[3], layout);
  return make_view(a.bytes.data(), a.dtype, s[0], s[2], s[1], s[3], layout);
}

// Masks and biases: (N, M), (H|1, N, M) or (B|1, H|1, N, M).
TensorView mask_view(NpyArray& a, const std::string& name) {
  std::vector<int64_t> s = a.shape;
  if (s.size() < 2 || s.size() > 4) fail(name, "must have 2 to 4 dimensions (.., N, M), got " + std::to_string(s.size()));
  while (s.size() < 4) s.insert(s.begin(), 1);
  return make_view(a.bytes.data(), a.dtype, s[0], s[1], s[2], s[3]);
}

// --param NAME=file.npy (and the aliases --wq/--wk/--w): arrays kept alive in `store`.
void add_param(const std::string& name, const std::string& path, std::map<std::string, NpyArray>& store, Params& params) {
  if (name.empty()) fail("--param", "expected NAME=file.npy, got '=" + path + "'");
  if (params.count(name)) fail("--param", "'" + name + "' is given twice");
  NpyArray& a = store[name] = read_npy(path);
  params[name] = make_array_view(a.bytes.data(), a.dtype, a.shape);
}

// A view's elements in the .npy order of `layout` (the inverse of view_of), whatever its strides.
std::vector<uint8_t> packed(const TensorView& t, Layout layout) {
  const size_t es = dtype_size(t.dtype);
  std::vector<uint8_t> out(static_cast<size_t>(t.numel()) * es);
  uint8_t* dst = out.data();
  for (int64_t b = 0; b < t.shape[0]; ++b)
    for (int64_t x = 0; x < (layout == Layout::bhnd ? t.shape[1] : t.shape[2]); ++x)
      for (int64_t y = 0; y < (layout == Layout::bhnd ? t.shape[2] : t.shape[1]); ++y, dst += t.shape[3] * es) {
        const int64_t h = layout == Layout::bhnd ? x : y, n = layout == Layout::bhnd ? y : x;
        for (int64_t c = 0; c < t.shape[3]; ++c) std::memcpy(dst + c * es, t.ptr(b, h, n, c), es);
      }
  return out;
}

std::vector<int64_t> file_shape(const TensorView& t, Layout layout, bool three_d) {
  std::vector<int64_t> s = layout == Layout::bhnd ? std::vector<int64_t>{t.shape[0], t.shape[1], t.shape[2], t.shape[3]}
                                                  : std::vector<int64_t>{t.shape[0], t.shape[2], t.shape[1], t.shape[3]};
  if (three_d) s.erase(s.begin());
  return s;
}

// --k-cache/--v-cache: append --k/--v (optional) at --cache-seqlens, attend, write the output and,
// when asked, the updated caches; --cu-seqlens-q/k: packed ragged batches.
int run_cache_or_varlen(const RunArgs& r, const Mechanism& mech, Layout layout, const AttendOptions& opt) {
  const bool cache = !r.k_cache.empty();
  if (cache && !r.cu_seqlens_q.empty()) fail("--cu-seqlens-q", "packed batches and --k-cache are separate calls: give one");
  if (r.k.empty() != r.v.empty()) fail(r.k.empty() ? "--k" : "--v", "new keys and values come together: give both or neither");
  if (!cache && (r.k.empty() || r.cu_seqlens_k.empty())) fail("--cu-seqlens-k", "packed batches need --k, --v, --cu-seqlens-q and --cu-seqlens-k");
  if (cache && r.v_cache.empty()) fail("--v-cache", "is required with --k-cache");
  if (r.out.empty()) fail("--out", "is required");
  std::vector<std::pair<std::string, std::string>> inputs = {{"--q", r.q}, {"--k", r.k}, {"--v", r.v}, {"--k-cache", r.k_cache},
                                                             {"--v-cache", r.v_cache}, {"--rotary-cos", r.rotary_cos},
                                                             {"--rotary-sin", r.rotary_sin}};
  OutputFiles files(inputs, {{"--out", r.out}, {"--lse", r.lse}, {"--k-cache-out", r.k_cache_out}, {"--v-cache-out", r.v_cache_out}});
  NpyArray qa = read_npy(r.q), ka, va, kca, vca, cosa, sina;
  const TensorView q = view_of(qa, r.q, layout);
  AttendResult res;
  if (!cache) {
    ka = read_npy(r.k), va = read_npy(r.v);
    const TensorView k = view_of(ka, r.k, layout), v = view_of(va, r.v, layout);
    int64_t max_q = 0, max_k = 0;
    for (size_t b = 1; b < r.cu_seqlens_q.size(); ++b) max_q = std::max(max_q, r.cu_seqlens_q[b] - r.cu_seqlens_q[b - 1]);
    for (size_t b = 1; b < r.cu_seqlens_k.size(); ++b) max_k = std::max(max_k, r.cu_seqlens_k[b] - r.cu_seqlens_k[b - 1]);
    res = attend_varlen(q, k, v, r.cu_seqlens_q, r.cu_seqlens_k, max_q, max_k, mech, opt);
  } else {
    kca = read_npy(r.k_cache), vca = read_npy(r.v_cache);
    KvCacheUpdate u;
    u.cache_seqlens = r.cache_seqlens;
    if (!r.k.empty()) {
      ka = read_npy(r.k), va = read_npy(r.v);
      u.k = view_of(ka, r.k, layout), u.v = view_of(va, r.v, layout);
    }
    if (!r.rotary_cos.empty() || !r.rotary_sin.empty()) {
      if (r.rotary_cos.empty() || r.rotary_sin.empty()) fail("--rotary-cos", "rotary tables come as --rotary-cos and --rotary-sin together");
      cosa = read_npy(r.rotary_cos), sina = read_npy(r.rotary_sin);
      for (NpyArray* t : {&cosa, &sina})
        if (t->shape.size() != 2) fail(t == &cosa ? "--rotary-cos" : "--rotary-sin", "must be 2-D (positions, rotary_dim / 2)");
      u.rotary = RotaryTables{make_view(cosa.bytes.data(), cosa.dtype, 1, 1, cosa.shape[0], cosa.shape[1]),
                              make_view(sina.bytes.data(), sina.dtype, 1, 1, sina.shape[0], sina.shape[1]),
                              r.rotary_interleaved ? RopeStyle::interleaved : RopeStyle::half};
    }
    if (!r.block_table.empty() || r.blocks_per_seq) {
      if (r.blocks_per_seq < 1) fail("--blocks-per-seq", "is required with --block-table (block ids per sequence)");
      u.paged = PagedKv{std::vector<int32_t>(r.block_table.begin(), r.block_table.end()), r.blocks_per_seq, -1};
      for (const int64_t id : r.block_table)
        if (id < INT32_MIN || id > INT32_MAX) fail("--block-table", "ids must fit int32, got " + std::to_string(id));
    }
    res = attend_with_kvcache(q, view_of(kca, r.k_cache, layout), view_of(vca, r.v_cache, layout), u, mech, opt);
  }
  const auto& o = res.out.view();
  files.write(r.out, o.dtype, file_shape(o, layout, qa.shape.size() == 3), packed(o, layout).data());
  if (!r.lse.empty()) files.write(r.lse, DType::f32, {o.shape[0], o.shape[1], o.shape[2]}, res.lse.view().data);
  if (!r.k_cache_out.empty()) files.write(r.k_cache_out, kca.dtype, kca.shape, kca.bytes.data());
  if (!r.v_cache_out.empty()) files.write(r.v_cache_out, vca.dtype, vca.shape, vca.bytes.data());
  files.commit();
  fmt::print("{}: q {} -> {}\n", to_string(mech), describe(q), r.out);
  return 0;
}

// --distributed: under mpirun every rank has read the whole q, k, v; it attends its shard (ring
// attention for the softmax family, zig-zag when causal; LASP-2 for linear attention) and rank 0
// gathers the rows and writes the whole output.
int run_distributed(const RunArgs& r, const Mechanism& mech, Layout layout, const TensorView& q, const TensorView& k,
                    const TensorView& v, bool three_d, OutputFiles& files) {
#ifdef ATTN_CLI_MPI
  int ready = 0;
  MPI_Initialized(&ready);
  if (!ready) MPI_Init(nullptr, nullptr);
  struct Finalize {
    ~Finalize() {
      int done = 0;
      MPI_Finalized(&done);
      if (!done) MPI_Finalize();
    }
  } finalize;
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  namespace dist = attn::distributed;
  if (k.tokens() != q.tokens() || v.tokens() != q.tokens())
    fail("--distributed", "q, k and v must have the same tokens (one sequence split across ranks), got " +
                              std::to_string(q.tokens()) + ", " + std::to_string(k.tokens()) + " and " + std::to_string(v.tokens()));
  const Linear* lin = std::get_if<Linear>(&mech);
  const bool causal = !lin && std::visit([](const auto& m) {
    if constexpr (requires { m.causal; }) return static_cast<bool>(m.causal);
    else return false;
  }, mech);
  const int64_t B = q.batch(), H = q.heads(), N = q.tokens(), Dv = v.dim();
  const std::vector<dist::Piece> pieces = dist::shard_pieces(N, size, rank, causal);
  auto take = [&](const TensorView& x) {
    Tensor t(x.dtype, {x.batch(), x.heads(), dist::shard_length(N, size, rank, causal), x.dim()});
    for (const dist::Piece& p : pieces)
      for (int64_t b = 0; b < x.batch(); ++b)
        for (int64_t h = 0; h < x.heads(); ++h)
          for (int64_t i = 0; i < p.length; ++i)
            for (int64_t c = 0; c < x.dim(); ++c)
              store_from_float(t.view().data, t.view().dtype, t.view().offset(b, h, p.local + i, c), x.at(b, h, p.start + i, c));
    return t;
  };
  const Tensor qs = take(q), ks = take(k), vs = take(v);
  AttendResult res;
  dist::RingStats st;
  if (lin) {
    res = dist::linear_attention(qs.view(), ks.view(), vs.view(), MPI_COMM_WORLD, *lin, !r.final_state.empty(), r.threads);
  } else {
    dist::RingOptions o;
    o.return_lse = !r.lse.empty();
    o.threads = r.threads;
    o.stats = &st;
    res = dist::ring_attention(qs.view(), ks.view(), vs.view(), MPI_COMM_WORLD, mech, o);
  }
  // Rank 0 gathers every rank's rows, (B, H, n_r, Dv) floats then (B, H, n_r) lse, in rank order.
  const int64_t nl = qs.view().tokens(), width = Dv + 1;
  std::vector<float> mine(static_cast<size_t>(B * H * nl * width));
  for (int64_t b = 0, at = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < nl; ++i) {
        for (int64_t c = 0; c < Dv; ++c) mine[static_cast<size_t>(at++)] = res.out.at(b, h, i, c);
        mine[static_cast<size_t>(at++)] = res.lse.defined() ? res.lse.at(b, h, i, 0) : 0.0f;
      }
  std::vector<int> counts(static_cast<size_t>(size)), displs(static_cast<size_t>(size));
  int64_t total = 0;
  for (int p = 0; p < size; ++p) {
    const int64_t n = B * H * dist::shard_length(N, size, p, causal) * width;
    if (total + n > INT_MAX) fail("--distributed", "the output exceeds MPI's int count");
    counts[static_cast<size_t>(p)] = static_cast<int>(n), displs[static_cast<size_t>(p)] = static_cast<int>(total);
    total += n;
  }
  std::vector<float> all(rank == 0 ? static_cast<size_t>(total) : 0);
  MPI_Gatherv(mine.data(), counts[static_cast<size_t>(rank)], MPI_FLOAT, all.data(), counts.data(), displs.data(),
              MPI_FLOAT, 0, MPI_COMM_WORLD);
  if (rank != 0) return 0;
  Tensor whole(q.dtype, {B, H, N, Dv}, layout);
  std::vector<float> lse(static_cast<size_t>(B * H * N));
  for (int p = 0; p < size; ++p) {
    const float* src = all.data() + displs[static_cast<size_t>(p)];
    const int64_t n = dist::shard_length(N, size, p, causal);
    for (const dist::Piece& piece : dist::shard_pieces(N, size, p, causal))
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < piece.length; ++i) {
            const float* row = src + ((b * H + h) * n + piece.local + i) * width;
            for (int64_t c = 0; c < Dv; ++c)
              store_from_float(whole.view().data, whole.view().dtype, whole.view().offset(b, h, piece.start + i, c), row[c]);
            lse[static_cast<size_t>((b * H + h) * N + piece.start + i)] = row[Dv];
          }
  }
  const TensorView& o = whole.view();
  files.write(r.out, o.dtype, file_shape(o, layout, three_d), packed(o, layout).data());
  if (!r.lse.empty()) files.write(r.lse, DType::f32, {B, H, N}, lse.data());
  if (!r.final_state.empty()) {
    const auto& f = res.final_state.view().shape;
    files.write(r.final_state, DType::f32, {f[0], f[1], f[2], f[3]}, res.final_state.view().data);
  }
  files.commit();
  if (lin)
    fmt::print("{}: q {} -> {} (distributed over {} rank{}, states all-gathered)\n", to_string(mech), describe(q), r.out,
               size, size == 1 ? "" : "s");
  else
    fmt::print("{}: q {} -> {} (distributed over {} rank{}; rank 0 sent {} bytes of K/V, attended {} piece pairs, skipped {})\n",
               to_string(mech), describe(q), r.out, size, size == 1 ? "" : "s", st.bytes_sent, st.blocks_computed,
               st.blocks_skipped);
  return 0;
#else
  (void)r, (void)mech, (void)layout, (void)q, (void)k, (void)v, (void)three_d, (void)files;
  fail("--distributed", "this attn was built without MPI: install Open MPI (Debian: openmpi-bin libopenmpi-dev) and rebuild");
#endif
}

int run(const RunArgs& r) {
  const Layout layout = r.layout == "bnhd" ? Layout::bnhd : Layout::bhnd;
  const Mechanism mech = parse_mechanism(r.mechanism);
  std::vector<std::pair<std::string, std::string>> inputs = {
      {"--q", r.q}, {"--k", r.k}, {"--v", r.v}, {"--mask", r.mask}, {"--bias", r.bias}, {"--block-mask", r.block_mask},
      {"--wq", r.wq}, {"--wk", r.wk}, {"--w", r.w}};
  for (const std::string& p : r.params) inputs.emplace_back("--param", p.substr(p.find('=') + 1));
  OutputFiles files(inputs, {{"--out", r.out}, {"--lse", r.lse}, {"--probs", r.probs}, {"--final-state", r.final_state},
                                   {"--stats", r.stats}});
  const bool cache_call = !r.k_cache.empty() || !r.v_cache.empty() || !r.cu_seqlens_q.empty() || !r.cu_seqlens_k.empty();
  if (r.distributed && (cache_call || !r.probs.empty() || !r.stats.empty() || r.explain || !r.mask.empty() ||
                        !r.bias.empty() || !r.block_mask.empty() || !r.kv_lengths.empty() || !r.alibi.empty() ||
                        !r.params.empty() || !r.wq.empty() || !r.wk.empty() || !r.w.empty() || !r.form.empty() || r.reference ||
                        r.precision != "auto"))
    fail("--distributed", "takes --out, --lse, --final-state (linear), --layout and --threads only; no caches, "
                          "packed batches, masks, biases, ALiBi, params, --probs, --stats, --explain, --form or "
                          "--precision");
  if (!cache_call && (r.k.empty() || r.v.empty())) fail(r.k.empty() ? "--k" : "--v", "is required (or --k-cache/--v-cache)");
  if (cache_call && (!r.probs.empty() || !r.final_state.empty() || !r.stats.empty() || r.explain || !r.mask.empty() ||
                     !r.kv_lengths.empty()))
    fail("--k-cache", "KV-cache and packed calls take no --probs, --final-state, --stats, --explain, --mask or --kv-lengths");
  AttendOptions opt;
  opt.threads = r.threads;
  opt.form = r.form;
  if (r.reference) {
    if (!r.form.empty() && r.form != "reference") fail("--reference", "conflicts with --form " + r.form);
    opt.form = "reference";
  }
  opt.key_padding_lengths = r.kv_lengths;
  opt.alibi_slopes = r.alibi;
  opt.return_lse = !r.lse.empty();
  opt.return_probs = !r.probs.empty();
  opt.return_final_state = !r.final_state.empty();
  opt.return_stats = !r.stats.empty();
  opt.stats_topk = r.stats_topk;
  NpyArray ma, ba, bm;
  if (!r.block_mask.empty()) {
    bm = read_npy(r.block_mask);
    if (bm.dtype != DType::boolean) fail(r.block_mask, "--block-mask must be a bool array, got " + dtype_name(bm.dtype));
    opt.block_mask = mask_view(bm, r.block_mask);
    opt.block_size = {r.block_size[0], r.block_size[1]};
  }
  if (!r.mask.empty()) {
    ma = read_npy(r.mask);
    if (ma.dtype != DType::boolean) fail(r.mask, "--mask must be a bool array (use --bias for float masks), got " + dtype_name(ma.dtype));
    opt.mask = mask_view(ma, r.mask);
  }
  if (!r.bias.empty()) {
    ba = read_npy(r.bias);
    opt.bias = mask_view(ba, r.bias);
  }
  std::map<std::string, NpyArray> param_arrays;
  for (const std::string& p : r.params) {
    const size_t eq = p.find('=');
    if (eq == std::string::npos) fail("--param", "expected NAME=file.npy, got '" + p + "'");
    add_param(p.substr(0, eq), p.substr(eq + 1), param_arrays, opt.params);
  }
  for (auto [name, path] : {std::pair{"wq", &r.wq}, {"wk", &r.wk}, {"w", &r.w}})
    if (!path->empty()) add_param(name, *path, param_arrays, opt.params);
  if (!r.isa.empty()) opt.isa = parse_isa(r.isa, "--isa");
  opt.precision = parse_precision(r.precision, "--precision");
  if (cache_call) return run_cache_or_varlen(r, mech, layout, opt);
  NpyArray qa = read_npy(r.q), ka = read_npy(r.k), va = read_npy(r.v);
  const TensorView q = view_of(qa, r.q, layout), k = view_of(ka, r.k, layout), v = view_of(va, r.v, layout);
  if (r.explain) {
    opt.return_lse = !r.lse.empty();
    opt.return_probs = !r.probs.empty();
    fmt::print("{}", explain(q, k, v, mech, opt).text());
    return 0;
  }
  if (r.out.empty()) fail("--out", "is required (except with --explain)");
  if (r.distributed) return run_distributed(r, mech, layout, q, k, v, qa.shape.size() == 3, files);
  const AttendResult res = attend(q, k, v, mech, opt);
  const auto& o = res.out.view();
  std::vector<int64_t> oshape = layout == Layout::bhnd ? std::vector<int64_t>{o.shape[0], o.shape[1], o.shape[2], o.shape[3]}
                                                       : std::vector<int64_t>{o.shape[0], o.shape[2], o.shape[1], o.shape[3]};
  if (qa.shape.size() == 3) oshape.erase(oshape.begin());
  // attend() allocates the output contiguous in q's layout and dtype (float32 or float16 here),
  // which is exactly the .npy order of `oshape`.
  files.write(r.out, o.dtype, oshape, o.data);
  const auto& s = q.shape;
  if (!r.lse.empty()) files.write(r.lse, DType::f32, {s[0], s[1], s[2]}, res.lse.view().data);
  if (!r.probs.empty()) files.write(r.probs, DType::f32, {s[0], s[1], s[2], k.shape[2]}, res.probs.view().data);
  if (!r.stats.empty()) {  // (B, H, N, 4): sparsity, entropy, max_weight, topk_mass per row
    std::vector<float> st(static_cast<size_t>(s[0] * s[1] * s[2] * 4));
    size_t at = 0;
    for (int64_t b = 0; b < s[0]; ++b)
      for (int64_t h = 0; h < s[1]; ++h)
        for (int64_t i = 0; i < s[2]; ++i)
          for (const Tensor* t : {&res.sparsity, &res.entropy, &res.max_weight, &res.topk_mass}) st[at++] = t->at(b, h, i, 0);
    files.write(r.stats, DType::f32, {s[0], s[1], s[2], 4}, st.data());
  }
  if (!r.final_state.empty()) {
    const auto& f = res.final_state.view().shape;
    files.write(r.final_state, DType::f32, {f[0], f[1], f[2], f[3]}, res.final_state.view().data);
  }
  files.commit();
  fmt::print("{}: q {} -> {}\n", to_string(mech), describe(q), r.out);
  return 0;
}

// Every family's text grammar and the range of each float option (attn::info: the families'
// facts, so the help cannot drift from what validation refuses).
std::string mechanism_help() {
  std::string o = "Mechanism text, per family (float options outside their range are refused):\n";
  for (const MechanismInfo& f : family_infos()) {
    o += "  " + f.grammar + "\n";
    if (!f.option_ranges.empty()) {
      o += "      ";
      for (size_t i = 0; i < f.option_ranges.size(); ++i) o += (i ? "; " : "") + f.option_ranges[i];
      o += "\n";
    }
  }
  return o;
}

}  // namespace

Runner add_run(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* c = app.add_subcommand("run", "Attention on .npy files: out = attend(q, k, v, mechanism)");
  c->footer(
      "Example:\n  attn run --mechanism softmax:causal --q q.npy --k k.npy --v v.npy --out o.npy --lse l.npy\n"
      "Arrays are float32 or float16, C order. With --layout bhnd (default) q is (B, H, N, D);\n"
      "with bnhd it is (B, N, H, D) (as in flash-attn and most model code). A 3-D array is one batch.\n"
      "k and v may have fewer heads than q (MQA/GQA) if that number divides q's.\n"
      "  attn run -m softmax:causal --q q.npy --k k.npy --v v.npy --explain      (which form runs, and why)\n"
      "Causal is bottom-right aligned (query i sees keys j <= i + M - N); rows that see no key give\n"
      "  zeros and lse = -inf.\n"
      "KV cache (decode one token of two sequences of 5 and 9 cached tokens, bnhd layout):\n"
      "  attn run -m softmax:causal --layout bnhd --q q.npy --k-cache kc.npy --v-cache vc.npy --k k.npy --v v.npy\n"
      "           --cache-seqlens 5,9 --out o.npy --k-cache-out kc2.npy --v-cache-out vc2.npy\n"
      "Packed sequences of 3 and 4 tokens: --layout bnhd --q q.npy --k k.npy --v v.npy --cu-seqlens-q 0,3,7 --cu-seqlens-k 0,3,7\n" +
      mechanism_help());
  c->add_option("-m,--mechanism", args->mechanism, "Mechanism text form")->capture_default_str();
  c->add_option("--q", args->q, "Queries .npy")->required()->check(CLI::ExistingFile);
  c->add_option("--k", args->k, "Keys .npy (with --k-cache: new keys to append, optional)")->check(CLI::ExistingFile);
  c->add_option("--v", args->v, "Values .npy (with --k-cache: new values to append, optional)")->check(CLI::ExistingFile);
  c->add_option("--out", args->out, "Output .npy (same layout as q; float16 stays float16); not needed with --explain");
  c->add_option("--lse", args->lse, "Also write the row log-sum-exp, (B, H, N) float32");
  c->add_option("--probs", args->probs, "Also write the weights (B, H, N, M) float32 (before dropout)");
  c->add_option("--stats", args->stats,
                "Also write each row's concentration, streamed without the N x M weights: (B, H, N, 4) float32 =\n"
                "sparsity, entropy, max_weight, topk_mass (docs/concentration.md)");
  c->add_option("--stats-topk", args->stats_topk, "k of topk_mass")->capture_default_str()->check(in_range(int64_t{1}, int64_t{1024}));
  c->add_option("--final-state", args->final_state,
                "Also write the recurrent state after the last token (linear attention), (B, H, F, Dv [+ 1]) float32; "
                "continue a sequence with --param initial_state=FILE");
  c->add_option("--layout", args->layout, "Memory layout of q, k, v, out")->check(CLI::IsMember({"bhnd", "bnhd"}))->capture_default_str();
  c->add_option("--kv-lengths", args->kv_lengths, "Key padding: valid keys per batch entry");
  c->add_option("--mask", args->mask, "Boolean mask .npy, (N, M) / (H, N, M) / (B, H, N, M); true = attend");
  c->add_option("--bias", args->bias, "Additive float bias .npy, same shapes as --mask");
  c->add_option("--alibi", args->alibi, "ALiBi slopes, one per query head");
  c->add_option("--block-mask", args->block_mask,
                "Boolean block mask .npy, (ceil(N/BQ), ceil(M/BK)) / (H, ..) / (B, H, ..); false hides the block");
  c->add_option("--block-size", args->block_size, "BQ BK: query rows and keys per block of --block-mask")
      ->expected(2)->capture_default_str()->check(in_range(int64_t{1}, int64_t{1} << 31));
  c->add_option("--param", args->params,
                "A named parameter tensor the mechanism takes, NAME=file.npy (repeatable); e.g. for\n"
                "score=additive: --param wq=wq.npy --param wk=wk.npy --param w=w.npy");
  c->add_option("--wq", args->wq, "Same as --param wq=FILE (additive score: Wq (A, D))");
  c->add_option("--wk", args->wk, "Same as --param wk=FILE (additive score: Wk (A, D))");
  c->add_option("--w", args->w, "Same as --param w=FILE (additive score: w (A))");
  c->add_option("--k-cache", args->k_cache,
                "KV cache (flash_attn_with_kvcache): keys (B, capacity, Hkv, D) in bnhd, or a page pool\n"
                "(blocks, page, Hkv, D) with --block-table; --k/--v are appended at --cache-seqlens")->check(CLI::ExistingFile);
  c->add_option("--v-cache", args->v_cache, "KV cache: values, as --k-cache")->check(CLI::ExistingFile);
  c->add_option("--k-cache-out", args->k_cache_out, "Write the key cache after the append");
  c->add_option("--v-cache-out", args->v_cache_out, "Write the value cache after the append");
  c->add_option("--cache-seqlens", args->cache_seqlens, "Tokens already cached per sequence (default: the caches are full)")
      ->delimiter(',');
  c->add_option("--block-table", args->block_table, "Paged cache: block ids, B x --blocks-per-seq, row-major")->delimiter(',');
  c->add_option("--blocks-per-seq", args->blocks_per_seq, "Paged cache: block ids per sequence");
  c->add_option("--rotary-cos", args->rotary_cos, "RoPE table cos (positions, rotary_dim / 2) for q and the new keys")
      ->check(CLI::ExistingFile);
  c->add_option("--rotary-sin", args->rotary_sin, "RoPE table sin, as --rotary-cos")->check(CLI::ExistingFile);
  c->add_flag("--rotary-interleaved", args->rotary_interleaved, "Rotate channel pairs (2c, 2c+1) instead of (c, c + R/2)");
  c->add_option("--cu-seqlens-q", args->cu_seqlens_q,
                "Packed ragged batch (flash_attn_varlen_func): query offsets 0,..,total of q (total, H, D)")->delimiter(',');
  c->add_option("--cu-seqlens-k", args->cu_seqlens_k, "Packed ragged batch: key offsets of k and v")->delimiter(',');
  c->add_option("--threads", args->threads, "Threads (0 = all cores, at most 256)")->capture_default_str()
      ->check(in_range(0, 256));
  c->add_option("--isa", args->isa, "Force a kernel set: portable (or scalar), avx2, avx512");
  c->add_option("--precision", args->precision,
                "Products of exact attention: auto (bf16 when q, k, v are all bfloat16), f32, bf16 (operands "
                "rounded to bf16, float32 sums; ~1.5x faster on CPUs with AVX512-BF16)")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}))
      ->capture_default_str();
  c->add_option("--form", args->form,
                "Force an implementation (softmax: rows, tiled_bf16, tiled, reference); default: the first that supports the call");
  c->add_flag("--reference", args->reference, "Same as --form reference: the float64 reference (slow, exact)");
  c->add_flag("--distributed", args->distributed,
              "Under mpirun: every rank reads the whole inputs and attends its shard (ring attention, zig-zag\n"
              "when causal; LASP-2 for linear); rank 0 writes the whole output (docs/distributed.md)");
  c->add_flag("--explain", args->explain,
              "Print which form would run and why the others would not (validates the inputs; writes nothing)");
  return [args] { return run(*args); };
}

}  // namespace attn::cli
