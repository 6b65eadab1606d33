// attn._attn's attention-weight refinement (attn/refinement.hpp): refine_attention_{f32,f64} and
// refined_weights_{f32,f64}. The Python side (python/attn/refinement.py) checks the array shapes
// and hands over C-contiguous arrays of one dtype; C++ checks the rest (causality, row sums,
// gamma, weight shapes). Results are new NumPy arrays; the GIL is released while C++ computes.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <string>
#include <vector>

#include "binding_arrays.hpp"
#include "attn/refinement.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using attn::python::In;
using attn::python::owned_array;

attn::RefineOptions options(const std::string& form, double gamma, double tolerance, int threads) {
  attn::RefineOptions o;
  o.form = attn::parse_refine_form(form);
  o.gamma = gamma;
  o.row_sum_tolerance = tolerance;
  o.threads = threads;
  return o;
}

template <class T>
attn::MatrixRef<T> matrix(const In<T>& w) {
  return {w.data(), static_cast<int64_t>(w.shape(0)), static_cast<int64_t>(w.shape(1))};
}

template <class T>
void bind_type(nb::module_& m, const char* suffix) {
  // a (batch, n, n), v (batch, n, dv), w1, w2 (n, r): all 3-D / 2-D as the wrapper reshapes them
  m.def(
      (std::string("refine_attention_") + suffix).c_str(),
      [](In<T> a, In<T> v, In<T> w1, In<T> w2, const std::string& form, double gamma, double tolerance,
         int threads) {
        const int64_t batch = static_cast<int64_t>(a.shape(0)), n = static_cast<int64_t>(a.shape(1)),
                      dv = static_cast<int64_t>(v.shape(2));
        const attn::RefineOptions o = options(form, gamma, tolerance, threads);
        auto* out = new std::vector<T>(static_cast<size_t>(batch * n * dv));
        try {
          nb::gil_scoped_release release;
          attn::refine_attention(a.data(), v.data(), batch, n, dv, matrix(w1), matrix(w2), out->data(), o);
        } catch (...) {
          delete out;
          throw;
        }
        return owned_array(out, {static_cast<size_t>(batch), static_cast<size_t>(n), static_cast<size_t>(dv)});
      },
      "a"_a, "v"_a, "w1"_a, "w2"_a, "form"_a, "gamma"_a, "row_sum_tolerance"_a, "threads"_a = 0);
  m.def(
      (std::string("refined_weights_") + suffix).c_str(),
      [](In<T> a, In<T> w1, In<T> w2, const std::string& form, double gamma, double tolerance) {
        const int64_t batch = static_cast<int64_t>(a.shape(0)), n = static_cast<int64_t>(a.shape(1));
        const attn::RefineOptions o = options(form, gamma, tolerance, 0);
        auto* out = new std::vector<T>(static_cast<size_t>(batch * n * n));
        try {
          nb::gil_scoped_release release;
          attn::refined_weights(a.data(), batch, n, matrix(w1), matrix(w2), out->data(), o);
        } catch (...) {
          delete out;
          throw;
        }
        return owned_array(out, {static_cast<size_t>(batch), static_cast<size_t>(n), static_cast<size_t>(n)});
      },
      "a"_a, "w1"_a, "w2"_a, "form"_a, "gamma"_a, "row_sum_tolerance"_a);
}

}  // namespace

void bind_refinement(nb::module_& m) {
  bind_type<float>(m, "f32");
  bind_type<double>(m, "f64");
}
