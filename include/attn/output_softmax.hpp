// Output-layer softmax variants (docs/output-softmax.md): what turns a hidden vector h (d) into log
// probabilities over a vocabulary of V words.
//   log_softmax                  stable, over the last axis; a row of all -inf stays all -inf
//   HuffmanTree                  word2vec's tree (its tie and bit rules), codes root first
//   HierarchicalSoftmax<T>       log P(w | h) = sum_l log sigmoid((1 - 2 b_l) theta_{n_l} . h)
//   AdaptiveLogSoftmaxWithLoss<T> PyTorch's module of that name (head + clusters), same weights
// Matrices are row-major and contiguous; T is float or double (dot products accumulate in
// double either way). Bad input throws attn::Error naming the argument, expected and actual.
// Rows are independent, so results do not depend on `threads` (0 = the library's default).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace attn {

// out[r][i] = x[r][i] - m - log sum_j exp(x[r][j] - m), m = max_j x[r][j], for r < rows, i < n
// (x and out: (rows, n), out may alias x). A row of all -inf gives all -inf (never NaN); a NaN
// in a row makes that row NaN. The sum runs in double.
void log_softmax(const float* x, float* out, int64_t rows, int64_t n, int threads = 0);
void log_softmax(const double* x, double* out, int64_t rows, int64_t n, int threads = 0);

// word2vec's Huffman tree over V words (CreateBinaryTree in word2vec.c, whose rules
// follow): words sorted by count, descending (stable); V - 1 inner nodes numbered 0 .. V - 2 in
// creation order, the root is V - 2. Each step joins the two smallest nodes of two queues (leaves
// from the low-count end, inner nodes in creation order; on equal counts the inner node is taken);
// the first taken gets bit 0, the second bit 1. Word ids are the indices of `counts`.
class HuffmanTree {
 public:
  // counts: V >= 1 positive integers whose sum fits int64. V = 1 gives a tree with no inner
  // node (the only word has the empty code and probability 1).
  static HuffmanTree from_counts(std::span<const int64_t> counts);

  int64_t vocab_size() const { return vocab_; }
  int64_t inner_nodes() const { return vocab_ - 1; }
  // Inner nodes on word's path, root first (n_1 .. n_L), and its bits b_1 .. b_L (0 or 1).
  std::span<const int32_t> path(int64_t word) const;
  std::span<const uint8_t> code(int64_t word) const;
  // The bits as text, root first: counts (5, 3, 1, 1) give "1", "01", "001", "000".
  std::string code_string(int64_t word) const;
  // Child of inner node `node` on `bit`: an inner node id (>= 0) or -(word + 1) for a leaf.
  int64_t child(int64_t node, int bit) const { return children_[static_cast<size_t>(2 * node + bit)]; }

 private:
  int64_t vocab_ = 0;
  std::vector<int64_t> offsets_;  // V + 1: word w's path is [offsets_[w], offsets_[w + 1])
  std::vector<int32_t> nodes_;
  std::vector<uint8_t> bits_;
  std::vector<int64_t> children_;  // 2 (V - 1)
  int64_t checked_word(int64_t word) const;
};

// Hierarchical softmax over a HuffmanTree with one vector theta_n (d) per inner node:
// log P(w | h) = sum over w's path of log sigmoid((1 - 2 b_l) theta_{n_l} . h), each term
// evaluated as -softplus(-z) (finite for any finite z). Sum_w P(w | h) = 1 at every h.
template <class T>
class HierarchicalSoftmax {
 public:
  // theta: (V - 1, dim) row-major, copied.
  HierarchicalSoftmax(HuffmanTree tree, std::span<const T> theta, int64_t dim);
  static HierarchicalSoftmax from_counts(std::span<const int64_t> counts, std::span<const T> theta, int64_t dim) {
    return HierarchicalSoftmax(HuffmanTree::from_counts(counts), theta, dim);
  }

  const HuffmanTree& tree() const { return tree_; }
  int64_t dim() const { return dim_; }
  int64_t vocab_size() const { return tree_.vocab_size(); }

  // out[r] = log P(targets[r] | h[r]) for r < rows; h: (rows, dim). L_w dot products per row.
  void log_prob(const T* h, int64_t rows, const int64_t* targets, T* out, int threads = 0) const;
  // out: (rows, V), every word's log P in one top-down pass (V - 1 dot products per row).
  void log_prob_all(const T* h, int64_t rows, T* out, int threads = 0) const;

