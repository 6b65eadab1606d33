// The process's one team of worker threads, shared by every parallel loop (base/parallel.hpp).
//
// Built for a machine shared with other work: a region's items are claimed one at a time from a
// shared counter by whichever team member is running, the caller included, so a worker that has
// lost its core holds back at most the one item it is computing, never the ones it has not
// started. The caller does not wait for workers to wake or to arrive anywhere: it waits only for
// claimed items to finish. Idle workers spin briefly, then yield, then sleep on a futex.
//
// Claims are one compare-and-swap on a 64-bit word holding (region number, next item, item
// count), so a worker that wakes late, after its region ended, finds a different region number
// and claims nothing; the caller returns as soon as every item is done.
#pragma once
#include <cstdint>
#include <functional>

namespace attn {

// Runs fn(item, member) for item in [0, n), each exactly once, on the caller (member 0) and up to
// width - 1 workers (members 1 .. width - 1); returns when every item has finished. A call made
// from inside a region (nested), or while another thread's region holds the team, runs on the
// caller alone. fn must not throw.
void team_run(int64_t n, int width, const std::function<void(int64_t, int)>& fn);

// True on a thread while it computes an item of a region run by the team (workers and caller).
bool in_team_region();

}  // namespace attn
