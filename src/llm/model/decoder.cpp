// The decoder's forward pass and run state (see include/attn/model.hpp for the block).
//
// Tokens run in steps of at most kStepTokens: a long prompt is a sequence of steps, each
// attending to the cache the steps before it filled (causal masks are aligned bottom-right, so
// a step's queries see exactly the keys a full pass would show them), which bounds the
// activation buffers and lets them be allocated once.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>

#include "attn/attend.hpp"
#include "attn/error.hpp"
#include "attn/gguf.hpp"
#include "attn/info.hpp"
#include "attn/kv_cache.hpp"
#include "attn/kv_quant.hpp"
#include "attn/model.hpp"
#include "attn/rope.hpp"
#include "attn/tensor.hpp"
#include "base/parallel.hpp"
#include "model/architecture.hpp"
#include "model/layer_run.hpp"
#include "model/memory_need.hpp"
#include "model/moe.hpp"
#include "model/ops.hpp"
#include "model/weights.hpp"

namespace attn {
namespace {

using model::kBoundedSlack;
using model::kStepTokens;
constexpr const char* kWhere = "decoder";
constexpr const char* kConfigKey = "attn.decoder";

// A (1, heads, n, hd) view of packed (n, heads * hd) rows: token-major memory.
TensorView token_major(void* data, int64_t heads, int64_t n, int64_t hd, DType dtype = DType::f32) {
  return make_view(data, dtype, 1, heads, n, hd, Layout::bnhd);
}

// Tokens [i0, i0 + m) of a token-major view.
TensorView token_rows(TensorView t, int64_t i0, int64_t m) {
  t.data = t.ptr(0, 0, i0);
  t.shape[2] = m;
  return t;
}

// Per layer: a recurrent state, or a KV cache (1, Hkv, capacity, hd) in the decoder's cache dtype
// (float32, float16, bfloat16, or int8 rows with a float32 scale each: set_cache_dtype). The
// cache holds every position (capacity max_seq_len) unless the mechanism says its queries see a
// bounded past (attn::info: window + sinks, chunk): then the first `sinks` rows are pinned and the
// rows after them hold positions first.. in order, moved down when the run reaches the end. Rows are
// compacted in steps that keep (position - sinks) mod align, so the positions the kernels see
// (sinks, then the recent run, the queries bottom-right) give every query the keys, distances and
// chunks it has in the full cache: the same result with the cache of a window.
struct LayerMemory {
  Tensor k, v, state;
  Tensor k_scale, v_scale;              // an int8 cache's row scales (1, Hkv, capacity, 1)
  int64_t capacity = 0;                 // rows of k and v
  int64_t lookback = -1, sinks = 0, align = 1;  // the mechanism's bound (lookback -1: none)
  int64_t first = 0;                    // position held by row `sinks`
  int64_t sub_step = 0;                 // queries per attention call

  bool bounded() const { return lookback >= 0 && capacity > 0; }
  // Bytes of one position's K and V rows (int8 rows: with their scales).
  int64_t bytes_per_row() const {
    const TensorView& t = k.view();
    return 2 * t.shape[1] * (t.shape[3] * static_cast<int64_t>(dtype_size(t.dtype)) +
                             (k_scale.defined() ? static_cast<int64_t>(sizeof(float)) : 0));
  }
  // Row of position x (x < sinks, or x >= first).
  int64_t row_of(int64_t x) const { return x < sinks ? x : sinks + (x - first); }
  // The first position to keep so that the queries at x0.. see every key they see in full.
  int64_t keep_from(int64_t x0) const {
    const int64_t need = std::max(sinks, x0 - lookback);
    return sinks + (need - sinks) / align * align;
  }
  // Rows the keys of positions up to x0 + m - 1 take once room is made for them.
  int64_t rows_after(int64_t x0, int64_t m) const {
    if (row_of(x0 + m - 1) < capacity) return row_of(x0 + m - 1) + 1;
    return sinks + (x0 + m - keep_from(x0));
  }
  // Moves the rows still needed down so that positions x0..x0+m-1 fit (their rows are then free).
  void make_room(int64_t x0, int64_t m) {
    if (row_of(x0 + m - 1) < capacity) return;
    const int64_t from = keep_from(x0), count = x0 - from;
    for (Tensor* t : {&k, &v, &k_scale, &v_scale}) {
      if (!t->defined()) continue;
      const TensorView c = t->view();
      for (int64_t h = 0; h < c.shape[1]; ++h)
        std::memmove(c.ptr(0, h, sinks), c.ptr(0, h, row_of(from)),
                     static_cast<size_t>(count * c.shape[3]) * dtype_size(c.dtype));
    }
    first = from;
  }
};

}  // namespace

// The run state, and the shared blocks (arch/blocks.hpp) the architecture strings together per layer.
struct Decoder::Impl final : model::LayerRun {
  model::DecoderWeights w;
  const model::Architecture* arch = nullptr;
  int threads = 0;
  Isa isa = active_isa();
  std::string form;
  model::Activations activations = model::Activations::q8;  // products with quantized matrices ("auto": set_activations)
  DType cache_dtype = DType::f32;  // KV caches (set_cache_dtype)
  bool full_caches = false;  // every KV layer keeps every row (set_full_caches)
  int64_t pos = 0;
  int64_t step_n = 0, step_pos = 0;  // the rows and first position of the step being run
  bool row_wise = false;  // a paged step: products row by row (model::matmul's row_wise)
  std::vector<LayerMemory> memory;
  // Activations for one step of up to kStepTokens tokens.
  int64_t step = 0;
  std::vector<float> x, h, q, k, v, att, gate, tmp, gated, up, logits;
  std::vector<uint16_t> q16;  // the step's queries in a 16-bit cache's dtype
  model::MoeScratch moe_scratch;  // the MoE feed-forward's buffers, kept between steps
  std::map<std::string, size_t> replaced;  // set_weight's matrices: name -> their copy in w.owned

  // `cache`: the KV caches' dtype from the start (not float32 replaced later: a freed cache raises
  // malloc's mmap threshold, and the next caches' zeroing would then touch every page)
  explicit Impl(model::DecoderWeights weights, int thread_count, DType cache = DType::f32)
      : w(std::move(weights)), threads(thread_count), cache_dtype(cache) {
    const DecoderConfig& c = w.config;
    arch = &model::architecture(c.architecture, kWhere);
    step = std::min(kStepTokens, c.max_seq_len);
    allocate_step_buffers(step);
    memory.resize(c.layers.size());
    for (size_t i = 0; i < c.layers.size(); ++i) allocate_memory(i);
  }

