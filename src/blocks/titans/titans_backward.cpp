// Titans memory backward, float32: titans_backward_sequence.hpp's reverse loop in float, the
// sequences (b, h) in parallel, one per thread, each with its slice of scratch sized up front.
// Per-sequence dM_0 and dS_0 go to a (B*H, count) buffer; a group shared by several sequences then
// gets their sum in sequence order, split over blocks of weights: the same bits for any threads.
#include <algorithm>
#include <new>
#include <string>
#include <vector>

#include "base/parallel.hpp"
#include "titans/titans_backward_sequence.hpp"
#include "titans/titans_common.hpp"

namespace attn {

void titans_memory_backward(const TitansShape& shape, const TitansConfig& config, const TitansArgs& in,
                            const float* dy, const float* dw_out, const float* ds_out, const TitansGrads& out,
                            int threads) try {
  titans::check_backward_args(shape, config, in, out);
  if (threads < 0 || threads > kMaxThreads)
    fail(titans::kWhereBackward,
         "threads must be in [0, " + std::to_string(kMaxThreads) + "], got " + std::to_string(threads));
  const int64_t seqs = shape.batch * shape.heads, N = shape.tokens, d = shape.dim;
  const int64_t count = titans_weight_count(config.memory, d);
  const int64_t b = std::min(config.batch_size, std::max<int64_t>(N, 1));
  if (out.dw0) std::fill(out.dw0, out.dw0 + in.w0_groups * count, 0.0f);
  if (out.ds0) std::fill(out.ds0, out.ds0 + in.w0_groups * count, 0.0f);
  if (seqs == 0) return;
  const int nt = resolve_threads(threads, seqs);
  const int64_t per = titans::backward_scratch_size(config.memory, d, N, b);
  std::vector<float> scratch(static_cast<size_t>(per * nt));
  std::vector<float> dw0(static_cast<size_t>(seqs * count)), ds0(dw0.size());
  parallel_for(seqs, nt, [&](int64_t bh, int t) {
    const int64_t row = bh * N;
    const auto si = titans::sequence_in<float>(in, bh, N, d, shape.heads, count, dy, dw_out, ds_out);
    titans::SequenceOut<float> so{out.dq + row * d, out.dk + row * d, out.dv + row * d, out.dtheta + row,
                                  out.deta + row,   out.dalpha + row,  dw0.data() + bh * count,
                                  ds0.data() + bh * count};
    titans::sequence_backward(config.memory, config.loss, N, d, b, si, so, scratch.data() + t * per);
  });
  // Group sums, sequences in order, over blocks of 1024 weights.
  const int64_t blocks = (count + 1023) / 1024;
  parallel_for(blocks, resolve_threads(threads, blocks), [&](int64_t blk, int) {
    const int64_t i0 = blk * 1024, i1 = std::min(count, i0 + 1024);
    for (int64_t bh = 0; bh < seqs; ++bh) {
      const int64_t g = titans::group_of(in.w0_groups, bh, shape.heads);
      for (int64_t i = i0; i < i1; ++i) {
        if (out.dw0) out.dw0[g * count + i] += dw0[static_cast<size_t>(bh * count + i)];
        if (out.ds0) out.ds0[g * count + i] += ds0[static_cast<size_t>(bh * count + i)];
      }
    }
  });
} catch (const std::bad_alloc&) {
  fail(titans::kWhereBackward, "out of memory for the backward of " + std::to_string(shape.batch * shape.heads) +
                                   " sequences of " + std::to_string(shape.tokens) + " tokens");
}

}  // namespace attn
