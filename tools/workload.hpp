// Timing shared by `attn demo` and `attn bench`.
#pragma once
#include <algorithm>
#include <chrono>

namespace attn::cli {

// Best wall time of `reps` calls, after warm-up calls that last at least 0.2 s (thread pool
// start, page faults and clock ramp-up otherwise land in the first timings).
template <class F>
double best_seconds(int reps, F&& f) {
  const auto w0 = std::chrono::steady_clock::now();
  do f();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count() < 0.2);
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace attn::cli
