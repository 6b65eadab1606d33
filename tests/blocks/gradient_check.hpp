// The blocks' gradient tests' two measures: a fast float gradient against the float64 reference,
// with a tolerance set by a plain float32 implementation's error, and a float64 gradient against
// central finite differences.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace attn::testing {

// Tolerance floor, as a fraction of the largest reference entry: 2^-20 (~1e-6, eight float ulps of
// it). It only matters when the plain float32 implementation is, by luck of rounding, nearly
// exact on every entry; otherwise 3 x its error dominates.
constexpr double kGradientFloor = 1.0 / (1 << 20);

// max |fast - ref| <= 3 max |plain - ref| + kGradientFloor max |ref|, and fast is bitwise fast1
// (the same call with another thread count). Returns the fast form's error.
inline double expect_gradient_close(const std::string& name, const std::vector<float>& fast,
                                    const std::vector<float>& fast1, const std::vector<double>& ref,
                                    const std::vector<float>& plain) {
  EXPECT_EQ(fast.size(), ref.size()) << name;
  double err = 0, err_plain = 0, scale = 0;
  for (size_t e = 0; e < ref.size(); ++e) {
    err = std::max(err, std::fabs(fast[e] - ref[e]));
    err_plain = std::max(err_plain, std::fabs(plain[e] - ref[e]));
    scale = std::max(scale, std::fabs(ref[e]));
    if (fast[e] != fast1[e]) {
      ADD_FAILURE() << name << ": the thread count changed element " << e << " (" << fast[e] << " vs " << fast1[e]
                    << ")";
      break;
    }
  }
  EXPECT_TRUE(std::isfinite(err)) << name;
  if (std::getenv("ATTN_GRADIENT_FIGURES") != nullptr)  // the figures the tolerance came from
    std::printf("  %-14s fast %.3g, plain float32 %.3g, largest entry %.3g\n", name.c_str(), err, err_plain, scale);
  EXPECT_LE(err, 3 * err_plain + kGradientFloor * scale)
      << name << ": fast error " << err << ", plain float32 error " << err_plain << ", largest entry " << scale;
  return err;
}

// Central differences of the scalar loss f over every entry of x (changed in place and restored)
// against grad: |fd - grad| <= tol (1 + |grad|) per entry, h = 1e-6.
inline void expect_finite_differences(const std::string& name, std::vector<double>& x, const std::vector<double>& grad,
                                      const std::function<double()>& loss, double tol = 1e-6,
                                      const std::function<bool(size_t)>& skip = nullptr) {
  ASSERT_EQ(x.size(), grad.size()) << name;
  const double h = 1e-6;
  for (size_t e = 0; e < x.size(); ++e) {
    if (skip && skip(e)) continue;
    const double keep = x[e];
    x[e] = keep + h;
    const double up = loss();
    x[e] = keep - h;
    const double down = loss();
    x[e] = keep;
    const double fd = (up - down) / (2 * h);
    ASSERT_LE(std::fabs(fd - grad[e]), tol * (1 + std::fabs(grad[e])))
        << name << "[" << e << "]: finite difference " << fd << ", gradient " << grad[e];
  }
}

}  // namespace attn::testing
