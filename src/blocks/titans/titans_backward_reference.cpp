// Titans memory backward, the float64 reference: titans_backward_sequence.hpp's reverse loop in
// double, one sequence after another; a group of M_0 shared by several sequences gets their sum.
#include <algorithm>
#include <vector>

#include "titans/titans_backward_sequence.hpp"
#include "titans/titans_common.hpp"

namespace attn {

void titans_memory_backward_reference(const TitansShape& shape, const TitansConfig& config, const TitansArgs64& in,
                                      const double* dy, const double* dw_out, const double* ds_out,
                                      const TitansGrads64& out) {
  titans::check_backward_args(shape, config, in, out);
  const int64_t seqs = shape.batch * shape.heads, N = shape.tokens, d = shape.dim;
  const int64_t count = titans_weight_count(config.memory, d);
  const int64_t b = std::min(config.batch_size, std::max<int64_t>(N, 1));
  std::vector<double> scratch(static_cast<size_t>(titans::backward_scratch_size(config.memory, d, N, b)));
  std::vector<double> dw0(static_cast<size_t>(count)), ds0(dw0.size());
  if (out.dw0) std::fill(out.dw0, out.dw0 + in.w0_groups * count, 0.0);
  if (out.ds0) std::fill(out.ds0, out.ds0 + in.w0_groups * count, 0.0);
  for (int64_t bh = 0; bh < seqs; ++bh) {
    const int64_t row = bh * N;
    const auto si = titans::sequence_in<double>(in, bh, N, d, shape.heads, count, dy, dw_out, ds_out);
    titans::SequenceOut<double> so{out.dq + row * d, out.dk + row * d, out.dv + row * d, out.dtheta + row,
                                   out.deta + row,   out.dalpha + row,  dw0.data(),       ds0.data()};
    titans::sequence_backward(config.memory, config.loss, N, d, b, si, so, scratch.data());
    const int64_t g = titans::group_of(in.w0_groups, bh, shape.heads);
    for (int64_t i = 0; i < count; ++i) {
      if (out.dw0) out.dw0[g * count + i] += dw0[static_cast<size_t>(i)];
      if (out.ds0) out.ds0[g * count + i] += ds0[static_cast<size_t>(i)];
    }
  }
}

}  // namespace attn