  // Activation buffers for `rows` rows (a step's; a paged step's rows come from several sequences).
  void allocate_step_buffers(int64_t rows_per_step) {
    const DecoderConfig& c = w.config;
    const int64_t qdim = c.heads * c.head_dim;
    auto rows = [&](int64_t width) { return std::vector<float>(static_cast<size_t>(rows_per_step * width)); };
    x = rows(c.dim), h = rows(c.dim), tmp = rows(c.dim);
    q = rows(qdim), k = rows(qdim), v = rows(qdim), att = rows(qdim), gate = rows(qdim);
    gated = rows(c.hidden_dim), up = rows(c.hidden_dim);
    buffer_rows = rows_per_step;
  }
  int64_t buffer_rows = 0;

  // ---- the shared blocks (model::LayerRun): h, the normed rows; f (tmp), a block's output ----
  const DecoderConfig& config() const override { return w.config; }
  const model::LayerWeights& layer(size_t i) const override { return w.layers[i]; }
  void norm(const std::vector<float>& weight) override {
    const DecoderConfig& c = w.config;
    model::rms_norm(x.data(), step_n, c.dim, c.dim, weight, c.norm_eps, h.data(), threads);
  }
  void attention(size_t i) override { attention_block(i, step_n, step_pos); }
  void swiglu(size_t i) override { gated_feed_forward(i, model::GateActivation::silu); }
  void geglu(size_t i) override { gated_feed_forward(i, model::GateActivation::gelu_tanh); }
  // f = (act(h W1^T) ⊙ h W3^T) W2^T
  void gated_feed_forward(size_t i, model::GateActivation act) {
    const DecoderConfig& c = w.config;
    const model::LayerWeights& l = w.layers[i];
    const int64_t n = step_n;
    model::matmul_many(h.data(), n, {{&l.w1, gated.data()}, {&l.w3, up.data()}}, threads, isa, activations, row_wise);
    model::gated_activation(act, gated.data(), up.data(), n, c.hidden_dim, threads, isa);
    model::matmul(gated.data(), n, l.w2, tmp.data(), threads, isa, activations, row_wise);
  }
  void norm_output(const std::vector<float>& weight) override {
    const DecoderConfig& c = w.config;
    model::rms_norm(tmp.data(), step_n, c.dim, c.dim, weight, c.norm_eps, tmp.data(), threads);
  }
  void moe(size_t i) override {
    model::moe_forward(h.data(), step_n, w.layers[i].moe, w.config.moe_top_k, tmp.data(), threads, isa, moe_scratch);
  }
  // x = x + f, or x = a·h + f (a residual that keeps the normed input h).
  void residual(double scale) override {
    const int64_t count = step_n * w.config.dim;
    if (scale == 1.0) {
      for (int64_t i = 0; i < count; ++i) x[i] += tmp[i];
      return;
    }
    const float a = static_cast<float>(scale);
    for (int64_t i = 0; i < count; ++i) x[i] = a * h[i] + tmp[i];
  }

  // Layer i's memory as its mechanism asks (attn::info): a state, or a full or bounded KV cache.
  void allocate_memory(size_t i) {
    const DecoderConfig& c = w.config;
    const model::LayerWeights& l = w.layers[i];
    const MechanismInfo facts = info(c.layers[i].mechanism);
    LayerMemory m;
    if (facts.cache == CacheKind::state) {
      const auto shape = state_shape(token_major(q.data(), c.heads, 1, c.head_dim),
                                     token_major(k.data(), l.kv_heads, 1, c.head_dim),
                                     token_major(v.data(), l.kv_heads, 1, c.head_dim), c.layers[i].mechanism);
      m.state = Tensor(DType::f32, shape);
    } else {
      m.capacity = c.max_seq_len, m.sub_step = step;
      if (facts.lookback >= 0 && !full_caches) {
        const int64_t bound = facts.sinks + facts.lookback + facts.align - 1 + kBoundedSlack;
        if (bound < c.max_seq_len) {
          m.capacity = bound, m.sub_step = std::min(step, kBoundedSlack);
          m.lookback = facts.lookback, m.sinks = facts.sinks, m.align = facts.align;
        }
      }
      m.first = m.sinks;
      m.k = Tensor(cache_dtype, {1, l.kv_heads, m.capacity, c.head_dim});
      m.v = Tensor(cache_dtype, {1, l.kv_heads, m.capacity, c.head_dim});
      if (cache_dtype == DType::i8) {
        m.k_scale = Tensor(DType::f32, {1, l.kv_heads, m.capacity, 1});
        m.v_scale = Tensor(DType::f32, {1, l.kv_heads, m.capacity, 1});
      }
    }
    memory[i] = std::move(m);
    forget_checks();
  }

  // Whether layer i's memory would change shape under `mechanism`.
  bool memory_changes(size_t i, const Mechanism& mechanism) const {
    const MechanismInfo facts = info(mechanism);
    const LayerMemory& m = memory[i];
    if ((facts.cache == CacheKind::state) != m.state.defined()) return true;
    if (m.state.defined()) {  // another state shape (polaformer's, a normaliser column more or less)
      const DecoderConfig& c = w.config;
      const auto shape = state_shape(token_major(const_cast<float*>(q.data()), c.heads, 1, c.head_dim),
                                     token_major(const_cast<float*>(k.data()), w.layers[i].kv_heads, 1, c.head_dim),
                                     token_major(const_cast<float*>(v.data()), w.layers[i].kv_heads, 1, c.head_dim), mechanism);
      return shape != m.state.view().shape;
    }
    const int64_t bound = facts.sinks + facts.lookback + facts.align - 1 + kBoundedSlack;
    const bool want_bounded = facts.lookback >= 0 && !full_caches && bound < w.config.max_seq_len;
    return want_bounded != m.bounded() ||
           (want_bounded && (bound != m.capacity || facts.lookback != m.lookback || facts.sinks != m.sinks ||
                             facts.align != m.align));
  }

  // The options of layer li's attention call: threads, ISA, forced form, and for a recurrent
  // layer its state (read and written in place) and, for lightning layers, the per-head decays.
  AttendOptions layer_options(size_t li) const {
    AttendOptions o;
    o.threads = threads, o.isa = isa, o.form = form;
    if (const Tensor& state = memory[li].state; state.defined()) {
      const auto& s = state.view().shape;
      o.params["initial_state"] = make_array_view(state.view().data, DType::f32, {s[0], s[1], s[2], s[3]});
      if (w.config.layers[li].lightning)
        o.params["decay"] = make_array_view(w.layers[li].decays.data(), DType::f32, {w.config.heads});
    }
    return o;
  }

