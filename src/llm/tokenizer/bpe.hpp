// Byte-pair encoding by merge rank: a word starts as one token per byte; while some adjacent pair
// of tokens has a merge, the pair with the lowest rank (the leftmost of equals) becomes the merged
// token. Pairs are looked up in an open-addressing hash table keyed on the two token ids.
#pragma once
#include <cstdint>
#include <vector>

namespace attn::tokenizer {

class BpeMerges {
 public:
  // Adds the merge (left, right) -> merged with the given rank (ranks must be added in increasing
  // order). Returns the rank the pair already had, or -1 when it is new (then it is added).
  int32_t add(int32_t left, int32_t right, int32_t merged);
  int32_t size() const { return count_; }

  // Merges the tokens of one word in place.
  void apply(std::vector<int32_t>& ids) const;

 private:
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0, merged = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  const Slot* find(int32_t left, int32_t right) const;
  void grow();

  std::vector<Slot> slots_;
  int32_t count_ = 0;
};

}  // namespace attn::tokenizer
