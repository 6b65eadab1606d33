// Rows of K or V as int8 with a float32 scale per row (attn/kv_quant.hpp).
#include "attn/kv_quant.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "core/io_checks.hpp"

namespace attn {
namespace {

const char* kWhere = "quantize_rows";

void check_shape(const TensorView& v, const std::string& name, std::array<int64_t, 4> want, const char* meaning) {
  if (v.shape != want)
    fail(kWhere, name + " must have shape " + meaning + " = (" + std::to_string(want[0]) + ", " + std::to_string(want[1]) +
                     ", " + std::to_string(want[2]) + ", " + std::to_string(want[3]) + "), got " + core::dims_text(v));
}

}  // namespace

float quantize_row(const float* x, int64_t n, int8_t* q) {
  float amax = 0;
  bool finite = true;
  for (int64_t c = 0; c < n; ++c) {
    finite &= std::isfinite(x[c]);
    amax = std::max(amax, std::fabs(x[c]));
  }
  if (!finite) {
    for (int64_t c = 0; c < n; ++c) q[c] = 0;
    return std::numeric_limits<float>::quiet_NaN();
  }
  if (amax == 0) {
    for (int64_t c = 0; c < n; ++c) q[c] = 0;
    return 0;
  }
  // in double: 127 / amax overflows float32 for amax below ~3.7e-37 (subnormal rows)
  const double inv = 127.0 / static_cast<double>(amax);
  for (int64_t c = 0; c < n; ++c) q[c] = static_cast<int8_t>(std::nearbyint(static_cast<double>(x[c]) * inv));
  return static_cast<float>(static_cast<double>(amax) / 127.0);
}

void quantize_rows(const TensorView& x, const TensorView& rows, const TensorView& scales) {
  core::check_view(x, "x");
  core::check_view(rows, "rows");
  core::check_view(scales, "scales");
  if (!core::is_float(x.dtype)) fail(kWhere, "x must be float32, bfloat16 or float16, got " + dtype_name(x.dtype));
  if (rows.dtype != DType::i8) fail(kWhere, "rows must be int8, got " + dtype_name(rows.dtype));
  if (scales.dtype != DType::f32) fail(kWhere, "scales must be float32, got " + dtype_name(scales.dtype));
  check_shape(rows, "rows", x.shape, "x's (B, H, N, D)");
  check_shape(scales, "scales", {x.shape[0], x.shape[1], x.shape[2], 1}, "(B, H, N, 1)");
  const int64_t D = x.shape[3];
  std::vector<float> row(static_cast<size_t>(D));
  std::vector<int8_t> q(static_cast<size_t>(D));
  for (int64_t b = 0; b < x.shape[0]; ++b)
    for (int64_t h = 0; h < x.shape[1]; ++h)
      for (int64_t i = 0; i < x.shape[2]; ++i) {
        for (int64_t c = 0; c < D; ++c) row[static_cast<size_t>(c)] = x.at(b, h, i, c);
        const float s = quantize_row(row.data(), D, q.data());
        for (int64_t c = 0; c < D; ++c) static_cast<int8_t*>(rows.data)[rows.offset(b, h, i, c)] = q[static_cast<size_t>(c)];
        static_cast<float*>(scales.data)[scales.offset(b, h, i, 0)] = s;
      }
}

QuantizedRows quantize_rows(const TensorView& x) {
  core::check_view(x, "x");
  QuantizedRows r{Tensor(DType::i8, x.shape), Tensor(DType::f32, {x.shape[0], x.shape[1], x.shape[2], 1})};
  quantize_rows(x, r.rows.view(), r.scales.view());
  return r;
}

}  // namespace attn
