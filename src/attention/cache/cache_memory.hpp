// What memory a cache call writes, and what else shares it. attend_with_kvcache writes new rows
// into caches the caller owns and then reads them; inputs that are views of those caches, or
// caches that alias each other, would see half-written data. These helpers find such overlaps
// before the first write (kv_cache.cpp decides what to do: copy an input aside, or refuse).
#pragma once
#include <cstdint>
#include <vector>

#include "attn/tensor.hpp"
#include "core/kv_rows.hpp"

namespace attn::cache_memory {

// The bytes [lo, hi) that hold every element of v (lo == hi when v has no elements).
struct Span {
  uintptr_t lo = 0, hi = 0;
  bool overlaps(const Span& o) const { return lo < o.hi && o.lo < hi; }
};
Span span_of(const TensorView& v);

// True when no two elements of v can share memory (strides sorted by size each step past the
// reach of the smaller ones: numpy's sufficient test). False does not mean they do.
bool elements_distinct(const TensorView& v);

// Refuses (Error from `where`) a call whose written cache rows share memory with another row of
// either cache that the call reads or writes: k_cache and v_cache that alias each other, or a
// cache whose strides make two rows one. Rows [before[b], before[b] + Nnew) of each sequence are
// written, rows [0, before[b] + Nnew) read; pages maps rows to blocks (null: plain caches). Runs
// the exact row-by-row test only when the cheap one (disjoint spans, distinct elements) fails.
void check_written_rows_are_private(const TensorView& k_cache, const TensorView& v_cache, const core::PageTable* pages,
                                    const std::vector<int64_t>& before, int64_t Nnew, const char* where);

}  // namespace attn::cache_memory
