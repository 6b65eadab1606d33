// The machine's own ceilings, measured in the same run as the benchmark they judge.
#pragma once

namespace attn::cli {

// Best-of-several OpenBLAS sgemm GFLOP/s for square n x n matrices on `threads` threads.
double sgemm_gflops(int n, int threads);
// Best-of-several streaming read bandwidth in GB/s (sum over a buffer much larger than L3).
double memory_bandwidth_gbs(int threads);
// The low-precision dot-product peaks, in the same units as sgemm's (a multiply and an add are 2
// operations), from register-resident chains on `threads` threads, best of several; 0 when this
// CPU lacks the instruction:
//   bf16: AVX512-BF16's vdpbf16ps (32 bf16 products summed into 16 float32 lanes per instruction)
//   int8: VNNI's vpdpbusd (64 u8 x s8 products into 16 int32 lanes; AVX-VNNI's 256-bit form when
//         only that is present)
double bf16_dot_gflops(int threads);
// The float32 FMA peak the same way (AVX-512 vfmadd, or AVX2's on 256 bits; 0 on neither): how far
// sgemm is from the cores' own ceiling.
double f32_fma_gflops(int threads);
double int8_dot_gops(int threads);

}  // namespace attn::cli