  // RoPE's cos and sin of the step's rows' positions for base theta, as apply_rope computes them
  // (angle = position * theta^(-2c / head_dim) in float64, then rounded): computed once per step
  // and base, not once per layer and tensor (a prompt's sines and cosines took a tenth of it).
  struct RopeAngles {
    double theta = 0;
    std::vector<int64_t> positions;
    std::vector<float> cos, sin;  // (rows, head_dim / 2)
  };
  std::vector<RopeAngles> rope_angles;  // one per base the layers use
  std::vector<int64_t> rope_rows;       // 0 .. n-1: the step's tokens' rows of the tables
  std::vector<int64_t> step_positions;  // each row's position (contiguous: step_pos..; paged: per sequence)
  const RopeAngles& rope_angles_for(double theta) {
    auto it = std::find_if(rope_angles.begin(), rope_angles.end(), [&](const RopeAngles& a) { return a.theta == theta; });
    if (it == rope_angles.end()) {
      RopeAngles fresh;
      fresh.theta = theta;
      it = rope_angles.insert(rope_angles.end(), std::move(fresh));
    }
    RopeAngles& a = *it;
    const int64_t n = static_cast<int64_t>(step_positions.size());
    rope_rows.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) rope_rows[static_cast<size_t>(i)] = i;
    if (a.positions == step_positions) return a;
    const int64_t half = w.config.head_dim / 2;
    std::vector<double> inv_freq(static_cast<size_t>(half));
    for (int64_t c = 0; c < half; ++c)
      inv_freq[static_cast<size_t>(c)] =
          std::pow(theta, -2.0 * static_cast<double>(c) / static_cast<double>(w.config.head_dim));
    a.cos.resize(static_cast<size_t>(n * half)), a.sin.resize(static_cast<size_t>(n * half));
    parallel_for(n, resolve_threads(threads, n / 16 + 1), [&](int64_t i, int) {
      for (int64_t c = 0; c < half; ++c) {
        const double angle = static_cast<double>(step_positions[static_cast<size_t>(i)]) * inv_freq[static_cast<size_t>(c)];
        a.cos[static_cast<size_t>(i * half + c)] = static_cast<float>(std::cos(angle));
        a.sin[static_cast<size_t>(i * half + c)] = static_cast<float>(std::sin(angle));
      }
    });
    a.positions = step_positions;
    return a;
  }

  // f (tmp) = layer li's attention block on h, for n tokens at positions p..
  void attention_block(size_t li, int64_t n, int64_t p) {
    const DecoderConfig& c = w.config;
    const DecoderLayerSpec& spec = c.layers[li];
    const model::LayerWeights& l = w.layers[li];
    LayerMemory& mem = memory[li];
    // q, k, v (and a lightning layer's output gate) from h in one parallel region
    std::vector<model::Product> from_h{{&l.wq, q.data()}, {&l.wk, k.data()}, {&l.wv, v.data()}};
    if (spec.lightning) from_h.push_back({&l.gate, gate.data()});
    model::matmul_many(h.data(), n, from_h, threads, isa, activations, row_wise);
    const int64_t kv_width = l.kv_heads * c.head_dim, q_width = c.heads * c.head_dim;
    if (spec.lightning) {
      for (int64_t i = 0; i < n * q_width; ++i) q[i] = model::silu(q[i]);
      for (int64_t i = 0; i < n * kv_width; ++i) k[i] = model::silu(k[i]), v[i] = model::silu(v[i]);
    }
    const TensorView qv = token_major(q.data(), c.heads, n, c.head_dim);
    const TensorView kv = token_major(k.data(), l.kv_heads, n, c.head_dim);
    const TensorView vv = token_major(v.data(), l.kv_heads, n, c.head_dim);
    const TensorView out = token_major(att.data(), c.heads, n, c.head_dim);
    if (!l.q_norm.empty()) {  // per-head RMSNorm: rows of head_dim values
      model::rms_norm(q.data(), n * c.heads, c.head_dim, c.head_dim, l.q_norm, c.norm_eps, q.data(), threads);
      model::rms_norm(k.data(), n * l.kv_heads, c.head_dim, c.head_dim, l.k_norm, c.norm_eps, k.data(), threads);
    }
    if (spec.rope) {
      const RopeAngles& a = rope_angles_for(spec.rope_theta > 0 ? spec.rope_theta : c.rope_theta);
      const TensorView cos = make_view(const_cast<float*>(a.cos.data()), DType::f32, 1, 1, n, c.head_dim / 2);
      const TensorView sin = make_view(const_cast<float*>(a.sin.data()), DType::f32, 1, 1, n, c.head_dim / 2);
      apply_rope_table(qv, cos, sin, c.rope_style, rope_rows), apply_rope_table(kv, cos, sin, c.rope_style, rope_rows);
    }
    AttendOptions o = layer_options(li);
    if (!paged_rows.empty()) {
      paged_attention(li, queries_for(cache_dtype, n), kv, vv, out, o);
    } else if (mem.state.defined()) {
      attend_into(qv, kv, vv, spec.mechanism, o, out, nullptr, nullptr, &mem.state.view());
    } else {
      const TensorView qc = queries_for(mem.k.view().dtype, n);
      const bool int8_rows = mem.k_scale.defined();
      // Bounded caches take the step's queries in runs of at most sub_step (their rows fit).
      for (int64_t i0 = 0; i0 < n; i0 += mem.sub_step) {
        const int64_t m = std::min(mem.sub_step, n - i0);
        mem.make_room(p + i0, m);
        TensorView kc = mem.k.view(), vc = mem.v.view();
        for (int64_t hk = 0; hk < l.kv_heads; ++hk)
          for (int64_t i = i0; i < i0 + m; ++i) {
            const int64_t row = mem.row_of(p + i);
            if (int8_rows) {  // token-major rows: head hk of token i is head_dim floats in a run
              float* ks = static_cast<float*>(mem.k_scale.view().data);
              float* vs = static_cast<float*>(mem.v_scale.view().data);
              ks[mem.k_scale.view().offset(0, hk, row, 0)] = quantize_row(
                  reinterpret_cast<const float*>(kv.ptr(0, hk, i)), c.head_dim, reinterpret_cast<int8_t*>(kc.ptr(0, hk, row)));
              vs[mem.v_scale.view().offset(0, hk, row, 0)] = quantize_row(
                  reinterpret_cast<const float*>(vv.ptr(0, hk, i)), c.head_dim, reinterpret_cast<int8_t*>(vc.ptr(0, hk, row)));
              continue;
            }
            for (int64_t e = 0; e < c.head_dim; ++e) {
              store_from_float(kc.data, kc.dtype, kc.offset(0, hk, row, e), kv.at(0, hk, i, e));
              store_from_float(vc.data, vc.dtype, vc.offset(0, hk, row, e), vv.at(0, hk, i, e));
            }
          }
        const int64_t rows = mem.row_of(p + i0 + m - 1) + 1;
        kc.shape[2] = vc.shape[2] = rows;
        if (int8_rows) {
          o.kv_scales = KvScales{mem.k_scale.view(), mem.v_scale.view()};
          o.kv_scales->k.shape[2] = o.kv_scales->v.shape[2] = rows;
        }
        attend_into(token_rows(qc, i0, m), kc, vc, spec.mechanism, o, token_rows(out, i0, m), nullptr, nullptr);
      }
    }
    if (spec.lightning) {
      model::rms_norm(att.data(), n, q_width, q_width, l.out_norm, c.norm_eps, att.data(), threads);
      for (int64_t i = 0; i < n * q_width; ++i) att[i] *= model::sigmoid(gate[i]);
    }
    model::matmul(att.data(), n, l.wo, tmp.data(), threads, isa, activations, row_wise);
  }

