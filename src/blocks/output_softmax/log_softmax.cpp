// attn::log_softmax over the rows of a (rows, n) array: x_i - m - log sum_j e^(x_j - m), m = max.
#include "attn/error.hpp"
#include "attn/output_softmax.hpp"
#include "base/parallel.hpp"
#include "output_softmax/row_ops.hpp"

namespace attn {
namespace {

template <class T>
void log_softmax_rows(const T* x, T* out, int64_t rows, int64_t n, int threads) {
  if (rows < 0 || n < 0) fail("log_softmax", "shape must be non-negative, got (" + std::to_string(rows) + ", " +
                                                 std::to_string(n) + ")");
  if (threads < 0 || threads > kMaxThreads)
    fail("log_softmax", "threads must be in [0, " + std::to_string(kMaxThreads) + "], got " + std::to_string(threads));
  if (rows == 0 || n == 0) return;
  parallel_for(rows, resolve_threads(threads, rows),
               [&](int64_t r, int) { output::log_softmax_row(x + r * n, out + r * n, n); });
}

}  // namespace

void log_softmax(const float* x, float* out, int64_t rows, int64_t n, int threads) {
  log_softmax_rows(x, out, rows, n, threads);
}
void log_softmax(const double* x, double* out, int64_t rows, int64_t n, int threads) {
  log_softmax_rows(x, out, rows, n, threads);
}

}  // namespace attn
