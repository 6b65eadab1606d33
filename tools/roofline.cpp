#include "roofline.hpp"

#include <cblas.h>
#include <omp.h>

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "attn/isa.hpp"

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

namespace {

// Operations per thread per call of the chains below: kChains independent accumulators in
// registers, unrolled (enough to cover the instructions' latency at their throughput: on Zen 5
// 8 chains gave 0.66 (bf16) and 0.87 (int8) of 16's rate, 24 spilled), kSteps rounds.
constexpr int kChains = 16;
constexpr int64_t kSteps = 1 << 20;

// Runs `chain` (ops operations each call) on `threads` threads at once, best of 5; GOP/s.
template <class F>
double peak(int threads, double ops_per_call, F chain) {
  double best = 1e30;
  volatile float sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
    float total = 0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : total)
    total += chain();
    best = std::min(best, seconds_since(t0));
    sink = sink + total;
  }
  return ops_per_call * threads / best / 1e9;
}

__attribute__((target("avx512f"))) float f32_chain() {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_setzero_ps();
  const __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(0.5f);
  for (int64_t s = 0; s < kSteps; ++s)
#pragma GCC unroll 32
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(a, b, acc[c]);
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  return _mm512_reduce_add_ps(sum);
}

__attribute__((target("avx2,fma"))) float f32_chain256() {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_setzero_ps();
  const __m256 a = _mm256_set1_ps(1.0f), b = _mm256_set1_ps(0.5f);
  for (int64_t s = 0; s < kSteps; ++s)
#pragma GCC unroll 32
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(a, b, acc[c]);
  __m256 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = 0;
  for (const float x : lanes) total += x;
  return total;
}

__attribute__((target("avx512f,avx512bf16"))) float bf16_chain() {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_setzero_ps();
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x3f003f00);
  for (int64_t s = 0; s < kSteps; ++s)
#pragma GCC unroll 32
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  return _mm512_reduce_add_ps(sum);
}

__attribute__((target("avx512f,avx512vnni"))) float int8_chain512() {
  __m512i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_setzero_si512();
  const __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(2);
  for (int64_t s = 0; s < kSteps; ++s)
#pragma GCC unroll 32
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbusd_epi32(acc[c], a, b);
  __m512i sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_epi32(sum, acc[c]);  // wraps (unsigned lanes): fine here
  // the lanes summed in 64 bits (_mm512_reduce_add_epi32 adds them as int: 16 lanes of ~2^27
  // overflow, undefined behaviour that UBSan reports)
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, sum);
  int64_t total = 0;
  for (const int32_t x : lanes) total += x;
  return static_cast<float>(total);
}

__attribute__((target("avx2,avxvnni"))) float int8_chain256() {
  __m256i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_setzero_si256();
  const __m256i a = _mm256_set1_epi8(1), b = _mm256_set1_epi8(2);
  for (int64_t s = 0; s < kSteps; ++s)
#pragma GCC unroll 32
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_dpbusd_avx_epi32(acc[c], a, b);
  __m256i sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_epi32(sum, acc[c]);
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sum);
  int64_t total = 0;
  for (const int32_t x : lanes) total += x;
  return static_cast<float>(total);
}

}  // namespace

double f32_fma_gflops(int threads) {
  if (best_supported_isa() >= Isa::avx512) return peak(threads, 32.0 * kChains * static_cast<double>(kSteps), f32_chain);
  if (best_supported_isa() >= Isa::avx2) return peak(threads, 16.0 * kChains * static_cast<double>(kSteps), f32_chain256);
  return 0;
}

double bf16_dot_gflops(int threads) {
  if (best_supported_isa() < Isa::avx512 || !__builtin_cpu_supports("avx512bf16")) return 0;
  return peak(threads, 64.0 * kChains * static_cast<double>(kSteps), bf16_chain);
}

double int8_dot_gops(int threads) {
  if (best_supported_isa() >= Isa::avx512 && __builtin_cpu_supports("avx512vnni")) return peak(threads, 128.0 * kChains * static_cast<double>(kSteps), int8_chain512);
  if (best_supported_isa() >= Isa::avx2 && __builtin_cpu_supports("avxvnni")) return peak(threads, 64.0 * kChains * static_cast<double>(kSteps), int8_chain256);
  return 0;
}

}  // namespace attn::cli
