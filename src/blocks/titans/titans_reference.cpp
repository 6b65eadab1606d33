// Titans memory (Behrouz et al. 2024), float64 reference: the plain token loop. Each token
// takes its gradient at the state saved at the start of its mini-batch, then updates S and M,
// then reads.
#include <algorithm>
#include <vector>

#include "titans/titans_common.hpp"

namespace attn {

int64_t titans_weight_count(TitansMemory memory, int64_t dim) {
  return memory == TitansMemory::mlp ? 8 * dim * dim : dim * dim;
}

TitansMemory titans_memory_from_text(const std::string& text) {
  if (text == "linear") return TitansMemory::linear;
  if (text == "mlp") return TitansMemory::mlp;
  fail(titans::kWhere, "memory must be 'linear' or 'mlp', got '" + text + "'");
}

TitansLoss titans_loss_from_text(const std::string& text) {
  if (text == "sum") return TitansLoss::sum;
  if (text == "mean") return TitansLoss::mean;
  fail(titans::kWhere, "loss must be 'sum' or 'mean', got '" + text + "'");
}

namespace {

// y = M(x) for weights w; for the mlp, z (4d) and a (4d) are kept for the gradient.
void apply(TitansMemory memory, int64_t d, const double* w, const double* x, double* y, double* z, double* a) {
  if (memory == TitansMemory::linear) {
    for (int64_t o = 0; o < d; ++o) {
      double s = 0;
      for (int64_t p = 0; p < d; ++p) s += w[o * d + p] * x[p];
      y[o] = s;
    }
    return;
  }
  const int64_t h = 4 * d;
  const double* w1 = w;          // (4d, d)
  const double* w2 = w + h * d;  // (d, 4d)
  for (int64_t r = 0; r < h; ++r) {
    double s = 0;
    for (int64_t p = 0; p < d; ++p) s += w1[r * d + p] * x[p];
    z[r] = s;
    a[r] = titans::gelu(s);
  }
  for (int64_t o = 0; o < d; ++o) {
    double s = 0;
    for (int64_t r = 0; r < h; ++r) s += w2[o * h + r] * a[r];
    y[o] = s;
  }
}

}  // namespace

double titans_loss_and_gradient(TitansMemory memory, TitansLoss loss, int64_t dim, const double* weights,
                                const double* k, const double* v, double* grad) {
  const int64_t d = dim, h = 4 * d;
  std::vector<double> e(static_cast<size_t>(d)), z(static_cast<size_t>(h)), a(static_cast<size_t>(h)),
      back(static_cast<size_t>(h));
  apply(memory, d, weights, k, e.data(), z.data(), a.data());
  double l = 0;
  for (int64_t o = 0; o < d; ++o) {
    e[o] -= v[o];
    l += e[o] * e[o];
  }
  const double c = titans::grad_scale(loss, d);  // grad of c/2 ||e||^2 ... = c e (...)
  if (loss == TitansLoss::mean) l /= double(d);
  if (grad == nullptr) return l;
  if (memory == TitansMemory::linear) {
    for (int64_t o = 0; o < d; ++o)
      for (int64_t p = 0; p < d; ++p) grad[o * d + p] = c * e[o] * k[p];
    return l;
  }
  const double* w2 = weights + h * d;
  double* g1 = grad;
  double* g2 = grad + h * d;
  for (int64_t o = 0; o < d; ++o)
    for (int64_t r = 0; r < h; ++r) g2[o * h + r] = c * e[o] * a[r];
  for (int64_t r = 0; r < h; ++r) {
    double s = 0;
    for (int64_t o = 0; o < d; ++o) s += w2[o * h + r] * e[o];
    back[r] = c * s * titans::gelu_grad(z[r]);
  }
  for (int64_t r = 0; r < h; ++r)
    for (int64_t p = 0; p < d; ++p) g1[r * d + p] = back[r] * k[p];
  return l;
}

void titans_memory_reference(const TitansShape& shape, const TitansConfig& config, const TitansArgs64& in,
                             double* y, double* w_out, double* s_out) {
  titans::check_args(shape, config, in.q, in.k, in.v, in.theta, in.eta, in.alpha, in.w0_groups, y, w_out);
  const int64_t d = shape.dim, N = shape.tokens, count = titans_weight_count(config.memory, d);
  const int64_t seqs = shape.batch * shape.heads;
  std::vector<double> w(static_cast<size_t>(count)), s(w.size()), snap(w.size()), g(w.size());
  std::vector<double> z(static_cast<size_t>(4 * d)), a(z.size());
  for (int64_t bh = 0; bh < seqs; ++bh) {
    const double* w0 = titans::w0_of(in.w0, in.w0_groups, bh, shape.heads, count);
    if (w0 != nullptr)
      std::copy(w0, w0 + count, w.begin());
    else
      std::fill(w.begin(), w.end(), 0.0);
    const double* s0 = titans::w0_of(in.s0, in.w0_groups, bh, shape.heads, count);
    if (s0 != nullptr)
      std::copy(s0, s0 + count, s.begin());
    else
      std::fill(s.begin(), s.end(), 0.0);
    for (int64_t t = 0; t < N; ++t) {
      const int64_t row = bh * N + t;
      if (t % config.batch_size == 0) snap = w;  // M_{t'}: the state before this mini-batch
      titans_loss_and_gradient(config.memory, config.loss, d, snap.data(), in.k + row * d, in.v + row * d, g.data());
      const double th = in.theta[row], et = in.eta[row], keep = 1.0 - in.alpha[row];
      for (int64_t i = 0; i < count; ++i) {
        s[i] = et * s[i] - th * g[i];
        w[i] = keep * w[i] + s[i];
      }
      apply(config.memory, d, w.data(), in.q + row * d, y + row * d, z.data(), a.data());
    }
    std::copy(w.begin(), w.end(), w_out + bh * count);
    if (s_out != nullptr) std::copy(s.begin(), s.end(), s_out + bh * count);
  }
}

}  // namespace attn
