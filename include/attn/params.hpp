// Named parameter tensors: the extra arrays a mechanism needs beyond q, k and v (the additive
// score's Wq, Wk, w today; Linformer's projections, Performer's random features, per-head
// decays later) travel in one map of views, validated against what the mechanism declares.
// A missing or unexpected name, a wrong dtype or a wrong shape is an Error naming it.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "attn/dtype.hpp"

namespace attn {

// A non-owning view of any rank; strides in elements.
struct ArrayView {
  const void* data = nullptr;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
};

// C-order view of a contiguous buffer.
ArrayView make_array_view(const void* data, DType dtype, std::vector<int64_t> shape);

using Params = std::map<std::string, ArrayView, std::less<>>;

}  // namespace attn
