// Rotary position embedding (RoPE), a reusable piece: rotates pairs of channels of q or k by
// angles that grow with the token's position, so q_i . k_j depends on i - j only.
//
//   pair c (c < R/2, R = rotary dims) at position p:  angle = p * theta^(-2c / R)
//   (x_a, x_b) -> (x_a cos - x_b sin, x_a sin + x_b cos)
//   style half:        a = c,     b = c + R/2   (rotate-half: llama / GPT-NeoX / Hugging Face)
//   style interleaved: a = 2c,    b = 2c + 1    (GPT-J, the original paper; flash-attn's
//                                                rotary_interleaved=True)
// Channels R..D-1 are left as they are (partial rotary, e.g. MiniMax's 64 of 128).
// Token n of batch b is at position offset + n (+ offsets[b] when per-batch offsets are given,
// e.g. the cached length of each sequence).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "attn/tensor.hpp"

namespace attn {

enum class RopeStyle { half, interleaved };

struct Rope {
  double theta = 10000.0;
  RopeStyle style = RopeStyle::half;
  int64_t rotary_dim = 0;  // 0: all D channels; else even, <= D
  int64_t offset = 0;      // position of token 0
  int threads = 0;         // 0: all cores
};

// Rotates x (B, H, N, D), float32/bfloat16/float16, any strides, in place. `batch_offsets`
// (empty, or B values) add to the offset per batch. Angles are computed in float64, so
// positions up to 2^40 keep their accuracy; the rotation itself is float32.
void apply_rope(const TensorView& x, const Rope& rope, const std::vector<int64_t>& batch_offsets = {});

// Rotates x (B, H, N, D) in place with token n at position rope.offset + positions[n] (N
// values, the same for every batch), for schemes that remap positions (Dual Chunk Attention).
void apply_rope_at(const TensorView& x, const Rope& rope, const std::vector<int64_t>& positions);

// Rotates x (B, H, N, D) in place with given tables (flash-attn's rotary_cos / rotary_sin):
// cos and sin (1, 1, P, R/2), any float dtype and strides, rotary dims R = 2 * their last dim
// (<= D); token n of batch b is at position positions[b * N + n], which must be < P.
void apply_rope_table(const TensorView& x, const TensorView& cos, const TensorView& sin, RopeStyle style,
                      const std::vector<int64_t>& positions);

// The float64 reference of the same rotation (tests): returns the rotated values of x,
// (B, H, N, D) row-major.
std::vector<double> rope_reference(const TensorView& x, const Rope& rope, const std::vector<int64_t>& batch_offsets = {});

std::string to_string(RopeStyle s);

}  // namespace attn
