// The forms of exact softmax attention, in the order attend() tries them.
#include "exact/reference.hpp"
#include "exact/softmax_family.hpp"
#include "exact/softmax_rows.hpp"
#include "exact/softmax_tiled.hpp"

namespace attn::exact {
namespace {

void refuse_nothing(const Problem&, const core::Outputs&, core::Reasons&) {}

}  // namespace

const std::vector<core::Form<Problem>>& SoftmaxFamily::forms() {
  static const std::vector<core::Form<Problem>> list = {
      {"rows", "split-K over key chunks for few query rows per kv head (decode-shaped calls)", refuse_rows,
       softmax_rows},
      {"tiled", "tiled online softmax, 64 queries x 64 keys per tile, no N x M buffer", refuse_nothing,
       softmax_tiled},
      {"reference", "float64 full score rows (slow, exact)", refuse_nothing, softmax_reference_form},
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
