// attn._attn: a thin nanobind layer over attn::attend. Arrays arrive through DLPack / the buffer
// protocol as views (no copy); each call takes one options object (_attn.Options, attn's
// AttendOptions by field name); C++ validates, allocates the outputs and hands them to Python
// without a copy, as NumPy arrays or torch tensors like the inputs. The GIL is released while
// kernels run.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <limits>

#include "attn/attn.hpp"
#include "attn/blocks.hpp"
#include "attn/llm.hpp"
#include "attn/shards.hpp"
#include "base/parallel.hpp"
#include "attn/info.hpp"
#include "attn/pattern.hpp"
#include "attn/sampler.hpp"
#include "attn/concentration.hpp"
#include "attn/theory.hpp"

namespace nb = nanobind;
using namespace nb::literals;

void bind_output_softmax(nb::module_& m);  // python/output_bindings.cpp
void bind_titans(nb::module_& m);          // python/titans_bindings.cpp
void bind_refinement(nb::module_& m);      // python/refinement_bindings.cpp
void bind_sana(nb::module_& m);            // python/sana_bindings.cpp
void bind_moe(nb::module_& m);  // python/moe_bindings.cpp
#ifdef ATTN_PY_MPI
void bind_distributed(nb::module_& m);  // python/distributed_bindings.cpp (built when CMake finds MPI)
#endif

