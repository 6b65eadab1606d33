// Generated inputs and timing shared by `attn demo` and `attn bench`.
#pragma once
#include <chrono>
#include <cstdint>
#include <random>
#include <string>

#include "attn/attn.hpp"

namespace attn::cli {

struct Workload {
  int64_t B = 1, H = 8, Hkv = 8, N = 1024, M = 1024, D = 64;
  DType dtype = DType::f32;
  Tensor q, k, v;
  void generate(uint32_t seed = 42) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    q = Tensor(dtype, {B, H, N, D});
    k = Tensor(dtype, {B, Hkv, M, D});
    v = Tensor(dtype, {B, Hkv, M, D});
    for (Tensor* t : {&q, &k, &v})
      for (int64_t i = 0; i < t->view().numel(); ++i) store_from_float(t->view().data, dtype, i, d(rng));
  }
};

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
