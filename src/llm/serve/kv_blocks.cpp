#include "serve/kv_blocks.hpp"

#include <algorithm>

#include "attn/error.hpp"

namespace attn::serve {

KvBlocks::KvBlocks(int64_t count, int64_t block_size) : block_size_(block_size) {
  if (count < 2) fail("kv blocks", "count must be at least 2 (block 0 is the null block), got " + std::to_string(count));
  if (block_size < 1) fail("kv blocks", "block_size must be >= 1, got " + std::to_string(block_size));
  blocks_.resize(static_cast<size_t>(count));
  plain_.reserve(static_cast<size_t>(count - 1));
  for (int64_t id = count - 1; id >= 1; --id) plain_.push_back(static_cast<int32_t>(id));  // 1 taken first
}

uint64_t KvBlocks::chain(uint64_t parent, std::span<const int32_t> tokens) {
  // FNV-1a over the parent key and the token ids, then a final mix; 0 is kept for "no key"
  uint64_t h = 0xcbf29ce484222325ull ^ parent;
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i, v >>= 8) h = (h ^ (v & 0xff)) * 0x100000001b3ull;
  };
  for (const int32_t t : tokens) mix(static_cast<uint32_t>(t));
  h ^= h >> 33, h *= 0xff51afd7ed558ccdull, h ^= h >> 33;
  return h == 0 ? 1 : h;
}

void KvBlocks::forget_key(int32_t id) {
  Block& b = blocks_[static_cast<size_t>(id)];
  if (b.key == 0) return;
  const auto it = by_key_.find(b.key);
  if (it != by_key_.end() && it->second == id) by_key_.erase(it);
  b.key = 0, b.parent = 0;
  b.tokens.clear();
}

int32_t KvBlocks::take() {
  int32_t id = -1;
  if (!plain_.empty()) {
    id = plain_.back();
    plain_.pop_back();
  } else if (!lru_.empty()) {
    id = lru_.begin()->second;
    lru_.erase(lru_.begin());
    forget_key(id);
  } else {
    return -1;
  }
  blocks_[static_cast<size_t>(id)].holders = 1;
  ++in_use_;
  return id;
}

void KvBlocks::hold(int32_t id) {
  Block& b = blocks_[static_cast<size_t>(id)];
  if (b.holders == 0) {
    if (b.key == 0) fail("kv blocks", "hold: block " + std::to_string(id) + " is free and unkeyed");
    lru_.erase({b.released, id});
    ++in_use_;
  }
  ++b.holders;
}

void KvBlocks::release(int32_t id) {
  Block& b = blocks_[static_cast<size_t>(id)];
  if (b.holders <= 0) fail("kv blocks", "release: block " + std::to_string(id) + " is not held");
  if (--b.holders > 0) return;
  --in_use_;
  b.released = ++tick_;
  if (b.key != 0)
    lru_.insert({b.released, id});
  else
    plain_.push_back(id);
}

uint64_t KvBlocks::publish(int32_t id, uint64_t parent, std::span<const int32_t> tokens) {
  const uint64_t key = chain(parent, tokens);
  Block& b = blocks_[static_cast<size_t>(id)];
  if (b.key == key) return key;
  // the same tokens published already, or (rarely) a collision: the first block keeps the key,
  // this one none (match compares tokens, so a collision is never shared)
  if (by_key_.count(key)) return key;
  forget_key(id);
  b.key = key, b.parent = parent;
  b.tokens.assign(tokens.begin(), tokens.end());
  by_key_[key] = id;
  return key;
}

KvBlocks::Match KvBlocks::match(std::span<const int32_t> tokens, int64_t max_blocks) {
  Match m;
  uint64_t parent = 0;
  const int64_t full = std::min<int64_t>(max_blocks, static_cast<int64_t>(tokens.size()) / block_size_);
  for (int64_t i = 0; i < full; ++i) {
    const std::span<const int32_t> part = tokens.subspan(static_cast<size_t>(i * block_size_), static_cast<size_t>(block_size_));
    const uint64_t key = chain(parent, part);
    const auto it = by_key_.find(key);
    if (it == by_key_.end()) break;
    const Block& b = blocks_[static_cast<size_t>(it->second)];
    if (b.parent != parent || !std::equal(b.tokens.begin(), b.tokens.end(), part.begin(), part.end())) break;
    m.ids.push_back(it->second);
    m.keys.push_back(key);
    parent = key;
  }
  for (const int32_t id : m.ids) hold(id);
  return m;
}

}  // namespace attn::serve