  // The step's n queries as attention takes them beside a cache of `dtype`: float32 for float32
  // and int8 caches (int8 rows take float32 queries), else converted to the 16-bit dtype.
  TensorView queries_for(DType dtype, int64_t n) {
    const DecoderConfig& c = w.config;
    if (dtype == DType::f32 || dtype == DType::i8) return token_major(q.data(), c.heads, n, c.head_dim);
    const int64_t count = n * c.heads * c.head_dim;
    if (static_cast<int64_t>(q16.size()) < count) q16.resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) store_from_float(q16.data(), dtype, i, q[static_cast<size_t>(i)]);
    return token_major(q16.data(), c.heads, n, c.head_dim, dtype);
  }

  // ---- the paged pool (set_kv_pool, forward_paged) ----------------------------------------
  // Per layer: K and V pools (blocks, Hkv, block_size, hd) in the cache dtype; int8 rows'
  // scales (blocks, Hkv, block_size, 1).
  struct KvPool {
    Tensor k, v, k_scale, v_scale;
  };
  std::vector<KvPool> pool;
  int64_t pool_blocks = 0, pool_block_size = 0;
  // The step's sequences (forward_paged): each one's rows of the step buffers; empty otherwise.
  struct PagedRows {
    const PagedSequence* seq = nullptr;
    int64_t row0 = 0, n = 0;
  };
  std::vector<PagedRows> paged_rows;
  std::vector<int32_t> paged_table;  // a run of decoding sequences' block tables, padded with 0
  std::vector<int64_t> paged_lengths;

  // Writes the step's K and V rows of layer li into each sequence's blocks, then attends each
  // sequence's queries to its positions 0..pos+n-1: a run of consecutive one-token sequences in
  // one call (each sequence still its own attend(): the same bits as alone), others one each.
  void paged_attention(size_t li, const TensorView& qc, const TensorView& kv, const TensorView& vv, const TensorView& out,
                       AttendOptions& o) {
    const DecoderConfig& c = w.config;
    const int64_t kv_heads = w.layers[li].kv_heads, hd = c.head_dim, bs = pool_block_size;
    KvPool& pl = pool[li];
    const TensorView kp = pl.k.view(), vp = pl.v.view();
    const bool int8_rows = pl.k_scale.defined();
    const int64_t rows = step_n;
    parallel_for(rows * kv_heads, resolve_threads(threads, rows * kv_heads / 64 + 1), [&](int64_t item, int) {
      const int64_t r = item / kv_heads, hk = item % kv_heads;
      const PagedRows& pr = *std::find_if(paged_rows.begin(), paged_rows.end(),
                                          [&](const PagedRows& x) { return r < x.row0 + x.n; });
      const int64_t pos = pr.seq->pos + (r - pr.row0);
      const int64_t block = pr.seq->blocks[static_cast<size_t>(pos / bs)], slot = pos % bs;
      if (int8_rows) {
        static_cast<float*>(pl.k_scale.view().data)[pl.k_scale.view().offset(block, hk, slot, 0)] = quantize_row(
            reinterpret_cast<const float*>(kv.ptr(0, hk, r)), hd, reinterpret_cast<int8_t*>(kp.ptr(block, hk, slot)));
        static_cast<float*>(pl.v_scale.view().data)[pl.v_scale.view().offset(block, hk, slot, 0)] = quantize_row(
            reinterpret_cast<const float*>(vv.ptr(0, hk, r)), hd, reinterpret_cast<int8_t*>(vp.ptr(block, hk, slot)));
        return;
      }
      for (int64_t e = 0; e < hd; ++e) {
        store_from_float(kp.data, kp.dtype, kp.offset(block, hk, slot, e), kv.at(0, hk, r, e));
        store_from_float(vp.data, vp.dtype, vp.offset(block, hk, slot, e), vv.at(0, hk, r, e));
      }
    });
    if (int8_rows) o.kv_scales = KvScales{pl.k_scale.view(), pl.v_scale.view()};
    const Mechanism& mechanism = c.layers[li].mechanism;
    for (size_t s = 0; s < paged_rows.size();) {
      size_t e = s + 1;  // [s, e): one sequence, or a run of one-token sequences
      if (paged_rows[s].n == 1)
        while (e < paged_rows.size() && paged_rows[e].n == 1) ++e;
      const int64_t count = static_cast<int64_t>(e - s), row0 = paged_rows[s].row0, n = paged_rows[s].n;
      int64_t per_seq = 0;
      for (size_t i = s; i < e; ++i) per_seq = std::max<int64_t>(per_seq, static_cast<int64_t>(paged_rows[i].seq->blocks.size()));
      paged_table.assign(static_cast<size_t>(count * per_seq), 0);
      paged_lengths.resize(static_cast<size_t>(count));
      for (size_t i = s; i < e; ++i) {
        const PagedSequence& q_seq = *paged_rows[i].seq;
        std::copy(q_seq.blocks.begin(), q_seq.blocks.end(), paged_table.begin() + static_cast<int64_t>(i - s) * per_seq);
        paged_lengths[i - s] = q_seq.pos + paged_rows[i].n;
      }
      KvCacheUpdate update;
      update.cache_seqlens = paged_lengths;
      update.paged = PagedKv{paged_table, per_seq, -1};
      // (count, H, n, hd) over rows row0..: one-token sequences are consecutive rows
      TensorView qs = make_view(qc.ptr(0, 0, row0), qc.dtype, count, c.heads, n, hd, Layout::bnhd);
      TensorView os = make_view(out.ptr(0, 0, row0), out.dtype, count, c.heads, n, hd, Layout::bnhd);
      attend_with_kvcache_into(qs, kp, vp, update, mechanism, o, os, nullptr);
      s = e;
    }
  }

  // x = the embeddings of the step's n tokens (scaled as the architecture asks).
  void embed(const int32_t* tokens, int64_t n, float* rows) {
    const DecoderConfig& c = w.config;
    for (int64_t i = 0; i < n; ++i) model::matrix_row(w.embed, tokens[i], rows + i * c.dim, isa);
    if (c.embed_scale != 1.0) {
      const float scale = static_cast<float>(c.embed_scale);
      for (int64_t i = 0; i < n * c.dim; ++i) rows[i] *= scale;
    }
  }

  // logits_out = the output layer on `rows` rows of the residual stream (packed, in `from`).
  void output_logits(const float* from, int64_t rows, bool prompt_step, float* logits_out) {
    const DecoderConfig& c = w.config;
    model::rms_norm(from, rows, c.dim, c.dim, w.final_norm, c.norm_eps, h.data(), threads);
    // the rows of a prompt step multiply as a prompt's, the last one alone included (q8-decode:
    // float panels give the first token of a reply, not the 8-bit decode products)
    const model::Activations a =
        prompt_step && activations == model::Activations::q8_decode ? model::Activations::f32 : activations;
    model::matmul(h.data(), rows, w.output, logits_out, threads, isa, a, row_wise);
    if (c.final_softcap > 0) {
      const float cap = static_cast<float>(c.final_softcap);
      for (int64_t i = 0; i < rows * c.vocab_size; ++i) logits_out[i] = cap * std::tanh(logits_out[i] / cap);
    }
  }

  // Runs n <= step tokens at positions p..; logits of rows [first, n) go to `logits_out`.
  void run_step(const int32_t* tokens, int64_t n, int64_t p, int64_t first, float* logits_out) {
    const DecoderConfig& c = w.config;
    embed(tokens, n, x.data());
    step_n = n, step_pos = p;
    step_positions.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) step_positions[static_cast<size_t>(i)] = p + i;
    paged_rows.clear();
    for (size_t li = 0; li < c.layers.size(); ++li) arch->run_layer(*this, li);
    if (first >= n) return;
    output_logits(x.data() + first * c.dim, n - first, n >= model::kPromptRows, logits_out);
  }

  // One step over the pool's sequences (forward_paged, checked): their rows one after another.
  void run_paged(std::span<const PagedSequence> seqs) {
    const DecoderConfig& c = w.config;
    paged_rows.clear();
    step_positions.clear();
    int64_t rows = 0, out_rows = 0;
    for (const PagedSequence& sq : seqs) {
      const int64_t n = static_cast<int64_t>(sq.tokens.size());
      paged_rows.push_back({&sq, rows, n});
      embed(sq.tokens.data(), n, x.data() + rows * c.dim);
      for (int64_t i = 0; i < n; ++i) step_positions.push_back(sq.pos + i);
      rows += n, out_rows += sq.all_logits ? n : 1;
    }
    step_n = rows, step_pos = 0;
    // matmul and the gated activation are row-wise (bitwise: a row's result does not depend on
    // the other rows): the integer products for quantized matrices serve any row count alike;
    // float matrices go in groups of four rows (model::matmul's row_wise), never the prompt
    // panels. The decoder's own mode comes back however the step ends (an Error included).
    struct Restore {
      Impl& s;
      model::Activations activations;
      ~Restore() { s.activations = activations, s.row_wise = false, s.paged_rows.clear(); }
    } restore{*this, activations};
    if (activations == model::Activations::q8_decode) activations = model::Activations::q8;
    row_wise = true;
    for (size_t li = 0; li < c.layers.size(); ++li) arch->run_layer(*this, li);
    // the rows whose logits are asked, packed in tmp
    int64_t r = 0, o = 0;
    for (const PagedRows& pr : paged_rows) {
      const int64_t first = pr.seq->all_logits ? 0 : pr.n - 1;
      std::memcpy(tmp.data() + o * c.dim, x.data() + (r + first) * c.dim, static_cast<size_t>((pr.n - first) * c.dim) * sizeof(float));
      o += pr.n - first, r += pr.n;
    }
    logits.resize(static_cast<size_t>(out_rows * c.vocab_size));
    output_logits(tmp.data(), out_rows, false, logits.data());
  }

  // Every layer's attention call for a step of n tokens at position p, checked (validate_call()
  // validates like attend_into() and builds no text) before anything runs: a call that fails
  // leaves caches and states as they were. A layer's plan (its mechanism, options and memory)
  // is fixed between the setters, so a shape it has passed is not checked again: a recurrent
  // layer or a bounded cache at its capacity is checked once per step size, a growing cache once
  // per length.
  void check_step(int64_t n, int64_t p) {
    const DecoderConfig& c = w.config;
    checked.resize(c.layers.size(), kUnchecked);
    for (size_t li = 0; li < c.layers.size(); ++li) {
      const model::LayerWeights& l = w.layers[li];
      const LayerMemory& mem = memory[li];
      const TensorView qv = token_major(q.data(), c.heads, n, c.head_dim);
      const int64_t m = mem.state.defined() ? n : std::min(mem.sub_step, n);
      const CheckedShape shape{n, m, mem.state.defined() ? 0 : mem.rows_after(p, m)};
      if (checked[li] == shape) continue;
      AttendOptions o = layer_options(li);
      try {
        if (mem.state.defined()) {
          const TensorView kv = token_major(k.data(), l.kv_heads, n, c.head_dim);
          validate_call(qv, kv, kv, c.layers[li].mechanism, o);
        } else {  // the first run of queries, against the keys it will see
          TensorView kc = mem.k.view(), qc = qv;
          kc.shape[2] = shape[2];
          if (mem.k_scale.defined()) {  // int8 rows: float32 queries, the rows' scales
            o.kv_scales = KvScales{mem.k_scale.view(), mem.v_scale.view()};
            o.kv_scales->k.shape[2] = o.kv_scales->v.shape[2] = kc.shape[2];
          } else {
            qc.dtype = kc.dtype;  // shapes and options are what is checked (nothing is read)
          }
          validate_call(token_rows(qc, 0, m), kc, kc, c.layers[li].mechanism, o);
        }
      } catch (const Error& e) {
        fail(kWhere, "layer " + std::to_string(li) + " (" + to_string(c.layers[li].mechanism) + "): " + e.what());
      }
      checked[li] = shape;
    }
  }

  // What check_step has passed per layer: (tokens, queries per call, key rows); forgotten by
  // every setter that changes a layer's plan.
  using CheckedShape = std::array<int64_t, 3>;
  static constexpr CheckedShape kUnchecked{-1, -1, -1};
  std::vector<CheckedShape> checked;
  void forget_checks() { checked.clear(); }
};

