// The MoE router's choice (model/moe.cpp's forms and model/moe_backward*.cpp): shared so that the
// backward re-derives exactly the experts the forward chose.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace attn::model {

// The top_k largest of p[0..E) in descending order, ties to the lower id. A NaN logit makes the
// whole softmax row NaN: it then chooses ids 0, 1, ... and its weights are NaN (propagated).
// O(E log k) with a heap of the k best so far in `ids` itself (worst at the front; no allocation).
template <class T>
inline void moe_top_k(const T* p, int64_t E, int64_t k, int32_t* ids) {
  for (int64_t e = 0; e < k; ++e) ids[e] = static_cast<int32_t>(e);
  for (int64_t e = 0; e < E; ++e)
    if (std::isnan(p[e])) return;
  auto before = [p](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); };  // a ranks first
  std::make_heap(ids, ids + k, before);
  for (int64_t e = k; e < E; ++e)
    if (before(static_cast<int32_t>(e), ids[0])) {
      std::pop_heap(ids, ids + k, before);
      ids[k - 1] = static_cast<int32_t>(e);
      std::push_heap(ids, ids + k, before);
    }
  std::sort_heap(ids, ids + k, before);
}

}  // namespace attn::model
