// RoPE: angles per (position, pair) in float64, shared by every head of a token; the rotation in
// float32. Parallel over (batch, token): each token's heads are rotated by one thread.
#include "attn/rope.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "attn/error.hpp"
#include "base/checked_math.hpp"
#include "base/parallel.hpp"
#include "core/io_checks.hpp"
#include "rope/rope_tables.hpp"

namespace attn {
namespace {

const char* kWhere = "rope";

struct Plan {
  int64_t R = 0, half = 0;
  std::vector<double> inv_freq;  // theta^(-2c/R), c < R/2
};

Plan validate(const TensorView& x, const Rope& r, const std::vector<int64_t>& batch_offsets) {
  core::check_view(x, "x");
  if (!core::is_float(x.dtype)) fail(kWhere, "x must be float32, bfloat16 or float16, got " + dtype_name(x.dtype));
  if (!std::isfinite(r.theta) || r.theta <= 1.0)
    fail(kWhere, "theta must be a finite number > 1, got " + std::to_string(r.theta));
  const int64_t D = x.dim();
  Plan p;
  p.R = r.rotary_dim == 0 ? D : r.rotary_dim;
  if (p.R < 0 || p.R > D || p.R % 2 != 0)
    fail(kWhere, "rotary_dim must be even and in [0, D = " + std::to_string(D) + "] (0 = all), got " +
                     std::to_string(r.rotary_dim));
  if (!batch_offsets.empty() && static_cast<int64_t>(batch_offsets.size()) != x.batch())
    fail(kWhere, "batch_offsets must have one value per batch (" + std::to_string(x.batch()) + "), got " +
                     std::to_string(batch_offsets.size()));
  constexpr int64_t kMaxPosition = int64_t{1} << 40;  // float64 angles stay exact to ~1e-4 rad here
  auto check_pos = [&](int64_t base, const std::string& what) {
    if (base < 0 || base > kMaxPosition || x.tokens() > kMaxPosition - base)
      fail(kWhere, what + " gives positions outside [0, 2^40]: " + std::to_string(base) + " + " +
                       std::to_string(x.tokens()) + " tokens");
  };
  check_pos(r.offset, "offset");
  for (size_t b = 0; b < batch_offsets.size(); ++b)
    check_pos(checked_add(r.offset, batch_offsets[b], kWhere), "offset + batch_offsets[" + std::to_string(b) + "]");
  p.half = p.R / 2;
  for (int64_t c = 0; c < p.half; ++c)
    p.inv_freq.push_back(std::pow(r.theta, -2.0 * static_cast<double>(c) / static_cast<double>(p.R)));
  return p;
}

int64_t position(const Rope& r, const std::vector<int64_t>& batch_offsets, int64_t b, int64_t n) {
  return r.offset + (batch_offsets.empty() ? 0 : batch_offsets[static_cast<size_t>(b)]) + n;
}

// Channel indices of pair c.
void pair(RopeStyle s, int64_t half, int64_t c, int64_t& a, int64_t& b) {
  if (s == RopeStyle::half) a = c, b = c + half;
  else a = 2 * c, b = 2 * c + 1;
}

// Rotates token n of batch b by the angles angles_of(b, n, cs) writes: cs[2c] = cos, cs[2c + 1] =
// sin of pair c.
template <class AnglesOf>
void rotate(const TensorView& x, const Rope& r, const Plan& p, AnglesOf angles_of) {
  if (p.half == 0 || x.numel() == 0) return;
  constexpr int64_t kTokensPerItem = 64;
  const int64_t blocks = (x.tokens() + kTokensPerItem - 1) / kTokensPerItem, items = x.batch() * blocks;
  const int threads = resolve_threads(r.threads, items);
  // pair c: channels ia[c], ib[c]
  std::vector<int64_t> ia(static_cast<size_t>(p.half)), ib(static_cast<size_t>(p.half));
  for (int64_t c = 0; c < p.half; ++c) pair(r.style, p.half, c, ia[static_cast<size_t>(c)], ib[static_cast<size_t>(c)]);
  const bool plain = x.dtype == DType::f32;
  std::vector<std::vector<float>> scratch(static_cast<size_t>(threads), std::vector<float>(static_cast<size_t>(2 * p.half)));
  parallel_for(items, threads, [&](int64_t item, int tid) {
    const int64_t b = item / blocks, n0 = item % blocks * kTokensPerItem;
    float* cs = scratch[static_cast<size_t>(tid)].data();
    for (int64_t n = n0; n < std::min(x.tokens(), n0 + kTokensPerItem); ++n) {
      angles_of(b, n, cs);
      for (int64_t h = 0; h < x.heads(); ++h) {
        const int64_t base = x.offset(b, h, n, 0), stride = x.strides[3];
        for (int64_t c = 0; c < p.half; ++c) {
          const float co = cs[2 * c], si = cs[2 * c + 1];
          const int64_t oa = base + ia[static_cast<size_t>(c)] * stride, ob = base + ib[static_cast<size_t>(c)] * stride;
          if (plain) {
            float* f = static_cast<float*>(x.data);
            const float xa = f[oa], xb = f[ob];
            f[oa] = xa * co - xb * si;
            f[ob] = xa * si + xb * co;
          } else {
            const float xa = load_as_float(x.data, x.dtype, oa), xb = load_as_float(x.data, x.dtype, ob);
            store_from_float(x.data, x.dtype, oa, xa * co - xb * si);
            store_from_float(x.data, x.dtype, ob, xa * si + xb * co);
          }
        }
      }
    }
  });
}

// cos and sin of every pair at position pos (angles in float64).
void angles_at(const Plan& p, int64_t pos, float* cs) {
  for (int64_t c = 0; c < p.half; ++c) {
    const double angle = static_cast<double>(pos) * p.inv_freq[static_cast<size_t>(c)];
    cs[2 * c] = static_cast<float>(std::cos(angle));
    cs[2 * c + 1] = static_cast<float>(std::sin(angle));
  }
}

}  // namespace

std::string to_string(RopeStyle s) { return s == RopeStyle::half ? "half" : "interleaved"; }

void apply_rope(const TensorView& x, const Rope& r, const std::vector<int64_t>& batch_offsets) {
  const Plan p = validate(x, r, batch_offsets);
  rotate(x, r, p, [&](int64_t b, int64_t n, float* cs) { angles_at(p, position(r, batch_offsets, b, n), cs); });
}

void apply_rope_at(const TensorView& x, const Rope& r, const std::vector<int64_t>& positions) {
  const Plan p = validate(x, r, {});
  if (static_cast<int64_t>(positions.size()) != x.tokens())
    fail(kWhere, "positions must have one value per token (" + std::to_string(x.tokens()) + "), got " +
                     std::to_string(positions.size()));
  for (int64_t pos : positions)
    if (pos < 0 || pos > (int64_t{1} << 40) - r.offset)
      fail(kWhere, "offset + positions must lie in [0, 2^40], got " + std::to_string(r.offset) + " + " +
                       std::to_string(pos));
  // Remapped positions repeat (DCA: j mod chunk): each distinct one's angles are computed once.
  std::vector<int64_t> distinct(positions);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  std::vector<float> table(distinct.size() * static_cast<size_t>(2 * p.half));
  for (size_t u = 0; u < distinct.size(); ++u) angles_at(p, r.offset + distinct[u], table.data() + u * 2 * p.half);
  rotate(x, r, p, [&](int64_t, int64_t n, float* cs) {
    const auto u = std::lower_bound(distinct.begin(), distinct.end(), positions[static_cast<size_t>(n)]) - distinct.begin();
    std::copy_n(table.data() + u * 2 * p.half, 2 * p.half, cs);
  });
}

void rope::check_rope_tables(int64_t head_dim, const TensorView& cos, const TensorView& sin) {
  core::check_view(cos, "rotary_cos");
  core::check_view(sin, "rotary_sin");
  for (auto [t, name] : {std::pair{&cos, "rotary_cos"}, {&sin, "rotary_sin"}}) {
    if (!core::is_float(t->dtype)) fail(kWhere, std::string(name) + " must be a float dtype, got " + dtype_name(t->dtype));
    if (t->shape[0] != 1 || t->shape[1] != 1)
      fail(kWhere, std::string(name) + " must be (positions, rotary_dim / 2), got shape " + core::dims_text(*t));
  }
  if (sin.shape != cos.shape)
    fail(kWhere, "rotary_sin must have the shape of rotary_cos " + core::dims_text(cos) + ", got " + core::dims_text(sin));
  if (2 * cos.dim() > head_dim || cos.dim() < 1)
    fail(kWhere, "rotary_cos must have 1 to head_dim / 2 = " + std::to_string(head_dim / 2) +
                     " columns (rotary_dim / 2), got " + std::to_string(cos.dim()));
}

void apply_rope_table(const TensorView& x, const TensorView& cos, const TensorView& sin, RopeStyle style,
                      const std::vector<int64_t>& positions) {
  core::check_view(x, "x");
  if (!core::is_float(x.dtype)) fail(kWhere, "x must be float32, bfloat16 or float16, got " + dtype_name(x.dtype));
  rope::check_rope_tables(x.dim(), cos, sin);
  if (static_cast<int64_t>(positions.size()) != x.batch() * x.tokens())
    fail(kWhere, "positions must have batch x tokens = " + std::to_string(x.batch() * x.tokens()) + " values, got " +
                     std::to_string(positions.size()));
  for (size_t i = 0; i < positions.size(); ++i)
    if (positions[i] < 0 || positions[i] >= cos.tokens())
      fail(kWhere, "position " + std::to_string(positions[i]) + " (batch " + std::to_string(i / std::max<int64_t>(1, x.tokens())) +
                       ", token " + std::to_string(i % std::max<int64_t>(1, x.tokens())) +
                       ") is outside the rotary tables' " + std::to_string(cos.tokens()) + " positions");
  Plan p;
  p.half = cos.dim(), p.R = 2 * p.half;
  Rope r;
  r.style = style;
  rotate(x, r, p, [&](int64_t b, int64_t n, float* cs) {
    const int64_t pos = positions[static_cast<size_t>(b * x.tokens() + n)];
    for (int64_t c = 0; c < p.half; ++c) cs[2 * c] = cos.at(0, 0, pos, c), cs[2 * c + 1] = sin.at(0, 0, pos, c);
  });
}

std::vector<double> rope_reference(const TensorView& x, const Rope& r, const std::vector<int64_t>& batch_offsets) {
  const Plan p = validate(x, r, batch_offsets);
  const int64_t B = x.batch(), H = x.heads(), N = x.tokens(), D = x.dim();
  std::vector<double> out(static_cast<size_t>(B * H * N * D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < N; ++n) {
        double* o = &out[static_cast<size_t>(((b * H + h) * N + n) * D)];
        for (int64_t c = 0; c < D; ++c) o[c] = x.at(b, h, n, c);
        const double pos = static_cast<double>(position(r, batch_offsets, b, n));
        for (int64_t c = 0; c < p.half; ++c) {
          const double angle = pos * std::pow(r.theta, -2.0 * static_cast<double>(c) / static_cast<double>(p.R));
          int64_t ia, ib;
          pair(r.style, p.half, c, ia, ib);
          const double xa = x.at(b, h, n, ia), xb = x.at(b, h, n, ib);
          o[ia] = xa * std::cos(angle) - xb * std::sin(angle);
          o[ib] = xa * std::sin(angle) + xb * std::cos(angle);
        }
      }
  return out;
}

}  // namespace attn
