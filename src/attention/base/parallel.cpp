#include "base/parallel.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

#include "base/thread_team.hpp"

namespace attn {
namespace {

std::atomic<bool> g_forked{false};
std::atomic<uint64_t> g_regions{0};

void mark_child() { g_forked = true; }

// Registered when the library loads: a forked child runs attn single-threaded.
const int g_atfork = pthread_atfork(nullptr, nullptr, mark_child);

// The CPU quota of this process's cgroup in CPUs, rounded up (0: none set). cgroup v2 writes
// "max 100000" or "<quota> <period>" in cpu.max; v1 splits them into two files.
int cgroup_cpu_quota() {
  double quota = 0, period = 0;
  std::string first;
  if (std::ifstream v2("/sys/fs/cgroup/cpu.max"); v2 >> first >> period) {
    if (first == "max") return 0;
    quota = std::atof(first.c_str());
  } else if (std::ifstream q("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), p("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
             !(q >> quota && p >> period)) {
    return 0;
  }
  if (quota <= 0 || period <= 0) return 0;
  return std::max(1, static_cast<int>(std::ceil(quota / period)));
}

// The CPUs this process may run on: its affinity mask, capped by its cgroup's CPU quota.
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  if (const int quota = cgroup_cpu_quota(); quota > 0) cpus = std::min(cpus, quota);
  return std::clamp(cpus, 1, kMaxThreads);
}

// OMP_NUM_THREADS's first number if it is a positive integer (0 otherwise), as OpenMP reads it.
int requested_by_environment() {
  const char* text = std::getenv("OMP_NUM_THREADS");
  if (!text) return 0;
  char* end = nullptr;
  const long n = std::strtol(text, &end, 10);
  if (end == text || (*end != '\0' && *end != ',') || n <= 0) return 0;
  return static_cast<int>(std::min<long>(n, kMaxThreads));
}

// The default thread count, decided when first asked: the usable CPUs, or OMP_NUM_THREADS when it
// asks for fewer.
int default_threads() {
  static const int threads = [] {
    const int cpus = usable_cpus(), asked = requested_by_environment();
    return asked > 0 ? std::min(asked, cpus) : cpus;
  }();
  return threads;
}

}  // namespace

bool in_forked_child() { return g_forked.load(); }

uint64_t parallel_regions() { return g_regions.load(std::memory_order_relaxed); }

int resolve_threads(int requested, int64_t items) {
  (void)g_atfork;
  if (in_forked_child()) return 1;
  int t = requested > 0 ? std::min(requested, kMaxThreads) : default_threads();
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
  team_run(n, threads, fn);
}

}  // namespace attn