 private:
  HuffmanTree tree_;
  std::vector<T> theta_;
  int64_t dim_ = 0;
};

// A row-major matrix (rows, cols) handed to a constructor (copied there).
template <class T>
struct MatrixRef {
  const T* data = nullptr;
  int64_t rows = 0, cols = 0;
};

// Adaptive softmax with torch.nn.AdaptiveLogSoftmaxWithLoss's semantics and its weights' layout.
// cutoffs c_1 < ... < c_m in [1, V - 1] (torch's argument: without V); c_{m+1} = V. The head
// (c_1 + m, d) (+ an optional bias) gives the shortlist's logits, then one per cluster; cluster i
// has a projection (h_i, d) and an output (c_{i+1} - c_i, h_i), no biases. With
// H = log_softmax(head(x)): log p(y) = H[y] for y < c_1, else H[c_1 + i - 1] +
// log_softmax(out_i(proj_i(x)))[y - c_i] for y in cluster i (clusters counted from 1).
template <class T>
class AdaptiveLogSoftmaxWithLoss {
 public:
  // tail[i] = (projection, output) of cluster i; head_bias empty or c_1 + m values.
  AdaptiveLogSoftmaxWithLoss(int64_t n_classes, std::vector<int64_t> cutoffs, MatrixRef<T> head_weight,
                             std::span<const T> head_bias,
                             const std::vector<std::pair<MatrixRef<T>, MatrixRef<T>>>& tail);

  int64_t in_features() const { return dim_; }
  int64_t n_classes() const { return vocab_; }
  int64_t shortlist_size() const { return cutoffs_[0]; }
  int64_t n_clusters() const { return static_cast<int64_t>(cutoffs_.size()) - 1; }
  int64_t head_size() const { return shortlist_size() + n_clusters(); }
  // torch's module.cutoffs: the given cutoffs, then n_classes.
  const std::vector<int64_t>& cutoffs() const { return cutoffs_; }

  // x: (rows, d). out: (rows, V) log probabilities (torch's log_prob). float: products by the
  // kernel table's gemm in blocks of rows, rows normalised with its vector exp (float sums, as
  // torch's); double: sums in double.
  void log_prob(const T* x, int64_t rows, T* out, int threads = 0) const;
  // out[r]: torch's predict: the head's argmax if it is a shortlist word, else the argmax of the
  // row's full log_prob (first maximum on ties, as torch.argmax).
  void predict(const T* x, int64_t rows, int64_t* out, int threads = 0) const;
  // torch's forward: out[r] = log p(target[r] | x[r]); returns the loss, mean of -out (NaN if
  // rows = 0, as torch's mean of nothing). Targets outside [0, V) throw Error.
  T forward(const T* x, int64_t rows, const int64_t* target, T* out, int threads = 0) const;

 private:
  struct Cluster {
    std::vector<T> proj, out;  // (hidden, d), (size, hidden)
    std::vector<float> proj_t, out_t;  // float only: (d, hidden), (hidden, size) for the gemm
    int64_t hidden = 0, size = 0;
  };
  int64_t dim_ = 0, vocab_ = 0;
  std::vector<int64_t> cutoffs_;  // m + 1 values, the last is V
  std::vector<T> head_, head_bias_;
  std::vector<float> head_t_;  // float only: (d, c_1 + m), the head transposed for the gemm
  std::vector<Cluster> clusters_;
  int64_t max_cluster_size_ = 0, max_hidden_ = 0;
  // Scratch of one row: head log-probabilities (head_size), a projection, a cluster's logits.
  void head_log_probs(const T* x, double* head) const;
  void cluster_log_probs(const T* x, int64_t i, double* hidden, double* logits) const;
  // row (V) = every word's log probability for x, rounded to T; scratch: head, hidden, logits.
  void all_log_probs(const T* x, double* head, double* hidden, double* logits, T* row) const;
  // float: log_prob of blocks of rows through the kernel table's gemm (float sums)
  void log_prob_blocked(const float* x, int64_t rows, float* out, int threads) const;
};

extern template class HierarchicalSoftmax<float>;
extern template class HierarchicalSoftmax<double>;
extern template class AdaptiveLogSoftmaxWithLoss<float>;
extern template class AdaptiveLogSoftmaxWithLoss<double>;

}  // namespace attn
