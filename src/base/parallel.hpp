// Parallel loop over independent work items. Each item is computed by exactly one thread
// and no item reads another's result, so the output does not depend on the thread count
// (bitwise); the schedule only changes which thread does an item.
#pragma once
#include <cstdint>
#include <functional>

namespace attn {

// Calls fn(item, thread_index) for item in [0, n). threads <= 0: OpenMP default.
// fn must not throw.
void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int)>& fn);
int max_threads();

}  // namespace attn
