// Adaptive softmax with torch.nn.AdaptiveLogSoftmaxWithLoss's semantics: a head over the
// shortlist and one logit per cluster, each cluster a low-rank (projection, output) pair.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/shape_text.hpp"
#include "attn/error.hpp"
#include "attn/output_softmax.hpp"
#include "attn/isa.hpp"
#include "base/parallel.hpp"
#include "kernels/kernel_table.hpp"
#include "output_softmax/row_ops.hpp"

namespace attn {
namespace {

constexpr const char* kWhere = "AdaptiveLogSoftmaxWithLoss";

// b = a transposed: a is (rows, cols) row-major, b (cols, rows).
template <class T>
std::vector<float> transposed(const std::vector<T>& a, int64_t rows, int64_t cols) {
  std::vector<float> b(a.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) b[c * rows + r] = static_cast<float>(a[r * cols + c]);
  return b;
}

std::string shape(int64_t r, int64_t c) { return core::shape_text({r, c}); }

template <class T>
void check_matrix(const MatrixRef<T>& m, const std::string& name, int64_t rows, int64_t cols,
                  const std::string& expect) {
  if (m.rows != rows || m.cols != cols)
    fail(kWhere, name + " must have shape " + expect + " = " + shape(rows, cols) + ", got " + shape(m.rows, m.cols));
  if (m.data == nullptr && rows * cols > 0) fail(kWhere, name + " has no data");
}

void check_call(const char* op, int64_t rows, int threads) {
  if (rows < 0) fail(op, "rows must be non-negative, got " + std::to_string(rows));
  if (threads < 0 || threads > kMaxThreads)
    fail(op, "threads must be in [0, " + std::to_string(kMaxThreads) + "], got " + std::to_string(threads));
}

// First index of the largest value (torch.argmax); NaN counts as the largest, as in torch.
template <class V>
int64_t argmax(const V* x, int64_t n) {
  int64_t best = 0;
  for (int64_t j = 1; j < n; ++j) {
    if (std::isnan(x[best])) break;
    if (std::isnan(x[j]) || x[j] > x[best]) best = j;
  }
  return best;
}

// x[j] = (x[j] - m) - log sum_k exp(x[k] - m) + base, m = max_k x[k], in float with the kernel
// table's vector exp (float sums, as torch's log_softmax); tmp: n floats of scratch. A row holding
// NaN or +inf, or all -inf, goes through output::log_softmax_row (NaN rows stay NaN, -inf rows -inf).
void log_softmax_plus(const kernels::TileKernels& kern, float* x, int64_t n, float base, float* tmp) {
  bool nan = false;
  const float m = kern.row_max(x, n, -std::numeric_limits<float>::infinity(), &nan);
  if (nan || !std::isfinite(m)) {
    output::log_softmax_row(x, x, n);
    for (int64_t j = 0; j < n; ++j) x[j] += base;
    return;
  }
  std::copy(x, x + n, tmp);
  const float log_sum = std::log(kern.exp_shift_sum(tmp, n, m));
  for (int64_t j = 0; j < n; ++j) x[j] = ((x[j] - m) - log_sum) + base;
}

}  // namespace

template <class T>
AdaptiveLogSoftmaxWithLoss<T>::AdaptiveLogSoftmaxWithLoss(
    int64_t n_classes, std::vector<int64_t> cutoffs, MatrixRef<T> head_weight, std::span<const T> head_bias,
    const std::vector<std::pair<MatrixRef<T>, MatrixRef<T>>>& tail)
    : dim_(head_weight.cols), vocab_(n_classes), cutoffs_(std::move(cutoffs)) {
  if (cutoffs_.empty()) fail(kWhere, "cutoffs must hold at least one value, got none");
  if (n_classes < 2) fail(kWhere, "n_classes must be at least 2, got " + std::to_string(n_classes));
  for (size_t i = 0; i < cutoffs_.size(); ++i) {
    const int64_t c = cutoffs_[i];
    const std::string at = "cutoffs[" + std::to_string(i) + "] = " + std::to_string(c);
    if (c < 1 || c > n_classes - 1)
      fail(kWhere, at + " must be in [1, n_classes - 1] = [1, " + std::to_string(n_classes - 1) + "]");
    if (i > 0 && c == cutoffs_[i - 1])
      fail(kWhere, at + " repeats cutoffs[" + std::to_string(i - 1) + "] (duplicates)");
    if (i > 0 && c < cutoffs_[i - 1])
      fail(kWhere, at + " must be greater than cutoffs[" + std::to_string(i - 1) + "] = " +
                       std::to_string(cutoffs_[i - 1]) + " (cutoffs must be increasing)");
  }
  const int64_t m = static_cast<int64_t>(cutoffs_.size());
  cutoffs_.push_back(n_classes);
  if (dim_ < 1)
    fail(kWhere, "head_weight must have at least one column (d >= 1), got " + shape(head_weight.rows, dim_));
  check_matrix(head_weight, "head_weight", head_size(), dim_, "(c_1 + n_clusters, d)");
  head_.assign(head_weight.data, head_weight.data + head_size() * dim_);
  if (!head_bias.empty() && static_cast<int64_t>(head_bias.size()) != head_size())
    fail(kWhere, "head_bias must have c_1 + n_clusters = " + std::to_string(head_size()) + " values, got " +
                     std::to_string(head_bias.size()));
  head_bias_.assign(head_bias.begin(), head_bias.end());
  if (static_cast<int64_t>(tail.size()) != m)
    fail(kWhere, "tail_weights must hold one (projection, output) pair per cluster (" + std::to_string(m) +
                     "), got " + std::to_string(tail.size()));
  for (int64_t i = 0; i < m; ++i) {
    const auto& [proj, out] = tail[static_cast<size_t>(i)];
    const std::string name = "tail_weights[" + std::to_string(i) + "]";
    if (proj.cols != dim_ || proj.rows < 0)
      fail(kWhere, name + "[0] (projection) must have shape (hidden, d) = (hidden, " + std::to_string(dim_) +
                       "), got " + shape(proj.rows, proj.cols));
    Cluster c;
    c.hidden = proj.rows;
    c.size = cutoffs_[i + 1] - cutoffs_[i];
    check_matrix(proj, name + "[0] (projection)", c.hidden, dim_, "(hidden, d)");
    check_matrix(out, name + "[1] (output)", c.size, c.hidden, "(c_" + std::to_string(i + 2) + " - c_" +
                                                                   std::to_string(i + 1) + ", hidden)");
    c.proj.assign(proj.data, proj.data + c.hidden * dim_);
    c.out.assign(out.data, out.data + c.size * c.hidden);
    if constexpr (std::is_same_v<T, float>) {
      c.proj_t = transposed(c.proj, c.hidden, dim_);
      c.out_t = transposed(c.out, c.size, c.hidden);
    }
    max_cluster_size_ = std::max(max_cluster_size_, c.size);
    max_hidden_ = std::max(max_hidden_, c.hidden);
    clusters_.push_back(std::move(c));
  }
  if constexpr (std::is_same_v<T, float>) head_t_ = transposed(head_, head_size(), dim_);
}

// head[j] = log_softmax(W x + b)[j] for j < head_size.
template <class T>
void AdaptiveLogSoftmaxWithLoss<T>::head_log_probs(const T* x, double* head) const {
  const int64_t n = head_size();
  for (int64_t j = 0; j < n; ++j)
    head[j] = output::dot(head_.data() + j * dim_, x, dim_) + (head_bias_.empty() ? 0.0 : double(head_bias_[j]));
  output::log_softmax_row(head, head, n);
}

// logits[k] = log_softmax(out_i (proj_i x))[k] for k < size of cluster i (hidden: scratch).
template <class T>
void AdaptiveLogSoftmaxWithLoss<T>::cluster_log_probs(const T* x, int64_t i, double* hidden, double* logits) const {
  const Cluster& c = clusters_[static_cast<size_t>(i)];
  // the projection is rounded to T, as torch stores the first Linear's output in the input's dtype
  for (int64_t k = 0; k < c.hidden; ++k)
    hidden[k] = static_cast<double>(static_cast<T>(output::dot(c.proj.data() + k * dim_, x, dim_)));
  for (int64_t k = 0; k < c.size; ++k) {
    double s = 0;
    const T* w = c.out.data() + k * c.hidden;
    for (int64_t p = 0; p < c.hidden; ++p) s += static_cast<double>(w[p]) * hidden[p];
    logits[k] = s;
  }
  output::log_softmax_row(logits, logits, c.size);
}

// Blocks of kBlockRows rows: the head's logits, then per cluster the projection and the output
// logits written straight into `out`, each a gemm over the block; log-softmax rows in place.
// Blocks do not depend on the thread count, nor a row's sums on its block: same bits for any.
template <class T>
void AdaptiveLogSoftmaxWithLoss<T>::log_prob_blocked(const float* x, int64_t rows, float* out, int threads) const {
  constexpr int64_t kBlockRows = 64;
  const kernels::TileKernels& kern = kernels::kernels_for(active_isa());
  const int64_t H = head_size(), blocks = (rows + kBlockRows - 1) / kBlockRows;
  const int nt = resolve_threads(threads, blocks);
  const int64_t per = kBlockRows * (H + max_hidden_) + std::max(H, max_cluster_size_);
  std::vector<float> scratch(static_cast<size_t>(per * nt));
  parallel_for(blocks, nt, [&](int64_t b, int t) {
    const int64_t r0 = b * kBlockRows, nb = std::min(kBlockRows, rows - r0);
    const float* xb = x + r0 * dim_;
    float* head = scratch.data() + t * per;  // (nb, H)
    float* hidden = head + kBlockRows * H;   // (nb, hidden)
    float* tmp = hidden + kBlockRows * max_hidden_;  // one row for the exps
    kern.gemm(nb, H, dim_, xb, dim_, 1, head_t_.data(), H, head, H, false);
    for (int64_t r = 0; r < nb; ++r) {
      float* hr = head + r * H;
      if (!head_bias_.empty())
        for (int64_t j = 0; j < H; ++j) hr[j] += static_cast<float>(head_bias_[j]);
      log_softmax_plus(kern, hr, H, 0.0f, tmp);
      std::copy(hr, hr + shortlist_size(), out + (r0 + r) * vocab_);
    }
    for (int64_t i = 0; i < n_clusters(); ++i) {
      const Cluster& c = clusters_[static_cast<size_t>(i)];
      float* ob = out + r0 * vocab_ + cutoffs_[i];  // (nb, size), row stride V
      if (c.hidden > 0) {
        kern.gemm(nb, c.hidden, dim_, xb, dim_, 1, c.proj_t.data(), c.hidden, hidden, c.hidden, false);
        kern.gemm(nb, c.size, c.hidden, hidden, c.hidden, 1, c.out_t.data(), c.size, ob, vocab_, false);
      } else {
        for (int64_t r = 0; r < nb; ++r) std::fill(ob + r * vocab_, ob + r * vocab_ + c.size, 0.0f);
      }
      for (int64_t r = 0; r < nb; ++r)
        log_softmax_plus(kern, ob + r * vocab_, c.size, head[r * H + shortlist_size() + i], tmp);
    }
  });
}

template <class T>
void AdaptiveLogSoftmaxWithLoss<T>::log_prob(const T* x, int64_t rows, T* out, int threads) const {
  check_call("AdaptiveLogSoftmaxWithLoss.log_prob", rows, threads);
  if (rows == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    log_prob_blocked(x, rows, out, threads);
    return;
  }
  const int nt = resolve_threads(threads, rows);
  const int64_t per = head_size() + max_hidden_ + max_cluster_size_;
  std::vector<double> scratch(static_cast<size_t>(per * nt));
  parallel_for(rows, nt, [&](int64_t r, int t) {
    double* head = scratch.data() + t * per;
    double* hidden = head + head_size();
    double* logits = hidden + max_hidden_;
    all_log_probs(x + r * dim_, head, hidden, logits, out + r * vocab_);
  });
}

template <class T>
void AdaptiveLogSoftmaxWithLoss<T>::all_log_probs(const T* x, double* head, double* hidden, double* logits,
                                                  T* row) const {
  head_log_probs(x, head);
  for (int64_t j = 0; j < shortlist_size(); ++j) row[j] = static_cast<T>(head[j]);
  for (int64_t i = 0; i < n_clusters(); ++i) {
    cluster_log_probs(x, i, hidden, logits);
    const double base = head[shortlist_size() + i];
    for (int64_t k = 0; k < clusters_[i].size; ++k) row[cutoffs_[i] + k] = static_cast<T>(logits[k] + base);
  }
}

template <class T>
void AdaptiveLogSoftmaxWithLoss<T>::predict(const T* x, int64_t rows, int64_t* out, int threads) const {
  check_call("AdaptiveLogSoftmaxWithLoss.predict", rows, threads);
  if (rows == 0) return;
  const int nt = resolve_threads(threads, rows);
  const int64_t per = head_size() + max_hidden_ + max_cluster_size_;
  std::vector<double> scratch(static_cast<size_t>(per * nt));
  std::vector<T> full(static_cast<size_t>(vocab_ * nt));
  parallel_for(rows, nt, [&](int64_t r, int t) {
    double* head = scratch.data() + t * per;
    double* hidden = head + head_size();
    double* logits = hidden + max_hidden_;
    const T* xr = x + r * dim_;
    // torch takes the argmax of the head's logits; log_softmax keeps their order (rounded to T
    // first, as torch compares the stored logits)
    T* row = full.data() + t * vocab_;
    for (int64_t j = 0; j < head_size(); ++j)
      row[j] = static_cast<T>(output::dot(head_.data() + j * dim_, xr, dim_) +
                              (head_bias_.empty() ? 0.0 : double(head_bias_[j])));
    const int64_t best = argmax(row, head_size());
    if (best < shortlist_size()) {
      out[r] = best;
      return;
    }
    all_log_probs(xr, head, hidden, logits, row);
    out[r] = argmax(row, vocab_);
  });
}

template <class T>
T AdaptiveLogSoftmaxWithLoss<T>::forward(const T* x, int64_t rows, const int64_t* target, T* out, int threads) const {
  check_call("AdaptiveLogSoftmaxWithLoss", rows, threads);
  for (int64_t r = 0; r < rows; ++r)
    if (target[r] < 0 || target[r] >= vocab_)
      fail(kWhere, "target[" + std::to_string(r) + "] = " + std::to_string(target[r]) +
                       " is outside [0, n_classes) = [0, " + std::to_string(vocab_) + ")");
  if (rows == 0) return std::numeric_limits<T>::quiet_NaN();
  const int nt = resolve_threads(threads, rows);
  const int64_t per = head_size() + max_hidden_ + max_cluster_size_;
  std::vector<double> scratch(static_cast<size_t>(per * nt));
  parallel_for(rows, nt, [&](int64_t r, int t) {
    double* head = scratch.data() + t * per;
    double* hidden = head + head_size();
    double* logits = hidden + max_hidden_;
    head_log_probs(x + r * dim_, head);
    const int64_t y = target[r];
    if (y < shortlist_size()) {
      out[r] = static_cast<T>(head[y]);
      return;
    }
    // cluster i covers [cutoffs_[i], cutoffs_[i + 1])
    const int64_t i = std::upper_bound(cutoffs_.begin(), cutoffs_.end(), y) - cutoffs_.begin() - 1;
    cluster_log_probs(x + r * dim_, i, hidden, logits);
    out[r] = static_cast<T>(head[shortlist_size() + i] + logits[y - cutoffs_[i]]);
  });
  double loss = 0;  // summed in row order: the same for any thread count
  for (int64_t r = 0; r < rows; ++r) loss -= static_cast<double>(out[r]);
  return static_cast<T>(loss / static_cast<double>(rows));
}

template class AdaptiveLogSoftmaxWithLoss<float>;
template class AdaptiveLogSoftmaxWithLoss<double>;

}  // namespace attn
