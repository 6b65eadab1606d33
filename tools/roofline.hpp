// The machine's own ceilings, measured in the same run as the benchmark they judge.
#pragma once

namespace attn::cli {

// Best-of-several OpenBLAS sgemm GFLOP/s for square n x n matrices on `threads` threads.
double sgemm_gflops(int n, int threads);
// Best-of-several streaming read bandwidth in GB/s (sum over a buffer much larger than L3).
double memory_bandwidth_gbs(int threads);

}  // namespace attn::cli
