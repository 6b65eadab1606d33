// attn._attn: a thin nanobind layer over attn::attend_into. Arrays arrive through DLPack /
// the buffer protocol as views (no copy); the Python side allocates outputs with the same
// framework as the inputs. The GIL is released while kernels run.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "attn/attn.hpp"
#include "attn/info.hpp"
#include "attn/pattern.hpp"
#include "attn/sampler.hpp"
#include "attn/concentration.hpp"
#include "attn/theory.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using Array = nb::ndarray<nb::ro, nb::device::cpu>;     // inputs: read-only views welcome
using OutArray = nb::ndarray<nb::device::cpu>;        // outputs: written in place

template <class A>
attn::DType dtype_of(const A& a, const char* name, bool allow_bool = false) {
  const auto dt = a.dtype();
  if (dt == nb::dtype<float>()) return attn::DType::f32;
  if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) && dt.bits == 16) return attn::DType::f16;
  if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && dt.bits == 16) return attn::DType::bf16;
  if (allow_bool && dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bool) && dt.bits == 8) return attn::DType::boolean;
  static const char* kinds[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  const std::string got = (dt.code < 7 ? kinds[dt.code] : "dtype") + std::to_string(dt.bits);
  throw nb::type_error((std::string(name) + " must be float32, float16 or bfloat16" +
                        (allow_bool ? std::string(" (or bool)") : std::string()) + ", got " + got).c_str());
}

// A 4-D array as a (B, H, N, D) view; with layout "bnhd" the array is (B, N, H, D).
template <class A>
attn::TensorView view_of(const A& a, const char* name, bool bnhd, bool allow_bool = false) {
  if (a.ndim() != 4)
    throw nb::value_error((std::string(name) + " must have 4 dimensions (" + (bnhd ? "B, N, H, D" : "B, H, N, D") +
                           "), got " + std::to_string(a.ndim())).c_str());
  attn::TensorView v;
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  v.dtype = dtype_of(a, name, allow_bool);
  const int p[4] = {0, bnhd ? 2 : 1, bnhd ? 1 : 2, 3};
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = static_cast<int64_t>(a.shape(p[i]));
    v.strides[i] = a.stride(p[i]);
  }
  return v;
}

// Masks and biases are always (B|1, H|1, N, M), whatever the q/k/v layout.
attn::TensorView mask_view(const Array& a, const char* name, bool allow_bool) { return view_of(a, name, false, allow_bool); }

std::vector<float> floats(const std::optional<Array>& a, const char* name) {
  std::vector<float> out;
  if (!a) return out;
  if (a->dtype() != nb::dtype<float>()) throw nb::type_error((std::string(name) + " must be float32").c_str());
  const auto* p = static_cast<const float*>(a->data());
  const int64_t n = static_cast<int64_t>(a->size());
  out.resize(static_cast<size_t>(n));
  // honour strides of a 1-D or 2-D array
  if (a->ndim() == 1) {
    for (int64_t i = 0; i < n; ++i) out[i] = p[i * a->stride(0)];
  } else if (a->ndim() == 2) {
    for (size_t r = 0, k = 0; r < a->shape(0); ++r)
      for (size_t c = 0; c < a->shape(1); ++c) out[k++] = p[r * a->stride(0) + c * a->stride(1)];
  } else {
    throw nb::value_error((std::string(name) + " must have 1 or 2 dimensions").c_str());
  }
  return out;
}

// A named parameter of any rank as an ArrayView (no copy; validated by the mechanism).
attn::ArrayView array_view(const Array& a, const std::string& name) {
  attn::ArrayView v;
  v.data = a.data();
  v.dtype = dtype_of(a, ("params['" + name + "']").c_str());
  for (size_t i = 0; i < a.ndim(); ++i) {
    v.shape.push_back(static_cast<int64_t>(a.shape(i)));
    v.strides.push_back(a.stride(i));
  }
  return v;
}

// Everything but the outputs: the views and options one call needs.
struct Call {
  attn::TensorView q, k, v;
  attn::Mechanism mech;
  attn::AttendOptions opt;
  bool bnhd = true;
};

