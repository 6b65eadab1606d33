// attn._attn's mixture-of-experts feed-forward (attn/moe.hpp) for float32 and float64. The Python
// side (python/attn/moe.py) checks shapes and hands over C-contiguous arrays of one dtype; the
// results are new NumPy arrays. The GIL is released while C++ computes.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <memory>
#include <string>
#include <vector>

#include "binding_arrays.hpp"
#include "attn/moe.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using attn::python::In;
using attn::python::owned_array;

template <class T>
void bind_type(nb::module_& m) {
  m.def(
      (std::string("moe_feed_forward_") + (sizeof(T) == 4 ? "f32" : "f64")).c_str(),
      [](In<T, nb::ndim<2>> x, In<T, nb::ndim<2>> router, In<T, nb::ndim<3>> w1, In<T, nb::ndim<3>> w2,
         In<T, nb::ndim<3>> w3, int64_t top_k, int threads) {
        attn::MoeSizes z;
        z.tokens = static_cast<int64_t>(x.shape(0)), z.dim = static_cast<int64_t>(x.shape(1));
        z.experts = static_cast<int64_t>(router.shape(0)), z.hidden = static_cast<int64_t>(w1.shape(1));
        z.top_k = top_k;
        auto* y = new std::vector<T>(static_cast<size_t>(z.tokens * z.dim));
        auto* ids = new std::vector<int32_t>();
        auto* weights = new std::vector<T>();
        double aux = 0;
        try {
          attn::MoeRouting<T> routing;
          {
            nb::gil_scoped_release release;
            aux = attn::moe_feed_forward(z, std::span<const T>(x.data(), x.size()),
                                         std::span<const T>(router.data(), router.size()),
                                         std::span<const T>(w1.data(), w1.size()), std::span<const T>(w2.data(), w2.size()),
                                         std::span<const T>(w3.data(), w3.size()), std::span<T>(*y), threads, &routing);
          }
          *ids = std::move(routing.ids), *weights = std::move(routing.weights);
        } catch (...) {
          delete y, delete ids, delete weights;
          throw;
        }
        const size_t n = static_cast<size_t>(z.tokens), k = static_cast<size_t>(z.top_k);
        return nb::make_tuple(owned_array(y, {n, static_cast<size_t>(z.dim)}), aux, owned_array(ids, {n, k}),
                              owned_array(weights, {n, k}));
      },
      "x"_a, "router"_a, "w1"_a, "w2"_a, "w3"_a, "top_k"_a, "threads"_a = 0,
      "attn::moe_feed_forward: (y, aux_loss, expert ids, routing weights).");
}

template <class T>
void bind_backward(nb::module_& m) {
  m.def(
      (std::string("moe_feed_forward_backward_") + (sizeof(T) == 4 ? "f32" : "f64")).c_str(),
      [](In<T, nb::ndim<2>> dy, double daux, In<T, nb::ndim<2>> x, In<T, nb::ndim<2>> router, In<T, nb::ndim<3>> w1,
         In<T, nb::ndim<3>> w2, In<T, nb::ndim<3>> w3, int64_t top_k, int threads) {
        attn::MoeSizes z;
        z.tokens = static_cast<int64_t>(x.shape(0)), z.dim = static_cast<int64_t>(x.shape(1));
        z.experts = static_cast<int64_t>(router.shape(0)), z.hidden = static_cast<int64_t>(w1.shape(1));
        z.top_k = top_k;
        auto vec = [](size_t n) { return std::make_unique<std::vector<T>>(n); };
        auto dx = vec(x.size()), dr = vec(router.size()), d1 = vec(w1.size()), d2 = vec(w2.size()), d3 = vec(w3.size());
        {
          nb::gil_scoped_release release;
          attn::moe_feed_forward_backward(
              z, std::span<const T>(dy.data(), dy.size()), daux, std::span<const T>(x.data(), x.size()),
              std::span<const T>(router.data(), router.size()), std::span<const T>(w1.data(), w1.size()),
              std::span<const T>(w2.data(), w2.size()), std::span<const T>(w3.data(), w3.size()),
              attn::MoeGradients<T>{*dx, *dr, *d1, *d2, *d3}, threads);
        }
        return nb::make_tuple(owned_array(dx.release(), {x.shape(0), x.shape(1)}),
                              owned_array(dr.release(), {router.shape(0), router.shape(1)}),
                              owned_array(d1.release(), {w1.shape(0), w1.shape(1), w1.shape(2)}),
                              owned_array(d2.release(), {w2.shape(0), w2.shape(1), w2.shape(2)}),
                              owned_array(d3.release(), {w3.shape(0), w3.shape(1), w3.shape(2)}));
      },
      "dy"_a, "daux"_a, "x"_a, "router"_a, "w1"_a, "w2"_a, "w3"_a, "top_k"_a, "threads"_a = 0,
      "attn::moe_feed_forward_backward: (dx, drouter, dw1, dw2, dw3).");
}

}  // namespace

void bind_moe(nb::module_& m) {
  bind_type<float>(m);
  bind_type<double>(m);
  bind_backward<float>(m);
  bind_backward<double>(m);
}
