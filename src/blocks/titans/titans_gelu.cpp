// The Titans fast form's gelu and gelu' (declared and described in titans_common.hpp). This file
// is compiled with -fno-trapping-math: it changes no value, and lets GCC turn the selects into
// blends so the loop vectorises.
#include <bit>
#include <cmath>
#include <cstdint>

#include "titans/titans_common.hpp"

namespace attn::titans {

void gelu_rows(const float* z, float* g, float* dg, int64_t n) {
  constexpr float c[11] = {4.107433823e-02f, -2.204522461e-01f, 4.525506855e-01f, -3.881203360e-01f,
                           6.438332908e-02f,  -1.446969717e-02f, 7.405535795e-02f, 1.807611802e-01f,
                           2.459418034e-01f,  2.821844942e-01f,  2.820911100e-01f};
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float zi = z[i];
    const float u = std::fabs(zi) * 0.70710678118654752f;
    const float x = -u * u;  // exp(x), x <= 0
    const float xc = x < -87.0f ? -87.0f : x;
    const float k = static_cast<float>(static_cast<int32_t>(xc * 1.44269504088896341f - 0.5f));
    const float r = (xc - k * 0.693145752f) - k * 1.42860677e-06f;  // ln 2 in two parts
    float p = 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const float keep = x >= -87.0f ? 1.0f : 0.0f;
    const float e = keep * p * std::bit_cast<float>((static_cast<int32_t>(k) + 127) << 23);
    const float t = 1.0f / (1.0f + 0.5f * u);
    const float q = ((((((((((c[0] * t + c[1]) * t + c[2]) * t + c[3]) * t + c[4]) * t + c[5]) * t + c[6]) * t + c[7]) *
                              t + c[8]) * t + c[9]) * t + c[10]);
    const float half = 0.5f * e * t * q;
    const float cdf = zi >= 0.0f ? 1.0f - half : half;
    g[i] = zi * cdf;
    dg[i] = cdf + zi * 0.398942280401432678f * e;
  }
}

}  // namespace attn::titans