Call make_call(const Array& q, const Array& k, const Array& v, const std::string& mechanism, const std::string& layout,
               std::vector<int64_t> key_padding_lengths, std::optional<Array> mask, std::optional<Array> bias,
               std::optional<Array> alibi_slopes, std::optional<Array> block_mask, std::pair<int64_t, int64_t> block_size,
               const std::map<std::string, Array>& params, int threads, const std::string& form, const std::string& isa) {
  if (layout != "bnhd" && layout != "bhnd")
    throw nb::value_error(("layout must be 'bnhd' or 'bhnd', got '" + layout + "'").c_str());
  Call c;
  c.bnhd = layout == "bnhd";
  c.mech = attn::parse_mechanism(mechanism);
  c.opt.threads = threads;
  c.opt.form = form;
  if (!isa.empty()) c.opt.isa = attn::parse_isa(isa, "isa");
  c.opt.key_padding_lengths = std::move(key_padding_lengths);
  if (mask) c.opt.mask = mask_view(*mask, "attn_mask", true);
  if (bias) c.opt.bias = mask_view(*bias, "bias", false);
  if (block_mask) c.opt.block_mask = mask_view(*block_mask, "block_mask", true);
  c.opt.block_size = block_size;
  c.opt.alibi_slopes = floats(alibi_slopes, "alibi_slopes");
  for (const auto& [name, a] : params) c.opt.params[name] = array_view(a, name);
  c.q = view_of(q, "q", c.bnhd), c.k = view_of(k, "k", c.bnhd), c.v = view_of(v, "v", c.bnhd);
  return c;
}

// A (B, H, N) float32 array (lse, a row statistic) as the (B, H, N, 1) view attend takes.
attn::TensorView row_view(const OutArray& a, const char* name) {
  if (a.ndim() != 3) throw nb::value_error((std::string(name) + " must have 3 dimensions (B, H, N)").c_str());
  attn::TensorView t;
  t.data = a.data();
  t.dtype = dtype_of(a, name);
  t.shape = {static_cast<int64_t>(a.shape(0)), static_cast<int64_t>(a.shape(1)), static_cast<int64_t>(a.shape(2)), 1};
  t.strides = {a.stride(0), a.stride(1), a.stride(2), 1};
  return t;
}

void attend_into(const Array& q, const Array& k, const Array& v, const std::string& mechanism, const OutArray& out,
                 std::optional<OutArray> lse, std::optional<OutArray> probs, const std::string& layout,
                 std::vector<int64_t> key_padding_lengths, std::optional<Array> mask, std::optional<Array> bias,
                 std::optional<Array> alibi_slopes, std::optional<Array> block_mask,
                 std::pair<int64_t, int64_t> block_size, const std::map<std::string, Array>& params, int threads,
                 const std::string& form, const std::string& isa, std::optional<OutArray> final_state,
                 std::optional<std::vector<OutArray>> stats, int64_t stats_topk) {
  Call c = make_call(q, k, v, mechanism, layout, std::move(key_padding_lengths), mask, bias, alibi_slopes,
                     block_mask, block_size, params, threads, form, isa);
  const attn::TensorView ov = view_of(out, "out", c.bnhd);
  std::optional<attn::TensorView> sv;
  if (final_state) sv = view_of(*final_state, "final_state", false);  // (B, H, F, columns)
  std::optional<attn::TensorView> lv, pv;
  if (lse) lv = row_view(*lse, "lse");
  if (probs) pv = view_of(*probs, "probs", false);
  std::optional<attn::RowStatsViews> rv;
  if (stats) {  // sparsity, entropy, max_weight, topk_mass
    if (stats->size() != 4) throw nb::value_error("stats must be 4 arrays (sparsity, entropy, max_weight, topk_mass)");
    rv = attn::RowStatsViews{row_view((*stats)[0], "sparsity"), row_view((*stats)[1], "entropy"),
                             row_view((*stats)[2], "max_weight"), row_view((*stats)[3], "topk_mass")};
    c.opt.stats_topk = stats_topk;
  }
  nb::gil_scoped_release release;
  attn::attend_into(c.q, c.k, c.v, c.mech, c.opt, ov, lv ? &*lv : nullptr, pv ? &*pv : nullptr, sv ? &*sv : nullptr,
                    rv ? &*rv : nullptr);
}