Decoder::Decoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Decoder::Decoder(Decoder&&) noexcept = default;
Decoder& Decoder::operator=(Decoder&&) noexcept = default;
Decoder::~Decoder() = default;

Decoder Decoder::from_safetensors(const std::string& path, int threads, const std::vector<DecoderLayerSpec>* layers) try {
  auto file = std::make_shared<const SafetensorsFile>(SafetensorsFile::open(path));
  const auto it = file->metadata().find(kConfigKey);
  if (it == file->metadata().end())
    fail(path, std::string("has no '") + kConfigKey + "' entry in its metadata (the decoder config attn writes with save())");
  DecoderConfig config = DecoderConfig::from_json(it->second, path + ": metadata '" + kConfigKey + "'");
  if (layers) {
    if (layers->size() != config.layers.size())
      fail(kWhere, "layers: the file has " + std::to_string(config.layers.size()) + " layers, got " +
                       std::to_string(layers->size()) + " layer specs");
    for (size_t i = 0; i < layers->size(); ++i)
      if ((*layers)[i].lightning != config.layers[i].lightning)
        fail(kWhere, "layers[" + std::to_string(i) + "]: the file's layer is " +
                         (config.layers[i].lightning ? "a lightning layer" : "not a lightning layer") +
                         " (its weights differ), the spec says otherwise");
    config.layers = *layers;
    config.validate();
  }
  model::check_memory_need(config, 0, path);  // matrices are mapped
  return Decoder(std::make_unique<Impl>(model::load_weights(std::move(file), config), threads));
} catch (const std::bad_alloc&) {
  fail(path, "out of memory while loading the decoder");
}

