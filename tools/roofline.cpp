#include "roofline.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace attn::cli {

static double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double sgemm_gflops(int n, int threads) {
  openblas_set_num_threads(threads);
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
  double best = 1e30;
  for (int rep = 0; rep < 8; ++rep) {  // best of 8: the roofline is a ceiling, not an average
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * n * n * static_cast<double>(n) / best / 1e9;
}

double memory_bandwidth_gbs(int threads) {
  const size_t n = size_t{1} << 26;  // 256 MiB of floats, far beyond L3
  // Distinct values on every page, so that nothing about the data (pages of one constant, which
  // a VM's host may merge) can make the sum cheaper than a read of it.
  std::vector<float> buf(n);
  for (size_t i = 0; i < n; ++i) buf[i] = static_cast<float>(i % 8191);
  double best = 1e30;
  volatile float sink = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    float total = 0;
    // 16 independent partial sums per thread, so the loop is bound by loads, not add latency
#pragma omp parallel for reduction(+ : total) num_threads(threads) schedule(static)
    for (size_t blk = 0; blk < n / 64; ++blk) {
      float part[16] = {};
      const float* p = buf.data() + blk * 64;
      for (int k = 0; k < 64; k += 16)
        for (int i = 0; i < 16; ++i) part[i] += p[k + i];
      for (float x : part) total += x;
    }
    best = std::min(best, seconds_since(t0));
    sink = sink + total;
  }
  return static_cast<double>(n * sizeof(float)) / best / 1e9;
}

}  // namespace attn::cli