std::string explain(const Array& q, const Array& k, const Array& v, const std::string& mechanism,
                    const std::string& layout, std::vector<int64_t> key_padding_lengths, std::optional<Array> mask,
                    std::optional<Array> bias, std::optional<Array> alibi_slopes, std::optional<Array> block_mask,
                    std::pair<int64_t, int64_t> block_size, const std::map<std::string, Array>& params, int threads,
                    const std::string& form, const std::string& isa, bool return_lse, bool return_probs,
                    bool return_stats, int64_t stats_topk) {
  Call c = make_call(q, k, v, mechanism, layout, std::move(key_padding_lengths), mask, bias, alibi_slopes, block_mask,
                     block_size, params, threads, form, isa);
  c.opt.return_lse = return_lse;
  c.opt.return_probs = return_probs;
  c.opt.return_stats = return_stats;
  c.opt.stats_topk = stats_topk;
  return attn::explain(c.q, c.k, c.v, c.mech, c.opt).text();
}

// A 2-D (P, R/2) rotary table as a (1, 1, P, R/2) view.
attn::TensorView table_view(const Array& a, const char* name) {
  if (a.ndim() != 2)
    throw nb::value_error((std::string(name) + " must have 2 dimensions (positions, rotary_dim / 2), got " +
                           std::to_string(a.ndim())).c_str());
  attn::TensorView v;
  v.data = const_cast<void*>(a.data());
  v.dtype = dtype_of(a, name);
  v.shape = {1, 1, static_cast<int64_t>(a.shape(0)), static_cast<int64_t>(a.shape(1))};
  v.strides = {0, 0, a.stride(0), a.stride(1)};
  return v;
}

// A packed (total, H, D) array as a (1, H, total, D) view.
template <class A>
attn::TensorView packed_view(const A& a, const char* name) {
  if (a.ndim() != 3)
    throw nb::value_error((std::string(name) + " must have 3 dimensions (total tokens, heads, head_dim), got " +
                           std::to_string(a.ndim())).c_str());
  attn::TensorView v;
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  v.dtype = dtype_of(a, name);
  v.shape = {1, static_cast<int64_t>(a.shape(1)), static_cast<int64_t>(a.shape(0)), static_cast<int64_t>(a.shape(2))};
  v.strides = {0, a.stride(1), a.stride(0), a.stride(2)};
  return v;
}

// An lse array as a (B, H, N, 1) view: (B, H, N) as given, or (H, total) as (1, H, total).
attn::TensorView lse_view(const OutArray& a) {
  attn::TensorView t;
  t.data = a.data();
  t.dtype = dtype_of(a, "lse");
  if (a.ndim() == 3) {
    t.shape = {static_cast<int64_t>(a.shape(0)), static_cast<int64_t>(a.shape(1)), static_cast<int64_t>(a.shape(2)), 1};
    t.strides = {a.stride(0), a.stride(1), a.stride(2), 1};
  } else if (a.ndim() == 2) {
    t.shape = {1, static_cast<int64_t>(a.shape(0)), static_cast<int64_t>(a.shape(1)), 1};
    t.strides = {0, a.stride(0), a.stride(1), 1};
  } else {
    throw nb::value_error("lse must have 3 dimensions (B, H, N) or 2 (H, total)");
  }
  return t;
}

using BlockTable = nb::ndarray<const int32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

void kvcache_into(const Array& q, const OutArray& k_cache, const OutArray& v_cache, std::optional<Array> k,
                  std::optional<Array> v, std::optional<Array> rotary_cos, std::optional<Array> rotary_sin,
                  bool rotary_interleaved, std::vector<int64_t> cache_seqlens, std::optional<BlockTable> block_table,
                  const std::string& mechanism, std::optional<Array> alibi_slopes, const OutArray& out,
                  std::optional<OutArray> lse, int threads) {
  attn::KvCacheUpdate u;
  u.cache_seqlens = std::move(cache_seqlens);
  if (k) u.k = view_of(*k, "k", true);
  if (v) u.v = view_of(*v, "v", true);
  if (rotary_cos.has_value() != rotary_sin.has_value())
    throw nb::value_error("give both rotary_cos and rotary_sin, or neither");
  if (rotary_cos)
    u.rotary = attn::RotaryTables{table_view(*rotary_cos, "rotary_cos"), table_view(*rotary_sin, "rotary_sin"),
                                  rotary_interleaved ? attn::RopeStyle::interleaved : attn::RopeStyle::half};
  if (block_table) {
    const auto* p = block_table->data();
    u.paged = attn::PagedKv{std::vector<int32_t>(p, p + block_table->size()), static_cast<int64_t>(block_table->shape(1)), -1};
  }
  attn::AttendOptions opt;
  opt.threads = threads;
  opt.alibi_slopes = floats(alibi_slopes, "alibi_slopes");
  const attn::Mechanism mech = attn::parse_mechanism(mechanism);
  const attn::TensorView qv = view_of(q, "q", true), kc = view_of(k_cache, "k_cache", true),
                         vc = view_of(v_cache, "v_cache", true), ov = view_of(out, "out", true);
  std::optional<attn::TensorView> lv;
  if (lse) lv = lse_view(*lse);
  nb::gil_scoped_release release;
  attn::attend_with_kvcache_into(qv, kc, vc, u, mech, opt, ov, lv ? &*lv : nullptr);
}