Decoder Decoder::from_gguf(const std::string& path, const GgufLoadOptions& options) try {
  auto file = std::make_shared<const GgufFile>(GgufFile::open(path));
  const DecoderConfig config = model::gguf_config(*file, options.max_seq_len);
  // dequantized: float32; else packed copies and decode-only types converted to Q8_0 blocks
  model::check_memory_need(config, options.dequantize ? 128 : 34, path);
  const bool repack = options.repack && options.activations != "f32";
  const DType cache = options.cache_dtype;
  if (cache != DType::f32 && cache != DType::f16 && cache != DType::bf16 && cache != DType::i8)
    fail("cache_dtype", "expected float32, float16, bfloat16 or int8, got " + dtype_name(cache));
  Decoder d(std::make_unique<Impl>(model::load_gguf_weights(std::move(file), config, options.dequantize, repack),
                                   options.threads, cache));
  d.set_activations(options.activations);
  d.set_cache_dtype(options.cache_dtype);
  return d;
} catch (const std::bad_alloc&) {
  fail(path, "out of memory while loading the decoder");
}

Decoder Decoder::random(const DecoderConfig& config, uint64_t seed, DType dtype, int threads) try {
  config.validate();
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16)
    fail("random weights", "dtype must be float32, bfloat16 or float16, got " + dtype_name(dtype));
  model::check_memory_need(config, 32 * static_cast<int64_t>(dtype_size(dtype)), "random decoder");
  return Decoder(std::make_unique<Impl>(model::random_weights(config, seed, dtype, threads), threads));
} catch (const std::bad_alloc&) {
  fail("random decoder", "out of memory while making the decoder");
}

const DecoderConfig& Decoder::config() const { return impl_->w.config; }
int64_t Decoder::position() const { return impl_->pos; }
void Decoder::set_mechanism(int64_t layer, const Mechanism& mechanism) {
  DecoderConfig& c = impl_->w.config;
  const int64_t count = static_cast<int64_t>(c.layers.size());
  if (layer < -1 || layer >= count)
    fail(kWhere, "layer must be -1 (every layer) or in [0, " + std::to_string(count) + "), got " + std::to_string(layer));
  DecoderConfig next = c;
  for (int64_t i = 0; i < count; ++i) {
    if (layer != -1 && i != layer) continue;
    DecoderLayerSpec& spec = next.layers[static_cast<size_t>(i)];
    // a KV cache and a recurrent state are exchanged like caches of other sizes: on an empty
    // context (a softmax layer of a trained model may become linear, as in linearisation studies)
    const bool has_state = info(mechanism).cache == CacheKind::state;
    const bool had_state = info(spec.mechanism).cache == CacheKind::state;
    if (impl_->pos > 0 && impl_->memory_changes(static_cast<size_t>(i), mechanism))
      fail(kWhere, "layer " + std::to_string(i) + ": mechanism '" + to_string(mechanism) + "' keeps " +
                       (has_state != had_state ? std::string(has_state ? "a recurrent state" : "a KV cache") + " where '" +
                                                     to_string(spec.mechanism) + "' keeps " +
                                                     (had_state ? "a recurrent state" : "a KV cache")
                                               : "a different number of cache rows than '" + to_string(spec.mechanism) + "'") +
                       ", and the context holds " + std::to_string(impl_->pos) + " tokens: reset() first");
    spec.mechanism = mechanism;
    if (!spec.lightning) spec.rope = !info(mechanism).applies_positions;
  }
  next.validate();
  for (int64_t i = 0; i < count; ++i)
    if ((layer == -1 || i == layer) && impl_->memory_changes(static_cast<size_t>(i), next.layers[static_cast<size_t>(i)].mechanism)) {
      c.layers[static_cast<size_t>(i)] = next.layers[static_cast<size_t>(i)];
      impl_->allocate_memory(static_cast<size_t>(i));
    }
  c.layers = std::move(next.layers);
  impl_->forget_checks();
}

void Decoder::set_full_caches(bool full) {
  Impl& s = *impl_;
  if (full == s.full_caches) return;  // nothing changes (a live cache stays as it is)
  if (s.pos > 0) fail(kWhere, "set_full_caches: the context holds tokens: reset() first");
  s.full_caches = full;
  for (size_t i = 0; i < s.memory.size(); ++i)
    if (!s.memory[i].state.defined()) s.allocate_memory(i);
}

std::vector<LayerCache> Decoder::layer_caches() const {
  std::vector<LayerCache> out;
  for (size_t i = 0; i < impl_->memory.size(); ++i) {
    const LayerMemory& m = impl_->memory[i];
    LayerCache l;
    l.mechanism = to_string(impl_->w.config.layers[i].mechanism);
    if (m.state.defined()) {
      l.kind = "state";
      l.bytes = m.state.view().numel() * static_cast<int64_t>(sizeof(float));
    } else {
      l.kind = m.bounded() ? "kv-bounded" : "kv";
      l.rows = m.capacity;
      l.bytes = m.capacity * m.bytes_per_row();
    }
    out.push_back(l);
  }
  return out;
}

void Decoder::set_attention_form(const std::string& form) {
  impl_->form = form;
  impl_->forget_checks();
}

void Decoder::set_activations(const std::string& activations) {
  if (activations == "f32") impl_->activations = model::Activations::f32;
  else if (activations == "q8" || activations == "auto") impl_->activations = model::Activations::q8;
  else if (activations == "q8-decode") impl_->activations = model::Activations::q8_decode;
  else fail("activations", "expected 'f32', 'q8', 'q8-decode' or 'auto', got '" + activations + "'");
}

void Decoder::set_cache_dtype(DType dtype) {
  Impl& s = *impl_;
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16 && dtype != DType::i8)
    fail("cache_dtype", "expected float32, float16, bfloat16 or int8, got " + dtype_name(dtype));
  if (dtype == s.cache_dtype) return;
  if (s.pos > 0) fail(kWhere, "set_cache_dtype: the context holds tokens: reset() first");
  s.cache_dtype = dtype;
  for (size_t i = 0; i < s.memory.size(); ++i)
    if (!s.memory[i].state.defined()) s.allocate_memory(i);
}

DType Decoder::cache_dtype() const { return impl_->cache_dtype; }

