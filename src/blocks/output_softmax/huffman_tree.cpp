// word2vec's Huffman tree (CreateBinaryTree in word2vec.c): built with two queues, codes read
// root first.
#include <algorithm>
#include <limits>
#include <numeric>

#include "attn/error.hpp"
#include "attn/output_softmax.hpp"

namespace attn {

HuffmanTree HuffmanTree::from_counts(std::span<const int64_t> counts) {
  const char* where = "HierarchicalSoftmax";
  const int64_t V = static_cast<int64_t>(counts.size());
  if (V == 0) fail(where, "counts must hold at least one word's count, got none");
  if (V > std::numeric_limits<int32_t>::max())
    fail(where, "counts holds " + std::to_string(V) + " words, more than 2^31 - 1");
  int64_t total = 0;
  for (int64_t w = 0; w < V; ++w) {
    const int64_t c = counts[static_cast<size_t>(w)];
    if (c <= 0) fail(where, "counts[" + std::to_string(w) + "] = " + std::to_string(c) + " must be positive");
    if (c > std::numeric_limits<int64_t>::max() - total) fail(where, "the sum of counts overflows int64");
    total += c;
  }
  // Position p in the sorted order holds word order[p]; counts descending, ties by word id.
  std::vector<int64_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return counts[a] > counts[b]; });

  // Nodes 0 .. V-1 are the sorted leaves, V + a is inner node a (creation order).
  const int64_t nodes = 2 * V - 1;
  std::vector<int64_t> count(static_cast<size_t>(nodes)), parent(static_cast<size_t>(nodes), -1);
  std::vector<uint8_t> bit(static_cast<size_t>(nodes), 0);
  for (int64_t p = 0; p < V; ++p) count[p] = counts[order[p]];
  int64_t leaf = V - 1, inner = V;  // next leaf (smallest remaining count), next inner node
  HuffmanTree t;
  t.vocab_ = V;
  t.children_.assign(static_cast<size_t>(2 * (V - 1)), 0);
  for (int64_t a = 0; a < V - 1; ++a) {
    int64_t taken[2];
    for (int64_t& pick : taken) {
      // an inner node is available if created; on equal counts the inner node wins
      const bool inner_ready = inner < V + a;
      if (leaf >= 0 && (!inner_ready || count[leaf] < count[inner])) pick = leaf--;
      else pick = inner++;
    }
    count[V + a] = count[taken[0]] + count[taken[1]];
    for (int b = 0; b < 2; ++b) {
      parent[taken[b]] = V + a;
      bit[taken[b]] = static_cast<uint8_t>(b);
      const int64_t n = taken[b];
      t.children_[static_cast<size_t>(2 * a + b)] = n >= V ? n - V : -(order[n] + 1);
    }
  }
  // Paths leaf -> root, stored root first.
  t.offsets_.assign(static_cast<size_t>(V + 1), 0);
  std::vector<int64_t> length(static_cast<size_t>(V), 0);
  for (int64_t p = 0; p < V; ++p)
    for (int64_t n = p; parent[n] >= 0; n = parent[n]) ++length[order[p]];
  for (int64_t w = 0; w < V; ++w) t.offsets_[w + 1] = t.offsets_[w] + length[w];
  t.nodes_.resize(static_cast<size_t>(t.offsets_[V]));
  t.bits_.resize(static_cast<size_t>(t.offsets_[V]));
  for (int64_t p = 0; p < V; ++p) {
    const int64_t w = order[p];
    int64_t i = t.offsets_[w + 1];
    for (int64_t n = p; parent[n] >= 0; n = parent[n]) {
      --i;
      t.nodes_[i] = static_cast<int32_t>(parent[n] - V);
      t.bits_[i] = bit[n];
    }
  }
  return t;
}

int64_t HuffmanTree::checked_word(int64_t word) const {
  if (word < 0 || word >= vocab_)
    fail("HierarchicalSoftmax", "word " + std::to_string(word) + " is outside [0, " + std::to_string(vocab_) + ")");
  return word;
}

std::span<const int32_t> HuffmanTree::path(int64_t word) const {
  const int64_t w = checked_word(word);
  return {nodes_.data() + offsets_[w], static_cast<size_t>(offsets_[w + 1] - offsets_[w])};
}

std::span<const uint8_t> HuffmanTree::code(int64_t word) const {
  const int64_t w = checked_word(word);
  return {bits_.data() + offsets_[w], static_cast<size_t>(offsets_[w + 1] - offsets_[w])};
}

std::string HuffmanTree::code_string(int64_t word) const {
  std::string s;
  for (uint8_t b : code(word)) s.push_back(static_cast<char>('0' + b));
  return s;
}

}  // namespace attn
