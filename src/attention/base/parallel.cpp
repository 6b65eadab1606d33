#include "base/parallel.hpp"

#include <omp.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>

namespace attn {
namespace {

std::atomic<bool> g_forked{false};
std::atomic<uint64_t> g_regions{0};

void mark_child() { g_forked = true; }

// Registered when the library loads: a forked child runs attn single-threaded.
const int g_atfork = pthread_atfork(nullptr, nullptr, mark_child);

}  // namespace

bool in_forked_child() { return g_forked.load(); }

uint64_t parallel_regions() { return g_regions.load(std::memory_order_relaxed); }

int resolve_threads(int requested, int64_t items) {
  (void)g_atfork;
  if (in_forked_child()) return 1;
  int t = requested > 0 ? std::min(requested, kMaxThreads) : std::min(omp_get_max_threads(), omp_get_num_procs());
  t = std::max(t, 1);
  return static_cast<int>(std::min<int64_t>(t, std::max<int64_t>(items, 1)));
}

void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  if (threads <= 1 || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  g_regions.fetch_add(1, std::memory_order_relaxed);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) fn(i, omp_get_thread_num());
}

}  // namespace attn
