// Counter-based random numbers: a value is a pure function of (seed, coordinates), so results do
// not depend on the order or the thread that draws them (dropout masks, random projections).
#pragma once
#include <cmath>
#include <cstdint>

namespace attn {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) from the top 53 bits.
inline double unit_uniform(uint64_t x) { return static_cast<double>(x >> 11) * (1.0 / 9007199254740992.0); }

// A standard normal value for (seed, a, b, c) (Box-Muller on two counter-based uniforms).
inline double counter_normal(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  const uint64_t h = splitmix64(splitmix64(splitmix64(splitmix64(seed) ^ a) ^ b) ^ c);
  const double u1 = 1.0 - unit_uniform(h), u2 = unit_uniform(splitmix64(h));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace attn
