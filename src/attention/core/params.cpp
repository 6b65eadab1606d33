#include "core/params.hpp"

#include <cmath>

#include "attn/error.hpp"
#include "core/shape_text.hpp"
#include "base/checked_math.hpp"

namespace attn {

ArrayView make_array_view(const void* data, DType dtype, std::vector<int64_t> shape) {
  ArrayView a;
  a.data = data;
  a.dtype = dtype;
  a.strides.assign(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) a.strides[i - 1] = a.strides[i] * shape[i];
  a.shape = std::move(shape);
  return a;
}

namespace core {
namespace {

const char* kWhere = "attend";

std::string spec_text(const ParamSpec& p) {
  std::string o = "(";
  for (size_t i = 0; i < p.dims.size(); ++i) o += (i ? ", " : "") + p.dims[i];
  return o + (p.dims.size() == 1 ? ",)" : ")");
}

std::string names(const std::vector<ParamSpec>& specs) {
  if (specs.empty()) return "none";
  std::string o;
  for (const auto& s : specs) o += (o.empty() ? "" : ", ") + s.name;
  return o;
}

bool is_number(const std::string& s) { return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos; }

int64_t element_count(const ArrayView& a, const std::string& name) {
  int64_t n = 1;
  for (int64_t d : a.shape) {
    if (d < 0) fail(kWhere, "params['" + name + "'] has a negative dimension in shape " + shape_text(a.shape));
    n = checked_mul(n, d, [&] { return std::string(kWhere) + ": params['" + name + "'] element count"; });
  }
  return n;
}

// Offset of the element with C-order index `flat`.
int64_t offset_of(const ArrayView& a, int64_t flat) {
  int64_t off = 0;
  for (size_t i = a.shape.size(); i-- > 0;) {
    off += (flat % a.shape[i]) * a.strides[i];
    flat /= a.shape[i];
  }
  return off;
}

}  // namespace

const float* contiguous_f32(const ArrayView& a) {
  if (a.dtype != DType::f32) return nullptr;
  int64_t stride = 1;
  for (size_t i = a.shape.size(); i-- > 0;) {
    if (a.shape[i] != 1 && a.strides[i] != stride) return nullptr;
    stride *= a.shape[i];
  }
  return static_cast<const float*>(a.data);
}

void check_params(const Params& given, const std::vector<ParamSpec>& specs, LazyText mechanism, Symbols& symbols) {
  for (const auto& [name, view] : given) {
    bool declared = false;
    for (const auto& s : specs) declared |= s.name == name;
    if (!declared)
      fail(kWhere, "params has '" + name + "', which " + mechanism.str() + " does not take (it takes: " + names(specs) +
                       ")");
  }
  for (const auto& spec : specs) {
    const auto it = given.find(spec.name);
    if (it == given.end() && spec.optional) continue;
    if (it == given.end())
      fail(kWhere, mechanism.str() + " needs params['" + spec.name + "'] of shape " + spec_text(spec) + ": " +
                       spec.meaning);
    const ArrayView& a = it->second;
    auto label = [&] { return "params['" + spec.name + "']"; };  // for messages only
    if (a.dtype != DType::f32 && a.dtype != DType::bf16 && a.dtype != DType::f16)
      fail(kWhere, label() + " must be float32, bfloat16 or float16, got " + dtype_name(a.dtype));
    if (a.strides.size() != a.shape.size())
      fail(kWhere, label() + " has " + std::to_string(a.shape.size()) + " dimensions but " +
                       std::to_string(a.strides.size()) + " strides");
    if (a.shape.size() != spec.dims.size())
      fail(kWhere, label() + " must have shape " + spec_text(spec) + ", got " + shape_text(a.shape));
    const int64_t n = element_count(a, spec.name);
    if (n > 0 && a.data == nullptr) fail(kWhere, label() + " has " + std::to_string(n) + " elements but no data");
    for (size_t i = 0; i < spec.dims.size(); ++i) {
      const std::string& sym = spec.dims[i];
      int64_t want = -1;
      if (is_number(sym)) {
        want = std::stoll(sym);
      } else if (auto s = symbols.find(sym); s != symbols.end()) {
        want = s->second;
      } else {
        if (a.shape[i] < 1)
          fail(kWhere, label() + " dimension " + std::to_string(i) + " (" + sym + ") must be at least 1, got shape " +
                           shape_text(a.shape));
        symbols[sym] = a.shape[i];
        continue;
      }
      if (a.shape[i] != want)
        fail(kWhere, label() + " must have shape " + spec_text(spec) + " with " + sym + " = " + std::to_string(want) +
                         ", got " + shape_text(a.shape));
    }
    if (const float* f = contiguous_f32(a)) {  // one vectorisable pass: x * 0 is 0 unless x is inf or NaN
      float lanes[16] = {};
      int64_t e = 0;
      for (; e + 16 <= n; e += 16)
        for (int l = 0; l < 16; ++l) lanes[l] += f[e + l] * 0.0f;
      for (; e < n; ++e) lanes[0] += f[e] * 0.0f;
      float all = 0;
      for (float x : lanes) all += x;
      if (all == 0.0f) continue;  // else find the element for the message below
    }
    for (int64_t e = 0; e < n; ++e)
      if (!std::isfinite(load_as_float(a.data, a.dtype, offset_of(a, e))))
        fail(kWhere, label() + " must be finite, element " + std::to_string(e) + " is not");
  }
}

float element_at(const ArrayView& a, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  const std::vector<int64_t>& st = a.strides;
  return load_as_float(a.data, a.dtype, i0 * st[0] + i1 * st[1] + i2 * st[2] + i3 * st[3]);
}

std::vector<float> to_floats(const ArrayView& a) {
  int64_t n = 1;
  for (int64_t d : a.shape) n *= d;
  std::vector<float> out(static_cast<size_t>(n));
  if (const float* f = contiguous_f32(a)) return std::vector<float>(f, f + n);
  for (int64_t e = 0; e < n; ++e) out[static_cast<size_t>(e)] = load_as_float(a.data, a.dtype, offset_of(a, e));
  return out;
}

}  // namespace core
}  // namespace attn