std::string Decoder::activations() const {
  switch (impl_->activations) {
    case model::Activations::q8: return "q8";
    case model::Activations::q8_decode: return "q8-decode";
    case model::Activations::f32: break;
  }
  return "f32";
}

void Decoder::reset() {
  // Recurrent states restart from zero; cache rows past the position are never read (and are
  // left untouched, so a long context's cache becomes resident only as it fills).
  for (LayerMemory& m : impl_->memory) {
    if (m.state.defined()) std::memset(m.state.view().data, 0, static_cast<size_t>(m.state.view().numel()) * sizeof(float));
    m.first = m.sinks;
  }
  impl_->pos = 0;
}

const std::vector<float>& Decoder::forward(const std::vector<int32_t>& tokens, int64_t pos, bool all_logits) {
  Impl& s = *impl_;
  const DecoderConfig& c = s.w.config;
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) fail(kWhere, "tokens must not be empty");
  if (pos != s.pos)
    fail(kWhere, "pos must be the number of tokens run since reset() (" + std::to_string(s.pos) + "), got " +
                     std::to_string(pos));
  if (pos + n > c.max_seq_len)
    fail(kWhere, "positions " + std::to_string(pos) + ".." + std::to_string(pos + n - 1) + " exceed max_seq_len " +
                     std::to_string(c.max_seq_len));
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      fail(kWhere, "tokens[" + std::to_string(i) + "] must be in [0, " + std::to_string(c.vocab_size) + "), got " +
                       std::to_string(tokens[i]));
  for (int64_t t0 = 0; t0 < n; t0 += s.step) s.check_step(std::min(s.step, n - t0), pos + t0);
  s.logits.assign(static_cast<size_t>((all_logits ? n : 1) * c.vocab_size), 0.0f);
  for (int64_t t0 = 0; t0 < n; t0 += s.step) {
    const int64_t m = std::min(s.step, n - t0);
    const bool last = t0 + m == n;
    const int64_t first = all_logits ? 0 : (last ? m - 1 : m);
    float* out = s.logits.data() + (all_logits ? t0 * c.vocab_size : 0);
    s.run_step(tokens.data() + t0, m, pos + t0, first, out);
    s.pos = pos + t0 + m;
  }
  return s.logits;
}

int64_t Decoder::max_step_tokens() const { return impl_->pool_blocks > 0 ? impl_->buffer_rows : impl_->step; }

int64_t Decoder::kv_pool_block_bytes(int64_t block_size) const {
  const DecoderConfig& c = impl_->w.config;
  const int64_t value = static_cast<int64_t>(dtype_size(impl_->cache_dtype));
  const int64_t scale = impl_->cache_dtype == DType::i8 ? static_cast<int64_t>(sizeof(float)) : 0;
  int64_t bytes = 0;
  for (const model::LayerWeights& l : impl_->w.layers) bytes += 2 * l.kv_heads * (c.head_dim * value + scale);
  return bytes * block_size;
}

void Decoder::set_kv_pool(int64_t blocks, int64_t block_size) {
  Impl& s = *impl_;
  const DecoderConfig& c = s.w.config;
  if (blocks < 0) fail("kv pool", "blocks must be >= 0, got " + std::to_string(blocks));
  if (blocks == 0) {
    s.pool.clear(), s.pool_blocks = 0, s.pool_block_size = 0;
    return;
  }
  if (blocks < 2) fail("kv pool", "blocks must be at least 2 (block 0 is the null block), got " + std::to_string(blocks));
  if (block_size < 1 || block_size > 4096)
    fail("kv pool", "block_size must be in [1, 4096], got " + std::to_string(block_size));
  for (size_t i = 0; i < c.layers.size(); ++i)
    if (info(c.layers[i].mechanism).cache != CacheKind::kv)
      fail("kv pool", "layer " + std::to_string(i) + " (" + to_string(c.layers[i].mechanism) +
                          ") keeps a recurrent state, not a KV cache: a paged pool holds KV rows only");
  std::vector<Impl::KvPool> pool(c.layers.size());
  for (size_t i = 0; i < c.layers.size(); ++i) {
    const int64_t hkv = s.w.layers[i].kv_heads;
    pool[i].k = Tensor(s.cache_dtype, {blocks, hkv, block_size, c.head_dim});
    pool[i].v = Tensor(s.cache_dtype, {blocks, hkv, block_size, c.head_dim});
    if (s.cache_dtype == DType::i8) {
      pool[i].k_scale = Tensor(DType::f32, {blocks, hkv, block_size, 1});
      pool[i].v_scale = Tensor(DType::f32, {blocks, hkv, block_size, 1});
    }
    for (Tensor* t : {&pool[i].k, &pool[i].v, &pool[i].k_scale, &pool[i].v_scale})  // the null block: zeros
      if (t->defined()) std::memset(t->view().data, 0, static_cast<size_t>(t->view().numel() / blocks) * dtype_size(t->view().dtype));
  }
  // every layer's mechanism reads a paged pool in this dtype: one query against the null block
  const int64_t hd = c.head_dim;
  std::vector<float> zeros(static_cast<size_t>(c.heads * hd), 0.0f), out(zeros.size());
  std::vector<int32_t> table{0};
  for (size_t i = 0; i < c.layers.size(); ++i) {
    Impl::KvPool& p = pool[i];
    KvCacheUpdate update;
    update.cache_seqlens = {1};
    update.paged = PagedKv{table, 1, -1};
    AttendOptions o = s.layer_options(i);
    o.threads = 1;
    if (p.k_scale.defined()) o.kv_scales = KvScales{p.k_scale.view(), p.v_scale.view()};
    const DType qt = s.cache_dtype == DType::i8 ? DType::f32 : s.cache_dtype;
    std::vector<uint16_t> q16(zeros.size(), 0), out16(zeros.size());
    void* qd = qt == DType::f32 ? static_cast<void*>(zeros.data()) : static_cast<void*>(q16.data());
    void* od = qt == DType::f32 ? static_cast<void*>(out.data()) : static_cast<void*>(out16.data());
    try {
      attend_with_kvcache_into(make_view(qd, qt, 1, c.heads, 1, hd, Layout::bnhd), p.k.view(), p.v.view(), update,
                               c.layers[i].mechanism, o, make_view(od, qt, 1, c.heads, 1, hd, Layout::bnhd), nullptr);
    } catch (const Error& e) {
      fail("kv pool", "layer " + std::to_string(i) + " (" + to_string(c.layers[i].mechanism) + ") cannot read a paged " +
                          dtype_name(s.cache_dtype) + " pool: " + e.what());
    }
  }
  s.pool = std::move(pool), s.pool_blocks = blocks, s.pool_block_size = block_size;
  // a paged step's rows come from several sequences: as many as a step of a long context has
  if (s.buffer_rows < model::kStepTokens) s.allocate_step_buffers(model::kStepTokens);
}

