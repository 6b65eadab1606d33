#include "tokenizer/bpe.hpp"

#include <cstddef>
#include <functional>
#include <queue>

namespace attn::tokenizer {
namespace {

size_t slot_of(uint64_t key, size_t mask) {
  key ^= key >> 31;  // mix both ids into the low bits (splitmix64's finaliser)
  key *= 0xBF58476D1CE4E5B9ull;
  key ^= key >> 29;
  return static_cast<size_t>(key) & mask;
}

}  // namespace

const BpeMerges::Slot* BpeMerges::find(int32_t left, int32_t right) const {
  if (slots_.empty()) return nullptr;
  const uint64_t k = key(left, right);
  const size_t mask = slots_.size() - 1;
  for (size_t s = slot_of(k, mask);; s = (s + 1) & mask) {
    if (slots_[s].key == k) return &slots_[s];
    if (slots_[s].key == kEmpty) return nullptr;
  }
}

void BpeMerges::grow() {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(old.empty() ? 64 : old.size() * 2, Slot{});
  const size_t mask = slots_.size() - 1;
  for (const Slot& o : old) {
    if (o.key == kEmpty) continue;
    size_t s = slot_of(o.key, mask);
    while (slots_[s].key != kEmpty) s = (s + 1) & mask;
    slots_[s] = o;
  }
}

int32_t BpeMerges::add(int32_t left, int32_t right, int32_t merged) {
  if (const Slot* s = find(left, right)) return s->rank;
  if (static_cast<size_t>(count_ + 1) * 2 > slots_.size()) grow();  // at most half full
  const uint64_t k = key(left, right);
  const size_t mask = slots_.size() - 1;
  size_t s = slot_of(k, mask);
  while (slots_[s].key != kEmpty) s = (s + 1) & mask;
  slots_[s] = Slot{k, count_++, merged};
  return -1;
}

void BpeMerges::apply(std::vector<int32_t>& ids) const {
  const int32_t n = static_cast<int32_t>(ids.size());
  if (n < 2) return;
  // The word as a linked list over its first characters' positions; a merge keeps the left
  // token's position. Candidates are (rank, position) with the pair they were made for, checked
  // when they come out of the queue (a merge since may have consumed either side).
  struct Candidate {
    int32_t rank, pos, left, right, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<int32_t> next(static_cast<size_t>(n)), prev(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) next[i] = i + 1 < n ? i + 1 : -1, prev[i] = i - 1;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto consider = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    const int32_t right = ids[next[pos]];
    if (const Slot* s = find(ids[pos], right)) queue.push({s->rank, pos, ids[pos], right, s->merged});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  constexpr int32_t kGone = -1;
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    if (ids[c.pos] != c.left || next[c.pos] < 0 || ids[next[c.pos]] != c.right) continue;  // stale
    const int32_t gone = next[c.pos];
    ids[c.pos] = c.merged;
    ids[gone] = kGone;
    next[c.pos] = next[gone];
    if (next[gone] >= 0) prev[next[gone]] = c.pos;
    consider(prev[c.pos]);
    consider(c.pos);
  }
  int32_t w = 0;
  for (int32_t i = 0; i < n; ++i)
    if (ids[i] != kGone) ids[w++] = ids[i];
  ids.resize(static_cast<size_t>(w));
}

}  // namespace attn::tokenizer
