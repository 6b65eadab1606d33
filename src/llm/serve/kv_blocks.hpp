// The blocks of a paged KV pool as the serving engine hands them out: ids 1..count-1 (0 is the
// pool's null block, never handed out), each held by any number of sequences, and the prefix
// cache over them.
//
// A full block of a sequence can be published under the key of its tokens chained to the key of
// the block before it (key_i = hash(key_{i-1}, tokens of block i)), so that equal prefixes give
// equal keys. A later prompt asks match() for the longest run of published blocks that starts its
// tokens (each candidate's tokens compared, not only its hash: a collision never shares a wrong
// block) and holds them. A block no sequence holds is free: kept with its key ("cached") until a
// take() needs it, least recently released first, blocks without a key before any cached one.
// Not thread-safe: the engine's thread owns it.
#pragma once
#include <cstdint>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace attn::serve {

class KvBlocks {
 public:
  KvBlocks(int64_t count, int64_t block_size);

  // A block for one holder: a free block without a key if any, else the least recently released
  // cached one (its key forgotten); -1 when every block is held.
  int32_t take();
  // Adds a holder to a held or cached block (a cached one is held again and leaves the free list).
  void hold(int32_t id);
  // Removes a holder; the last one frees the block (cached when it has a key).
  void release(int32_t id);
  // Publishes held full block `id` holding `tokens` (block_size of them) after the block keyed
  // `parent` (0: the first block); returns its key. When an equal block is published already, this
  // one stays unkeyed (it is freed, not cached, when released) and the existing key is returned.
  uint64_t publish(int32_t id, uint64_t parent, std::span<const int32_t> tokens);
  // The published blocks that hold tokens[0 .. k*block_size) for the largest k <= max_blocks,
  // each held once more for the caller, with their keys (the chain a sequence publishes on from).
  struct Match {
    std::vector<int32_t> ids;
    std::vector<uint64_t> keys;
  };
  Match match(std::span<const int32_t> tokens, int64_t max_blocks);

  int64_t block_size() const { return block_size_; }
  int64_t total() const { return static_cast<int64_t>(blocks_.size()) - 1; }  // the null block excluded
  int64_t in_use() const { return in_use_; }   // held by at least one sequence
  int64_t cached() const { return static_cast<int64_t>(lru_.size()); }  // free, with a key
  int64_t available() const { return total() - in_use_; }  // free (cached or not)
  int32_t holders(int32_t id) const { return blocks_[static_cast<size_t>(id)].holders; }

  static uint64_t chain(uint64_t parent, std::span<const int32_t> tokens);

 private:
  struct Block {
    int32_t holders = 0;
    uint64_t key = 0;         // 0: not published
    uint64_t parent = 0;
    std::vector<int32_t> tokens;  // a published block's tokens (collisions are checked)
    uint64_t released = 0;    // tick of the last release (the LRU order of cached blocks)
  };
  void forget_key(int32_t id);

  int64_t block_size_;
  std::vector<Block> blocks_;
  std::vector<int32_t> plain_;                      // free blocks without a key
  std::set<std::pair<uint64_t, int32_t>> lru_;      // free blocks with a key: (released tick, id)
  std::unordered_map<uint64_t, int32_t> by_key_;
  int64_t in_use_ = 0;
  uint64_t tick_ = 0;
};

}  // namespace attn::serve