const std::vector<float>& Decoder::forward_paged(std::span<const PagedSequence> seqs) {
  Impl& s = *impl_;
  const DecoderConfig& c = s.w.config;
  const std::string where = "forward_paged";
  if (s.pool_blocks == 0) fail(where, "the decoder has no KV pool (set_kv_pool first)");
  if (seqs.empty()) fail(where, "sequences must not be empty");
  int64_t rows = 0;
  std::vector<int32_t> written;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const PagedSequence& q = seqs[i];
    const std::string at = "sequences[" + std::to_string(i) + "]";
    const int64_t n = static_cast<int64_t>(q.tokens.size());
    if (n == 0) fail(where, at + ".tokens must not be empty");
    if (q.pos < 0 || q.pos + n > c.max_seq_len)
      fail(where, at + ": positions " + std::to_string(q.pos) + ".." + std::to_string(q.pos + n - 1) +
                      " must be in [0, max_seq_len " + std::to_string(c.max_seq_len) + ")");
    for (int64_t t = 0; t < n; ++t)
      if (q.tokens[static_cast<size_t>(t)] < 0 || q.tokens[static_cast<size_t>(t)] >= c.vocab_size)
        fail(where, at + ".tokens[" + std::to_string(t) + "] must be in [0, " + std::to_string(c.vocab_size) +
                        "), got " + std::to_string(q.tokens[static_cast<size_t>(t)]));
    const int64_t need = (q.pos + n + s.pool_block_size - 1) / s.pool_block_size;
    if (static_cast<int64_t>(q.blocks.size()) < need)
      fail(where, at + ".blocks must cover " + std::to_string(q.pos + n) + " positions (" + std::to_string(need) +
                      " blocks of " + std::to_string(s.pool_block_size) + "), got " + std::to_string(q.blocks.size()));
    for (size_t b = 0; b < q.blocks.size(); ++b)
      if (q.blocks[b] < 0 || q.blocks[b] >= s.pool_blocks)
        fail(where, at + ".blocks[" + std::to_string(b) + "] must be in [0, " + std::to_string(s.pool_blocks) +
                        "), got " + std::to_string(q.blocks[b]));
    for (int64_t b = q.pos / s.pool_block_size; b < need; ++b) {
      const int32_t id = q.blocks[static_cast<size_t>(b)];
      if (id == 0) fail(where, at + ".blocks[" + std::to_string(b) + "] is the null block 0, and the step writes it");
      written.push_back(id);
    }
    rows += n;
  }
  if (rows > s.buffer_rows)
    fail(where, "the sequences hold " + std::to_string(rows) + " tokens, more than a step's " + std::to_string(s.buffer_rows));
  std::sort(written.begin(), written.end());
  if (const auto twice = std::adjacent_find(written.begin(), written.end()); twice != written.end())
    fail(where, "block " + std::to_string(*twice) + " is written by two sequences (or twice by one) in this step");
  s.run_paged(seqs);
  return s.logits;
}

int64_t Decoder::kv_bytes_per_token() const {
  int64_t bytes = 0;
  for (const LayerMemory& m : impl_->memory)
    if (m.k.defined() && !m.bounded())
      bytes += m.bytes_per_row();
  return bytes;
}

int64_t Decoder::bounded_cache_bytes() const {
  int64_t bytes = 0;
  for (const LayerMemory& m : impl_->memory)
    if (m.bounded()) bytes += m.capacity * m.bytes_per_row();
  return bytes;
}

int64_t Decoder::state_bytes() const {
  int64_t bytes = 0;
  for (const LayerMemory& m : impl_->memory)
    if (m.state.defined()) bytes += m.state.view().numel() * static_cast<int64_t>(sizeof(float));
  return bytes;
}

int64_t Decoder::parameter_count() const {
  int64_t n = 0;
  for (const model::WeightSpec& s : model::weight_specs(impl_->w.config)) {
    int64_t e = 1;
    for (const int64_t d : s.shape) e *= d;
    n += e;
  }
  return n;
}

namespace {

model::WeightSlot find_weight(model::DecoderWeights& w, const std::string& name) {
  for (const model::WeightSlot& s : model::weight_slots(w))
    if (s.spec.name == name) return s;
  fail(kWhere, "weight: no weight named '" + name +
                   "' (Hugging Face llama names, e.g. 'model.layers.0.mlp.gate_proj.weight', 'model.norm.weight'; " +
                   std::to_string(w.config.layers.size()) + " layers)");
}

}  // namespace

std::vector<std::string> Decoder::weight_names() const {
  std::vector<std::string> names;
  for (const model::WeightSpec& s : model::weight_specs(impl_->w.config)) names.push_back(s.name);
  return names;
}

WeightValues Decoder::weight(const std::string& name) const {
  const model::WeightSlot s = find_weight(impl_->w, name);
  WeightValues out{s.spec.shape, {}};
  if (s.vector) {
    out.values = *s.vector;
    return out;
  }
  const model::Matrix& m = *s.matrix;
  out.values.resize(static_cast<size_t>(m.rows * m.cols));
  for (int64_t r = 0; r < m.rows; ++r) model::matrix_row(m, r, out.values.data() + r * m.cols, impl_->isa);
  return out;
}

void Decoder::set_weight(const std::string& name, const std::vector<int64_t>& shape, std::span<const float> values) {
  Impl& s = *impl_;
  const model::WeightSlot slot = find_weight(s.w, name);
  if (shape != slot.spec.shape)
    fail(kWhere, "set_weight: '" + name + "' has shape " + model::shape_text(slot.spec.shape) +
                     ", got values of shape " + model::shape_text(shape));
  int64_t count = 1;
  for (const int64_t d : shape) count *= d;
  if (static_cast<int64_t>(values.size()) != count)
    fail(kWhere, "set_weight: shape " + model::shape_text(shape) + " holds " + std::to_string(count) + " values, got " +
                     std::to_string(values.size()));
  if (slot.vector) {
    slot.vector->assign(values.begin(), values.end());
    return;
  }
  std::vector<uint8_t> copy(values.size() * sizeof(float));
  std::memcpy(copy.data(), values.data(), copy.size());
  const auto it = s.replaced.find(name);
  const size_t index = it != s.replaced.end() ? it->second : s.w.owned.size();
  if (index == s.w.owned.size()) s.w.owned.emplace_back(), s.replaced[name] = index;
  s.w.owned[index] = std::move(copy);  // a moved vector keeps its buffer: the matrix's rows stay valid
  *slot.matrix = model::matrix_over(s.w.owned[index].data(), DType::f32, shape[0], shape[1]);
  if (slot.matrix == &s.w.embed && s.w.config.tied_embeddings) s.w.output = s.w.embed;
}

void Decoder::save(const std::string& path) const {
  write_safetensors(path, model::weight_entries(impl_->w), {{kConfigKey, impl_->w.config.to_json()}});
}

}  // namespace attn