void varlen_into(const Array& q, const Array& k, const Array& v, std::vector<int64_t> cu_q, std::vector<int64_t> cu_k,
                 int64_t max_q, int64_t max_k, const std::string& mechanism, std::optional<Array> alibi_slopes,
                 const OutArray& out, std::optional<OutArray> lse, int threads) {
  attn::AttendOptions opt;
  opt.threads = threads;
  opt.alibi_slopes = floats(alibi_slopes, "alibi_slopes");
  const attn::Mechanism mech = attn::parse_mechanism(mechanism);
  const attn::TensorView qv = packed_view(q, "q"), kv = packed_view(k, "k"), vv = packed_view(v, "v"),
                         ov = packed_view(out, "out");
  std::optional<attn::TensorView> lv;
  if (lse) lv = lse_view(*lse);
  nb::gil_scoped_release release;
  attn::attend_varlen_into(qv, kv, vv, cu_q, cu_k, max_q, max_k, mech, opt, ov, lv ? &*lv : nullptr);
}

void rope_inplace(const OutArray& x, const std::string& layout, int64_t offset, double theta, const std::string& style,
                  int64_t rotary_dim, std::vector<int64_t> batch_offsets) {
  if (layout != "bnhd" && layout != "bhnd")
    throw nb::value_error(("layout must be 'bnhd' or 'bhnd', got '" + layout + "'").c_str());
  if (style != "half" && style != "interleaved")
    throw nb::value_error(("style must be 'half' or 'interleaved', got '" + style + "'").c_str());
  const attn::TensorView v = view_of(x, "x", layout == "bnhd");
  attn::Rope r;
  r.offset = offset, r.theta = theta, r.rotary_dim = rotary_dim;
  r.style = style == "half" ? attn::RopeStyle::half : attn::RopeStyle::interleaved;
  nb::gil_scoped_release release;
  attn::apply_rope(v, r, batch_offsets);
}

// The layer specs for `mechanisms`: one text per layer, or one text for every layer that is not
// a lightning layer (those keep theirs: their weights differ).
std::vector<attn::DecoderLayerSpec> layer_specs(const attn::DecoderConfig& c, const std::vector<std::string>& mechanisms) {
  if (mechanisms.size() != 1 && mechanisms.size() != c.layers.size())
    throw nb::value_error(("mechanisms: expected one text or one per layer (" + std::to_string(c.layers.size()) +
                           "), got " + std::to_string(mechanisms.size())).c_str());
  std::vector<attn::DecoderLayerSpec> specs = c.layers;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (mechanisms.size() == 1 && specs[i].lightning) continue;
    specs[i].mechanism = attn::parse_mechanism(mechanisms.size() == 1 ? mechanisms[0] : mechanisms[i]);
    specs[i].rope = !specs[i].lightning && !attn::info(specs[i].mechanism).applies_positions;
  }
  return specs;
}

attn::Decoder load_decoder(const std::string& path, int threads, const std::optional<std::vector<std::string>>& mechanisms) {
  if (!mechanisms) return attn::Decoder::from_safetensors(path, threads);
  const attn::SafetensorsFile f = attn::SafetensorsFile::open(path);
  const auto it = f.metadata().find("attn.decoder");
  if (it == f.metadata().end()) return attn::Decoder::from_safetensors(path, threads);  // its error
  const std::vector<attn::DecoderLayerSpec> specs =
      layer_specs(attn::DecoderConfig::from_json(it->second, path), *mechanisms);
  return attn::Decoder::from_safetensors(path, threads, &specs);
}

