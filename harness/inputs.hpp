// Seeded inputs of a case: q, k, v in the case's dtype and layout, and whatever extras it
// declares (padding, mask, bias, ALiBi, named parameters), wired into AttendOptions.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <random>
#include <vector>

#include "harness/case.hpp"

namespace attn::harness {

struct Buffer {
  std::vector<uint8_t> bytes;
  TensorView view;
};

// (B, H, N, D) in `layout`; `pad` extra elements per token row make the token stride larger
// than the packed one (a sliced/packed-QKV-like view).
Buffer random_tensor(std::mt19937& rng, DType dtype, int64_t B, int64_t H, int64_t N, int64_t D,
                     Layout layout = Layout::bhnd, float magnitude = 1.0f, int64_t pad = 0);

struct Inputs {
  Buffer q, k, v;
  std::vector<uint8_t> mask, block_mask;
  std::vector<float> bias;
  std::vector<float> k_scale, v_scale;  // int8 K/V rows' scales (Extras::int8_kv)
  std::map<std::string, std::vector<float>> param_data;  // named params' values
  AttendOptions options;  // views point into this struct: do not copy it
  Mechanism mechanism;
  Inputs() = default;
  Inputs(const Inputs&) = delete;
  Inputs& operator=(const Inputs&) = delete;
};

// Fills `in` for case `c` (return_lse on for families with one, return_final_state for families
// with a recurrent state). With shapes_only, q, k and v are views of the right
// shapes over one zero (all strides 0): enough for explain() and FLOP counts, nothing to compute.
void make_inputs(const Case& c, Inputs& in, bool shapes_only = false);

}  // namespace attn::harness
