// Parallel loop over independent work items. Each item is computed by exactly one thread
// and no item reads another's result, so the output does not depend on the thread count
// (bitwise); the schedule only changes which thread does an item.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

namespace attn {

// Largest thread count a caller may ask for (AttendOptions::threads, --threads, threads=);
// more is an Error. Oversubscribing the CPUs up to this is allowed (and still deterministic).
constexpr int kMaxThreads = 256;

// The one place a thread count is decided: `requested`, or for 0 the CPUs this process may use
// (its affinity mask, capped by its cgroup's CPU quota; OMP_NUM_THREADS lowers it, so
// OMP_NUM_THREADS=100000 means "all usable CPUs"), never more than `items` (no idle threads, no
// scratch for them), 1 in a child process after fork() (the thread team does not survive fork;
// results are the same for any thread count).
int resolve_threads(int requested, int64_t items);

// Calls fn(item, thread_index) for item in [0, n) on at most `threads` threads (a count from
// resolve_threads) of the process's thread team (base/thread_team.hpp): items are claimed one at
// a time, so a thread that lost its core to another process holds back only the item it computes.
// thread_index < threads, and no two items run at once with the same index. fn must not throw
// and must not allocate (no std::vector, std::string or new inside it, nor in what it calls): an
// exception leaving a worker ends the process through std::terminate. Size scratch
// before the call, one slice per thread (indexed by thread_index), and re-initialise in fn what
// an item needs fresh; allocation failure then happens on the calling thread, where the entry
// points turn it into Error (core/out_of_memory.hpp). tests/core/test_alloc_failure.cpp checks
// every form.
void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int)>& fn);

// The scratch of a parallel region, one T(args...) per thread (indexed by parallel_for's
// thread_index), built before the region on the calling thread.
template <class T, class... Args>
std::vector<T> per_thread(int threads, Args&&... args) {  // each T gets args as lvalues
  std::vector<T> scratch;
  scratch.reserve(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) scratch.emplace_back(args...);
  return scratch;
}

// Parallel regions entered (with more than one thread) since the library loaded: what a
// benchmark counts per decoded token (each ends in a barrier all threads wait at).
uint64_t parallel_regions();

// True in a child process created by fork() after this library was loaded.
bool in_forked_child();

}  // namespace attn
