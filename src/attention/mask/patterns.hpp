// The pattern each mechanism implies, checked and normalised for N queries and M keys (bounds
// beyond every key become unbounded, causal caps the window's right side, BigBird's random
// blocks are drawn). Errors name the option, the expected and the actual value.
#pragma once
#include <cstdint>

#include "attn/mechanism.hpp"
#include "mask/pattern.hpp"

namespace attn::mask {

Pattern pattern_of(const Softmax& m, int64_t N, int64_t M);
Pattern pattern_of(const Longformer& m, int64_t N, int64_t M);
Pattern pattern_of(const BigBird& m, int64_t N, int64_t M);

}  // namespace attn::mask
