// Softmax-specific checks, once, at the entry point (q/k/v/outputs: core/io_checks.cpp).
// Messages name the argument, the expected and the actual value.
#include <cmath>
#include <string>

#include "attn/error.hpp"
#include "core/params.hpp"
#include "softmax/problem.hpp"
#include "softmax/softmax_family.hpp"
#include "mask/patterns.hpp"

namespace attn::exact {
namespace {

const char* kWhere = "attend";
using core::check_finite;
using core::check_view;
using core::dims_text;
using core::is_float;

// Masks and biases broadcast over batch and heads: size 1 there means stride 0.
TensorView broadcast_mask(TensorView m, const std::string& name, int64_t B, int64_t H, int64_t N, int64_t M,
                          const std::string& rows_cols = "N, M") {
  check_view(m, name);
  if ((m.shape[0] != B && m.shape[0] != 1) || (m.shape[1] != H && m.shape[1] != 1) || m.shape[2] != N ||
      m.shape[3] != M)
    fail(kWhere, name + " must have shape (B|1, H|1, " + rows_cols + ") = (" + std::to_string(B) + "|1, " +
                     std::to_string(H) + "|1, " + std::to_string(N) + ", " + std::to_string(M) + "), got " + dims_text(m));
  if (m.shape[0] == 1) m.strides[0] = 0;
  if (m.shape[1] == 1) m.strides[1] = 0;
  m.shape[0] = B;
  m.shape[1] = H;
  return m;
}

// Everything but the pattern: inputs, scale and score options, mask, bias, ALiBi, params.
Problem validate_scores(const TensorView& q, const TensorView& k, const TensorView& v, const Softmax& mech,
                        LazyText text, const AttendOptions& opt, const core::Outputs& outs) {
  Problem p;
  static_cast<core::Dims&>(p) = core::check_io(q, k, v, outs, opt, core::KvStorage::rows);
  p.offset = p.M - p.N;
  p.precision = opt.precision;

  // mechanism parameters
  p.mech = mech;
  if (mech.scale) {  // in range: SoftmaxFamily::validate checked the facts' ranges (or the caller did)
    p.base_scale = *mech.scale;
  } else {
    p.base_scale = mech.score == ScoreKind::additive ? 1.0 : 1.0 / std::sqrt(static_cast<double>(p.D));
  }
  if (mech.entropy_train_len < 0 || mech.entropy_train_len == 1)
    fail(kWhere, "entropy_scale training length must be >= 2 (0 = off), got " +
                     std::to_string(mech.entropy_train_len));

  if (opt.mask) {
    if (opt.mask->dtype != DType::boolean)
      fail(kWhere, "mask must be boolean (use bias for additive float masks), got " +
                       dtype_name(opt.mask->dtype));
    p.mask = broadcast_mask(*opt.mask, "mask", p.B, p.H, p.N, p.M);
  }
  if (opt.block_mask) {
    const auto [bq, bk] = opt.block_size;
    if (bq < 1 || bk < 1)
      fail(kWhere, "block_size must be (query rows, keys) per block, each >= 1, got (" + std::to_string(bq) + ", " +
                       std::to_string(bk) + ")");
    if (opt.block_mask->dtype != DType::boolean)
      fail(kWhere, "block_mask must be boolean, got " + dtype_name(opt.block_mask->dtype));
    p.bq = bq, p.bk = bk;
    p.block_mask = broadcast_mask(*opt.block_mask, "block_mask", p.B, p.H, (p.N + bq - 1) / bq, (p.M + bk - 1) / bk,
                                  "ceil(N / " + std::to_string(bq) + "), ceil(M / " + std::to_string(bk) + ")");
  }
  p.mask_mod = opt.mask_mod;
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

  core::Symbols symbols{{"D", p.D}};
  core::check_params(opt.params, softmax_params(mech), text, symbols);
  if (mech.score == ScoreKind::additive) {
    p.wq = core::to_floats(opt.params.at("wq"));
    p.wk = core::to_floats(opt.params.at("wk"));
    p.w = core::to_floats(opt.params.at("w"));
    p.A = symbols.at("A");
  }
  return p;
}

// A pattern mechanism (Longformer, BigBird): plain dot-product softmax with its scale, over its
// pattern.
template <class PatternMechanism>
Problem validate_pattern(const TensorView& q, const TensorView& k, const TensorView& v, const PatternMechanism& mech,
                         const AttendOptions& opt, const core::Outputs& outs) {
  Softmax scores;
  scores.scale = mech.scale;
  Problem p = validate_scores(q, k, v, scores, core::mechanism_text(mech), opt, outs);
  p.pattern = mask::pattern_of(mech, p.N, p.M);
  return p;
}

}  // namespace

Problem validate_softmax(const TensorView& q, const TensorView& k, const TensorView& v, const Softmax& mech,
                         const AttendOptions& opt, const core::Outputs& outs) {
  Problem p = validate_scores(q, k, v, mech, core::mechanism_text(mech), opt, outs);
  p.pattern = mask::pattern_of(mech, p.N, p.M);
  return p;
}

Problem validate_softmax(const TensorView& q, const TensorView& k, const TensorView& v, const Longformer& mech,
                         const AttendOptions& opt, const core::Outputs& outs) {
  return validate_pattern(q, k, v, mech, opt, outs);
}

Problem validate_softmax(const TensorView& q, const TensorView& k, const TensorView& v, const BigBird& mech,
                         const AttendOptions& opt, const core::Outputs& outs) {
  return validate_pattern(q, k, v, mech, opt, outs);
}

}  // namespace attn::exact
