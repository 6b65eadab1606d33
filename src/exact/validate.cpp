// Every check on user input, once, at the entry point. Messages name the argument, the
// expected and the actual value.
#include <cmath>
#include <string>

#include "attn/error.hpp"
#include "base/checked_math.hpp"
#include "exact/problem.hpp"

namespace attn::exact {
namespace {

const char* kWhere = "attend";

std::string dims(const TensorView& v) {
  return "(" + std::to_string(v.shape[0]) + ", " + std::to_string(v.shape[1]) + ", " +
         std::to_string(v.shape[2]) + ", " + std::to_string(v.shape[3]) + ")";
}

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// Shape non-negative, data present when non-empty, largest offset representable.
void check_view(const TensorView& v, const std::string& name) {
  int64_t n = 1;
  for (int i = 0; i < 4; ++i) {
    if (v.shape[i] < 0)
      fail(kWhere, name + " has negative dimension " + std::to_string(i) + " in shape " + dims(v));
    n = checked_mul(n, v.shape[i], std::string(kWhere) + ": " + name + " element count");
  }
  checked_mul(n, static_cast<int64_t>(dtype_size(v.dtype)), std::string(kWhere) + ": " + name + " bytes");
  int64_t span = 0;
  for (int i = 0; i < 4; ++i) {
    if (v.shape[i] == 0) continue;
    const int64_t s = v.strides[i] < 0 ? -v.strides[i] : v.strides[i];
    span = checked_add(span, checked_mul(v.shape[i] - 1, s, std::string(kWhere) + ": " + name + " extent"),
                       std::string(kWhere) + ": " + name + " extent");
  }
  if (n > 0 && v.data == nullptr) fail(kWhere, name + " has " + std::to_string(n) + " elements but no data");
}

void check_shape(const TensorView& v, const std::string& name, std::array<int64_t, 4> want,
                 const std::string& meaning) {
  if (v.shape != want)
    fail(kWhere, name + " must have shape " + meaning + " = (" + std::to_string(want[0]) + ", " +
                     std::to_string(want[1]) + ", " + std::to_string(want[2]) + ", " +
                     std::to_string(want[3]) + "), got " + dims(v));
}

// Masks and biases broadcast over batch and heads: size 1 there means stride 0.
TensorView broadcast_mask(TensorView m, const std::string& name, int64_t B, int64_t H, int64_t N,
                          int64_t M) {
  check_view(m, name);
  if ((m.shape[0] != B && m.shape[0] != 1) || (m.shape[1] != H && m.shape[1] != 1) ||
      m.shape[2] != N || m.shape[3] != M)
    fail(kWhere, name + " must have shape (B|1, H|1, N, M) = (" + std::to_string(B) + "|1, " +
                     std::to_string(H) + "|1, " + std::to_string(N) + ", " + std::to_string(M) +
                     "), got " + dims(m));
  if (m.shape[0] == 1) m.strides[0] = 0;
  if (m.shape[1] == 1) m.strides[1] = 0;
  m.shape[0] = B;
  m.shape[1] = H;
  return m;
}

void check_finite(double x, const std::string& name) {
  if (!std::isfinite(x)) fail(kWhere, name + " must be finite, got " + std::to_string(x));
}

}  // namespace

Problem validate_softmax(const TensorView& q, const TensorView& k, const TensorView& v,
                         const Softmax& mech, const AttendOptions& opt, const TensorView& out,
                         const TensorView* lse, const TensorView* probs) {
  check_view(q, "q");
  check_view(k, "k");
  check_view(v, "v");
  for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}})
    if (!is_float(t->dtype))
      fail(kWhere, std::string(name) + " must be float32, bfloat16 or float16, got " + dtype_name(t->dtype));
  if (k.dtype != q.dtype || v.dtype != q.dtype)
    fail(kWhere, "q, k and v must share a dtype, got q " + dtype_name(q.dtype) + ", k " +
                     dtype_name(k.dtype) + ", v " + dtype_name(v.dtype));

  Problem p;
  p.q = q, p.k = k, p.v = v;
  p.B = q.shape[0], p.H = q.shape[1], p.N = q.shape[2], p.D = q.shape[3];
  p.Hkv = k.shape[1], p.M = k.shape[2], p.Dv = v.shape[3];
  if (p.H < 1) fail(kWhere, "q must have at least one head, got shape " + dims(q));
  if (p.Hkv < 1) fail(kWhere, "k must have at least one head, got shape " + dims(k));
  if (p.D < 1) fail(kWhere, "head_dim of q must be at least 1, got shape " + dims(q));
  if (p.Dv < 1) fail(kWhere, "head_dim of v must be at least 1, got shape " + dims(v));
  if (k.shape[0] != p.B)
    fail(kWhere, "k has batch " + std::to_string(k.shape[0]) + ", q has " + std::to_string(p.B));
  if (k.shape[3] != p.D)
    fail(kWhere, "k has head_dim " + std::to_string(k.shape[3]) + ", q has " + std::to_string(p.D));
  check_shape(v, "v", {p.B, p.Hkv, p.M, p.Dv}, "(batch of q, heads of k, tokens of k, Dv)");
  if (p.H % p.Hkv != 0)
    fail(kWhere, "k has " + std::to_string(p.Hkv) + " heads, which does not divide q's " +
                     std::to_string(p.H));
  p.group = p.H / p.Hkv;
  p.offset = p.M - p.N;

  check_view(out, "out");
  if (!is_float(out.dtype)) fail(kWhere, "out must be a float dtype, got " + dtype_name(out.dtype));
  check_shape(out, "out", {p.B, p.H, p.N, p.Dv}, "(B, H, N, Dv)");
  if (lse) {
    check_view(*lse, "lse");
    if (lse->dtype != DType::f32) fail(kWhere, "lse must be float32, got " + dtype_name(lse->dtype));
    check_shape(*lse, "lse", {p.B, p.H, p.N, 1}, "(B, H, N, 1)");
  }
  if (probs) {
    check_view(*probs, "probs");
    if (probs->dtype != DType::f32) fail(kWhere, "probs must be float32, got " + dtype_name(probs->dtype));
    check_shape(*probs, "probs", {p.B, p.H, p.N, p.M}, "(B, H, N, M)");
  }

  // mechanism parameters
  p.mech = mech;
  if (mech.scale) {
    check_finite(*mech.scale, "scale");
    if (*mech.scale <= 0) fail(kWhere, "scale must be > 0, got " + std::to_string(*mech.scale));
    p.base_scale = *mech.scale;
  } else {
    p.base_scale = mech.score == ScoreKind::additive ? 1.0 : 1.0 / std::sqrt(static_cast<double>(p.D));
  }
  check_finite(mech.softcap, "softcap");
  if (mech.softcap < 0) fail(kWhere, "softcap must be >= 0 (0 = off), got " + std::to_string(mech.softcap));
  check_finite(mech.dropout, "dropout");
  if (mech.dropout < 0 || mech.dropout >= 1)
    fail(kWhere, "dropout must be in [0, 1), got " + std::to_string(mech.dropout));
  if (mech.entropy_train_len < 0 || mech.entropy_train_len == 1)
    fail(kWhere, "entropy_scale training length must be >= 2 (0 = off), got " +
                     std::to_string(mech.entropy_train_len));
  if (mech.window_left < -1 || mech.window_right < -1)
    fail(kWhere, "window must be (left, right) with each >= 0 or -1 for unbounded, got (" +
                     std::to_string(mech.window_left) + ", " + std::to_string(mech.window_right) + ")");
  p.left = mech.window_left;
  p.right = mech.window_right;
  if (mech.causal) p.right = p.right < 0 ? 0 : std::min<int64_t>(p.right, 0);

  // key padding
  if (!opt.key_padding_lengths.empty()) {
    if (static_cast<int64_t>(opt.key_padding_lengths.size()) != p.B)
      fail(kWhere, "key_padding_lengths must have one length per batch (" + std::to_string(p.B) +
                       "), got " + std::to_string(opt.key_padding_lengths.size()));
    for (size_t b = 0; b < opt.key_padding_lengths.size(); ++b) {
      const int64_t len = opt.key_padding_lengths[b];
      if (len < 0 || len > p.M)
        fail(kWhere, "key_padding_lengths[" + std::to_string(b) + "] must be in [0, " +
                         std::to_string(p.M) + "], got " + std::to_string(len));
    }
    p.kv_len = opt.key_padding_lengths;
  } else {
    p.kv_len.assign(static_cast<size_t>(p.B), p.M);
  }

  if (opt.mask) {
    if (opt.mask->dtype != DType::boolean)
      fail(kWhere, "mask must be boolean (use bias for additive float masks), got " +
                       dtype_name(opt.mask->dtype));
    p.mask = broadcast_mask(*opt.mask, "mask", p.B, p.H, p.N, p.M);
  }
  if (opt.bias) {
    if (!is_float(opt.bias->dtype))
      fail(kWhere, "bias must be a float dtype, got " + dtype_name(opt.bias->dtype));
    p.bias = broadcast_mask(*opt.bias, "bias", p.B, p.H, p.N, p.M);
  }
  if (!opt.alibi_slopes.empty()) {
    const auto n = static_cast<int64_t>(opt.alibi_slopes.size());
    if (n != p.H && n != p.B * p.H)
      fail(kWhere, "alibi_slopes must have H (" + std::to_string(p.H) + ") or B*H (" +
                       std::to_string(p.B * p.H) + ") values, got " + std::to_string(n));
    for (int64_t i = 0; i < n; ++i) check_finite(opt.alibi_slopes[i], "alibi_slopes[" + std::to_string(i) + "]");
    p.alibi.resize(static_cast<size_t>(p.B * p.H));
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t h = 0; h < p.H; ++h) p.alibi[b * p.H + h] = opt.alibi_slopes[n == p.H ? h : b * p.H + h];
  }

  if (mech.score == ScoreKind::additive) {
    if (!opt.additive)
      fail(kWhere, "score=additive needs additive weights (wq, wk of shape (A, D) and w of shape (A))");
    const auto& w = *opt.additive;
    p.A = static_cast<int64_t>(w.w.size());
    if (p.A < 1) fail(kWhere, "additive weight w must have at least one element");
    if (static_cast<int64_t>(w.wq.size()) != p.A * p.D)
      fail(kWhere, "additive weight wq must have A*D = " + std::to_string(p.A * p.D) +
                       " elements, got " + std::to_string(w.wq.size()));
    if (static_cast<int64_t>(w.wk.size()) != p.A * p.D)
      fail(kWhere, "additive weight wk must have A*D = " + std::to_string(p.A * p.D) +
                       " elements, got " + std::to_string(w.wk.size()));
    for (const auto* vec : {&w.wq, &w.wk, &w.w})
      for (float x : *vec) check_finite(x, "additive weights");
    p.additive = &w;
  }
  if (opt.threads < 0) fail(kWhere, "threads must be >= 0 (0 = default), got " + std::to_string(opt.threads));
  return p;
}

}  // namespace attn::exact
