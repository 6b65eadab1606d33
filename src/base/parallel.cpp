#include "base/parallel.hpp"

#include <omp.h>

namespace attn {

int max_threads() { return omp_get_max_threads(); }

void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  const int t = threads > 0 ? threads : omp_get_max_threads();
  if (t == 1 || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(t)
  for (int64_t i = 0; i < n; ++i) fn(i, omp_get_thread_num());
}

}  // namespace attn
