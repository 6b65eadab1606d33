// The checks every mechanism shares: q, k, v and the output views (dtypes, shapes, head
// grouping, sizes that fit 64-bit offsets) and the run options (threads). Families add their
// own checks on top (src/exact/validate.cpp).
#pragma once
#include <array>
#include <string>
#include <vector>

#include "attn/attend.hpp"
#include "core/form.hpp"

namespace attn::core {

// Sizes of a validated call: q (B, H, N, D), k (B, Hkv, M, D), v (B, Hkv, M, Dv).
struct Dims {
  TensorView q, k, v;
  int64_t B = 0, H = 0, Hkv = 0, N = 0, M = 0, D = 0, Dv = 0;
  int64_t group = 1;   // query heads per kv head: kv head of h is h / group
  std::vector<int64_t> kv_len;  // valid keys per batch (key_padding_lengths; M when none given)
  int64_t kv_head(int64_t h) const { return h / group; }
};

// Validates q, k, v, the outputs that are given (none when explaining), key padding and the run
// options.
Dims check_io(const TensorView& q, const TensorView& k, const TensorView& v, const Outputs& outs,
              const AttendOptions& options);

// For families whose weights are no score matrix to mask: a boolean mask, a block mask or
// mask_mod, an additive bias or ALiBi slopes is an Error "<kind> does not take <what> (<why>)".
void refuse_score_options(const AttendOptions& options, const std::string& kind, const std::string& why);

// Shared helpers for family checks.
std::string dims_text(const TensorView& v);
void check_view(const TensorView& v, const std::string& name);
void check_finite(double x, const std::string& name);
// x must be finite, > 0, and a normal float32 (kernels compute in float32: 1e39 would be inf).
void check_positive_float32(double x, const std::string& name);
bool is_float(DType t);

}  // namespace attn::core