nb::ndarray<nb::numpy, float> decoder_forward(attn::Decoder& d, const std::vector<int32_t>& tokens, int64_t pos,
                                              bool all_logits) {
  const std::vector<float>* logits = nullptr;
  {
    nb::gil_scoped_release release;
    logits = &d.forward(tokens, pos, all_logits);
  }
  const size_t vocab = static_cast<size_t>(d.config().vocab_size), rows = logits->size() / vocab;
  auto* copy = new std::vector<float>(*logits);
  nb::capsule owner(copy, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  return nb::ndarray<nb::numpy, float>(copy->data(), {rows, vocab}, owner);
}

}  // namespace

NB_MODULE(_attn, m) {
  m.doc() = "Low-level bindings of the attn C++ library; use the functions of the attn package.";
  m.def("attend_into", &attend_into, "q"_a, "k"_a, "v"_a, "mechanism"_a, "out"_a, "lse"_a.none(), "probs"_a.none(),
        "layout"_a, "key_padding_lengths"_a, "mask"_a.none(), "bias"_a.none(), "alibi_slopes"_a.none(),
        "block_mask"_a.none(), "block_size"_a, "params"_a, "threads"_a, "form"_a, "isa"_a,
        "final_state"_a.none() = nb::none(), "stats"_a.none() = nb::none(), "stats_topk"_a = 8,
        "Runs attn::attend_into on caller-allocated outputs (no copies of inputs).");
  m.def(
      "state_shape",
      [](const Array& q, const Array& k, const Array& v, const std::string& mechanism, const std::string& layout,
         std::vector<int64_t> key_padding_lengths, const std::map<std::string, Array>& params) {
        const Call c = make_call(q, k, v, mechanism, layout, std::move(key_padding_lengths), std::nullopt, std::nullopt,
                                 std::nullopt, std::nullopt, {128, 128}, params, 0, "", "");
        const std::array<int64_t, 4> s = attn::state_shape(c.q, c.k, c.v, c.mech, c.opt);
        return std::vector<int64_t>(s.begin(), s.end());
      },
      "q"_a, "k"_a, "v"_a, "mechanism"_a, "layout"_a, "key_padding_lengths"_a, "params"_a,
      "(B, H, F, columns) of the call's recurrent state (attn::state_shape); zeros without one.");
  m.def("explain", &explain, "q"_a, "k"_a, "v"_a, "mechanism"_a, "layout"_a, "key_padding_lengths"_a, "mask"_a.none(),
        "bias"_a.none(), "alibi_slopes"_a.none(), "block_mask"_a.none(), "block_size"_a, "params"_a, "threads"_a,
        "form"_a, "isa"_a, "return_lse"_a, "return_probs"_a, "return_stats"_a = false, "stats_topk"_a = 8,
        "Which form attn::attend would run for this call, and why the others would not.");
  m.def("kvcache_into", &kvcache_into, "q"_a, "k_cache"_a, "v_cache"_a, "k"_a.none(), "v"_a.none(),
        "rotary_cos"_a.none(), "rotary_sin"_a.none(), "rotary_interleaved"_a, "cache_seqlens"_a,
        "block_table"_a.none(), "mechanism"_a, "alibi_slopes"_a.none(), "out"_a, "lse"_a.none(), "threads"_a,
        "Runs attn::attend_with_kvcache_into: appends k/v to the caches in place, then attends (flash-attn layout).");
  m.def("varlen_into", &varlen_into, "q"_a, "k"_a, "v"_a, "cu_seqlens_q"_a, "cu_seqlens_k"_a, "max_seqlen_q"_a,
        "max_seqlen_k"_a, "mechanism"_a, "alibi_slopes"_a.none(), "out"_a, "lse"_a.none(), "threads"_a,
        "Runs attn::attend_varlen_into on packed (total, H, D) arrays.");
  m.def("rope_inplace", &rope_inplace, "x"_a, "layout"_a, "offset"_a, "theta"_a, "style"_a, "rotary_dim"_a,
        "batch_offsets"_a, "Rotates x in place with RoPE (attn::apply_rope).");
  m.def("data_pointer", [](const Array& a) { return reinterpret_cast<uintptr_t>(a.data()); }, "a"_a,
        "Address of the array's first element as the C++ side sees it (zero-copy checks).");
  m.def("info_json", [](const std::string& text, int64_t context) { return attn::info(attn::parse_mechanism(text), context).to_json(); },
        "text"_a, "context"_a, "attn::info(mechanism, context) as JSON.");
  m.def("family_infos_json", [] {
        std::vector<std::string> out;
        for (const attn::MechanismInfo& i : attn::family_infos()) out.push_back(i.to_json());
        return out;
      }, "attn::family_infos() as JSON texts.");
  m.def("canonical_mechanism", [](const std::string& s) { return attn::to_string(attn::parse_mechanism(s)); },
        "text"_a, "Parses a mechanism text form and returns its canonical spelling.");
  m.def(
      "mask_of",
      [](const std::string& mechanism, int64_t n, int64_t m) {
        attn::Tensor t = attn::mask_of(attn::parse_mechanism(mechanism), n, m);
        auto* owner = new attn::Tensor(std::move(t));
        nb::capsule free(owner, [](void* p) noexcept { delete static_cast<attn::Tensor*>(p); });
        return nb::ndarray<nb::numpy, bool, nb::ndim<2>>(owner->view().data, {static_cast<size_t>(n), static_cast<size_t>(m)},
                                                          free);
      },
      "mechanism"_a, "n"_a, "m"_a, "The (n, m) bool mask the mechanism's key pattern implies (attn::mask_of).");
  m.def(
      "lsh_buckets",
      [](const Array& q, const Array& k, const std::string& mechanism, const std::string& layout,
         std::vector<int64_t> key_padding_lengths, const std::map<std::string, Array>& params) {
        const Call c = make_call(q, k, k, mechanism, layout, std::move(key_padding_lengths), std::nullopt, std::nullopt,
                                 std::nullopt, std::nullopt, {128, 128}, params, 0, "", "");
        const auto* lsh = std::get_if<attn::Lsh>(&c.mech);
        if (!lsh) throw nb::value_error(("lsh_buckets needs an lsh mechanism such as 'lsh:buckets=32', got '" +
                                         mechanism + "'").c_str());
        auto* owner = new attn::LshBuckets(attn::lsh_buckets(c.q, c.k, c.k, *lsh, c.opt));
        nb::capsule free(owner, [](void* p) noexcept { delete static_cast<attn::LshBuckets*>(p); });
        using Out = nb::ndarray<nb::numpy, int32_t, nb::ndim<4>>;
        const size_t qshape[4] = {static_cast<size_t>(owner->B), static_cast<size_t>(owner->H),
                                  static_cast<size_t>(owner->rounds), static_cast<size_t>(owner->N)};
        const size_t kshape[4] = {static_cast<size_t>(owner->B), static_cast<size_t>(owner->key_heads),
                                  static_cast<size_t>(owner->rounds), static_cast<size_t>(owner->M)};
        return nb::make_tuple(Out(owner->query.data(), 4, qshape, free), Out(owner->key.data(), 4, kshape, free));
      },
      "q"_a, "k"_a, "mechanism"_a, "layout"_a, "key_padding_lengths"_a, "params"_a,
      "Reformer's buckets for q and k (attn::lsh_buckets): ((B, H, rounds, N), (B, Hk, rounds, M)) int32.");
  nb::class_<attn::Decoder>(m, "Decoder", "attn::Decoder: a llama-style decoder over attn's mechanisms.")
      .def_static("load", &load_decoder, "path"_a, "threads"_a, "mechanisms"_a.none(),
                  "Maps a safetensors file written by Decoder.save (config in its metadata).")
      .def_static(
          "random",
          [](const std::string& config_json, uint64_t seed, const std::string& dtype, int threads) {
            const attn::DType dt = dtype == "float32" ? attn::DType::f32
                                   : dtype == "bfloat16" ? attn::DType::bf16
                                   : dtype == "float16" ? attn::DType::f16
                                   : throw nb::value_error(("dtype must be 'float32', 'bfloat16' or 'float16', got '" + dtype + "'").c_str());
            return attn::Decoder::random(attn::DecoderConfig::from_json(config_json, "config"), seed, dt, threads);
          },
          "config_json"_a, "seed"_a, "dtype"_a, "threads"_a, "Random weights (counter-based from seed).")
      .def("forward", &decoder_forward, "tokens"_a, "pos"_a, "all_logits"_a,
           "Runs tokens at positions pos.. and returns logits (rows, vocab) as a new float32 array.")
      .def("reset", &attn::Decoder::reset, "Forgets the context.")
      .def_prop_ro("position", &attn::Decoder::position)
      .def_prop_ro("config_json", [](const attn::Decoder& d) { return d.config().to_json(); })
      .def_prop_ro("kv_bytes_per_token", &attn::Decoder::kv_bytes_per_token)
      .def_prop_ro("state_bytes", &attn::Decoder::state_bytes)
      .def("save", &attn::Decoder::save, "path"_a, "Writes weights and config to a safetensors file.")
      .def("set_attention_form", &attn::Decoder::set_attention_form, "form"_a)
      .def_static(
          "from_gguf",
          [](const std::string& path, int threads, bool dequantize, int64_t max_seq_len) {
            return attn::Decoder::from_gguf(path, {threads, dequantize, max_seq_len});
          },
          "path"_a, "threads"_a, "dequantize"_a, "max_seq_len"_a,
          "Maps a llama-architecture GGUF file (quantized matrices used as stored unless dequantize).")
      .def(
          "set_mechanism",
          [](attn::Decoder& d, int64_t layer, const std::string& text) { d.set_mechanism(layer, attn::parse_mechanism(text)); },
          "layer"_a, "mechanism"_a, "Replaces layer `layer`'s mechanism (-1: every layer).")
      .def_prop_ro("parameter_count", &attn::Decoder::parameter_count)
      .def(
          "token_nll",
          [](attn::Decoder& d, const std::vector<int32_t>& tokens) {
            nb::gil_scoped_release release;
            return attn::token_nll(d, tokens);
          },
          "tokens"_a, "Negative log-likelihood of tokens[1:] given their prefixes (one pass from an empty context).");
  nb::class_<attn::Sampler>(m, "Sampler", "attn::Sampler: greedy or nucleus sampling, counter-based draws.")
      .def(
          "__init__",
          [](attn::Sampler* self, double temperature, double top_p, uint64_t seed) {
            new (self) attn::Sampler(attn::SamplingOptions{temperature, top_p, seed});
          },
          "temperature"_a, "top_p"_a, "seed"_a)
      .def(
          "next",
          [](attn::Sampler& s, nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> logits) {
            return s.next(logits.data(), static_cast<int64_t>(logits.shape(0)));
          },
          "logits"_a, "The next token id from a row of logits (advances the draw counter).");
  // ---- Tokenizer (attn::Tokenizer; Python: attn.Tokenizer in python/attn/tokenizer.py) ----------------
  nb::class_<attn::Tokenizer>(m, "Tokenizer", "attn::Tokenizer: a GGUF file's byte-level BPE tokenizer.")
      .def_static("from_gguf", [](const std::string& path) { return attn::Tokenizer::from_gguf(path); }, "path"_a,
                  "Reads tokenizer.ggml.* and tokenizer.chat_template from a GGUF file.")
      .def(
          "encode",
          [](const attn::Tokenizer& t, const std::string& text, bool special) {
            std::vector<int32_t> ids;
            {
              nb::gil_scoped_release release;
              ids = t.encode(text, special);
            }
            return ids;
          },
          "text"_a, "special"_a, "Token ids of a str (UTF-8); special: match special-token texts.")
      .def(
          "encode",
          [](const attn::Tokenizer& t, const nb::bytes& text, bool special) {
            const std::string_view view(text.c_str(), text.size());
            std::vector<int32_t> ids;
            {
              nb::gil_scoped_release release;
              ids = t.encode(view, special);
            }
            return ids;
          },
          "text"_a, "special"_a, "Token ids of bytes.")
      .def(
          "decode",
          [](const attn::Tokenizer& t, const std::vector<int32_t>& ids) {
            const std::string bytes = t.decode(ids);
            return nb::bytes(bytes.data(), bytes.size());
          },
          "ids"_a, "The bytes the ids stand for (incomplete UTF-8 kept as it is).")
      .def("token_text", &attn::Tokenizer::token_text, "id"_a, "The token as the vocabulary writes it ('Ġthe').")
      .def("is_special", &attn::Tokenizer::is_special, "id"_a, "Control or user-defined token.")
      .def_prop_ro("bos_id", &attn::Tokenizer::bos_id)
      .def_prop_ro("eos_id", &attn::Tokenizer::eos_id)
      .def_prop_ro("vocab_size", &attn::Tokenizer::vocab_size)
      .def(
          "chat_prompt",
          [](const attn::Tokenizer& t, const std::vector<std::pair<std::string, std::string>>& messages,
             bool add_generation_prompt) {
            std::vector<attn::ChatMessage> m;
            for (const auto& [role, content] : messages) m.push_back({role, content});
            return t.chat_prompt(m, add_generation_prompt);
          },
          "messages"_a, "add_generation_prompt"_a, "The file's ChatML template applied to (role, content) pairs.")
      .def_static("unicode_version", &attn::Tokenizer::unicode_version);
  // ---- end Tokenizer ----------------------------------------------------------------------------------
  // ---- concentration measures (attn::concentration) and their n -> infinity closed forms (attn::theory) ----
  m.def(
      "row_measure",
      [](nb::ndarray<const double, nb::ndim<2>, nb::c_contig, nb::device::cpu> rows, const std::string& what, int64_t k) {
        const int64_t r = static_cast<int64_t>(rows.shape(0)), n = static_cast<int64_t>(rows.shape(1));
        auto* out = new std::vector<double>(static_cast<size_t>(r));
        nb::capsule owner(out, [](void* p) noexcept { delete static_cast<std::vector<double>*>(p); });
        for (int64_t i = 0; i < r; ++i) {
          const double* a = rows.data() + i * n;
          double& o = (*out)[static_cast<size_t>(i)];
          if (what == "sparsity") o = attn::concentration::sparsity(a, n);
          else if (what == "entropy") o = attn::concentration::entropy(a, n);
          else if (what == "max_weight") o = attn::concentration::max_weight(a, n);
          else if (what == "topk_mass") o = attn::concentration::topk_mass(a, n, k);
          else throw nb::value_error(("what: expected sparsity, entropy, max_weight or topk_mass, got '" + what + "'").c_str());
        }
        return nb::ndarray<nb::numpy, double, nb::ndim<1>>(out->data(), {static_cast<size_t>(r)}, owner);
      },
      "rows"_a, "what"_a, "k"_a, "One measure per row of a (rows, n) float64 array.");
  m.def(
      "theory_sparsity",
      [](const std::string& f, double beta, double gamma) {
        if (f == "exp") return attn::theory::sparsity_exp(beta, gamma);
        if (f == "relu2") return attn::theory::sparsity_relu2(beta, gamma);
        if (f == "relu2_erf_form") return attn::theory::sparsity_relu2_erf_form(beta, gamma);
        if (f == "identity") return attn::theory::sparsity_identity(beta, gamma);
        throw nb::value_error(("f: expected exp, relu2, relu2_erf_form or identity, got '" + f + "'").c_str());
      },
      "f"_a, "beta"_a, "gamma"_a);
  m.def("theory_sparsity_decay", &attn::theory::sparsity_decay, "lam"_a, "n"_a);
  m.def("theory_sparsity_linear", &attn::theory::sparsity_linear, "q"_a, "mu"_a, "sigma"_a);
  m.def("theory_sparsity_linear_iid", &attn::theory::sparsity_linear_iid, "q"_a, "mean"_a, "deviation"_a);
  m.def("active_isa", [] { return attn::isa_name(attn::active_isa()); }, "Kernel set in use (ATTN_ISA overrides).");
  m.def("supported_isas", [] {
    std::vector<std::string> out;
    for (auto i : attn::supported_isas()) out.push_back(attn::isa_name(i));
    return out;
  });
  m.def("set_isa", [](const std::string& name) { attn::set_isa(attn::parse_isa(name, "set_isa")); }, "name"_a,
        "Sets the process-wide default kernel set (portable/scalar, avx2, avx512); raises if the CPU cannot run it.\n"
        "Prefer the isa= argument of attend(), which applies to one call.");
}
