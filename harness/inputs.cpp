#include "harness/inputs.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>


namespace attn::harness {

Buffer random_tensor(std::mt19937& rng, DType dtype, int64_t B, int64_t H, int64_t N, int64_t D, Layout layout,
                     float magnitude, int64_t pad) {
  Buffer buf;
  const int64_t row = D + pad;
  const int64_t total = B * H * N * row;
  buf.bytes.assign(static_cast<size_t>(std::max<int64_t>(total, 1) * static_cast<int64_t>(dtype_size(dtype))), 0);
  TensorView v = make_view(buf.bytes.data(), dtype, B, H, N, row, layout);
  v.shape[3] = D;  // the last `pad` elements of each row are outside the view
  std::normal_distribution<float> dist(0.0f, magnitude);
  for (int64_t i = 0; i < total; ++i) store_from_float(v.data, dtype, i, dist(rng));
  buf.view = v;
  return buf;
}

namespace {

// The size of one declared dimension of a parameter for case c: a number, a dimension of the
// call, or a free symbol (5).
int64_t dim_size(const std::string& d, const Case& c) {
  if (!d.empty() && d.find_first_not_of("0123456789") == std::string::npos) return std::stoll(d);
  if (d == "B") return c.B;
  if (d == "H") return c.H;
  if (d == "N") return c.N;
  if (d == "M") return c.M;
  if (d == "D") return c.D;
  if (d == "Dv") return c.Dv;
  return 5;
}

// Every required param of the case's mechanism and the optional ones it asks for, each drawn by
// its declared rule (attn::ParamInfo::generate).
void add_params(const Case& c, Inputs& in, std::mt19937& rng) {
  AttendOptions& opt = in.options;
  for (const ParamInfo& p : info(in.mechanism).params) {
    const bool asked = std::find(c.extras.params.begin(), c.extras.params.end(), p.name) != c.extras.params.end();
    if (p.optional && !asked) continue;
    std::vector<int64_t> shape;
    if (p.generate == "state") {
      const std::array<int64_t, 4> s = state_shape(in.q.view, in.k.view, in.v.view, in.mechanism, opt);
      shape.assign(s.begin(), s.end());
    } else {
      for (const std::string& d : p.shape) shape.push_back(dim_size(d, c));
    }
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    std::vector<float>& data = in.param_data[p.name];
    data.resize(static_cast<size_t>(count));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const size_t colon = p.generate.find(':');
    const std::string rule = p.generate.substr(0, colon);
    const float sd = colon == std::string::npos ? 1.0f : std::stof(p.generate.substr(colon + 1));
    for (int64_t i = 0; i < count; ++i) {
      float& x = data[static_cast<size_t>(i)];
      if (rule == "normal") {
        x = sd * normal(rng);
      } else if (rule == "positive") {
        x = 1.0f + std::abs(sd * normal(rng));
      } else if (rule == "ones") {
        x = 1.0f;
      } else if (rule == "decay") {  // per head h of H
        x = 0.8f + 0.19f * static_cast<float>(i) / static_cast<float>(count);
      } else if (rule == "state") {  // normalisers (the last column, any past Dv) > 0
        const int64_t col = i % shape.back();
        x = col == shape.back() - 1 || col >= c.Dv ? 2.0f + std::abs(normal(rng)) : normal(rng);
      } else {
        fail("harness", "param '" + p.name + "': unknown generate rule '" + p.generate + "'");
      }
    }
    opt.params[p.name] = make_array_view(data.data(), DType::f32, shape);
  }
  for (const std::string& name : c.extras.params)
    if (!opt.params.count(name)) fail("harness", c.mechanism + " declares no param '" + name + "'");
}

// K and V as int8 rows (same layout and strides) with their scales, wired into kv_scales.
void int8_rows(const Case& c, Inputs& in, bool shapes_only) {
  for (auto [buf, scales] : {std::pair{&in.k, &in.k_scale}, {&in.v, &in.v_scale}}) {
    const TensorView f = buf->view;
    scales->assign(static_cast<size_t>(std::max<int64_t>(c.B * c.Hkv * c.M, 1)), 0.0f);
    Buffer rows;
    rows.view = f;
    rows.view.dtype = DType::i8;
    if (!shapes_only) {
      rows.bytes.assign(buf->bytes.size() / dtype_size(f.dtype), 0);
      rows.view.data = rows.bytes.data();
      quantize_rows(f, rows.view, make_view(scales->data(), DType::f32, c.B, c.Hkv, c.M, 1));
    }
    *buf = std::move(rows);
  }
  in.options.kv_scales = KvScales{make_view(in.k_scale.data(), DType::f32, c.B, c.Hkv, c.M, 1),
                                  make_view(in.v_scale.data(), DType::f32, c.B, c.Hkv, c.M, 1)};
}

}  // namespace

void make_inputs(const Case& c, Inputs& in, bool shapes_only) {
  std::mt19937 rng(c.seed);
  const Extras& x = c.extras;
  in.mechanism = parse_mechanism(c.mechanism);
  if (shapes_only) {
    static const uint64_t zero = 0;
    for (auto [buf, h, n, d] : {std::tuple{&in.q, c.H, c.N, c.D}, {&in.k, c.Hkv, c.M, c.D}, {&in.v, c.Hkv, c.M, c.Dv}}) {
      buf->view = make_view(const_cast<uint64_t*>(&zero), c.dtype, c.B, h, n, d);
      buf->view.strides = {0, 0, 0, 0};
    }
  } else {
    in.q = random_tensor(rng, c.dtype, c.B, c.H, c.N, c.D, c.layout, x.magnitude, x.pad);
    in.k = random_tensor(rng, c.dtype, c.B, c.Hkv, c.M, c.D, c.layout, x.magnitude, x.pad);
    in.v = random_tensor(rng, c.dtype, c.B, c.Hkv, c.M, c.Dv, c.layout, 1.0f, x.pad);
  }
  AttendOptions& opt = in.options;
  if (x.int8_kv) int8_rows(c, in, shapes_only);
  std::mt19937 extras_rng(c.seed ^ 0x5bd1e995u);  // apart from q/k/v, so shapes_only draws the same extras
  rng = extras_rng;
  if (x.padding) {
    std::uniform_int_distribution<int64_t> len(0, c.M);
    for (int64_t b = 0; b < c.B; ++b) opt.key_padding_lengths.push_back(b == 0 ? c.M : len(rng));
  }
  if (x.mask) {  // (1, H, N, M): broadcast over batch
    in.mask.resize(static_cast<size_t>(c.H * c.N * c.M));
    std::bernoulli_distribution keep(0.7);
    for (auto& m : in.mask) m = keep(rng);
    opt.mask = make_view(in.mask.data(), DType::boolean, 1, c.H, c.N, c.M);
    opt.mask->strides[0] = 0;
  }
  if (x.block_mask) {  // (B, 1, ceil(N / 16), ceil(M / 24)): broadcast over heads
    const int64_t bq = 16, bk = 24, rows = (c.N + bq - 1) / bq, cols = (c.M + bk - 1) / bk;
    in.block_mask.resize(static_cast<size_t>(c.B * rows * cols));
    std::bernoulli_distribution keep(0.6);
    for (auto& m : in.block_mask) m = keep(rng);
    opt.block_mask = make_view(in.block_mask.data(), DType::boolean, c.B, 1, rows, cols);
    opt.block_mask->strides[1] = 0;
    opt.block_size = {bq, bk};
  }
  if (x.mask_mod)
    opt.mask_mod = [](int64_t b, int64_t h, int64_t i, int64_t j) { return (b + h + i + 2 * j) % 5 != 0; };
  if (x.bias) {  // (B, 1, N, M) float, with a few -inf entries
    in.bias.resize(static_cast<size_t>(c.B * c.N * c.M));
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::bernoulli_distribution hide(0.05);
    for (auto& b : in.bias) b = hide(rng) ? -INFINITY : d(rng);
    opt.bias = make_view(in.bias.data(), DType::f32, c.B, 1, c.N, c.M);
    opt.bias->strides[1] = 0;
  }
  if (x.alibi)
    for (int64_t h = 0; h < c.H; ++h) opt.alibi_slopes.push_back(std::pow(2.0f, -8.0f * (h + 1) / c.H));
  add_params(c, in, rng);  // after every other option: a state's shape depends on them
  const MechanismInfo facts = info(in.mechanism);
  opt.return_lse = facts.has_lse;
  opt.return_final_state = facts.cache == CacheKind::state;
}

}  // namespace attn::harness
