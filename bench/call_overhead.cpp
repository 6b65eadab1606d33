// Per-call overhead of a tiny attend: nanoseconds per attn::attend_into call at B = H = 1, D = 64,
// float32, one thread, for a few shapes where the work is small and the call's fixed cost shows
// (validation, form choice, dispatch). Medians of 5 repetitions of `calls` calls each.
//   g++ -O2 -std=c++20 -fopenmp -Iinclude bench/call_overhead.cpp <libattn.a> -o call_overhead
//   ./call_overhead [calls]
#include <attn/attn.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace {

double median_ns(const char* mechanism, int64_t N, int64_t M, int64_t calls) {
  constexpr int64_t D = 64;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> q(static_cast<size_t>(N * D)), k(static_cast<size_t>(M * D)), v(k.size()), o(q.size());
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = normal(rng);
  const attn::TensorView qv = attn::make_view(q.data(), attn::DType::f32, 1, 1, N, D);
  const attn::TensorView kv = attn::make_view(k.data(), attn::DType::f32, 1, 1, M, D);
  const attn::TensorView vv = attn::make_view(v.data(), attn::DType::f32, 1, 1, M, D);
  const attn::TensorView ov = attn::make_view(o.data(), attn::DType::f32, 1, 1, N, D);
  const attn::Mechanism mech = attn::parse_mechanism(mechanism);
  attn::AttendOptions opt;
  opt.threads = 1;
  for (int i = 0; i < 2000; ++i) attn::attend_into(qv, kv, vv, mech, opt, ov, nullptr, nullptr);  // warm-up
  std::vector<double> reps;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < calls; ++i) attn::attend_into(qv, kv, vv, mech, opt, ov, nullptr, nullptr);
    const std::chrono::duration<double, std::nano> dt = std::chrono::steady_clock::now() - t0;
    reps.push_back(dt.count() / static_cast<double>(calls));
  }
  std::sort(reps.begin(), reps.end());
  return reps[2];
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t calls = argc > 1 ? std::atoll(argv[1]) : 100000;
  std::printf("attend_into per call, 1 thread, %s, isa %s\n", cpu_name().c_str(),
              attn::isa_name(attn::active_isa()).c_str());
  struct Shape {
    const char* mechanism;
    int64_t N, M;
  } const shapes[] = {{"softmax", 16, 16}, {"softmax:causal", 16, 16}, {"softmax:causal", 1, 512}};
  for (const Shape& s : shapes)
    std::printf("  %-16s N=%-3lld M=%-4lld %9.0f ns\n", s.mechanism, static_cast<long long>(s.N),
                static_cast<long long>(s.M), median_ns(s.mechanism, s.N, s.M, calls));
}
