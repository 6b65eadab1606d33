// The entry point: attend(q, k, v, mechanism, options).
//
// Shapes (views may use any strides, e.g. (B,H,N,D) or (B,N,H,D) memory):
//   q (B, H, N, D)   k (B, Hkv, M, D)   v (B, Hkv, M, Dv)   H a multiple of Hkv
//   out (B, H, N, Dv)
//   lse (B, H, N, 1) float32, natural log (a view with a trailing unit dim; Python and the CLI
//       return it as (B, H, N))
//   probs (B, H, N, M) float32, the softmax weights before dropout
//   sparsity, entropy, max_weight, topk_mass (B, H, N, 1) float32 each: statistics of each
//       row of weights the mechanism applies, streamed without the N x M matrix (RowStatsViews)
//
// Causal masks are aligned bottom-right: query i sees key j iff j <= i + M - N (like
// flash-attn; torch's is_causal is top-left when N != M). For M > N this is a block of new
// queries appended after a cache of M - N keys:
//
//        keys j ->            N = 2, M = 5
//   i=0  x x x x .            x visible, . masked
//   i=1  x x x x x
//
// A query row that sees no key returns zeros, and its log-sum-exp is -inf.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <string>
#include <string_view>
#include <vector>

#include "attn/isa.hpp"
#include "attn/mechanism.hpp"
#include "attn/params.hpp"
#include "attn/tensor.hpp"

