#include "base/thread_team.hpp"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <exception>
#include <thread>
#include <vector>

namespace attn {
namespace {

// The claim word: region number (24 bits) | next item (20 bits) | item count (20 bits). A region
// of more items than fit hands them out in runs of `stride` consecutive items per claim.
constexpr int kCountBits = 20;
constexpr uint64_t kCountMask = (uint64_t{1} << kCountBits) - 1;
constexpr uint64_t kRegionMask = (uint64_t{1} << (64 - 2 * kCountBits)) - 1;
constexpr uint64_t kOneClaim = uint64_t{1} << kCountBits;

uint64_t claim_word(uint64_t region, uint64_t next, uint64_t count) {
  return region << (2 * kCountBits) | next << kCountBits | count;
}
uint64_t next_of(uint64_t word) { return (word >> kCountBits) & kCountMask; }
uint64_t count_of(uint64_t word) { return word & kCountMask; }

// How long an idle member keeps its core before it yields it, then before it sleeps. A decoder
// step runs a region every few microseconds; a spin of ~2000 pauses (tens of microseconds) keeps
// a worker ready across that gap without holding a core another process wants for longer.
constexpr int kSpins = 2000;
constexpr int kYields = 64;

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

thread_local bool t_in_region = false;

using Body = std::function<void(int64_t, int)>;

class Team {
 public:
  void run(int64_t n, int width, const Body& fn) {
    std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
    width = lock ? std::min(width, 1 + grow(width - 1)) : 1;
    if (width <= 1) return run_alone(n, fn);
    const int64_t stride = (n + static_cast<int64_t>(kCountMask) - 1) / static_cast<int64_t>(kCountMask);
    const uint64_t count = static_cast<uint64_t>((n + stride - 1) / stride);
    fn_.store(&fn, std::memory_order_relaxed);
    width_.store(width, std::memory_order_relaxed);
    stride_.store(stride, std::memory_order_relaxed);
    total_.store(n, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    finished_.store(0, std::memory_order_relaxed);
    region_ = (region_ + 1) & kRegionMask;
    claim_.store(claim_word(region_, 0, count), std::memory_order_release);
    epoch_.fetch_add(1, std::memory_order_release);
    epoch_.notify_all();
    while (claim_and_run(0)) {
    }
    wait_until_finished();
  }

 private:
  static void run_alone(int64_t n, const Body& fn) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
  }

  // Starts workers until there are `wanted` (on the caller, before the region). Returns how many
  // there are: fewer when the system refuses a thread, and the region then runs narrower.
  int grow(int wanted) {
    while (static_cast<int>(workers_) < wanted) {
      try {
        std::thread(&Team::work, this, static_cast<int>(workers_) + 1, epoch_.load()).detach();
      } catch (const std::exception&) {  // std::system_error, std::bad_alloc
        break;
      }
      ++workers_;
    }
    return std::min(wanted, static_cast<int>(workers_));
  }

  // Claims the next item of the live region and computes it; false when there is none left or
  // this member is not part of the region. The compare-and-swap succeeds only while the region
  // it read is live (its item count is in the word), so fn_, width_, stride_ and total_ read
  // before it belong to that region: the caller cannot start another before this item is done.
  bool claim_and_run(int member) {
    uint64_t word = claim_.load(std::memory_order_acquire);
    for (;;) {
      if (next_of(word) >= count_of(word) || member >= width_.load(std::memory_order_relaxed)) return false;
      if (claim_.compare_exchange_weak(word, word + kOneClaim, std::memory_order_acq_rel, std::memory_order_acquire))
        break;
    }
    const Body& fn = *fn_.load(std::memory_order_relaxed);
    const int64_t stride = stride_.load(std::memory_order_relaxed), total = total_.load(std::memory_order_relaxed);
    const int64_t first = static_cast<int64_t>(next_of(word)) * stride;
    const int64_t last = std::min(total, first + stride);
    const bool nested = t_in_region;
    t_in_region = true;
    for (int64_t i = first; i < last; ++i) fn(i, member);
    t_in_region = nested;
    if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == count_of(word)) {
      finished_.store(1, std::memory_order_release);
      finished_.notify_one();
    }
    return true;
  }

  void wait_until_finished() {
    for (int i = 0; finished_.load(std::memory_order_acquire) == 0; ++i) {
      if (i < kSpins)
        cpu_relax();
      else if (i < kSpins + kYields)
        sched_yield();
      else
        finished_.wait(0, std::memory_order_acquire);
    }
  }

  // A worker's life: wait for a region (spin, yield, sleep), take items while there are any.
  void work(int member, uint32_t seen) {
    for (;;) {
      for (int i = 0; epoch_.load(std::memory_order_acquire) == seen; ++i) {
        if (i < kSpins)
          cpu_relax();
        else if (i < kSpins + kYields)
          sched_yield();
        else
          epoch_.wait(seen, std::memory_order_acquire);
      }
      seen = epoch_.load(std::memory_order_acquire);
      while (claim_and_run(member)) {
      }
    }
  }

  std::mutex busy_;         // one region at a time; a second caller runs alone
  size_t workers_ = 0;      // started so far (they never exit)
  uint64_t region_ = 0;     // the live region's number (caller only)
  std::atomic<uint64_t> claim_{0};
  std::atomic<uint32_t> epoch_{0};     // bumped per region: what idle workers wait on
  std::atomic<uint32_t> finished_{0};  // 1 once every item is done: what the caller waits on
  std::atomic<uint64_t> done_{0};      // claims finished in the live region
  std::atomic<const Body*> fn_{nullptr};
  std::atomic<int> width_{0};
  std::atomic<int64_t> stride_{1}, total_{0};
};

// Never destroyed: detached workers may still be asleep in it while the process exits.
Team& team() {
  static Team* t = new Team;
  return *t;
}

}  // namespace

void team_run(int64_t n, int width, const Body& fn) {
  if (n <= 0) return;
  if (t_in_region || width <= 1 || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  team().run(n, width, fn);
}

bool in_team_region() { return t_in_region; }

}  // namespace attn
