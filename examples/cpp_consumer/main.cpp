// A consumer of the installed attn library: causal softmax attention through attn::attend,
// checked against plain float64 attention written out below. Exit status 0 only if they agree.
//
// Shapes: q (B, H, N, D), k and v (B, Hkv, M, D) with H = 2 * Hkv (GQA) and N < M, so the
// causal mask's bottom-right alignment (query i sees keys j <= i + M - N) is exercised too.
#include <attn/attn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <random>
#include <vector>

int main() {
  constexpr int64_t B = 2, H = 4, Hkv = 2, N = 5, M = 9, D = 16;
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](std::vector<float>& x) { for (float& e : x) e = normal(gen); };
  std::vector<float> q(B * H * N * D), k(B * Hkv * M * D), v(B * Hkv * M * D);
  fill(q);
  fill(k);
  fill(v);

  attn::AttendResult res;
  try {
    auto qv = attn::make_view(q.data(), attn::DType::f32, B, H, N, D);
    auto kv = attn::make_view(k.data(), attn::DType::f32, B, Hkv, M, D);
    auto vv = attn::make_view(v.data(), attn::DType::f32, B, Hkv, M, D);
    res = attn::attend(qv, kv, vv, attn::parse_mechanism("softmax:causal"));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn_consumer: attend failed: %s\n", e.what());
    return 1;
  }

  // float64 reference: o[i] = sum_j softmax_j(q_i . k_j / sqrt(D)) v_j over j <= i + M - N,
  // query head h reading kv head h / (H / Hkv); arrays are contiguous (B, H, T, D).
  double max_err = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / (H / Hkv);
      const float* kh = &k[(b * Hkv + hk) * M * D];
      const float* vh = &v[(b * Hkv + hk) * M * D];
      for (int64_t i = 0; i < N; ++i) {
        const float* qi = &q[((b * H + h) * N + i) * D];
        const int64_t visible = i + M - N + 1;  // keys 0 .. i + M - N
        std::vector<double> s(visible);
        for (int64_t j = 0; j < visible; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < D; ++c) dot += double(qi[c]) * kh[j * D + c];
          s[j] = dot / std::sqrt(double(D));
        }
        const double mx = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (int64_t c = 0; c < D; ++c) {
          double o = 0;
          for (int64_t j = 0; j < visible; ++j) o += s[j] / sum * vh[j * D + c];
          max_err = std::max(max_err, std::abs(o - double(res.out.at(b, h, i, c))));
        }
      }
    }

  const double tol = 1e-4;
  const bool ok = max_err <= tol;  // false for NaN too
  std::printf("attn_consumer: softmax:causal, isa %s, q (%lld, %lld, %lld, %lld), k/v (%lld, %lld, %lld, %lld): "
              "max |attend - float64 reference| = %.3g (tolerance %g) %s\n",
              attn::isa_name(attn::active_isa()).c_str(), (long long)B, (long long)H, (long long)N,
              (long long)D, (long long)B, (long long)Hkv, (long long)M, (long long)D, max_err, tol,
              ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
