// Storage types. Computation is float32 (float64 in references) whatever the storage.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace attn {

// i8: signed 8-bit integers in [-127, 127], the rows of an 8-bit KV cache; each row's values are
// multiplied by its float32 scale (AttendOptions::kv_scales, attn/kv_quant.hpp). Read alone, an
// element is its integer.
enum class DType : uint8_t { f32, bf16, f16, boolean, i8 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16:
    case DType::f16: return 2;
    case DType::boolean:
    case DType::i8: return 1;
  }
  return 0;
}
std::string dtype_name(DType t);

// Round-to-nearest-even conversions; NaN stays NaN, infinities stay infinite.
uint16_t float_to_bf16(float x);
float bf16_to_float(uint16_t x);
uint16_t float_to_f16(float x);
float f16_to_float(uint16_t x);

// Reads element `i` of a buffer of storage type `t` as float (booleans read as 0/1).
float load_as_float(const void* base, DType t, int64_t i);
// Writes float `x` rounded to storage type `t` at element `i` (i8: to the nearest integer, ties to
// even, clamped to [-127, 127]; NaN gives 0).
void store_from_float(void* base, DType t, int64_t i, float x);
// Rounds x to the nearest value representable in `t` (identity for f32).
float round_to(DType t, float x);

}  // namespace attn
