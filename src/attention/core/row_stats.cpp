#include "core/row_stats.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

#include "attn/error.hpp"

namespace attn::core {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void all_nan(double out[4]) { out[0] = out[1] = out[2] = out[3] = kNaN; }

// log(u) of the old terms when the reference moves from `from` to `to` (<= 0).
double log_ratio(RowKind kind, double from, double to) {
  return kind == RowKind::softmax ? from - to : std::log(from / to);
}

// g(raw): the weight of a top value relative to the reference (<= 1).
double relative(RowKind kind, double ref, double raw) {
  return kind == RowKind::softmax ? std::exp(raw - ref) : raw / ref;
}

// Moves a summary's sums to a larger reference: u' = alpha u, log u' = log u + log alpha.
void rescale(RowSummary& r, double to) {
  if (r.a1 == 0) {  // no term yet (reference -inf or 0): nothing to carry, and no 0 * -inf
    r.a2 = r.e = 0;
    r.ref = static_cast<float>(to);
    return;
  }
  const double lr = log_ratio(r.kind, r.ref, to);
  const double alpha = std::exp(lr);
  r.e = static_cast<float>(alpha * (r.e + r.a1 * lr));
  r.a1 = static_cast<float>(alpha * r.a1);
  r.a2 = static_cast<float>(alpha * alpha * r.a2);
  r.ref = static_cast<float>(to);
}

}  // namespace

RowSummary RowSummary::empty(RowKind kind, int32_t k, float* top_slots) {
  RowSummary r;
  r.kind = kind;
  r.ref = kind == RowKind::softmax ? kNegInf : 0.0f;
  r.k = k;
  r.top = top_slots;
  return r;
}

void RowSummary::sort_top() { std::sort(top, top + count, std::greater<>()); }

void stream_scores(RowSummary& r, const float* s, int64_t n) {
  float mx = r.ref;
  for (int64_t j = 0; j < n; ++j) {
    if (std::isnan(s[j])) r.nan = true;
    if (s[j] == kNegInf || std::isnan(s[j])) continue;
    ++r.n;
    r.pos = true;
    r.offer(s[j]);
    mx = std::max(mx, s[j]);
  }
  if (mx == kNegInf) return;
  if (mx > r.ref) rescale(r, mx);
  double a1 = r.a1, a2 = r.a2, e = r.e;
  for (int64_t j = 0; j < n; ++j) {
    if (!(s[j] > kNegInf)) continue;
    const double x = static_cast<double>(s[j]) - r.ref, p = std::exp(x);
    a1 += p, a2 += p * p, e += p * x;
  }
  r.a1 = static_cast<float>(a1), r.a2 = static_cast<float>(a2), r.e = static_cast<float>(e);
}

void stream_weights(RowSummary& r, const float* a, int64_t n) {
  float mx = r.ref;
  for (int64_t j = 0; j < n; ++j) {
    if (std::isnan(a[j])) {
      r.nan = true;
      continue;
    }
    r.neg |= a[j] < 0;
    r.pos |= a[j] > 0;
    mx = std::max(mx, std::abs(a[j]));
  }
  r.n += n;
  if (mx == 0) return;
  if (mx > r.ref) rescale(r, mx);
  double a1 = r.a1, a2 = r.a2, e = r.e;
  for (int64_t j = 0; j < n; ++j) {
    if (std::isnan(a[j])) continue;
    const double u = std::abs(static_cast<double>(a[j])) / r.ref;
    a1 += u, a2 += u * u;
    if (u > 0) e += u * std::log(u);
    r.offer(std::abs(a[j]));
  }
  r.a1 = static_cast<float>(a1), r.a2 = static_cast<float>(a2), r.e = static_cast<float>(e);
}

void merge_into(RowSummary& r, const RowSummary& part) {
  if (r.kind != part.kind) fail("attend", "internal: merging row statistics of different kinds");
  r.nan |= part.nan, r.neg |= part.neg, r.pos |= part.pos;
  r.n += part.n;
  for (int32_t t = 0; t < part.count; ++t) r.offer(part.top[t]);
  if (part.a1 == 0) return;  // no term (a part that saw no key)
  if (r.a1 == 0) {
    r.ref = part.ref, r.a1 = part.a1, r.a2 = part.a2, r.e = part.e;
    return;
  }
  const double to = std::max(r.ref, part.ref);
  const double lr = log_ratio(r.kind, r.ref, to), lp = log_ratio(part.kind, part.ref, to);
  const double ar = std::exp(lr), ap = std::exp(lp);
  const double a1 = ar * r.a1 + ap * part.a1;
  const double a2 = ar * ar * r.a2 + ap * ap * part.a2;
  const double e = ar * (r.e + r.a1 * lr) + ap * (part.e + part.a1 * lp);
  r.ref = static_cast<float>(to);
  r.a1 = static_cast<float>(a1), r.a2 = static_cast<float>(a2), r.e = static_cast<float>(e);
}

