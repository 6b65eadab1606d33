// Memory overlap of cache rows: byte spans, the cheap "elements are distinct" test, and the exact
// test of written rows against every row a cache call touches (sorted byte ranges).
#include "cache/cache_memory.hpp"

#include <algorithm>
#include <string>

#include "attn/error.hpp"

namespace attn::cache_memory {

Span span_of(const TensorView& v) {
  if (v.numel() == 0) return {};
  const auto size = static_cast<int64_t>(dtype_size(v.dtype));
  int64_t lo = 0, hi = 0;  // element offsets of the lowest and highest element
  for (int i = 0; i < 4; ++i) {
    const int64_t reach = (v.shape[i] - 1) * v.strides[i];
    (reach < 0 ? lo : hi) += reach;
  }
  const auto base = reinterpret_cast<uintptr_t>(v.data);
  return {base + static_cast<uintptr_t>(lo * size), base + static_cast<uintptr_t>(hi * size + size)};
}

bool elements_distinct(const TensorView& v) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, extent) of dimensions longer than 1
  for (int i = 0; i < 4; ++i)
    if (v.shape[i] > 1) dims.emplace_back(v.strides[i] < 0 ? -v.strides[i] : v.strides[i], v.shape[i]);
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0;  // the largest offset the smaller dimensions reach
  for (const auto& [stride, n] : dims) {
    if (stride <= reach) return false;
    reach += (n - 1) * stride;
  }
  return true;
}

namespace {

// A row of a cache (c = -1) or, when its elements are not adjacent, one element of it.
struct Unit {
  uintptr_t lo = 0, hi = 0;
  int cache = 0;  // 0: k_cache, 1: v_cache
  int64_t b = 0, h = 0, pos = 0, c = -1;
  bool same_place(const Unit& o) const {
    return cache == o.cache && b == o.b && h == o.h && pos == o.pos && c == o.c;
  }
};

std::string describe(const Unit& u) {
  std::string s = std::string(u.cache == 0 ? "k_cache" : "v_cache") + " (sequence " + std::to_string(u.b) +
                  ", head " + std::to_string(u.h) + ", position " + std::to_string(u.pos);
  if (u.c >= 0) s += ", channel " + std::to_string(u.c);
  return s + ")";
}

// Calls f(unit) for the memory of row pos of (b, h) in a cache.
template <class F>
void for_units(const core::KvRows& rows, int cache, int64_t b, int64_t h, int64_t pos, F&& f) {
  const auto size = static_cast<int64_t>(dtype_size(rows.dtype()));
  const auto row = reinterpret_cast<uintptr_t>(rows.row(pos));
  const int64_t es = rows.elem_stride();
  if (es == 1 || es == -1 || rows.dim() == 1) {
    const int64_t reach = (rows.dim() - 1) * es * size;
    const uintptr_t lo = row + static_cast<uintptr_t>(std::min<int64_t>(reach, 0));
    f(Unit{lo, lo + static_cast<uintptr_t>((reach < 0 ? -reach : reach) + size), cache, b, h, pos, -1});
    return;
  }
  for (int64_t c = 0; c < rows.dim(); ++c) {
    const uintptr_t lo = row + static_cast<uintptr_t>(c * es * size);
    f(Unit{lo, lo + static_cast<uintptr_t>(size), cache, b, h, pos, c});
  }
}

}  // namespace

void check_written_rows_are_private(const TensorView& k_cache, const TensorView& v_cache, const core::PageTable* pages,
                                    const std::vector<int64_t>& before, int64_t Nnew, const char* where) {
  if (Nnew == 0) return;
  if (!span_of(k_cache).overlaps(span_of(v_cache)) && elements_distinct(k_cache) && elements_distinct(v_cache)) return;
  const auto B = static_cast<int64_t>(before.size());
  const TensorView* caches[2] = {&k_cache, &v_cache};
  std::vector<Unit> written;
  for (int cache = 0; cache < 2; ++cache)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < caches[cache]->heads(); ++h) {
        const core::KvRows rows(*caches[cache], b, h, pages);
        for (int64_t i = 0; i < Nnew; ++i)
          for_units(rows, cache, b, h, before[static_cast<size_t>(b)] + i, [&](const Unit& u) { written.push_back(u); });
      }
  std::sort(written.begin(), written.end(), [](const Unit& a, const Unit& b) { return a.lo < b.lo; });
  auto refuse = [&](const Unit& w, const Unit& other, const char* verb) {
    fail(where, describe(w) + ", written by this call, shares memory with " + describe(other) + ", " + verb +
                    " by it; give k_cache and v_cache memory of their own, one place per row");
  };
  for (size_t i = 0; i + 1 < written.size(); ++i)
    if (written[i].hi > written[i + 1].lo) refuse(written[i], written[i + 1], "also written");
  // Every row read: the written unit with the highest start below its end is the only candidate
  // (written units are disjoint now).
  for (int cache = 0; cache < 2; ++cache)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < caches[cache]->heads(); ++h) {
        const core::KvRows rows(*caches[cache], b, h, pages);
        for (int64_t j = 0; j < before[static_cast<size_t>(b)] + Nnew; ++j)
          for_units(rows, cache, b, h, j, [&](const Unit& u) {
            const auto it = std::partition_point(written.begin(), written.end(), [&](const Unit& w) { return w.lo < u.hi; });
            if (it == written.begin()) return;
            const Unit& w = *(it - 1);
            if (w.hi > u.lo && !w.same_place(u)) refuse(w, u, "read");
          });
      }
}

}  // namespace attn::cache_memory
