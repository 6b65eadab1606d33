// The checks every gradient test makes: a gradient against central finite
// differences of a float64 loss, and a fast form against the float64 reference under the 3x rule.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cctype>
#include <functional>
#include <string>

#include "attn/attn.hpp"
#include "attn/tensor.hpp"
#include "core/reference_result.hpp"
#include "families/internal_api.hpp"
#include "harness/inputs.hpp"

namespace attn::testing {

// sum dout . out for out = r.o, a float64 forward reference's output: the loss whose gradients a
// backward given dout returns.
inline double dot_with_output(const TensorView& dout, const core::ReferenceResult& r) {
  double l = 0;
  for (int64_t b = 0; b < dout.shape[0]; ++b)
    for (int64_t h = 0; h < dout.shape[1]; ++h)
      for (int64_t i = 0; i < dout.shape[2]; ++i)
        for (int64_t c = 0; c < dout.shape[3]; ++c) l += static_cast<double>(dout.at(b, h, i, c)) * r.o(b, h, i, c);
  return l;
}

// For a gradient test's inputs (fields q, k, v and dout as Buffers, m the mechanism, o the
// options): the loss sum dout . out of the float64 forward reference, and the gradients of a
// backward form after attend() returned out and lse for the same call.
template <class Inputs>
double reference_loss(const Inputs& s) {
  return dot_with_output(
      s.dout.view, families::reference_outputs(s.q.view, s.k.view, s.v.view, s.m, s.o, core::RefPrecision::f64));
}

template <class Inputs>
AttendGradients forward_then_backward(const Inputs& s, const std::string& form, int threads = 0) {
  AttendOptions fo = s.o;
  fo.return_lse = true;
  const AttendResult fwd = attend(s.q.view, s.k.view, s.v.view, s.m, fo);
  AttendOptions bo = s.o;
  bo.form = form;
  bo.threads = threads;
  return attend_backward(s.dout.view, s.q.view, s.k.view, s.v.view, fwd.out.view(), fwd.lse.view(), s.m, bo);
}

// Central differences of loss() in every element of x (the step actually taken is the difference
// of the two rounded inputs), against grad (x's shape). Second-order error of a 1e-2 step on
// unit-scale inputs: ~1e-4 relative; a gradient that is all zeros checks nothing.
inline void expect_matches_finite_differences(const std::function<double()>& loss, harness::Buffer& x,
                                              const Tensor& grad, const char* name) {
  const TensorView& v = x.view;
  double worst = 0, largest = 0;
  for (int64_t b = 0; b < v.shape[0]; ++b)
    for (int64_t h = 0; h < v.shape[1]; ++h)
      for (int64_t n = 0; n < v.shape[2]; ++n)
        for (int64_t c = 0; c < v.shape[3]; ++c) {
          const int64_t at = v.offset(b, h, n, c);
          const float x0 = v.at(b, h, n, c);
          const float up = x0 + 1e-2f, down = x0 - 1e-2f;
          store_from_float(v.data, v.dtype, at, up);
          const double lu = loss();
          store_from_float(v.data, v.dtype, at, down);
          const double ld = loss();
          store_from_float(v.data, v.dtype, at, x0);
          const double fd = (lu - ld) / (static_cast<double>(up) - down);
          const double got = grad.at(b, h, n, c);
          worst = std::max(worst, std::abs(fd - got));
          largest = std::max(largest, std::abs(fd));
        }
  EXPECT_LE(worst, 1e-3 * std::max(1.0, largest)) << name << ": max |finite difference - gradient| = " << worst;
  EXPECT_GT(largest, 1e-3) << name << ": a gradient that is all zeros checks nothing";
}

// The rule for gradients: max |fast - ref64| <= 3 max |plain - ref64| + floor, plain
// the reference algorithm in float with its intermediates rounded to the storage dtype, floor
// 1e-5 max(1, max |ref64|) (float32 sums over a few hundred rows).
inline void expect_within_rule(const Tensor& fast, const Tensor& ref, const Tensor& plain, const char* name) {
  const TensorView &a = fast.view(), &r = ref.view(), &pl = plain.view();
  double largest = 0, plain_err = 0, err = 0;
  int64_t worst = 0;
  for (int64_t e = 0; e < r.numel(); ++e) {
    const double want = load_as_float(r.data, r.dtype, e);
    largest = std::max(largest, std::abs(want));
    plain_err = std::max(plain_err, std::abs(double(load_as_float(pl.data, pl.dtype, e)) - want));
    const double d = std::abs(double(load_as_float(a.data, a.dtype, e)) - want);
    if (!(d <= err)) err = d, worst = e;
  }
  const double tol = 3 * plain_err + 1e-5 * std::max(1.0, largest);
  EXPECT_LE(err, tol) << name << ": element " << worst << " off by " << err << " (plain " << plain_err << ")";
}

// A parameterised test's name: its index and mechanism text with every other character '_'.
inline std::string param_name(size_t index, const std::string& mechanism) {
  std::string n = std::to_string(index) + "_" + mechanism;
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

}  // namespace attn::testing
