// attn._attn's attention-weight refinement (attn/refinement.hpp): refine_attention_{f32,f64},
// refined_weights_{f32,f64} and refine_attention_backward_{f32,f64} (-> (da, dv, dw1, dw2)). The
// Python side (python/attn/blocks/refinement.py) checks the array shapes and hands over
// C-contiguous arrays of one dtype; C++ checks the rest (causality, row sums, gamma, weight shapes).
// Results are new NumPy arrays; the GIL is released while C++ computes.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <memory>
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
  m.def(
      (std::string("refine_attention_backward_") + suffix).c_str(),
      [](In<T> dout, In<T> a, In<T> v, In<T> w1, In<T> w2, const std::string& form, double gamma, double tolerance,
         int threads) {
        const size_t batch = a.shape(0), n = a.shape(1), dv = v.shape(2), r = w1.shape(1);
        if (dout.ndim() != 3 || dout.shape(0) != batch || dout.shape(1) != n || dout.shape(2) != dv)
          throw nb::value_error("refine_attention_backward: dout must have the output's shape (batch, N, dv)");
        const attn::RefineOptions o = options(form, gamma, tolerance, threads);
        auto ga = std::make_unique<std::vector<T>>(batch * n * n);
        auto gv = std::make_unique<std::vector<T>>(batch * n * dv);
        auto g1 = std::make_unique<std::vector<T>>(w1.shape(0) * r), g2 = std::make_unique<std::vector<T>>(g1->size());
        {
          nb::gil_scoped_release release;
          attn::refine_attention_backward(dout.data(), a.data(), v.data(), static_cast<int64_t>(batch),
                                          static_cast<int64_t>(n), static_cast<int64_t>(dv), matrix(w1), matrix(w2),
                                          ga->data(), gv->data(), g1->data(), g2->data(), o);
        }
        return nb::make_tuple(owned_array(ga.release(), {batch, n, n}), owned_array(gv.release(), {batch, n, dv}),
                              owned_array(g1.release(), {w1.shape(0), r}), owned_array(g2.release(), {w1.shape(0), r}));
      },
      "dout"_a, "a"_a, "v"_a, "w1"_a, "w2"_a, "form"_a, "gamma"_a, "row_sum_tolerance"_a, "threads"_a = 0);
}

}  // namespace

void bind_refinement(nb::module_& m) {
  bind_type<float>(m, "f32");
  bind_type<double>(m, "f64");
}