namespace {

using Array = nb::ndarray<nb::ro, nb::device::cpu>;     // inputs: read-only views welcome
using OutArray = nb::ndarray<nb::device::cpu>;        // outputs: written in place

template <class A>
attn::DType dtype_of(const A& a, const char* name, bool allow_bool = false, bool allow_int8 = false) {
  const auto dt = a.dtype();
  if (dt == nb::dtype<float>()) return attn::DType::f32;
  if (allow_int8 && dt == nb::dtype<int8_t>()) return attn::DType::i8;  // an 8-bit KV cache's rows
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
attn::TensorView view_of(const A& a, const char* name, bool bnhd, bool allow_bool = false, bool allow_int8 = false) {
  if (a.ndim() != 4)
    throw nb::value_error((std::string(name) + " must have 4 dimensions (" + (bnhd ? "B, N, H, D" : "B, H, N, D") +
                           "), got " + std::to_string(a.ndim())).c_str());
  attn::TensorView v;
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  v.dtype = dtype_of(a, name, allow_bool, allow_int8);
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

// ---- one options object per call ----------------------------------------------------------------
// _attn.Options: attn::AttendOptions with Python's types (arrays as views, text names), filled by
// field name on the Python side. Ranges and names are checked by C++ (attend's validation), once.
struct Options {
  std::string layout = "bnhd";        // q/k/v (and out) are (B, N, H, D) ("bnhd") or (B, H, N, D)
  std::vector<int64_t> key_padding_lengths;
  std::optional<Array> mask;          // bool (B|1, H|1, N, M)
  std::optional<Array> bias;          // float (B|1, H|1, N, M)
  std::optional<Array> block_mask;    // bool (B|1, H|1, ceil(N / bq), ceil(M / bk))
  std::pair<int64_t, int64_t> block_size{128, 128};
  std::optional<Array> alibi_slopes;  // float32, H or (B, H)
  std::map<std::string, Array> params;
  std::optional<Array> k_scale, v_scale;  // int8 k and v rows' scales, float32 shaped as k with a last dim of 1
  int64_t threads = 0;
  std::string form;  // empty: the first form that supports the call
  std::string isa;   // empty: the active kernel set
  std::string precision = "auto";  // exact attention's products: auto, f32 or bf16 (attn::Precision)
  bool return_lse = false, return_probs = false, return_final_state = false, return_stats = false;
  int64_t stats_topk = 8;
  bool torch = false;  // outputs as torch tensors (else NumPy arrays)
};

// KvCacheUpdate with Python's types: the new tokens, rotary tables, cache lengths, block table.
struct KvUpdate {
  std::optional<Array> k, v;  // (B, Nnew, Hkv, D|Dv)
  std::optional<Array> rotary_cos, rotary_sin;  // (positions, rotary_dim / 2)
  bool rotary_interleaved = true;
  std::vector<int64_t> cache_seqlens;
  std::optional<nb::ndarray<const int32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>> block_table;
};

// A mechanism built from typed fields (or parsed once from text), passed to attend beside text.
struct PyMechanism {
  attn::Mechanism m;
};

attn::Mechanism mechanism_of(nb::handle h) {
  if (nb::isinstance<PyMechanism>(h)) return nb::cast<const PyMechanism&>(h).m;
  if (nb::isinstance<nb::str>(h)) return attn::parse_mechanism(nb::cast<std::string>(h));
  throw nb::type_error(("mechanism must be a str such as 'softmax:causal', got " +
                        std::string(nb::type_name(h.type()).c_str())).c_str());
}

// The C++ int a field is declared as; Python ints arrive as 64-bit integers.
int to_int(int64_t x, const char* name) {
  if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max())
    throw nb::value_error((std::string(name) + " must fit a 32-bit int, got " + std::to_string(x)).c_str());
  return static_cast<int>(x);
}

bool bnhd_of(const std::string& layout) {
  if (layout != "bnhd" && layout != "bhnd")
    throw nb::value_error(("layout must be 'bnhd' or 'bhnd', got '" + layout + "'").c_str());
  return layout == "bnhd";
}

// The attn::AttendOptions of `o` (views of its arrays, no copies but the ALiBi slopes).
attn::AttendOptions attend_options(const Options& o) {
  attn::AttendOptions opt;
  opt.out_layout = bnhd_of(o.layout) ? attn::Layout::bnhd : attn::Layout::bhnd;
  opt.threads = to_int(o.threads, "threads");
  opt.form = o.form;
  if (!o.isa.empty()) opt.isa = attn::parse_isa(o.isa, "isa");
  opt.precision = attn::parse_precision(o.precision, "precision");
  opt.key_padding_lengths = o.key_padding_lengths;
  if (o.mask) opt.mask = mask_view(*o.mask, "attn_mask", true);
  if (o.bias) opt.bias = mask_view(*o.bias, "attn_mask", false);  // a float attn_mask in Python
  if (o.block_mask) opt.block_mask = mask_view(*o.block_mask, "block_mask", true);
  opt.block_size = o.block_size;
  opt.alibi_slopes = floats(o.alibi_slopes, "alibi_slopes");
  for (const auto& [name, a] : o.params) opt.params[name] = array_view(a, name);
  if (o.k_scale && o.v_scale)
    opt.kv_scales = attn::KvScales{view_of(*o.k_scale, "kv_scales[0]", bnhd_of(o.layout)),
                                   view_of(*o.v_scale, "kv_scales[1]", bnhd_of(o.layout))};
  opt.return_lse = o.return_lse;
  opt.return_probs = o.return_probs;
  opt.return_final_state = o.return_final_state;
  opt.return_stats = o.return_stats;
  opt.stats_topk = o.stats_topk;
  return opt;
}

// Everything one call needs: the views, the mechanism and the options.
struct Call {
  attn::TensorView q, k, v;
  attn::Mechanism mech;
  attn::AttendOptions opt;
};

Call make_call(const Array& q, const Array& k, const Array& v, nb::handle mechanism, const Options& o) {
  Call c;
  c.mech = mechanism_of(mechanism);
  c.opt = attend_options(o);
  const bool bnhd = bnhd_of(o.layout);
  const bool int8_rows = c.opt.kv_scales.has_value();
  c.q = view_of(q, "q", bnhd), c.k = view_of(k, "k", bnhd, false, int8_rows), c.v = view_of(v, "v", bnhd, false, int8_rows);
  return c;
}

nb::dlpack::dtype dlpack_of(attn::DType t) {
  switch (t) {
    case attn::DType::f32: return nb::dtype<float>();
    case attn::DType::f16: return {static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
    case attn::DType::bf16: return {static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
    case attn::DType::boolean: return {static_cast<uint8_t>(nb::dlpack::dtype_code::Bool), 8, 1};
    case attn::DType::i8: return nb::dtype<int8_t>();
  }
  throw nb::type_error("unexpected output dtype");
}

// A tensor attn allocated, handed to Python without a copy (NumPy array or torch tensor, which
// frees it): `axes` picks and orders its (B, H, N, D) dims; dims left out must have size 1.
nb::object to_python(attn::Tensor&& t, std::initializer_list<int> axes, bool torch) {
  if (!t.defined()) return nb::none();
  auto* owner = new attn::Tensor(std::move(t));
  nb::capsule free(owner, [](void* p) noexcept { delete static_cast<attn::Tensor*>(p); });
  const attn::TensorView& v = owner->view();
  std::vector<size_t> shape;
  std::vector<int64_t> strides;
  for (int a : axes) shape.push_back(static_cast<size_t>(v.shape[a])), strides.push_back(v.strides[a]);
  if (torch)
    return nb::ndarray<nb::pytorch, nb::device::cpu>(v.data, shape.size(), shape.data(), free, strides.data(),
                                                     dlpack_of(v.dtype)).cast();
  return nb::ndarray<nb::numpy, nb::device::cpu>(v.data, shape.size(), shape.data(), free, strides.data(),
                                                 dlpack_of(v.dtype)).cast();
}

// attn::attend: C++ validates, allocates and fills every output. Returns (out, lse, probs,
// final_state, stats) with None for what was not asked; stats = (sparsity, entropy, max_weight,
// topk_mass), each (B, H, N).
nb::tuple attend(const Array& q, const Array& k, const Array& v, nb::handle mechanism, const Options& o) {
  const Call c = make_call(q, k, v, mechanism, o);
  attn::AttendResult r;
  {
    nb::gil_scoped_release release;
    r = attn::attend(c.q, c.k, c.v, c.mech, c.opt);
  }
  const bool t = o.torch;
  nb::object stats = nb::none();
  if (o.return_stats)
    stats = nb::make_tuple(to_python(std::move(r.sparsity), {0, 1, 2}, t), to_python(std::move(r.entropy), {0, 1, 2}, t),
                           to_python(std::move(r.max_weight), {0, 1, 2}, t),
                           to_python(std::move(r.topk_mass), {0, 1, 2}, t));
  return nb::make_tuple(to_python(std::move(r.out), bnhd_of(o.layout) ? std::initializer_list<int>{0, 2, 1, 3}
                                                                      : std::initializer_list<int>{0, 1, 2, 3}, t),
                        to_python(std::move(r.lse), {0, 1, 2}, t), to_python(std::move(r.probs), {0, 1, 2, 3}, t),
                        to_python(std::move(r.final_state), {0, 1, 2, 3}, t), stats);
}

// A (B, H, N) float32 array as a (B, H, N, 1) view.
attn::TensorView rows_view(const Array& a, const char* name) {
  if (a.ndim() != 3)
    throw nb::value_error((std::string(name) + " must have 3 dimensions (B, H, N), as attend returns lse, got " +
                           std::to_string(a.ndim())).c_str());
  attn::TensorView l;
  l.data = const_cast<void*>(a.data());
  l.dtype = dtype_of(a, name);
  l.shape = {static_cast<int64_t>(a.shape(0)), static_cast<int64_t>(a.shape(1)), static_cast<int64_t>(a.shape(2)), 1};
  l.strides = {a.stride(0), a.stride(1), a.stride(2), 1};
  return l;
}

// dq, dk, dv of attend() (attn::attend_backward), in the call's layout; lse as attend returns it (B, H, N),
// or None for a family without one (linear). dfinal_state: the gradient of the final state
// (B, H, F, columns) float32, or None. With params["initial_state"] the tuple gains its gradient
// (float32, its shape) as a fourth element; with learned params (Linformer's E and F, PolaFormer's
// power and coefficients) it gains a dict of their gradients by name (float32, each in its param's
// shape) last; otherwise it
// stays (dq, dk, dv).
nb::tuple attend_backward(const Array& dout, const Array& q, const Array& k, const Array& v, const Array& out,
                          std::optional<Array> lse, nb::handle mechanism, const Options& o, std::optional<Array> dlse,
                          std::optional<Array> dfinal_state) {
  const Call c = make_call(q, k, v, mechanism, o);
  // None stands for "this family has no lse" (GAU, the linear family); for a softmax it is a
  // missing argument, not an lse of shape (0, 0, 0, 0)
  if (!lse && attn::info(c.mech).has_lse)
    throw nb::value_error(("attend_backward: lse is required for '" + attn::to_string(c.mech) +
                           "' (its weights are a softmax), got None: pass the lse that attend(..., return_lse=True) "
                           "returned (None is for the families without one: GAU, the linear family)").c_str());
  const bool bnhd = bnhd_of(o.layout);
  const attn::TensorView d = view_of(dout, "dout", bnhd), ov = view_of(out, "out", bnhd);
  const attn::TensorView l = lse ? rows_view(*lse, "lse") : attn::TensorView{};
  std::optional<attn::TensorView> dl, ds;
  if (dlse) dl = rows_view(*dlse, "dlse");
  if (dfinal_state) ds = view_of(*dfinal_state, "dfinal_state", false);
  attn::AttendGradients g;
  {
    nb::gil_scoped_release release;
    g = attn::attend_backward(d, c.q, c.k, c.v, ov, l, c.mech, c.opt, dl ? &*dl : nullptr, ds ? &*ds : nullptr);
  }
  auto in_layout = [&](attn::Tensor&& t) {  // an initializer_list lives only as long as its full expression
    return bnhd ? to_python(std::move(t), {0, 2, 1, 3}, o.torch) : to_python(std::move(t), {0, 1, 2, 3}, o.torch);
  };
  nb::list grads;
  grads.append(in_layout(std::move(g.dq)));
  grads.append(in_layout(std::move(g.dk)));
  grads.append(in_layout(std::move(g.dv)));
  if (g.d_initial_state.defined()) grads.append(to_python(std::move(g.d_initial_state), {0, 1, 2, 3}, o.torch));
  if (!g.dparams.empty()) {
    nb::dict dparams;  // each held as (1, 1, rows, cols): returned in the param's shape, (rows, cols) or (cols)
    for (auto& [name, t] : g.dparams) {
      const auto given = c.opt.params.find(name);
      const bool vector = given != c.opt.params.end() && given->second.shape.size() == 1;
      dparams[name.c_str()] = vector ? to_python(std::move(t), {3}, o.torch) : to_python(std::move(t), {2, 3}, o.torch);
    }
    grads.append(dparams);
  }
  return nb::tuple(grads);
}

std::string explain(const Array& q, const Array& k, const Array& v, nb::handle mechanism, const Options& o) {
  const Call c = make_call(q, k, v, mechanism, o);
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

// attn::attend_with_kvcache (flash-attn layout): appends the update's k/v to the caches in place,
// then attends; C++ allocates out (B, N, H, Dv) and lse (B, H, N). Returns (out, lse or None).
nb::tuple attend_with_kvcache(const Array& q, const OutArray& k_cache, const OutArray& v_cache, const KvUpdate& u,
                              nb::handle mechanism, const Options& o) {
  attn::KvCacheUpdate cu;
  cu.cache_seqlens = u.cache_seqlens;
  if (u.k.has_value() != u.v.has_value()) throw nb::value_error("give both k and v (the new tokens), or neither");
  if (u.k) cu.k = view_of(*u.k, "k", true);
  if (u.v) cu.v = view_of(*u.v, "v", true);
  if (u.rotary_cos.has_value() != u.rotary_sin.has_value())
    throw nb::value_error("give both rotary_cos and rotary_sin, or neither");
  if (u.rotary_cos)
    cu.rotary = attn::RotaryTables{table_view(*u.rotary_cos, "rotary_cos"), table_view(*u.rotary_sin, "rotary_sin"),
                                   u.rotary_interleaved ? attn::RopeStyle::interleaved : attn::RopeStyle::half};
  if (u.block_table) {
    const auto* p = u.block_table->data();
    cu.paged = attn::PagedKv{std::vector<int32_t>(p, p + u.block_table->size()),
                             static_cast<int64_t>(u.block_table->shape(1)), -1};
  }
  const attn::Mechanism mech = mechanism_of(mechanism);
  attn::AttendOptions opt = attend_options(o);
  opt.out_layout = attn::Layout::bnhd;
  const attn::TensorView qv = view_of(q, "q", true), kc = view_of(k_cache, "k_cache", true),
                         vc = view_of(v_cache, "v_cache", true);
  attn::AttendResult r;
  {
    nb::gil_scoped_release release;
    r = attn::attend_with_kvcache(qv, kc, vc, cu, mech, opt);
  }
  return nb::make_tuple(to_python(std::move(r.out), {0, 2, 1, 3}, o.torch), to_python(std::move(r.lse), {0, 1, 2}, o.torch));
}

// attn::attend_varlen on packed (total, H, D) arrays; C++ allocates out (total_q, H, Dv), lse
// (H, total_q) and, with return_final_state (mechanisms with a state), each sequence's final state
// (S, H, F, C). Returns (out, lse or None, final_state or None).
nb::tuple attend_varlen(const Array& q, const Array& k, const Array& v, const std::vector<int64_t>& cu_q,
                        const std::vector<int64_t>& cu_k, int64_t max_q, int64_t max_k, nb::handle mechanism,
                        const Options& o) {
  const attn::Mechanism mech = mechanism_of(mechanism);
  attn::AttendOptions opt = attend_options(o);
  opt.out_layout = attn::Layout::bnhd;  // (1, total, H, Dv): the packed (total, H, Dv)
  const attn::TensorView qv = packed_view(q, "q"), kv = packed_view(k, "k"), vv = packed_view(v, "v");
  attn::AttendResult r;
  {
    nb::gil_scoped_release release;
    r = attn::attend_varlen(qv, kv, vv, cu_q, cu_k, max_q, max_k, mech, opt);
  }
  return nb::make_tuple(to_python(std::move(r.out), {2, 1, 3}, o.torch), to_python(std::move(r.lse), {1, 2}, o.torch),
                        to_python(std::move(r.final_state), {0, 1, 2, 3}, o.torch));
}

// attn::attend_varlen_backward on packed (total, H, D) arrays: dout and out (total_q, H, Dv), lse
// (H, total_q) or None, dlse likewise, dfinal_state (S, H, F, C) or None. Returns (dq, dk, dv) packed
// as q, k and v, then d_initial_state (S, H, F, C) when params has an initial_state, then a dict of
// the learned params' gradients (each in its param's shape) when the call has any.
nb::tuple attend_varlen_backward(const Array& dout, const Array& q, const Array& k, const Array& v, const Array& out,
                                 std::optional<Array> lse, const std::vector<int64_t>& cu_q,
                                 const std::vector<int64_t>& cu_k, int64_t max_q, int64_t max_k, nb::handle mechanism,
                                 const Options& o, std::optional<Array> dlse, std::optional<Array> dfinal_state) {
  const attn::Mechanism mech = mechanism_of(mechanism);
  const attn::AttendOptions opt = attend_options(o);
  const attn::TensorView qv = packed_view(q, "q"), kv = packed_view(k, "k"), vv = packed_view(v, "v");
  const attn::TensorView dv_ = packed_view(dout, "dout"), ov = packed_view(out, "out");
  // lse (H, total_q) as (1, H, total_q, 1)
  auto rows = [](const Array& a, const char* name) {
    if (a.ndim() != 2)
      throw nb::value_error((std::string(name) + " must have 2 dimensions (heads, total q tokens), got " +
                             std::to_string(a.ndim())).c_str());
    attn::TensorView l;
    l.data = const_cast<void*>(a.data());
    l.dtype = dtype_of(a, name);
    l.shape = {1, static_cast<int64_t>(a.shape(0)), static_cast<int64_t>(a.shape(1)), 1};
    l.strides = {0, a.stride(0), a.stride(1), 1};
    return l;
  };
  const attn::TensorView l = lse ? rows(*lse, "lse") : attn::TensorView{};
  std::optional<attn::TensorView> dl, ds;
  if (dlse) dl = rows(*dlse, "dlse");
  if (dfinal_state) ds = view_of(*dfinal_state, "dfinal_state", false);
  attn::AttendGradients g;
  {
    nb::gil_scoped_release release;
    g = attn::attend_varlen_backward(dv_, qv, kv, vv, ov, l, cu_q, cu_k, max_q, max_k, mech, opt, dl ? &*dl : nullptr,
                                     ds ? &*ds : nullptr);
  }
  nb::list grads;
  grads.append(to_python(std::move(g.dq), {2, 1, 3}, o.torch));
  grads.append(to_python(std::move(g.dk), {2, 1, 3}, o.torch));
  grads.append(to_python(std::move(g.dv), {2, 1, 3}, o.torch));
  if (g.d_initial_state.defined()) grads.append(to_python(std::move(g.d_initial_state), {0, 1, 2, 3}, o.torch));
  if (!g.dparams.empty()) {
    nb::dict dparams;  // each held as (1, 1, rows, cols): returned in the param's shape
    for (auto& [name, t] : g.dparams) {
      const auto given = opt.params.find(name);
      const bool vector = given != opt.params.end() && given->second.shape.size() == 1;
      dparams[name.c_str()] = vector ? to_python(std::move(t), {3}, o.torch) : to_python(std::move(t), {2, 3}, o.torch);
    }
    grads.append(dparams);
  }
  return nb::tuple(grads);
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
  nb::class_<Options>(m, "Options",
                      "attn::AttendOptions for one call, set by field name (ranges are checked by attend).")
      .def(nb::init<>())
      .def_rw("layout", &Options::layout)
      .def_rw("key_padding_lengths", &Options::key_padding_lengths)
      .def_rw("mask", &Options::mask)
      .def_rw("bias", &Options::bias)
      .def_rw("block_mask", &Options::block_mask)
      .def_rw("block_size", &Options::block_size)
      .def_rw("alibi_slopes", &Options::alibi_slopes)
      .def_rw("params", &Options::params)
      .def_rw("k_scale", &Options::k_scale)
      .def_rw("v_scale", &Options::v_scale)
      .def_rw("threads", &Options::threads)
      .def_rw("form", &Options::form)
      .def_rw("isa", &Options::isa)
      .def_rw("precision", &Options::precision)
      .def_rw("return_lse", &Options::return_lse)
      .def_rw("return_probs", &Options::return_probs)
      .def_rw("return_final_state", &Options::return_final_state)
      .def_rw("return_stats", &Options::return_stats)
      .def_rw("stats_topk", &Options::stats_topk)
      .def_rw("torch", &Options::torch, "Return torch tensors (else NumPy arrays).");
  nb::class_<KvUpdate>(m, "KvCacheUpdate", "attn::KvCacheUpdate: new tokens, rotary tables, cache lengths, block table.")
      .def(nb::init<>())
      .def_rw("k", &KvUpdate::k)
      .def_rw("v", &KvUpdate::v)
      .def_rw("rotary_cos", &KvUpdate::rotary_cos)
      .def_rw("rotary_sin", &KvUpdate::rotary_sin)
      .def_rw("rotary_interleaved", &KvUpdate::rotary_interleaved)
      .def_rw("cache_seqlens", &KvUpdate::cache_seqlens)
      .def_rw("block_table", &KvUpdate::block_table);
  nb::class_<PyMechanism>(m, "Mechanism", "An attn::Mechanism, parsed from text or built from typed fields.")
      .def("__init__", [](PyMechanism* self, const std::string& text) { new (self) PyMechanism{attn::parse_mechanism(text)}; },
           "text"_a)
      .def("__str__", [](const PyMechanism& p) { return attn::to_string(p.m); })
      .def("__repr__", [](const PyMechanism& p) { return "Mechanism('" + attn::to_string(p.m) + "')"; });
  m.def(
      "quantize_rows",
      [](const Array& x, const std::string& layout) {
        const bool bnhd = bnhd_of(layout);
        const attn::TensorView xv = view_of(x, "x", bnhd);
        const size_t d0 = x.shape(0), d1 = x.shape(1), d2 = x.shape(2), d3 = x.shape(3);
        auto* rows = new std::vector<int8_t>(d0 * d1 * d2 * d3);
        nb::capsule rows_owner(rows, [](void* p) noexcept { delete static_cast<std::vector<int8_t>*>(p); });
        auto* scales = new std::vector<float>(d0 * d1 * d2);
        nb::capsule scales_owner(scales, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
        // the outputs in x's dimension order, C-contiguous; viewed through the same layout
        const attn::TensorView rv = attn::make_view(rows->data(), attn::DType::i8, xv.shape[0], xv.shape[1], xv.shape[2],
                                                    xv.shape[3], bnhd ? attn::Layout::bnhd : attn::Layout::bhnd);
        const attn::TensorView sv = attn::make_view(scales->data(), attn::DType::f32, xv.shape[0], xv.shape[1],
                                                    xv.shape[2], 1, bnhd ? attn::Layout::bnhd : attn::Layout::bhnd);
        {
          nb::gil_scoped_release unlocked;
          attn::quantize_rows(xv, rv, sv);
        }
        return nb::make_tuple(nb::ndarray<nb::numpy, int8_t>(rows->data(), {d0, d1, d2, d3}, rows_owner),
                              nb::ndarray<nb::numpy, float>(scales->data(), {d0, d1, d2}, scales_owner));
      },
      "x"_a, "layout"_a = "bnhd", "attn::quantize_rows: (int8 rows, float32 scales) of a float array.");
  m.def(
      "softmax_mechanism",
      [](bool causal, std::optional<double> scale, std::pair<int64_t, int64_t> window, double softcap, double dropout,
         uint64_t seed) {
        attn::Softmax s;
        s.causal = causal, s.scale = scale, s.window_left = window.first, s.window_right = window.second;
        s.softcap = softcap, s.dropout = dropout, s.seed = seed;
        return PyMechanism{s};
      },
      nb::kw_only(), "causal"_a, "scale"_a.none(), "window"_a, "softcap"_a, "dropout"_a, "seed"_a,
      "An attn::Softmax from typed fields (checked by attend, as the text form's values are).");
  m.def(
      "linear_mechanism",
      [](const std::string& map, bool causal, bool normalize, std::optional<double> decay, int64_t chunk,
         std::optional<double> scale) {
        attn::Linear l;
        if (map.find(',') != std::string::npos)
          throw nb::value_error(("feature_map must be one name such as 'elu', got '" + map + "'").c_str());
        try {  // the names are the text form's: C++ owns them
          l.map = std::get<attn::Linear>(attn::parse_mechanism("linear:map=" + map)).map;
        } catch (const attn::Error& e) {
          throw nb::value_error((std::string("feature_map: ") + e.what()).c_str());
        }
        l.causal = causal, l.normalize = normalize, l.decay = decay, l.chunk = chunk, l.scale = scale;
        return PyMechanism{l};
      },
      nb::kw_only(), "map"_a, "causal"_a, "normalize"_a, "decay"_a.none(), "chunk"_a, "scale"_a.none(),
      "An attn::Linear from typed fields (checked by attend, as the text form's values are).");
  m.def("attend", &attend, "q"_a, "k"_a, "v"_a, "mechanism"_a, "options"_a,
        "attn::attend: validates, allocates and fills the outputs; (out, lse, probs, final_state, stats), None for "
        "what options did not ask for.");
  m.def(
      "state_shape",
      [](const Array& q, const Array& k, const Array& v, nb::handle mechanism, const Options& o) {
        const Call c = make_call(q, k, v, mechanism, o);
        const std::array<int64_t, 4> s = attn::state_shape(c.q, c.k, c.v, c.mech, c.opt);
        return std::vector<int64_t>(s.begin(), s.end());
      },
      "q"_a, "k"_a, "v"_a, "mechanism"_a, "options"_a,
      "(B, H, F, columns) of the call's recurrent state (attn::state_shape); zeros without one.");
  m.def("attend_backward", &attend_backward, "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "mechanism"_a, "options"_a,
        "dlse"_a = nb::none(), "dfinal_state"_a = nb::none(),
        "attn::attend_backward: (dq, dk, dv) of attend's output, recomputed from q, k, v and its out and lse "
        "(None for linear); d_initial_state follows when params has an initial_state, and a dict of the learned "
        "params' gradients (Linformer's E and F) last when the call passes them.");
  m.def("explain", &explain, "q"_a, "k"_a, "v"_a, "mechanism"_a, "options"_a,
        "Which form attn::attend would run for this call, and why the others would not.");
  m.def("attend_with_kvcache", &attend_with_kvcache, "q"_a, "k_cache"_a, "v_cache"_a, "update"_a, "mechanism"_a,
        "options"_a,
        "attn::attend_with_kvcache: appends the new k/v to the caches in place, then attends (flash-attn layout); "
        "(out, lse or None).");
  m.def("attend_varlen", &attend_varlen, "q"_a, "k"_a, "v"_a, "cu_seqlens_q"_a, "cu_seqlens_k"_a, "max_seqlen_q"_a,
        "max_seqlen_k"_a, "mechanism"_a, "options"_a,
        "attn::attend_varlen on packed (total, H, D) arrays; (out, lse or None, final_state or None).");
  m.def("attend_varlen_backward", &attend_varlen_backward, "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(),
        "cu_seqlens_q"_a, "cu_seqlens_k"_a, "max_seqlen_q"_a, "max_seqlen_k"_a, "mechanism"_a, "options"_a,
        "dlse"_a = nb::none(), "dfinal_state"_a = nb::none(),
        "attn::attend_varlen_backward on packed (total, H, D) arrays: (dq, dk, dv[, d_initial_state][, dparams]).");
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
      [](const Array& q, const Array& k, nb::handle mechanism, const Options& o) {
        const Call c = make_call(q, k, k, mechanism, o);
        const auto* lsh = std::get_if<attn::Lsh>(&c.mech);
        if (!lsh) throw nb::value_error(("lsh_buckets needs an lsh mechanism such as 'lsh:buckets=32', got '" +
                                         attn::to_string(c.mech) + "'").c_str());
        auto* owner = new attn::LshBuckets(attn::lsh_buckets(c.q, c.k, c.k, *lsh, c.opt));
        nb::capsule free(owner, [](void* p) noexcept { delete static_cast<attn::LshBuckets*>(p); });
        using Out = nb::ndarray<nb::numpy, int32_t, nb::ndim<4>>;
        const size_t qshape[4] = {static_cast<size_t>(owner->B), static_cast<size_t>(owner->H),
                                  static_cast<size_t>(owner->rounds), static_cast<size_t>(owner->N)};
        const size_t kshape[4] = {static_cast<size_t>(owner->B), static_cast<size_t>(owner->key_heads),
                                  static_cast<size_t>(owner->rounds), static_cast<size_t>(owner->M)};
        return nb::make_tuple(Out(owner->query.data(), 4, qshape, free), Out(owner->key.data(), 4, kshape, free));
      },
      "q"_a, "k"_a, "mechanism"_a, "options"_a,
      "Reformer's buckets for q and k (attn::lsh_buckets): ((B, H, rounds, N), (B, Hk, rounds, M)) int32.");
  m.def("shard_pieces", [](int64_t n, int ranks, int rank, bool zigzag) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const attn::distributed::Piece& p : attn::distributed::shard_pieces(n, ranks, rank, zigzag))
      out.emplace_back(p.start, p.length);
    return out;
  }, "n"_a, "ranks"_a, "rank"_a, "zigzag"_a, "(start, length) of the pieces of n tokens rank `rank` of `ranks` holds (attn/shards.hpp).");
  m.def("architectures", [] {
    std::vector<nb::dict> out;
    for (const attn::ArchitectureInfo& a : attn::architectures()) {
      nb::dict d;
      d["name"] = a.name, d["summary"] = a.summary, d["baseline"] = a.baseline, d["gguf"] = a.gguf;
      out.push_back(d);
    }
    return out;
  }, "The architectures the decoder knows: name, summary, baseline, gguf (its GGUF files load).");
  nb::class_<attn::Decoder>(m, "Decoder", "attn::Decoder: a decoder (of an architecture the registry knows) over attn's mechanisms.")
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
      .def_prop_rw("activations", &attn::Decoder::activations, &attn::Decoder::set_activations,
                   "Decode steps' products with quantized matrices: 'f32' or 'q8' (set 'auto' for q8).")
      .def_static(
          "from_gguf",
          [](const std::string& path, int threads, bool dequantize, int64_t max_seq_len, const std::string& activations,
             const std::string& cache_dtype, bool repack) {
            const attn::DType dt = cache_dtype == "f32" ? attn::DType::f32
                                   : cache_dtype == "f16" ? attn::DType::f16
                                   : cache_dtype == "bf16" ? attn::DType::bf16
                                   : cache_dtype == "int8" ? attn::DType::i8
                                   : throw nb::value_error(("cache_dtype: expected 'f32', 'f16', 'bf16' or 'int8', got '" + cache_dtype + "'").c_str());
            return attn::Decoder::from_gguf(path, {threads, dequantize, max_seq_len, activations, dt, repack});
          },
          "path"_a, "threads"_a, "dequantize"_a, "max_seq_len"_a, "activations"_a = "auto", "cache_dtype"_a = "f32",
          "repack"_a = true,
          "Maps a llama-architecture GGUF file (quantized matrices used as stored unless dequantize; packed in "
          "16-row groups at load when repack and activations is not 'f32').")
      .def(
          "set_mechanism",
          [](attn::Decoder& d, int64_t layer, const std::string& text) { d.set_mechanism(layer, attn::parse_mechanism(text)); },
          "layer"_a, "mechanism"_a, "Replaces layer `layer`'s mechanism (-1: every layer).")
      .def_prop_ro("parameter_count", &attn::Decoder::parameter_count)
      .def_prop_ro("weight_names", &attn::Decoder::weight_names)
      .def(
          "weight",
          [](const attn::Decoder& d, const std::string& name) {
            auto* w = new attn::WeightValues(d.weight(name));
            nb::capsule owner(w, [](void* p) noexcept { delete static_cast<attn::WeightValues*>(p); });
            std::vector<size_t> shape(w->shape.begin(), w->shape.end());
            return nb::ndarray<nb::numpy, float>(w->values.data(), shape.size(), shape.data(), owner);
          },
          "name"_a, "The weight `name` (Hugging Face llama name) as a new float32 array (quantized ones dequantized).")
      .def(
          "set_weight",
          [](attn::Decoder& d, const std::string& name,
             nb::ndarray<const float, nb::c_contig, nb::device::cpu> values) {
            std::vector<int64_t> shape(values.ndim());
            for (size_t i = 0; i < values.ndim(); ++i) shape[i] = static_cast<int64_t>(values.shape(i));
            d.set_weight(name, shape, std::span<const float>(values.data(), values.size()));
          },
          "name"_a, "values"_a, "Replaces the weight `name` with a float32 copy of `values` (its shape).")
      .def(
          "token_nll",
          [](attn::Decoder& d, const std::vector<int32_t>& tokens) {
            nb::gil_scoped_release release;
            return attn::token_nll(d, tokens);
          },
          "tokens"_a, "Negative log-likelihood of tokens[1:] given their prefixes (one pass from an empty context).");
  nb::class_<attn::Sampler>(m, "Sampler",
                            "attn::Sampler: greedy or sampled (repeat penalty, top-k, top-p, min-p), counter-based draws.")
      .def(
          "__init__",
          [](attn::Sampler* self, double temperature, double top_p, uint64_t seed, int64_t top_k, double min_p,
             double repeat_penalty, int64_t repeat_last_n) {
            new (self) attn::Sampler(
                attn::SamplingOptions{temperature, top_p, seed, top_k, min_p, repeat_penalty, repeat_last_n});
          },
          "temperature"_a, "top_p"_a, "seed"_a, "top_k"_a = 0, "min_p"_a = 0.0, "repeat_penalty"_a = 1.0,
          "repeat_last_n"_a = 64)
      .def(
          "next",
          [](attn::Sampler& s, nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> logits,
             const std::vector<int32_t>& context) {
            return s.next(logits.data(), static_cast<int64_t>(logits.shape(0)), context);
          },
          "logits"_a, "context"_a = std::vector<int32_t>{},
          "The next token id from a row of logits (advances the draw counter); `context`: the tokens before it, "
          "for repeat_penalty.");
  m.def("parallel_regions", &attn::parallel_regions,
        "Parallel regions entered since the library loaded (each ends in a barrier): benchmarks count them per token.");
  m.def("check_generation_length", &attn::check_generation_length, "argument"_a, "prompt_tokens"_a, "max_tokens"_a,
        "max_seq_len"_a, "attn::check_generation_length: max_tokens >= 0 and the prompt plus max_tokens within the context.");
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
      .def_prop_ro("add_bos", &attn::Tokenizer::add_bos)
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
  bind_output_softmax(m);
  bind_titans(m);
  bind_refinement(m);
  bind_sana(m);
  bind_moe(m);
#ifdef ATTN_PY_MPI
  bind_distributed(m);
#else
  m.attr("has_mpi") = false;  // attn.distributed says what to install
#endif
}
