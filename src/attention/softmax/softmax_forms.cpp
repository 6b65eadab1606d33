// The forms of exact softmax attention, in the order attend() tries them.
#include "softmax/reference.hpp"
#include "softmax/softmax_family.hpp"
#include "softmax/softmax_rows.hpp"
#include "softmax/softmax_tiled.hpp"

namespace attn::exact {
namespace {

// The tiled form keeps 64 query lanes per thread whatever N is: (2 D + 2 Dv) x 64 floats of
// scratch. Refuse when that is large and far beyond the inputs (e.g. D = 2^20 with N = M = 1),
// so memory stays in proportion to the inputs; the reference form runs such calls.
void refuse_tiled(const Problem& p, const core::Outputs&, core::Reasons& why) {
  const double scratch = 64.0 * 2 * static_cast<double>(p.D + p.Dv) * sizeof(float);
  const double inputs = static_cast<double>(p.q.numel() + p.k.numel() + p.v.numel()) * dtype_size(p.q.dtype);
  if (scratch > 64.0 * (1 << 20) && scratch > 4 * inputs)
    why.push_back([&] {
      return "head dims D = " + std::to_string(p.D) + ", Dv = " + std::to_string(p.Dv) + " need " +
             std::to_string(static_cast<int64_t>(scratch / (1 << 20))) +
             " MiB of scratch per thread, more than 4x the inputs";
    });
}

void refuse_tiled_f32(const Problem& p, const core::Outputs& o, core::Reasons& why) {
  if (p.precision == Precision::bf16) why.push_back("precision bf16 (tiled_bf16 computes in bf16)");
  refuse_tiled(p, o, why);
}

void refuse_tiled_bf16(const Problem& p, const core::Outputs& o, core::Reasons& why) {
  refuse_unless_bf16_products(p, why);
  if (p.mech.score != ScoreKind::dot) why.push_back([&] { return "score=" + to_string(p.mech.score) + " (dot only)"; });
  if (p.k_scale) why.push_back("int8 K/V rows (kv_scales)");
  refuse_tiled(p, o, why);
}

void refuse_float64(const Problem& p, const core::Outputs&, core::Reasons& why) {
  if (p.precision == Precision::bf16) why.push_back("precision bf16 (reference computes in float64)");
}

}  // namespace

void refuse_unless_bf16_products(const Problem& p, core::Reasons& why) {
  if (p.precision == Precision::f32) why.push_back("precision f32");
  if (p.precision == Precision::automatic && !p.bf16_products())
    why.push_back([&] {
      return "q, k, v are " + dtype_name(p.q.dtype) + ", " + dtype_name(p.k.dtype) + ", " + dtype_name(p.v.dtype) +
             " (precision auto computes in bf16 when all three are bfloat16)";
    });
}

const std::vector<core::Form<Problem>>& SoftmaxFamily::forms() {
  static const std::vector<core::Form<Problem>> list = {
      {"rows", "split-K over key chunks for few query rows per kv head (decode-shaped calls)", refuse_rows,
       softmax_rows},
      {"tiled_bf16", "the tiled form with bf16 products (vdpbf16ps), float32 softmax and sums", refuse_tiled_bf16,
       softmax_tiled_bf16},
      {"tiled", "tiled online softmax, 64 queries x 64 keys per tile, no N x M buffer", refuse_tiled_f32,
       softmax_tiled},
      {"reference", "float64 full score rows (slow, exact)", refuse_float64, softmax_reference_form},
  };
  return list;
}

double SoftmaxFamily::flops(const Problem& p) {
  return 2.0 * p.structural_pairs() * static_cast<double>(p.D + p.Dv);
}

core::ReferenceResult SoftmaxFamily::reference(const Problem& p, core::RefPrecision precision) {
  return reference_softmax(p, precision);
}

}  // namespace attn::exact
