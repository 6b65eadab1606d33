// A consumer of the installed LLM wing (attn::llm, which brings attn::attn): the mixture-of-experts
// feed-forward of a few tokens, its float32 form against its float64 reference. Exits non-zero on
// a mismatch.
#include <attn/llm.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <random>
#include <vector>

int main() {
  attn::MoeSizes z;
  z.tokens = 5, z.dim = 32, z.experts = 4, z.hidden = 48, z.top_k = 2;
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  auto draw = [&](int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& e : x) e = normal(gen);
    return x;
  };
  const std::vector<float> x = draw(z.tokens * z.dim), router = draw(z.experts * z.dim),
                           w1 = draw(z.experts * z.hidden * z.dim), w2 = draw(z.experts * z.dim * z.hidden),
                           w3 = draw(z.experts * z.hidden * z.dim);
  auto wide = [](const std::vector<float>& a) { return std::vector<double>(a.begin(), a.end()); };
  std::vector<float> y(x.size());
  std::vector<double> yd(x.size());
  try {
    attn::moe_feed_forward(z, x, router, w1, w2, w3, y);
    const std::vector<double> xd = wide(x), rd = wide(router), w1d = wide(w1), w2d = wide(w2), w3d = wide(w3);
    attn::moe_feed_forward(z, xd, rd, w1d, w2d, w3d, yd);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn_llm_consumer: moe_feed_forward failed: %s\n", e.what());
    return 1;
  }
  double max_err = 0;
  for (size_t i = 0; i < y.size(); ++i) max_err = std::max(max_err, std::abs(double(y[i]) - yd[i]));
  const double tol = 1e-5;
  const bool ok = max_err <= tol;  // false for NaN too
  std::printf("attn_llm_consumer: MoE feed-forward, %lld tokens, %lld experts (top %lld): "
              "max |float32 - float64 reference| = %.3g (tolerance %g) %s\n",
              (long long)z.tokens, (long long)z.experts, (long long)z.top_k, max_err, tol, ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
