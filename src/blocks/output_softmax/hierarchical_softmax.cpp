// Hierarchical softmax over word2vec's Huffman tree (word2vec -hs): log P of targets along their
// paths (L dot products each) and every word's log P in one top-down pass.
#include <algorithm>

#include "attn/error.hpp"
#include "attn/output_softmax.hpp"
#include "base/parallel.hpp"
#include "output_softmax/row_ops.hpp"

namespace attn {
namespace {

void check_rows(const char* op, int64_t rows, int threads) {
  if (rows < 0) fail(op, "rows must be non-negative, got " + std::to_string(rows));
  if (threads < 0 || threads > kMaxThreads)
    fail(op, "threads must be in [0, " + std::to_string(kMaxThreads) + "], got " + std::to_string(threads));
}

}  // namespace

template <class T>
HierarchicalSoftmax<T>::HierarchicalSoftmax(HuffmanTree tree, std::span<const T> theta, int64_t dim)
    : tree_(std::move(tree)), theta_(theta.begin(), theta.end()), dim_(dim) {
  if (dim < 0) fail("HierarchicalSoftmax", "dim must be non-negative, got " + std::to_string(dim));
  const int64_t want = tree_.inner_nodes() * dim;
  if (static_cast<int64_t>(theta_.size()) != want)
    fail("HierarchicalSoftmax", "theta must have (V - 1) * d = " + std::to_string(tree_.inner_nodes()) + " * " +
                                    std::to_string(dim) + " values, got " + std::to_string(theta_.size()));
}

template <class T>
void HierarchicalSoftmax<T>::log_prob(const T* h, int64_t rows, const int64_t* targets, T* out, int threads) const {
  check_rows("HierarchicalSoftmax.log_prob", rows, threads);
  const int64_t V = tree_.vocab_size();
  for (int64_t r = 0; r < rows; ++r)  // validated once, before any work
    if (targets[r] < 0 || targets[r] >= V)
      fail("HierarchicalSoftmax.log_prob", "targets[" + std::to_string(r) + "] = " + std::to_string(targets[r]) +
                                               " is outside [0, " + std::to_string(V) + ")");
  if (rows == 0) return;
  parallel_for(rows, resolve_threads(threads, rows), [&](int64_t r, int) {
    const std::span<const int32_t> path = tree_.path(targets[r]);
    const std::span<const uint8_t> code = tree_.code(targets[r]);
    double acc = 0;
    for (size_t l = 0; l < path.size(); ++l) {
      const double z = output::dot(theta_.data() + path[l] * dim_, h + r * dim_, dim_);
      acc += output::log_sigmoid(code[l] ? -z : z);
    }
    out[r] = static_cast<T>(acc);
  });
}

template <class T>
void HierarchicalSoftmax<T>::log_prob_all(const T* h, int64_t rows, T* out, int threads) const {
  check_rows("HierarchicalSoftmax.log_prob_all", rows, threads);
  const int64_t V = tree_.vocab_size(), inner = tree_.inner_nodes();
  if (rows == 0) return;
  const int nt = resolve_threads(threads, rows);
  // acc[n]: log P of reaching inner node n, one slice per thread (allocated here, not in fn).
  std::vector<double> scratch(static_cast<size_t>(std::max<int64_t>(inner, 1) * nt));
  parallel_for(rows, nt, [&](int64_t r, int t) {
    T* o = out + r * V;
    if (inner == 0) {  // one word, probability 1
      o[0] = 0;
      return;
    }
    double* acc = scratch.data() + static_cast<int64_t>(t) * inner;
    acc[inner - 1] = 0;  // the root
    // Children were created before their parent, so descending ids visit parents first.
    for (int64_t n = inner - 1; n >= 0; --n) {
      const double z = output::dot(theta_.data() + n * dim_, h + r * dim_, dim_);
      const double branch[2] = {acc[n] + output::log_sigmoid(z), acc[n] + output::log_sigmoid(-z)};
      for (int b = 0; b < 2; ++b) {
        const int64_t c = tree_.child(n, b);
        if (c >= 0) acc[c] = branch[b];
        else o[-c - 1] = static_cast<T>(branch[b]);
      }
    }
  });
}

template class HierarchicalSoftmax<float>;
template class HierarchicalSoftmax<double>;

}  // namespace attn