void finish(const RowSummary& r, double out[4]) {
  if (r.nan || r.n == 0 || !(r.a1 > 0) || !std::isfinite(r.a1) || r.count == 0) return all_nan(out);
  const double a1 = r.a1, a2 = r.a2, e = r.e, n = static_cast<double>(r.n);
  out[0] = std::min(1.0, a1 / std::sqrt(a2) / std::sqrt(n));
  out[1] = r.neg ? kNaN : std::max(0.0, std::log(a1) - e / a1);
  // top holds the k largest raw values in descending order; fewer than k (or a row of at most k
  // keys): every non-zero weight is in it, so its mass is the whole row's, exactly 1
  out[2] = std::min(1.0, relative(r.kind, r.ref, r.top[0]) / a1);
  if (r.count < r.k || r.n <= r.k) {
    out[3] = 1.0;
  } else {
    double mass = 0;
    for (int32_t t = 0; t < r.count; ++t) mass += relative(r.kind, r.ref, r.top[t]);
    out[3] = std::min(1.0, mass / a1);
  }
}

void reference_row_stats(const double* w, const uint8_t* seen, int64_t m, int64_t k, double out[4]) {
  std::vector<double> a;
  for (int64_t j = 0; j < m; ++j)
    if (!seen || seen[j]) a.push_back(w[j]);
  double c = 0;
  bool neg = false;
  for (double x : a) {
    if (std::isnan(x)) return all_nan(out);
    c = std::max(c, std::abs(x));
    neg |= x < 0;
  }
  if (a.empty() || c == 0 || !std::isfinite(c)) return all_nan(out);
  // relative to the largest magnitude, so tiny or huge rows neither underflow nor overflow
  std::vector<double> u(a.size());
  double l1 = 0, l2 = 0;
  for (size_t j = 0; j < a.size(); ++j) {
    u[j] = std::abs(a[j]) / c;
    l1 += u[j], l2 += u[j] * u[j];
  }
  out[0] = l1 / std::sqrt(l2) / std::sqrt(static_cast<double>(a.size()));
  double h = 0;
  for (double x : u)
    if (x > 0) h -= x / l1 * std::log(x / l1);
  out[1] = neg ? kNaN : h;
  std::sort(u.begin(), u.end(), std::greater<>());
  out[2] = u[0] / l1;
  double top = 0;
  for (int64_t t = 0; t < std::min<int64_t>(k, static_cast<int64_t>(u.size())); ++t) top += u[static_cast<size_t>(t)];
  out[3] = k >= static_cast<int64_t>(u.size()) ? 1.0 : top / l1;
}

StatsSink::StatsSink(const RowStatsViews& views, int64_t k) : finishing_(true), views_(views), k_(k) {}

StatsSink::StatsSink(int64_t B, int64_t H, int64_t N, int64_t k) : k_(k), H_(H), N_(N) {
  rows_.resize(static_cast<size_t>(B * H * N));
  tops_.resize(static_cast<size_t>(B * H * N * k));
  for (size_t r = 0; r < rows_.size(); ++r)
    rows_[r] = RowSummary::empty(RowKind::softmax, static_cast<int32_t>(k), tops_.data() + r * static_cast<size_t>(k));
}

void StatsSink::put(int64_t b, int64_t h, int64_t i, RowSummary s) const {
  s.sort_top();
  if (finishing_) {
    double v[4];
    finish(s, v);
    return put_values(b, h, i, v);
  }
  rows_[static_cast<size_t>(index(b, h, i))].keep(s);
}

void StatsSink::put_values(int64_t b, int64_t h, int64_t i, const double v[4]) const {
  if (!finishing_) fail("attend", "internal: finished row statistics put into a summary sink");
  const TensorView* views[4] = {&views_.sparsity, &views_.entropy, &views_.max_weight, &views_.topk_mass};
  for (int s = 0; s < 4; ++s)
    static_cast<float*>(views[s]->data)[views[s]->offset(b, h, i + row0_, 0)] = static_cast<float>(v[s]);
}

StatsSink StatsSink::from_row(int64_t i) const {
  if (!finishing_) fail("attend", "internal: a row sub-sink of a summary sink");
  StatsSink s(views_, k_);
  s.row0_ = row0_ + i;
  return s;
}

RowSummary StatsSink::summary(int64_t b, int64_t h, int64_t i) const {
  return rows_[static_cast<size_t>(index(b, h, i))];
}

}  // namespace attn::core
