#include "attn/dtype.hpp"

#include <cmath>

namespace attn {

std::string dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    case DType::boolean: return "bool";
    case DType::i8: return "int8";
  }
  return "unknown";
}

static uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
static float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

uint16_t float_to_bf16(float x) {
  uint32_t u = bits_of(x);
  if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x40);  // keep it a NaN
  u += 0x7fff + ((u >> 16) & 1);                                      // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_float(uint16_t x) { return float_of(static_cast<uint32_t>(x) << 16); }

uint16_t float_to_f16(float x) {
  uint32_t u = bits_of(x);
  const uint32_t sign = (u >> 16) & 0x8000;
  u &= 0x7fffffff;
  if (u > 0x7f800000) return static_cast<uint16_t>(sign | 0x7e00 | ((u >> 13) & 0x3ff));  // quiet NaN, payload kept as F16C does
  if (u == 0x7f800000) return static_cast<uint16_t>(sign | 0x7c00);
  if (u >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // rounds past 65504
  if (u < 0x38800000) {  // subnormal half (or zero): scale so the half ulp is 1, round
    const float mag = float_of(u) * 16777216.0f;  // 2^24, exact
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(mag)));
  }
  const uint32_t mant_odd = (u >> 13) & 1;
  u += 0xc8000fff + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return static_cast<uint16_t>(sign | (u >> 13));
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  if (exp == 0) {
    const float mag = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -mag : mag;
  }
  if (exp == 31) return float_of(sign | 0x7f800000 | (mant << 13));
  return float_of(sign | ((exp + 112) << 23) | (mant << 13));
}

float load_as_float(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::f16: return f16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::boolean: return static_cast<const uint8_t*>(base)[i] ? 1.0f : 0.0f;
    case DType::i8: return static_cast<const int8_t*>(base)[i];
  }
  return 0.0f;
}

void store_from_float(void* base, DType t, int64_t i, float x) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[i] = x; break;
    case DType::bf16: static_cast<uint16_t*>(base)[i] = float_to_bf16(x); break;
    case DType::f16: static_cast<uint16_t*>(base)[i] = float_to_f16(x); break;
    case DType::boolean: static_cast<uint8_t*>(base)[i] = x != 0.0f; break;
    case DType::i8:  // NaN fails both comparisons: 0
      static_cast<int8_t*>(base)[i] = x >= 127.0f    ? int8_t{127}
                                      : x <= -127.0f ? int8_t{-127}
                                      : x == x       ? static_cast<int8_t>(std::nearbyint(x))
                                                     : int8_t{0};
      break;
  }
}

float round_to(DType t, float x) {
  switch (t) {
    case DType::bf16: return bf16_to_float(float_to_bf16(x));
    case DType::f16: return f16_to_float(float_to_f16(x));
    case DType::i8: {
      int8_t r;
      store_from_float(&r, DType::i8, 0, x);
      return r;
    }
    default: return x;
  }
}

}  // namespace attn