namespace attn {

// A paged KV cache (the memory layout of vLLM's PagedAttention): k and v are pools of
// fixed-size blocks of rows, (num_blocks, Hkv, block_size, D) and (num_blocks, Hkv, block_size,
// Dv), any strides; the keys of batch entry b are, in order, the rows of the blocks its row of
// the block table names: key j is row j % block_size of block
// block_table[b * blocks_per_seq + j / block_size]. Blocks may be shared between entries
// (a common prefix). Read by the softmax family (softmax, longformer, bigbird).
struct PagedKv {
  std::vector<int32_t> block_table;  // B x blocks_per_seq, row-major
  int64_t blocks_per_seq = 0;
  // M, the keys of the call (causal alignment, probs' width); -1: blocks_per_seq * block_size.
  // Entries of a row beyond the blocks its valid keys (key_padding_lengths) need are not read.
  int64_t tokens = -1;
};

// An 8-bit KV cache: k and v hold int8 rows (DType::i8) and row j of kv head h of batch entry b
// stands for scale[b, h, j] * row, one float32 scale per row of k and of v (llama.cpp's q8_0 cache
// with one scale per row; attn::quantize_rows in attn/kv_quant.hpp makes them). q stays a float
// dtype. Read by the softmax family (softmax, longformer, bigbird), plain or paged: with a paged
// cache the scales follow the pools, (num_blocks, Hkv, block_size, 1).
struct KvScales {
  TensorView k, v;  // float32 (B, Hkv, M, 1) each, any strides
};

// The arithmetic of exact softmax attention's two products, Q K^T and P V:
//   f32   the operands widened to float32, float32 products (the most accurate; every form);
//   bf16  the operands rounded to bfloat16, products of bf16 pairs summed into float32 (AVX512-
//         BF16's vdpbf16ps where the CPU has it, else the same exact products on float32
//         instructions), the weights P rounded to bf16 for P V as flash-attention does on GPUs;
//         the online softmax, the scale, masks and biases stay float32. The tiled form only.
//   automatic (the default): bf16 when q, k and v are all bfloat16 and the tiled form runs the
//         call, else f32 (what PyTorch's SDPA does with bf16 tensors).
// bf16 is ~1.5x faster where the CPU has AVX512-BF16; its error is bounded by twice that of a
// plain bf16 implementation (docs/testing.md, "bf16 products"). Other families compute in float32
// and refuse bf16; attend_backward computes in float32 and refuses it.
enum class Precision { automatic, f32, bf16 };
std::string precision_name(Precision p);  // "auto", "f32", "bf16"
// "auto", "f32" or "bf16"; anything else throws Error naming `where`.
Precision parse_precision(const std::string& name, const std::string& where);

struct AttendOptions {
  // Keys j >= key_padding_lengths[b] are hidden from every query of batch b (length B).
  std::vector<int64_t> key_padding_lengths;
  // k and v are page pools read through a block table (see PagedKv); none: plain views.
  std::optional<PagedKv> paged;
  // k and v are int8 rows times these per-row scales (see KvScales); none: k and v are floats.
  std::optional<KvScales> kv_scales;
  // Boolean mask (true = may attend) with shape (B|1, H|1, N, M); size-1 dims broadcast.
  std::optional<TensorView> mask;
  // Your own sparsity, in the spirit of FlexAttention's BlockMask and mask_mod, combined with
  // the mechanism's pattern (softmax, longformer, bigbird):
  //  - block_mask: boolean (B|1, H|1, ceil(N / bq), ceil(M / bk)) with block_size = (bq, bk);
  //    false hides the whole block (its keys are never read for those queries);
  //  - mask_mod(b, h, i, j): true = may attend, asked only inside visible blocks; called from
  //    several threads at once, so it must be thread-safe and must not throw.
  std::optional<TensorView> block_mask;
  std::pair<int64_t, int64_t> block_size{128, 128};
  std::function<bool(int64_t b, int64_t h, int64_t i, int64_t j)> mask_mod;
  // Additive float bias with shape (B|1, H|1, N, M), added to the scores.
  std::optional<TensorView> bias;
  // ALiBi: adds -slope_h * |i + M - N - j|; H slopes, or B*H (batch-major).
  std::vector<float> alibi_slopes;
  // Extra tensors the mechanism declares, by name (score=additive: wq (A, D), wk (A, D),
  // w (A)). A missing or unexpected name is an Error.
  Params params;
  // attend(), attend_with_kvcache(), attend_varlen(): memory order of the `out` they allocate
  // (bnhd: (B, N, H, Dv) contiguous, bhnd: (B, H, N, Dv)); none: q's (attend) or bhnd.
  std::optional<Layout> out_layout;
  bool return_lse = false;    // attend(): allocate and fill AttendResult::lse
  bool return_probs = false;  // attend(): allocate and fill AttendResult::probs
  // attend(): allocate and fill AttendResult::final_state (mechanisms with a recurrent state:
  // linear attention). Asking it of a mechanism without one is an Error.
  bool return_final_state = false;
  // attend(): allocate and fill AttendResult::{sparsity, entropy, max_weight, topk_mass}, how
  // concentrated each query's row of weights is (definitions: attn/concentration.hpp), computed
  // while the row streams by, never holding N x M. The row is exactly what the mechanism applies:
  // softmax probabilities before dropout over the keys that survive every mask (n counts them);
  // a linear mechanism's phi(q).phi(k) weights over the keys it may see (scale-free, so
  // normalised or not gives the same values); a pattern's visible keys only. A row with no key,
  // all-zero weights or a NaN gives NaN; entropy is NaN for a row with a negative weight.
  bool return_stats = false;
  int64_t stats_topk = 8;     // k of topk_mass, in [1, 1024]
  int threads = 0;            // 0: the CPUs this process may use (OMP_NUM_THREADS lowers it)
  std::optional<Isa> isa;     // kernel set; default active_isa()
  Precision precision = Precision::automatic;  // exact attention's products (see Precision)
  // Force one implementation ("reference", "tiled", "rows" for softmax); empty: the first in
  // priority order that supports the call. A forced form that cannot run it is an Error
  // listing every form with its reasons (see explain()).
  std::string form;
  // Per-thread bound on float32 copies of K/V rows kept for bfloat16/float16/strided inputs
  // (a tuning knob: 0 converts rows per tile instead; results are bitwise the same).
  int64_t row_cache_bytes = int64_t{64} << 20;
};

struct AttendResult {
  Tensor out;    // dtype of q, same layout family as q
  Tensor lse;    // (B, H, N, 1) float32 when requested
  Tensor probs;  // (B, H, N, M) float32 when requested
  Tensor final_state;  // (B, H, F, Dv [+ 1]) float32 when requested (see Linear)
  // (B, H, N, 1) float32 each when return_stats is set
  Tensor sparsity, entropy, max_weight, topk_mass;
};

// Caller-provided row statistics, each (B, H, N, 1) float32 (see AttendOptions::return_stats).
struct RowStatsViews {
  TensorView sparsity, entropy, max_weight, topk_mass;
};

AttendResult attend(const TensorView& q, const TensorView& k, const TensorView& v,
                    const Mechanism& mechanism, const AttendOptions& options = {});

// Same, writing into caller-provided views (out: (B,H,N,Dv) any dtype/strides;
// lse: (B,H,N,1) f32; probs: (B,H,N,M) f32; final_state: (B,H,F,Dv [+ 1]) f32, may be the
// initial_state param itself; stats: four (B,H,N,1) f32 views, k = options.stats_topk). Pass
// nullptr for outputs you do not want.
// Outputs must not overlap k, v, masks or each other (out may be q itself: each block of
// queries is read before its outputs are written).
void attend_into(const TensorView& q, const TensorView& k, const TensorView& v,
                 const Mechanism& mechanism, const AttendOptions& options,
                 const TensorView& out, const TensorView* lse, const TensorView* probs,
                 const TensorView* final_state = nullptr, const RowStatsViews* stats = nullptr);

// The shape of the recurrent state this call would take as params["initial_state"] and return
// as final_state: (B, H, F, Dv + 1) for normalised linear attention (the last column is the
// normaliser z), (B, H, F, Dv) without normalize; all zeros for mechanisms without a state.
// Validates like attend().
std::array<int64_t, 4> state_shape(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const Mechanism& mechanism, const AttendOptions& options = {});

// Floating-point operations of the call: 2 * (D + Dv) per (query, key) pair the mechanism
// evaluates, counted from the same key ranges the kernels use (causal, window, padding).
double attention_flops(const TensorView& q, const TensorView& k, const TensorView& v, const Mechanism& mechanism,
                       const AttendOptions& options = {});

// Checks a call as attend_into() would (the same Error for bad input) and returns the name of the
// form it would run, without running it and without building any text: what a caller that must
// not start a multi-call step it cannot finish (the decoder, before it touches its caches) asks
// per call. Outputs are taken to be absent, as explain() takes them.
std::string_view validate_call(const TensorView& q, const TensorView& k, const TensorView& v,
                               const Mechanism& mechanism, const AttendOptions& options = {});

// Which implementation ("form") attend() would run for this call, and why each other form
// would or would not. Validates like attend() (bad input throws the same Error); outputs
// are taken to be those attend() allocates (options.return_lse / return_probs).
struct FormVerdict {
  std::string form;
  std::string summary;              // what the form is
  std::vector<std::string> reasons;  // empty: the form supports this call
};
struct Explanation {
  std::string mechanism;  // canonical text form
  std::string chosen;     // the form attend() runs (the forced one when options.form is set)
  std::string isa;
  std::vector<FormVerdict> forms;  // every form of the family, in priority order
  std::string text() const;        // human-readable, one line per form
};
Explanation explain(const TensorView& q, const TensorView& k, const TensorView& v, const Mechanism& mechanism,
                    const AttendOptions& options = {});

}  // namespace attn
