#include "serve/metrics_text.hpp"

#include <fmt/core.h>

#include <cmath>

namespace attn::cli::serve {
namespace {

void family(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void sample(std::string& out, const char* name, double value) {
  out += fmt::format("{} {}\n", name, value);
}

// Go's and Prometheus' spelling of a bucket bound: 0.025, 1, 2.5, 60
std::string bound_text(double b) { return std::isinf(b) ? "+Inf" : fmt::format("{}", b); }

void histogram(std::string& out, const char* name, const char* help, const Histogram& h) {
  family(out, name, "histogram", help);
  for (size_t i = 0; i < h.bounds.size(); ++i)
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bound_text(h.bounds[i]), i < h.counts.size() ? h.counts[i] : 0);
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, h.count);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, h.sum, name, h.count);
}

}  // namespace

std::string metrics_text(const EngineMetrics* engine, const std::map<int, int64_t>& requests) {
  const EngineMetrics m = engine ? *engine : EngineMetrics{};
  std::string out;
  family(out, "attn_requests_total", "counter", "HTTP responses sent, by status code");
  if (requests.empty()) out += "attn_requests_total{status=\"200\"} 0\n";
  for (const auto& [status, n] : requests) out += fmt::format("attn_requests_total{{status=\"{}\"}} {}\n", status, n);
  const struct {
    const char* name;
    const char* type;
    const char* help;
    int64_t value;
  } figures[] = {
      {"attn_prompt_tokens_total", "counter", "Prompt tokens of admitted requests (prefix-cached ones included)",
       m.prompt_tokens_total},
      {"attn_generated_tokens_total", "counter", "Tokens generated", m.generated_tokens_total},
      {"attn_prefix_cache_hits_total", "counter", "Requests that reused at least one cached KV block",
       m.prefix_cache_hits_total},
      {"attn_prefix_cached_tokens_total", "counter", "Prompt tokens taken from the prefix cache",
       m.prefix_cached_tokens_total},
      {"attn_preemptions_total", "counter", "Sequences preempted (blocks released, recomputed later)", m.preemptions_total},
      {"attn_steps_total", "counter", "Engine steps run", m.steps_total},
      {"attn_queue_length", "gauge", "Requests waiting to start", m.queue_length},
      {"attn_running_sequences", "gauge", "Sequences running", m.running_sequences},
      {"attn_kv_blocks_in_use", "gauge", "KV blocks held by a sequence", m.kv_blocks_in_use},
      {"attn_kv_blocks_cached", "gauge", "KV blocks held by no sequence, kept for the prefix cache", m.kv_blocks_cached},
      {"attn_kv_blocks_total", "gauge", "KV blocks of the pool", m.kv_blocks_total},
  };
  for (const auto& f : figures) {
    family(out, f.name, f.type, f.help);
    sample(out, f.name, static_cast<double>(f.value));
  }
  histogram(out, "attn_time_to_first_token_seconds", "Seconds from a request's arrival to its first generated token",
            m.time_to_first_token);
  histogram(out, "attn_inter_token_latency_seconds", "Seconds between a request's consecutive generated tokens",
            m.inter_token_latency);
  return out;
}

}  // namespace attn::cli::serve
